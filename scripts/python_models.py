"""Python-backend models written the way Triton users write them (``model.py`` + ``config.pbtxt``).

Their shapes follow Triton's python_backend examples (add_sub, auto_complete,
bls, bls_decoupled, decoupled repeat and square, a pre-processing model);
the code is ours and uses only the documented ``triton_python_backend_utils``
API.  Each builder writes one model directory into ``repo``.
"""

from __future__ import annotations

import pathlib
import textwrap


def _write(repo: pathlib.Path, name: str, config: str, model_py: str, version: int = 1) -> pathlib.Path:
    d = repo / name
    (d / str(version)).mkdir(parents=True, exist_ok=True)
    (d / str(version) / "model.py").write_text(textwrap.dedent(model_py).lstrip())
    if config:
        (d / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    return d


ADD_SUB_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1]))
        return responses

    def finalize(self):
        print("Cleaning up...")
"""


def add_sub(repo: pathlib.Path, name: str = "py_add_sub", max_batch_size: int = 0, extra: str = "") -> pathlib.Path:
    """Triton's add_sub: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32 [16])."""
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: {max_batch_size}
    input [
      {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
      {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
    ]
    output [
      {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
      {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
    ]
    instance_group [ {{ kind: KIND_CPU }} ]
    {extra}
    """
    return _write(repo, name, config, ADD_SUB_PY)


ARGS_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.model_dir = pb_utils.get_model_dir()

    def execute(self, requests):
        responses = []
        for request in requests:
            report = dict(self.args)
            report["model_dir"] = self.model_dir
            report["parameters"] = request.parameters()
            report["request_id"] = request.request_id()
            report["requested"] = sorted(request.requested_output_names())
            report["batch"] = len(requests)
            text = np.array([json.dumps(report).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)]))
        return responses
"""


def args_report(repo: pathlib.Path, name: str = "py_args") -> pathlib.Path:
    """Answers with what it was given: its initialize args, its model directory, the request's parameters."""
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    output [ {{ name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, ARGS_PY)


AUTO_COMPLETE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a * b)]))
        return responses
"""


def auto_complete(repo: pathlib.Path, name: str = "py_auto_complete") -> pathlib.Path:
    """No inputs or outputs in its config: its auto_complete_config adds them, batching too."""
    config = f"""
    name: "{name}"
    backend: "python"
    """
    return _write(repo, name, config, AUTO_COMPLETE_PY)


PREPROCESS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Text in, features out: upper-cased text and each text's length, as a tokenizer step would."""

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            words = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in text.reshape(-1)]
            upper = np.array([w.upper().encode("utf-8") for w in words], dtype=np.object_).reshape(text.shape)
            lengths = np.array([len(w) for w in words], dtype=np.float32).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("UPPER", upper),
                pb_utils.Tensor("LENGTH", lengths),
            ]))
        return responses
'''


def preprocess(repo: pathlib.Path, name: str = "py_preprocess") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 8
    dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
    input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }} ]
    output [
      {{ name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }},
      {{ name: "LENGTH" data_type: TYPE_FP32 dims: [ -1 ] }}
    ]
    """
    return _write(repo, name, config, PREPROCESS_PY)


BLS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls the model named by MODEL_NAME with INPUT0/INPUT1 and returns its outputs (Triton's bls example)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            model_name = model_name.decode("utf-8") if isinstance(model_name, bytes) else str(model_name)
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            out_0 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0")
            out_1 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", out_0.as_numpy()),
                pb_utils.Tensor("OUTPUT1", out_1.as_numpy()),
            ]))
        return responses
'''

BLS_ASYNC_PY = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends two BLS requests at once with async_exec and adds their results."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            # add_sub (ONNX) batches: its inputs get a batch dimension of 1
            batched = [pb_utils.Tensor(t.name(), t.as_numpy()[None]) for t in (in_0, in_1)]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name, requested_output_names=["OUTPUT0"], inputs=inputs
                ).async_exec()
                for name, inputs in (("add_sub", batched), ("py_add_sub", [in_0, in_1]))
            ]
            answers = await asyncio.gather(*calls)
            for answer in answers:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            total = sum(pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy().reshape(-1) for a in answers)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", total), pb_utils.Tensor("OUTPUT1", total)
            ]))
        return responses
'''


def bls(repo: pathlib.Path, name: str = "py_bls", asynchronous: bool = False) -> pathlib.Path:
    """Triton's bls example: a model that runs another model named in its request."""
    model_name = "" if asynchronous else '{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }, '
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [
      {model_name}{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
      {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
    ]
    output [
      {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
      {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
    ]
    """
    return _write(repo, name, config, BLS_ASYNC_PY if asynchronous else BLS_PY)


REPEAT_PY = '''
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's repeat example: one response per element of IN, DELAY ms apart, sent from a thread."""

    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                "model can support only decoupled transaction policy; make model_transaction_policy decoupled"
            )
        out_config = pb_utils.get_output_config_by_name(model_config, "OUT")
        self.out_dtype = pb_utils.triton_string_to_numpy(out_config["data_type"])
        self.inflight = 0
        self.lock = threading.Lock()
        self.cancelled = 0

    def execute(self, requests):
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().size == 0:
                # (a test's probe) an empty IN: one response with how many requests saw their client cancel
                sender = request.get_response_sender()
                with self.lock:
                    out = np.array([self.cancelled], dtype=self.out_dtype)
                idx = pb_utils.Tensor("IDX", np.array([0], dtype=np.uint32))
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out), idx]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            thread = threading.Thread(target=self.respond, args=(request,), daemon=True)
            thread.start()
        return None

    def respond(self, request):
        with self.lock:
            self.inflight += 1
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        for i, value in enumerate(values):
            if sender.is_cancelled():
                with self.lock:
                    self.cancelled += 1
                break
            time.sleep(int(delays[i % len(delays)]) / 1000)
            out = pb_utils.Tensor("OUT", np.array([value], dtype=self.out_dtype))
            idx = pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.inflight -= 1
'''


def repeat(repo: pathlib.Path, name: str = "py_repeat") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: true }}
    input [
      {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
      {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }}
    ]
    output [
      {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
    ]
    instance_group [ {{ count: 1 kind: KIND_CPU }} ]
    """
    return _write(repo, name, config, REPEAT_PY)


SQUARE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's square example: IN = n gets n responses OUT = n, then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def square(repo: pathlib.Path, name: str = "py_square") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: true }}
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, SQUARE_PY)


BLS_DECOUPLED_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's bls_decoupled shape: calls py_square with exec(decoupled=True) and sums what it streams."""

    def execute(self, requests):
        responses = []
        for request in requests:
            in_ = pb_utils.get_input_tensor_by_name(request, "IN")
            infer_request = pb_utils.InferenceRequest(
                model_name="py_square", requested_output_names=["OUT"], inputs=[in_]
            )
            total, count = 0, 0
            for infer_response in infer_request.exec(decoupled=True):
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
                if len(infer_response.output_tensors()) > 0:
                    total += int(pb_utils.get_output_tensor_by_name(infer_response, "OUT").as_numpy()[0])
                    count += 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32)),
            ]))
        return responses
'''


def bls_decoupled(repo: pathlib.Path, name: str = "py_bls_decoupled") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [
      {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }}
    ]
    """
    return _write(repo, name, config, BLS_DECOUPLED_PY)


ERRORS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """MODE 0: echo; 1: this request's response carries an error (INVALID_ARG); 2: raise; 3: wrong return."""

    def execute(self, requests):
        modes = [int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy().reshape(-1)[0]) for r in requests]
        if 2 in modes:
            raise pb_utils.TritonModelException("model was asked to fail")
        if 3 in modes:
            return tuple()
        responses = []
        for request, mode in zip(requests, modes):
            if mode == 1:
                error = pb_utils.TritonError("this request is bad", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                out = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
'''


def errors(repo: pathlib.Path, name: str = "py_errors") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 8
    dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
    input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, ERRORS_PY)


INIT_FAIL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("this model refuses to start")

    def execute(self, requests):
        return []
"""


def init_fail(repo: pathlib.Path, name: str = "py_init_fail") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, INIT_FAIL_PY)


NO_FINAL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends one response and keeps the sender without ever sending the final flag."""

    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]))
            self.kept.append(sender)
        return None
'''

DROP_FINAL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends one response, then lets go of the request without its final flag."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]))
        return None
'''


def no_final(repo: pathlib.Path, name: str = "py_no_final", keep: bool = True) -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    model_transaction_policy {{ decoupled: true }}
    parameters {{ key: "response_timeout_s" value: {{ string_value: "2" }} }}
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, NO_FINAL_PY if keep else DROP_FINAL_PY)


STATEFUL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A running sum per sequence, kept in Python by correlation id (START resets it, END drops it)."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corr = request.correlation_id()
            flags = request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[corr] = 0
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            self.sums[corr] = self.sums.get(corr, 0) + int(values.reshape(-1)[0])
            out = np.full(values.shape, self.sums[corr], dtype=np.int32)
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[corr]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
'''


def stateful(repo: pathlib.Path, name: str = "py_stateful") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 4
    sequence_batching {{ max_sequence_idle_microseconds: 5000000 }}
    input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, STATEFUL_PY)


TOKENS_PY = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """An LLM-shaped streaming model: text_input in, one word of it per response as text_output."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
            params = json.loads(request.parameters())
            limit = int(params.get("max_tokens", 1000))
            delay = float(params.get("delay_s", 0))
            for word in text.split()[:limit]:
                if sender.is_cancelled():
                    break
                time.sleep(delay)
                out = np.array([word.encode("utf-8")], dtype=np.object_)
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", out)],
                                                       parameters={"word": True}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def tokens(repo: pathlib.Path, name: str = "py_tokens") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: true }}
    input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }} ]
    output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, TOKENS_PY)


ECHO_TEXT_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """text_input in, the same text upper-cased out (one response: the generate endpoint's case)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            upper = np.array([t.upper() for t in text], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", upper)]))
        return responses
'''


def echo_text(repo: pathlib.Path, name: str = "py_echo_text") -> pathlib.Path:
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }} ]
    output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
    """
    return _write(repo, name, config, ECHO_TEXT_PY)


def build_all(repo: pathlib.Path) -> None:
    """Every model above (the BLS models call ``add_sub``, an ONNX model the caller provides, and
    ``py_add_sub`` and ``py_square`` from here)."""
    add_sub(repo)
    add_sub(
        repo,
        name="py_add_sub_batched",
        max_batch_size=8,
        extra="dynamic_batching { max_queue_delay_microseconds: 20000 }",
    )
    args_report(repo)
    auto_complete(repo)
    preprocess(repo)
    bls(repo)
    bls(repo, name="py_bls_async", asynchronous=True)
    repeat(repo)
    square(repo)
    bls_decoupled(repo)
    errors(repo)
    init_fail(repo)
    no_final(repo)
    no_final(repo, name="py_drop_final", keep=False)
    stateful(repo)
    tokens(repo)
    echo_text(repo)


# Models that keep the default (a process of their own) in the end-to-end repository; the others run in the
# gateway (dedicated_process: false), so the repository stays light on a small machine.
DEDICATED = ("py_add_sub", "py_bls", "py_repeat", "py_tokens")
SHARED_PARAMETER = 'parameters { key: "dedicated_process" value: { string_value: "false" } }\n'


def build_e2e(repo: pathlib.Path) -> None:
    """:func:`build_all`, with every model but :data:`DEDICATED` running in the gateway."""
    build_all(repo)
    for d in repo.iterdir():
        if d.name.startswith("py_") and d.name not in DEDICATED and (d / "config.pbtxt").is_file():
            with open(d / "config.pbtxt", "a") as f:
                f.write(SHARED_PARAMETER)


BLS_CHAIN_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A pipeline of two steps by BLS: py_add_sub, then py_add_sub on its outputs (2*INPUT0, 2*INPUT1)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            for _ in range(2):
                answer = pb_utils.InferenceRequest(
                    model_name="py_add_sub", requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs
                ).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out = [pb_utils.get_output_tensor_by_name(answer, n).as_numpy() for n in ("OUTPUT0", "OUTPUT1")]
                inputs = [pb_utils.Tensor("INPUT0", out[0]), pb_utils.Tensor("INPUT1", out[1])]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", inputs[0].as_numpy()), pb_utils.Tensor("OUTPUT1", inputs[1].as_numpy())
            ]))
        return responses
'''


def bls_chain(repo: pathlib.Path, name: str = "py_chain") -> pathlib.Path:
    """Two ``py_add_sub`` steps chained by BLS inside one model."""
    config = f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [
      {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
      {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
    ]
    output [
      {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
      {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
    ]
    """
    return _write(repo, name, config, BLS_CHAIN_PY)
