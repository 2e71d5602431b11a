"""How Python models are deployed: a process of their own by default, their requirements in its runtime env."""

from __future__ import annotations

import pathlib

from serve_app.backends.python.environment import pip_requirements
from serve_app.config import parse_config
from serve_app.config.hosting import dedicated_process
from serve_app.placement import ClusterGpus, plan_replicas
from serve_app.rayserve.model_apps import REPLICA_ENV, replica_options
from serve_app.settings import ServerSettings

PYTHON = 'name: "m" backend: "python" input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]'


def test_python_models_get_a_process_of_their_own_unless_they_say_otherwise() -> None:
    assert dedicated_process(parse_config(PYTHON, model="m", path="p"))
    shared = PYTHON + ' parameters { key: "dedicated_process" value: { string_value: "false" } }'
    assert not dedicated_process(parse_config(shared, model="m", path="p"))
    assert not dedicated_process(parse_config('name: "m" platform: "onnxruntime_onnx"', model="m", path="p"))


def test_requirements_become_the_replicas_pip_runtime_env(tmp_path: pathlib.Path) -> None:
    (tmp_path / "requirements.txt").write_text("# pinned for the tokenizer\nregex==2024.11.6\n\nsix  # tiny\n")
    pip = pip_requirements(tmp_path)
    assert pip == ["regex==2024.11.6", "six"]
    (group,) = plan_replicas(parse_config(PYTHON, model="m", path="p"), ClusterGpus(total=0))
    options = replica_options(group, ServerSettings(model_repository=str(tmp_path)), pip=pip)
    env = options["ray_actor_options"]["runtime_env"]
    assert env["pip"] == pip and REPLICA_ENV.items() <= env["env_vars"].items()
    plain = replica_options(group, ServerSettings(model_repository=str(tmp_path)))
    assert "pip" not in plain["ray_actor_options"]["runtime_env"]
