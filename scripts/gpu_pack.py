#!/usr/bin/env python3
"""Pack what the GPU machine lacks into archives small enough to travel there.

    python -m scripts.gpu_pack site   [--python-version 3.12] [--out .gpu]   # serve_app's and Ray's packages
    python -m scripts.gpu_pack triton [--out .gpu]                           # tritonserver, python backend

The GPU machine has no network, and one run carries at most 64 MiB with the working tree. Ray's wheel
alone is 76 MiB: most of it is a Java jar, the dashboard's web build and debug symbols, none of which a
server started with ``python -m serve_app`` uses. ``site`` installs every wheel of
``scripts/gpu_wheels.txt`` for the machine's CPython (``pip install --target --no-deps`` with that
platform's tags), drops those parts, strips the native binaries and writes one ``.tar.xz`` to unpack
and put first on ``PYTHONPATH``. ``triton`` does the same for the ``nvidia-pytriton`` wheel's
``tritonserver``, keeping its python backend for one CPython and the shared libraries they load, with
the protobuf runtime the benchmark's client needs, in an archive of its own that travels in a second run
(both together are over the limit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "scripts" / "gpu_wheels.txt"
OUT = ROOT / ".gpu"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64")  # fmt: skip
TRITON = "nvidia-pytriton==0.7.0"
# Ray's parts that `python -m serve_app` never loads: the Java worker, the dashboard's web build and its
# source maps, RLlib and Ray LLM (each imported only by name).
RAY_UNUSED = ("ray/jars", "ray/dashboard/client/build", "ray/rllib", "ray/llm")
# Native files whose symbol tables are most of their size (Ray ships them unstripped).
STRIP = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")


def requirements(path: Path = LIST) -> list[str]:
    """``name==version`` lines of the list (comments and blank lines dropped)."""
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return [ln for ln in lines if ln]


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    subprocess.run(cmd, check=True)


def _platform_args(python_version: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in PLATFORMS:
        args += ["--platform", p]
    return args


def download(reqs: list[str], cache: Path, python_version: str) -> list[Path]:
    """The wheels of ``reqs`` for that CPython on x86-64 Linux (kept in ``cache`` between builds)."""
    cache.mkdir(parents=True, exist_ok=True)
    _pip("download", "--no-deps", *_platform_args(python_version), "-d", str(cache), *reqs)
    wanted = {_key(r.split("==")[0]): r.split("==")[1] for r in reqs}
    wheels = [w for w in cache.glob("*.whl") if wanted.get(_key(w.name.split("-")[0])) == w.name.split("-")[1]]
    missing = set(wanted) - {_key(w.name.split("-")[0]) for w in wheels}
    if missing:
        raise SystemExit(f"no wheel downloaded for {sorted(missing)}")
    return sorted(wheels)


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def slim(site: Path) -> int:
    """Drop Ray's unused parts and strip its binaries; returns the bytes saved."""
    before = _size(site)
    for rel in RAY_UNUSED:
        shutil.rmtree(site / rel, ignore_errors=True)
    for m in site.glob("ray/dashboard/**/*.map"):
        m.unlink()
    strip = shutil.which("strip")
    if strip:
        for rel in STRIP:
            if (site / rel).exists():
                subprocess.run([strip, "--strip-unneeded", str(site / rel)], check=True)
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return before - _size(site)


def _size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())


def pack(src: Path, archive: Path) -> None:
    """``src``'s content as ``archive`` (.tar.xz): xz takes Ray's binaries to a third of their zip size."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".part")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for child in sorted(src.iterdir()):
            tar.add(child, arcname=child.name)
    tmp.replace(archive)


def build_site(python_version: str, out: Path) -> Path:
    reqs = requirements()
    wheels = download(reqs, out / "cache" / f"cp{python_version.replace('.', '')}", python_version)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        _pip("install", "--no-deps", "--no-compile", "--no-index", *_platform_args(python_version),
             "--target", str(site), *map(str, wheels))  # fmt: skip
        for script in (site / "bin").glob("*"):  # console scripts name this machine's interpreter; py-spy is a binary
            if script.name != "py-spy":
                script.unlink()
        saved = slim(site)
        archive = out / f"site-cp{python_version.replace('.', '')}.tar.xz"
        pack(site, archive)
        print(f"{len(wheels)} packages, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB of wheels; "
              f"installed {(_size(site)) / 2**20:.0f} MiB after {saved / 2**20:.0f} MiB dropped; "
              f"{archive.name} {archive.stat().st_size / 2**20:.1f} MiB")  # fmt: skip
    return archive


def needed(binary: Path) -> list[str]:
    """The shared libraries ``binary`` names (its ELF NEEDED entries)."""
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return [ln.split("[", 1)[1].split("]", 1)[0] for ln in out.splitlines() if "(NEEDED)" in ln]


def build_triton(python_version: str, out: Path) -> Path:
    """tritonserver, its python backend with the stub for ``python_version``, and the bundled libraries
    they load (the NEEDED closure inside the wheel's ``nvidia_pytriton.libs``)."""
    cache = out / "cache" / "triton"
    cache.mkdir(parents=True, exist_ok=True)
    _pip("download", "--no-deps", "--only-binary=:all:", "--platform", "manylinux_2_35_x86_64", "-d", str(cache),
         TRITON)  # fmt: skip
    wheel = next(cache.glob("nvidia_pytriton-*.whl"))
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "wheel", Path(tmp) / "triton"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(src)
        ts, libs = src / "pytriton" / "tritonserver", src / "nvidia_pytriton.libs"
        stub = ts / "python_backend_stubs" / python_version / "triton_python_backend_stub"
        py = ts / "backends" / "python"
        keep = {
            "bin/tritonserver": ts / "bin" / "tritonserver",
            "backends/python/libtriton_python.so": py / "libtriton_python.so",
            "backends/python/triton_python_backend_utils.py": py / "triton_python_backend_utils.py",
            "backends/python/triton_python_backend_stub": stub,
            "caches/local/libtritoncache_local.so": ts / "caches" / "local" / "libtritoncache_local.so",
        }
        todo = [p for p in keep.values() if p.suffix != ".py"]
        bundled: set[str] = set()
        while todo:
            for lib in needed(todo.pop()):
                if lib not in bundled and (libs / lib).exists():
                    bundled.add(lib)
                    todo.append(libs / lib)
        copies = [(path, dst / "tritonserver" / rel) for rel, path in keep.items()]
        copies += [(libs / lib, dst / "libs" / lib) for lib in sorted(bundled)]
        for path, target in copies:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o644 if target.suffix == ".py" else 0o755)  # zipfile drops the wheel's modes
        # The benchmark's client beside it: the protobuf runtime the generated code was built for.
        protobuf = next(r for r in requirements() if r.startswith("protobuf=="))
        _pip("install", "--no-deps", "--no-compile", *_platform_args(python_version), "--target", str(dst / "site"),
             protobuf)  # fmt: skip
        archive = out / "triton.tar.xz"
        pack(dst, archive)
        print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB; kept {len(keep)} files and "
              f"{len(bundled)} libraries, {_size(dst) / 2**20:.0f} MiB; {archive.name} "
              f"{archive.stat().st_size / 2**20:.1f} MiB")  # fmt: skip
    return archive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("site", "triton"))
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's CPython (major.minor)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    os.environ.setdefault("PIP_NO_INPUT", "1")
    build = build_site if args.what == "site" else build_triton
    build(args.python_version, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
