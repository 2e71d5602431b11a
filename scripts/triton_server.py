"""Start the real ``tritonserver`` unpacked from ``.gpu/triton.tar.xz`` (``scripts/gpu_pack.py triton``), beside
serve_app on the same machine, for the side-by-side benchmarks.

Its python backend's stub embeds the machine's ``libpython3.<minor>`` and imports the model's packages
(numpy, torch) from this interpreter's ``site-packages``: both are passed through the environment
(``SERVE_APP_TRITON_PYTHONPATH``, when set, goes first).
"""

from __future__ import annotations

import ctypes.util
import os
import pathlib
import signal
import site
import subprocess
import sys
import sysconfig
import time
import urllib.request

READY_S = 180.0
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def python_for_stub() -> tuple[str, str]:
    """(a directory to add to the loader's path for ``libpython3.<minor>``, "" where the system's loader finds
    it already; this Python's import path) for Triton's stub. The system's library comes first: the stub
    was built against a distribution's Python (with pyenv's own build first it answers wrong sizes)."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    paths = [*site.getsitepackages(), *[p for p in sys.path if p.endswith("site-packages")]]
    path = os.pathsep.join(dict.fromkeys(paths))
    if ctypes.util.find_library(f"python{minor}"):
        return "", path
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if sysconfig.get_config_var("Py_ENABLE_SHARED") != 1 or not pathlib.Path(libdir).is_dir():
        raise SystemExit(f"no libpython{minor}: {sys.executable} is not a shared-library build, and the system "
                         "has none; Triton's python backend stub can't load")  # fmt: skip
    return libdir, path


def start_triton(
    triton: pathlib.Path, repo: pathlib.Path, ports: tuple[int, int, int], log: pathlib.Path
) -> subprocess.Popen[bytes]:
    """``tritonserver`` on ``repo`` (HTTP, gRPC, metrics ports), once ``/v2/health/ready`` answers."""
    libdir, paths = python_for_stub()
    env = {**os.environ}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(triton / "libs"), libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("SERVE_APP_TRITON_PYTHONPATH", ""), paths) if p)
    # The embedded Python finds its standard library from the first python3 on PATH: a virtualenv's or pyenv's
    # there, beside the system's libpython, answered wrong sizes. Only the Python whose library it loads.
    env["PATH"] = os.pathsep.join([*([f"{sys.base_prefix}/bin"] if libdir else []), *SYSTEM_PATH])
    env.pop("VIRTUAL_ENV", None)
    http, grpc, metrics = ports
    cmd = [str(triton / "tritonserver" / "bin" / "tritonserver"), "--model-repository", str(repo),
           "--backend-directory", str(triton / "tritonserver" / "backends"), "--http-port", str(http),
           "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log-verbose", "0"]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tritonserver exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return proc
        except Exception:
            pass
        time.sleep(0.5)
    stop_triton(proc)
    raise SystemExit(f"tritonserver was not ready in {READY_S:g}s:\n{log.read_text(errors='replace')[-3000:]}")


def stop_triton(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
