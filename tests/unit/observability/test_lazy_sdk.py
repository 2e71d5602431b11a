"""The OpenTelemetry SDK is loaded by the first traced request, not by importing the server's code.

Every scheduler, instance and front end asks for the current span, so an import of the SDK at the
top of the spans module would load it (about 85 modules) into every process.  Each check runs in a
fresh interpreter: this one has imported far too much to tell.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import ROOT

# Ray loads OpenTelemetry itself; the model backends take seconds to import and are checked by the contract.
SKIPPED = ("serve_app.rayserve", "serve_app.backends", "serve_app.__main__", "serve_app.observability.otel_export")

_PROBE = """
import importlib, json, pkgutil, sys
import serve_app
first = None
for info in pkgutil.walk_packages(serve_app.__path__, "serve_app."):
    if info.name.startswith(SKIPPED) or first:
        continue
    importlib.import_module(info.name)
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] == "opentelemetry")
    if loaded:
        first = [info.name, loaded[:5]]
print(json.dumps({"first": first, "imported": len([m for m in sys.modules if m.startswith("serve_app.")])}))
"""

_TRACED = """
import sys
from serve_app.observability import spans
from serve_app.observability.trace_settings import ExportConfig
before = any(m.startswith("opentelemetry") for m in sys.modules)
span = spans.start_request(ExportConfig(url="127.0.0.1:9/v1/traces", bsp_schedule_delay=3600000), True, None, 0)
print(before, any(m.startswith("opentelemetry") for m in sys.modules), len(span.link().traceparent))
"""


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_importing_the_server_loads_no_opentelemetry_module() -> None:
    answer = json.loads(_run(f"SKIPPED = {SKIPPED!r}\n" + _PROBE))
    assert answer["first"] is None, f"{answer['first'][0]} loads {answer['first'][1]}"
    assert answer["imported"] > 100  # the walk did import the server's modules


def test_the_first_traced_request_loads_it() -> None:
    assert _run(_TRACED) == "False True 55"  # a W3C traceparent: 00-<32 hex>-<16 hex>-01
