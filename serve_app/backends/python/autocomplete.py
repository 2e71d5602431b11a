"""A Python model's ``auto_complete_config``, run the way Triton runs it: once, apart, before any instance.

Triton calls the static method in a throwaway stub process, so importing the
model's code never touches the server.  Here it runs in a short-lived child
interpreter (``python -m serve_app.backends.python.autocomplete``): the config
goes in as JSON on stdin, the completed config comes back on stdout, an
error as its text.  Models whose ``model.py`` doesn't mention the method skip
the child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from serve_app.config.json_format import config_from_json, config_to_json
from serve_app.errors import InternalError
from serve_app.protos import model_config_pb2 as mc

HOOK = "auto_complete_config"
TIMEOUT_S = 120.0
_ERROR_MARK = "serve_app-autocomplete-error:"


def complete_python_config(config: mc.ModelConfig, model: str, model_file: Path) -> None:
    """Let the model's ``auto_complete_config`` complete ``config`` (in place)."""
    if not model_file.is_file() or HOOK not in model_file.read_text(errors="replace"):
        return
    env = dict(os.environ)
    # The child imports serve_app the way this process does (an editable install or PYTHONPATH).
    env["PYTHONPATH"] = os.pathsep.join(p for p in [_package_root(), env.get("PYTHONPATH", "")] if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "serve_app.backends.python.autocomplete", str(model_file)],
            input=json.dumps(config_to_json(config)),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise InternalError(f"auto_complete_config of model '{model}' did not return within {TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        text = done.stdout
        message = text.split(_ERROR_MARK, 1)[1] if _ERROR_MARK in text else (done.stderr.strip() or text.strip())
        raise InternalError(message.strip())
    completed = config_from_json(done.stdout, model=model)
    config.CopyFrom(completed)


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[3])


def run_hook(model_file: Path, config_json: str) -> str:
    """In the child: import the model, call its hook, return the completed config as JSON."""
    from serve_app.backends.python.backend import MODEL_ERRORS, describe, install_utils_module, load_model_module
    from serve_app.backends.python.model_config import ModelConfig

    config = ModelConfig(config_json)
    name = config.as_dict().get("name", "")
    install_utils_module()
    try:
        module = load_model_module(model_file, "_triton_model_autocomplete")
        hook = getattr(module.TritonPythonModel, HOOK, None)
        if hook is None:
            return json.dumps(config.as_dict())
        returned = hook(config)
    except MODEL_ERRORS as exc:
        raise RuntimeError(describe(exc)) from None
    if not isinstance(returned, ModelConfig):
        raise RuntimeError(
            f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object."
        )
    return json.dumps(returned.as_dict())


def main() -> None:
    model_file = Path(sys.argv[1])
    answer, sys.stdout = sys.stdout, sys.stderr  # what the model prints must not mix with the answer
    try:
        out = run_hook(model_file, sys.stdin.read())
    except Exception as exc:
        answer.write(_ERROR_MARK + str(exc))
        sys.exit(1)
    answer.write(out)


if __name__ == "__main__":
    main()
