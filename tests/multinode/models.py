"""The multi-node tests' model repository: few, small models, each placed a known way.

=============  =====================================  ============================================
model          instance_group                         where its instances run
=============  =====================================  ============================================
add_sub        KIND_CPU count 2                       2 in each gateway (one gateway per node)
where_cpu      Python, KIND_CPU count 1               1 in each gateway; answers its node's address
where_gpu      Python, KIND_GPU count 1 gpus [ 1 ]    host-gpu1: one host on each node with GPU 1
seq_accum      direct, KIND_CPU count 1, backup on    1 in each gateway; running sum (implicit state)
seq_oldest     oldest, KIND_CPU count 1               1 in each gateway; running sum, CORRID echo
py_add_sub     Python, KIND_CPU count 1               one replica in the cluster
py_bls         Python, KIND_GPU count 1 gpus [ 0 ]    one replica on each GPU node; runs py_add_sub (BLS)
late           KIND_CPU count 1                       not loaded at start (model control tests)
lazy_py_<i>    Python, KIND_CPU count 1               loaded on its first request, on one node; answers
                                                      its node's address
lazy_add_<i>   KIND_CPU count 1                       loaded on its first request, in one node's gateway
=============  =====================================  ============================================

The server loads on demand with a budget of ``BUDGET`` models per node: the
``LOADED`` models count on every node, which leaves each node
``ON_DEMAND_SLOTS`` models loaded on demand.
"""

from __future__ import annotations

import pathlib
import textwrap

from scripts import example_models, python_models
from tests.e2e import sequence_models

LOADED = ("add_sub", "where_cpu", "where_gpu", "seq_accum", "seq_oldest", "py_add_sub", "py_bls")
ON_DEMAND_SLOTS = 2
BUDGET = len(LOADED) + ON_DEMAND_SLOTS
LAZY_PY = tuple(f"lazy_py_{i}" for i in range(5))
LAZY_ADD = tuple(f"lazy_add_{i}" for i in range(5))

# The address this process has on the node's network (the namespace's eth0): the one it uses to reach the head.
WHERE_PY = """
import json
import socket

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        head = json.loads(args["model_config"])["parameters"]["head"]["string_value"]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((head, 9))
            self.address = s.getsockname()[0]

    def execute(self, requests):
        out = np.array([self.address.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("NODE", out)]) for _ in requests]
"""


def where(repo: pathlib.Path, name: str, group: str, head: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(textwrap.dedent(WHERE_PY).lstrip())
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "NODE" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        f"instance_group [ {group} ]\n"
        f'parameters {{ key: "head" value: {{ string_value: "{head}" }} }}\n'
    )


def build(repo: pathlib.Path, head: str) -> None:
    example_models.add_sub(repo, extra_config="instance_group [ { kind: KIND_CPU count: 2 } ]\n")
    where(repo, "where_cpu", "{ kind: KIND_CPU count: 1 }", head)
    where(repo, "where_gpu", "{ kind: KIND_GPU count: 1 gpus: [ 1 ] }", head)
    sequence_models.accumulator(repo, "seq_accum", max_batch_size=2, instances=1, idle_us=60_000_000)
    sequence_models.oldest_accumulator(repo)
    python_models.add_sub(repo)
    bls = python_models.bls(repo)
    with open(bls / "config.pbtxt", "a") as config:
        config.write("instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n")
    example_models.add_sub(repo, name="late", extra_config="instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    for name in LAZY_PY:
        where(repo, name, "{ kind: KIND_CPU count: 1 }", head)
    for name in LAZY_ADD:
        example_models.add_sub(repo, name=name, extra_config="instance_group [ { kind: KIND_CPU count: 1 } ]\n")
