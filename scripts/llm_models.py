"""Small language models by a fixed rule, following Triton's LLM conventions, for the OpenAI port.

``py_llm`` follows the vLLM backend's: decoupled, ``text_input``, ``stream``,
``sampling_parameters`` (JSON), ``exclude_input_in_output`` and
``return_num_input_tokens`` / ``return_num_output_tokens``; it answers
``text_output`` (and the token counts when asked).  ``py_trtllm`` follows
TensorRT-LLM's: ``text_input``, ``max_tokens``, ``stop_words`` and ``stream``
as inputs, one response.  The rule: the prompt's words, last first, over and
over, one word (token) per response, until ``max_tokens`` or a stop string.
"""

from __future__ import annotations

import pathlib

from scripts.python_models import _write

LLM_PY = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

KNOWN = {"max_tokens", "temperature", "top_p", "seed", "stop", "n"}


def _one(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def generate(prompt, max_tokens, stop):
    """The fixed rule: the prompt's words, last first, cycling; each word is one token."""
    words = prompt.split() or ["..."]
    text = ""
    for i in range(max_tokens):
        token = " " + words[len(words) - 1 - i % len(words)]
        for s in stop:
            at = (text + token).find(s)
            if at >= 0:
                if at > len(text):
                    yield (text + token)[len(text):at]
                return
        text += token
        yield token


def _array(values, dtype):
    return np.array(values, dtype=dtype)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        delay = config.get("parameters", {}).get("token_delay_ms", {}).get("string_value", "0")
        self.delay_s = float(delay) / 1000

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                prompt, options = self.read(request)
            except ValueError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                if self.decoupled:
                    request.get_response_sender().send(
                        pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )
                else:
                    responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if self.decoupled:
                self.stream(request, prompt, options)
            else:
                text = "".join(generate(prompt, options["max_tokens"], options["stop"]))
                responses.append(self.response(options["prefix"] + text, None, None))
        return responses if not self.decoupled else None

    def read(self, request):
        prompt = str(_one(request, "text_input", ""))
        params = json.loads(_one(request, "sampling_parameters", "") or "{}")
        unknown = sorted(set(params) - KNOWN)
        if unknown:
            raise ValueError(f"unsupported sampling parameter(s): {', '.join(unknown)}")
        if params.get("n", 1) != 1:
            raise ValueError("n must be 1")
        stop = params.get("stop", [])
        stop_words = pb_utils.get_input_tensor_by_name(request, "stop_words")
        if stop_words is not None:
            stop = [w.decode("utf-8") for w in stop_words.as_numpy().reshape(-1)]
        return prompt, {
            "max_tokens": int(params.get("max_tokens", _one(request, "max_tokens", 16))),
            "stop": [stop] if isinstance(stop, str) else list(stop),
            "stream": bool(_one(request, "stream", False)),
            "prefix": "" if bool(_one(request, "exclude_input_in_output", True)) else prompt,
            "counts": bool(_one(request, "return_num_input_tokens", False)),
            "prompt_tokens": len(prompt.split()),
        }

    def response(self, text, prompt_tokens, output_tokens):
        outputs = [pb_utils.Tensor("text_output", _array([text.encode("utf-8")], np.object_))]
        if prompt_tokens is not None:
            outputs.append(pb_utils.Tensor("num_input_tokens", _array([prompt_tokens], np.uint32)))
            outputs.append(pb_utils.Tensor("num_output_tokens", _array([output_tokens], np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def stream(self, request, prompt, options):
        sender = request.get_response_sender()
        counts = options["prompt_tokens"] if options["counts"] else None
        if not options["stream"]:
            tokens = list(generate(prompt, options["max_tokens"], options["stop"]))
            text = options["prefix"] + "".join(tokens)
            sender.send(self.response(text, counts, len(tokens) if counts is not None else None),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        prefix = options["prefix"]
        for token in generate(prompt, options["max_tokens"], options["stop"]):
            if sender.is_cancelled():
                break
            if self.delay_s:
                time.sleep(self.delay_s)
            sender.send(self.response(prefix + token, counts, 1 if counts is not None else None))
            prefix = ""
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def text_llm(repo: pathlib.Path, name: str = "py_llm", token_delay_ms: int = 0) -> pathlib.Path:
    """The vLLM-convention model: decoupled, one word per response (``token_delay_ms`` before each)."""
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: true }}
    input [
      {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
      {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
      {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
      {{ name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
      {{ name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
      {{ name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
    ]
    output [
      {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }},
      {{ name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }},
      {{ name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }}
    ]
    parameters {{ key: "token_delay_ms" value: {{ string_value: "{token_delay_ms}" }} }}
    """
    return _write(repo, name, config, LLM_PY)


def trtllm_style(repo: pathlib.Path, name: str = "py_trtllm", extra: str = "") -> pathlib.Path:
    """The TensorRT-LLM-convention model: batched inputs, no sampling inputs but ``max_tokens`` and ``stop_words``
    (so a request with ``temperature`` is refused), one response."""
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 4
    input [
      {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
      {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true }},
      {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
    ]
    output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
    {extra}
    """
    return _write(repo, name, config, LLM_PY)
