"""gRPC cases: mutated inference requests, protobuf-level mistakes, corrupt messages, streams, the other RPCs
and repository calls."""

from __future__ import annotations

import random
from typing import Any

from serve_app.protos import grpc_service_pb2 as pb
from tests.support.fuzz.cases import REQUEST_KEYS, GrpcCase, junk_scalar, odd_name, odd_version
from tests.support.fuzz.mutations import RequestGenerator
from tests.support.fuzz.wire import grpc_message, set_param


class GrpcCases(RequestGenerator):
    """The gRPC half of the generator."""

    def grpc(self, rng: random.Random) -> GrpcCase:
        r = rng.random()
        if r < 0.6:
            return self.grpc_infer(rng)
        if r < 0.72:
            return self.grpc_stream(rng)
        if r < 0.87:
            return self.grpc_other(rng)
        return self.grpc_repository(rng)

    def infer_message(self, rng: random.Random) -> tuple[bytes, str, bool]:
        model = self.model(rng)
        if not model.inputs:
            return pb.ModelInferRequest(model_name=model.name).SerializeToString(), "not_ready", True
        req = self.valid(rng, model)
        labels = [self.mutate(rng, model, req) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
        raw = rng.random() < 0.6
        msg = grpc_message(req, raw)
        if rng.random() < 0.4:
            labels.append(self.grpc_field(rng, msg))
        data = msg.SerializeToString()
        if rng.random() < 0.1:
            labels.append("corrupt")
            data = self.corrupt(rng, data)
        return data, "+".join(labels or ["valid"]), self.maybe_unavailable(req)

    def grpc_field(self, rng: random.Random, msg: pb.ModelInferRequest) -> str:
        """A protobuf-level mistake: raw contents of the wrong count or size, typed contents in the wrong
        field, parameters of the wrong type or with no value."""
        r = rng.randrange(8)
        io = rng.choice(msg.inputs) if msg.inputs else None
        if r == 0:
            if msg.raw_input_contents and rng.random() < 0.5:
                del msg.raw_input_contents[-1]
            else:
                msg.raw_input_contents.append(rng.randbytes(rng.randint(0, 8)))
            return "raw_count"
        if r == 1 and msg.raw_input_contents:
            i = rng.randrange(len(msg.raw_input_contents))
            b = msg.raw_input_contents[i]
            msg.raw_input_contents[i] = b[: -rng.randint(1, 4)] if b and rng.random() < 0.5 else b + b"\x01\x00\x00"
            return "raw_size"
        if r == 2 and io is not None:
            field_ = rng.choice(
                [
                    "bool_contents",
                    "int_contents",
                    "int64_contents",
                    "uint_contents",
                    "uint64_contents",
                    "fp32_contents",
                    "fp64_contents",
                    "bytes_contents",
                ]
            )
            values = {"bool_contents": [True], "bytes_contents": [b"\xff", b""], "fp32_contents": [1.5]}
            getattr(io.contents, field_).extend(values.get(field_, [1, 2]))
            return "typed_field"
        if r == 3:
            target = rng.choice([msg.parameters, io.parameters if io else msg.parameters])
            key = rng.choice([*REQUEST_KEYS, "shared_memory_region", "classification", "x"])
            p = target[key]
            which = rng.randrange(6)
            if which == 0:
                p.bool_param = rng.random() < 0.5
            elif which == 1:
                p.int64_param = rng.choice([-1, 0, 1, -(2**63), 2**63 - 1])
            elif which == 2:
                p.string_param = rng.choice(["", "1", "x", "true"])
            elif which == 3:
                p.double_param = rng.choice([0.5, -1.0, float("nan"), float("inf")])
            elif which == 4:
                p.uint64_param = rng.choice([0, 1, 2**64 - 1])
            else:
                p.Clear()  # no value at all
            return "param_type"
        if r == 4 and io is not None:
            io.ClearField(rng.choice(["name", "datatype", "shape"]))
            return "missing_field"
        if r == 5:
            msg.ClearField(rng.choice(["model_name", "inputs", "outputs", "raw_input_contents"]))
            return "missing_field"
        if r == 6 and msg.outputs:
            o = rng.choice(msg.outputs)
            set_param(o.parameters, rng.choice(["classification", "binary_data", "x"]), junk_scalar(rng))
            return "output_param"
        if io is not None:
            io.shape[:] = [rng.choice([-1, 0, 2**62, -(2**63), 2**63 - 1]) for _ in range(rng.randint(1, 4))]
        return "shape"

    def corrupt(self, rng: random.Random, data: bytes) -> bytes:
        r = rng.randrange(4)
        if r == 0:
            return data[: rng.randrange(len(data) + 1)]
        if r == 1:
            return rng.randbytes(rng.randint(1, 64))
        if r == 2 and data:
            b = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            return bytes(b)
        return b"\x0a\x02\xff\xfe" + data  # model_name holding invalid UTF-8

    def grpc_infer(self, rng: random.Random) -> GrpcCase:
        if rng.random() < 0.02 and self.limits.max_body_bytes <= 8 * 2**20:
            msg = pb.ModelInferRequest(model_name=rng.choice(self.ready).name)
            msg.raw_input_contents.append(bytes(self.limits.max_body_bytes + 1))
            return GrpcCase("infer.over_max_message", "ModelInfer", [msg.SerializeToString()])
        data, label, unavailable = self.infer_message(rng)
        return GrpcCase("infer." + label, "ModelInfer", [data], unavailable)

    def grpc_stream(self, rng: random.Random) -> GrpcCase:
        messages = [self.infer_message(rng) for _ in range(rng.randint(1, 4))]
        return GrpcCase(
            "stream." + "|".join(m[1] for m in messages),
            "ModelStreamInfer",
            [m[0] for m in messages],
            any(m[2] for m in messages),
        )

    def grpc_other(self, rng: random.Random) -> GrpcCase:
        name, version = odd_name(rng, self.models), odd_version(rng) if rng.random() < 0.5 else ""
        rpc, msg = rng.choice(
            [
                ("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)),
                ("ModelReady", pb.ModelReadyRequest(name=name, version=version)),
                ("ModelConfig", pb.ModelConfigRequest(name=name, version=version)),
                ("ModelStatistics", pb.ModelStatisticsRequest(name=name, version=version)),
                ("ServerReady", pb.ServerReadyRequest()),
                ("ServerMetadata", pb.ServerMetadataRequest()),
                ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name=name, key="k", byte_size=8)),
                ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(name=name)),
                ("TraceSetting", pb.TraceSettingRequest(model_name=name)),
                ("LogSettings", pb.LogSettingsRequest()),
            ]
        )
        data = msg.SerializeToString()
        if rng.random() < 0.2:
            data = self.corrupt(rng, data)
        return GrpcCase(f"other.{rpc}", rpc, [data], unavailable_ok=True)

    def grpc_repository(self, rng: random.Random) -> GrpcCase:
        rpc = rng.choice(["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"])
        repo_name = rng.choice(["", "", "", "other"])
        if rpc == "RepositoryIndex":
            msg: Any = pb.RepositoryIndexRequest(repository_name=repo_name, ready=rng.random() < 0.5)
        else:
            name = odd_name(rng, self.models)
            if self.remote and name in self.served:
                name += "_not_served"
            cls = pb.RepositoryModelLoadRequest if rpc == "RepositoryModelLoad" else pb.RepositoryModelUnloadRequest
            msg = cls(repository_name=repo_name, model_name=name)
            for _ in range(rng.randint(0, 2)):
                p = msg.parameters[rng.choice(["config", "file:1/model.onnx", "unload_dependents", "x"])]
                which = rng.randrange(5)
                if which == 0:
                    p.bool_param = True
                elif which == 1:
                    p.int64_param = -1
                elif which == 2:
                    p.string_param = rng.choice(["{", "{}", "", "x"])
                elif which == 3:
                    p.bytes_param = rng.randbytes(8)
                else:
                    p.Clear()
        data = msg.SerializeToString()
        if rng.random() < 0.15:
            data = self.corrupt(rng, data)
        return GrpcCase(f"repository.{rpc}", rpc, [data], unavailable_ok=True)
