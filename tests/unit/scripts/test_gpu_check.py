"""The GPU check's kit where there is no GPU: its dry run passes end to end, and the wheel set check finds
what would stop the install on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.gpu_kit import wheel_problems
from tests.support.paths import ROOT


def test_the_dry_run_runs_the_check_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "on the GPU machine this runs" in proc.stdout
    summary = (out / "summary.txt").read_text()
    assert "## tests/gpu" in summary and " passed" in summary and "failed" not in summary, summary
    bench = json.loads((out / "bench.json").read_text())
    assert bench["dry_run"] and len(bench["runs"]) == 4
    # How many requests fit the short windows depends on the load: only that each run served on the CPU.
    assert all(not r["error"] and r["device"] == -1 for r in bench["runs"]), bench


def wheel(directory: Path, name: str, version: str, *requires: str) -> Path:
    path = directory / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_a_complete_set_has_no_problem(tmp_path: Path) -> None:
    wheels = [
        wheel(tmp_path, "alpha", "1.0", "beta>=2", "numpy", "gamma; python_version < '3.10'", "delta; extra == 'x'"),
        wheel(tmp_path, "beta", "2.1"),
    ]
    assert wheel_problems(wheels, frozenset({"numpy"})) == []


def test_missing_mismatched_and_doubled_packages_are_problems(tmp_path: Path) -> None:
    wheels = [
        wheel(tmp_path, "alpha", "1.0", "beta>=3", "missing"),
        wheel(tmp_path, "beta", "2.1"),
        wheel(tmp_path, "beta", "2.2"),
    ]
    problems = wheel_problems(wheels, frozenset())
    assert any("two versions of beta" in p for p in problems), problems
    assert any("needs beta>=3" in p for p in problems), problems
    assert any("needs missing" in p for p in problems), problems
