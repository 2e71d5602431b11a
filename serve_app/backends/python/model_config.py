"""``pb_utils.ModelConfig``: what a model's ``auto_complete_config`` receives and returns.

It wraps the config as Triton's JSON dict and offers Triton's setters, with
its checks and messages (``triton_python_backend_utils.py``): a setter may add
what the config lacks, never contradict what it says.
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config

    def as_dict(self) -> dict[str, Any]:
        """The config as a dict (Triton documents it as read-only)."""
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0) or 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for model "
                f"'{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for found in ("sequence_batching", "ensemble_scheduling"):
            if found in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{found}', but auto-complete-config function for "
                    f"model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, _INPUT_KEYS, "'name', 'data_type', 'dims' and 'optional'")

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_KEYS, "'name', 'data_type' and 'dims'")

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...], listed: str) -> None:
        model = self._name()
        if not isinstance(tensor, dict):
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' must be a dict")
        name = tensor.get("name", "")
        if any(key not in allowed for key in tensor):
            raise ValueError(
                f"{kind} '{name}' in auto-complete-config function for model '{model}' contains property other "
                f"than {listed}."
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model '{model}' is missing '{key}' property."
                )
        existing = self._model_config.setdefault(kind, [])
        for current in existing:
            if current.get("name") != name:
                continue
            have = current.get("data_type", "TYPE_INVALID")
            if have not in ("TYPE_INVALID", "", None) and have != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {have} for {kind} '{name}', "
                    f"model provides {tensor['data_type']}"
                )
            current["data_type"] = tensor["data_type"]
            dims = [int(d) for d in current.get("dims", [])]
            new_dims = [int(d) for d in tensor["dims"]]
            if dims and dims != new_dims:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims {new_dims} but the model "
                    f"configuration specifies dims {dims}"
                )
            current["dims"] = new_dims
            if "optional" in tensor:
                if "optional" in current and bool(current["optional"]) != bool(tensor["optional"]):
                    raise ValueError(
                        f"model '{model}', tensor '{name}': the model expects optional {tensor['optional']} but the "
                        f"model configuration specifies optional {current['optional']}"
                    )
                current["optional"] = bool(tensor["optional"])
            return
        entry = {"name": name, "data_type": tensor["data_type"], "dims": [int(d) for d in tensor["dims"]]}
        if "optional" in tensor:
            entry["optional"] = bool(tensor["optional"])
        existing.append(entry)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._name()
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                f"model transaction property in auto-complete-config function for model '{model}' contains property "
                "other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            new = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != new:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{model}', which is "
                    f"already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = new
