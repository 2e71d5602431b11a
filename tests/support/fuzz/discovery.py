"""What a server serves, learned as a client would: the generators build their requests from it."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as metadata reports it: -1 for a variable dimension, batch included


@dataclass(frozen=True)
class ModelInfo:
    name: str
    versions: tuple[str, ...]
    ready: bool
    max_batch_size: int = 0
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    sequence: bool = False
    string_corrid: bool = False


async def discover(client: httpx.AsyncClient) -> list[ModelInfo]:
    """Models from the repository index, each with its metadata and config (as a client would learn them)."""
    resp = await client.post("/v2/repository/index", content=b"{}")
    resp.raise_for_status()
    names = sorted({e["name"] for e in resp.json()})
    models = []
    for name in names:
        quoted = urllib.parse.quote(name, safe="")
        md = await client.get(f"/v2/models/{quoted}")
        cfg = await client.get(f"/v2/models/{quoted}/config")
        if md.status_code != 200 or cfg.status_code != 200:
            models.append(ModelInfo(name, ("1",), ready=False))
            continue
        meta, config = md.json(), cfg.json()

        def tensors(items: list[dict[str, Any]]) -> tuple[TensorInfo, ...]:
            return tuple(TensorInfo(t["name"], t["datatype"], tuple(int(d) for d in t["shape"])) for t in items)

        seq = config.get("sequence_batching")
        corrid = [
            c
            for ci in (seq or {}).get("control_input", [])
            for c in ci.get("control", [])
            if c.get("kind") == "CONTROL_SEQUENCE_CORRID"
        ]
        ready = (await client.get(f"/v2/models/{quoted}/ready")).status_code == 200
        models.append(
            ModelInfo(
                name=name,
                versions=tuple(meta.get("versions") or ["1"]),
                ready=ready,
                max_batch_size=int(config.get("max_batch_size", 0)),
                inputs=tensors(meta.get("inputs", [])),
                outputs=tensors(meta.get("outputs", [])),
                sequence=seq is not None,
                string_corrid=any(c.get("data_type") == "TYPE_STRING" for c in corrid),
            )
        )
    return models
