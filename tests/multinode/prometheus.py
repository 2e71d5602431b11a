"""A real Prometheus server for the monitoring test: Debian's ``prometheus`` binary, run by PID.

The binary is the one on PATH (or named by ``SERVE_APP_PROMETHEUS``); where there is none and this
is a Debian-like system with ``apt-get``, Debian's package is downloaded (not installed: no service,
no user, nothing outside the cache) and unpacked into a cache directory, once per machine.  The
package's binary is a Go program that needs only the C library.  Where neither works the test is
skipped, saying why.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from typing import Any

CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "serve_app" / "prometheus"


def binary() -> tuple[str | None, str]:
    """(the path of a ``prometheus`` binary, or None, and why there is none)."""
    named = os.environ.get("SERVE_APP_PROMETHEUS") or shutil.which("prometheus")
    if named:
        return named, ""
    unpacked = CACHE / "usr" / "bin" / "prometheus"
    if unpacked.is_file():
        return str(unpacked), ""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return None, "no `prometheus` on PATH and no apt-get/dpkg to fetch Debian's package"
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(
            ["apt-get", "download", "prometheus"], cwd=tmp, capture_output=True, text=True, timeout=300
        )
        debs = list(pathlib.Path(tmp).glob("prometheus_*.deb"))
        if got.returncode != 0 or not debs:
            return None, f"`apt-get download prometheus` failed: {got.stderr.strip()[-300:]}"
        CACHE.mkdir(parents=True, exist_ok=True)
        unpack = subprocess.run(["dpkg", "-x", str(debs[0]), str(CACHE)], capture_output=True, text=True, timeout=120)
        if unpack.returncode != 0 or not unpacked.is_file():
            return None, f"unpacking Debian's prometheus package failed: {unpack.stderr.strip()[-300:]}"
    return str(unpacked), ""


def config(targets: list[str], interval_s: int) -> str:
    """One scrape job over every node's metrics port (JSON is YAML: no YAML writer needed)."""
    job = {"job_name": "serve_app", "scrape_interval": f"{interval_s}s", "static_configs": [{"targets": targets}]}
    return json.dumps({"global": {"scrape_interval": f"{interval_s}s"}, "scrape_configs": [job]})


class Prometheus:
    """A Prometheus server in this (the root) namespace, which reaches every node through the bridge."""

    def __init__(self, path: str, workdir: pathlib.Path, targets: list[str], port: int, interval_s: int = 1) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(config(targets, interval_s))
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "prometheus.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    path, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
                ],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on Prometheus's error)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as r:
            answer = json.loads(r.read())
        if answer.get("status") != "success":
            raise RuntimeError(f"{expr}: {answer}")
        return list(answer["data"]["result"])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
