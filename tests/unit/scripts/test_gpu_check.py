"""The GPU check's kit where there is no GPU: its dry run passes end to end, and the wheel set check finds
what would stop the install on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.bench_gpu import top_frames
from scripts.gpu_kit import listed, wheel_problems
from scripts.gpu_pack import slim
from tests.support.paths import ROOT


def test_the_dry_run_runs_the_check_on_the_cpu(tmp_path: Path) -> None:
    """The whole check as it runs on the GPU machine (serve_app on Ray with a pretend GPU, the local server,
    both benchmarks), on the CPU with small models and short windows."""
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "on the GPU machine this runs" in proc.stdout
    summary = (out / "summary.txt").read_text()
    assert "## tests/gpu" in summary and " passed" in summary and "failed" not in summary, summary
    assert "test_ray_gpu.py::test_a_killed_gpu_instance_comes_back" in summary, summary
    bench = json.loads((out / "bench.json").read_text())
    assert bench["dry_run"] and len(bench["runs"]) == 10
    # How many requests fit the short windows depends on the load: only that each run served on the CPU.
    assert all(not r["error"] and r["device"] == -1 for r in bench["runs"]), bench
    cores = json.loads((out / "cores.json").read_text())
    assert cores["dry_run"] and len(cores["rows"]) == 12 and not any(r["error"] for r in cores["rows"]), cores


def test_the_busiest_functions_of_a_profile() -> None:
    collapsed = "main (a.py:1);serve (b.py:2);decode (c.py:3) 30\nmain (a.py:1);serve (b.py:2) 10\n"
    text = top_frames(collapsed + "main (a.py:1);serve (b.py:2);decode (c.py:3) 60\n")
    assert text.splitlines() == ["100 samples", " 90.0%  decode (c.py:3)", " 10.0%  serve (b.py:2)"]


def test_the_wheels_a_list_names_are_picked_from_a_cache(tmp_path: Path) -> None:
    kept = wheel(tmp_path, "alpha", "1.0")
    wheel(tmp_path, "alpha", "0.9")
    wheel(tmp_path, "beta", "2.0")
    assert listed(tmp_path.glob("*.whl"), ["alpha==1.0"]) == [kept]


def test_ray_s_serve_extra_counts_and_what_the_server_never_imports_does_not(tmp_path: Path) -> None:
    ray = wheel(tmp_path, "ray", "2.60.0", "fastapi; extra == 'serve'", "gymnasium; extra == 'rllib'",
                "virtualenv; extra == 'serve'")  # fmt: skip
    problems = wheel_problems([ray], frozenset())
    assert problems == ["ray-2.60.0-py3-none-any.whl needs fastapi; extra == \"serve\": no wheel, and the GPU "
                        "machine does not have it"], problems  # fmt: skip


def test_the_packed_site_drops_what_the_server_never_loads(tmp_path: Path) -> None:
    for rel in ("ray/jars/ray_dist.jar", "ray/dashboard/client/build/index.html", "ray/rllib/__init__.py",
                "ray/dashboard/modules/x.js.map", "ray/serve/__init__.py", "ray/__pycache__/a.pyc"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * 100)
    assert slim(tmp_path) == 500
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["ray/serve/__init__.py"]


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
