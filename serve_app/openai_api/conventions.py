"""Which models speak Triton's LLM conventions, and an OpenAI request as an inference request to one.

Two conventions, as Triton's front end knows them: vLLM's backend
(``text_input``, ``stream``, ``sampling_parameters`` as JSON,
``exclude_input_in_output``, ``return_num_input_tokens`` /
``return_num_output_tokens``) and TensorRT-LLM's (``text_input``,
``max_tokens``, and one input per sampling field).  Both answer
``text_output``.  A field the model has no way to receive is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse
from serve_app.openai_api.params import Params
from serve_app.protocol.generate_codec import generate_request

VLLM = "vllm"
TRTLLM = "tensorrtllm"
TEXT_INPUT, TEXT_OUTPUT = "text_input", "text_output"
# TensorRT-LLM's input for each OpenAI field (its older releases name the seed random_seed).
_TRTLLM_INPUTS = {
    "temperature": ("temperature",),
    "top_p": ("top_p", "runtime_top_p"),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "seed": ("seed", "random_seed"),
}


def convention(sig: ModelSignature) -> str | None:
    """The model's LLM convention, or None for a model that follows neither."""
    if TEXT_INPUT not in sig.inputs or TEXT_OUTPUT not in sig.outputs:
        return None
    if "sampling_parameters" in sig.inputs:
        return VLLM
    if "max_tokens" in sig.inputs:
        return TRTLLM
    return None


def infer_request(sig: ModelSignature, params: Params, prompt: str, *, request_id: str) -> InferRequest:
    """The inference request for ``prompt`` with the settings of ``params``."""
    kind = convention(sig)
    if kind is None:
        raise InvalidArgument(f"model '{sig.name}' does not follow Triton's LLM conventions")
    obj: dict[str, Any] = {TEXT_INPUT: prompt}
    if "stream" in sig.inputs:
        obj["stream"] = params.stream
    if "exclude_input_in_output" in sig.inputs:
        obj["exclude_input_in_output"] = not params.echo
    elif params.echo:
        raise InvalidArgument(f"'echo' is not supported by model '{sig.name}' (no input exclude_input_in_output)")
    if kind == VLLM:
        sampling: dict[str, Any] = {**params.sampling, "max_tokens": params.max_tokens}
        if params.stop:
            sampling["stop"] = params.stop
        obj["sampling_parameters"] = json.dumps(sampling)
        for name in ("return_num_input_tokens", "return_num_output_tokens"):
            if name in sig.inputs:
                obj[name] = True
    else:
        obj["max_tokens"] = params.max_tokens
        if params.stop:
            obj[_input(sig, "stop", ("stop_words",))] = params.stop
        for field_name, value in params.sampling.items():
            obj[_input(sig, field_name, _TRTLLM_INPUTS[field_name])] = value
    request = generate_request(obj, model_name=sig.name, model_version=sig.version, sig=sig)
    request.id = request_id
    return request


def _input(sig: ModelSignature, field_name: str, candidates: tuple[str, ...]) -> str:
    for name in candidates:
        if name in sig.inputs:
            return name
    raise InvalidArgument(f"'{field_name}' is not supported by model '{sig.name}' (no input {candidates[0]})")


@dataclass(frozen=True, slots=True)
class Piece:
    """What one response of the model says: its text, and the token counts it reports (vLLM's outputs)."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def read_response(response: InferResponse) -> Piece:
    text, counts = "", {}
    for tensor in response.outputs:
        flat = np.asarray(tensor.data).reshape(-1)
        if tensor.name == TEXT_OUTPUT:
            text = "".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat)
        elif tensor.name in ("num_input_tokens", "num_output_tokens") and flat.size:
            counts[tensor.name] = int(flat[0])
    return Piece(text, counts.get("num_input_tokens"), counts.get("num_output_tokens"))
