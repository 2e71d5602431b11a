"""Fuzz the HTTP and gRPC front ends with malformed requests; every one must get a client-error answer.

``scripts/fuzz`` is the command line and ``tests/integration/test_fuzz.py`` runs a seeded share in CI.  What a
server serves (``discovery``) feeds seeded generators (``generator``: ``mutations`` shared by ``http_cases``,
``grpc_cases`` and ``parity``, encoded by ``wire``) of ``cases``, which ``runners`` send to ``targets`` and
judge by ``oracle``.  Needs the test extra (httpx, tritonclient, onnx).
"""

from tests.support.fuzz.cases import describe
from tests.support.fuzz.discovery import ModelInfo, TensorInfo, discover
from tests.support.fuzz.generator import PROTOCOLS, Generator
from tests.support.fuzz.runners import SERVICE, chunks, fuzz, grpc_unary, health, run_case
from tests.support.fuzz.targets import IN_PROCESS_LIMITS, Targets, build_fuzz_repository, in_process, remote
from tests.support.fuzz.wire import set_param

__all__ = [
    "IN_PROCESS_LIMITS",
    "PROTOCOLS",
    "SERVICE",
    "Generator",
    "ModelInfo",
    "Targets",
    "TensorInfo",
    "build_fuzz_repository",
    "chunks",
    "describe",
    "discover",
    "fuzz",
    "grpc_unary",
    "health",
    "in_process",
    "remote",
    "run_case",
    "set_param",
]
