#!/usr/bin/env bash
# Download the wheels the GPU check installs there (scripts/gpu_wheels.txt) into .whl/, for the GPU
# machine's CPython 3.12 on x86-64 Linux, and check that the set is complete and small enough to travel.
#   scripts/gpu_wheels.sh [DIR]    (default .whl, ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.whl}"
mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
grep -v '^#' scripts/gpu_wheels.txt | grep . >"$dir/.requirements"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${platforms[@]}" -d "$dir" -r "$dir/.requirements"
rm -f "$dir/.requirements"
# A wheel left from an older list would be a second version of its package: keep only the listed ones.
python3 - "$dir" <<'PY'
import pathlib, sys
from packaging.utils import canonicalize_name
listed = {canonicalize_name(l.split("==")[0]): l.split("==")[1].strip()
          for l in pathlib.Path("scripts/gpu_wheels.txt").read_text().splitlines() if l and not l.startswith("#")}
for w in pathlib.Path(sys.argv[1]).glob("*.whl"):
    name, version = w.name.split("-")[:2]
    if listed.get(canonicalize_name(name)) != version:
        print(f"removing {w.name}: not in scripts/gpu_wheels.txt")
        w.unlink()
PY
PYTHONPATH=. python3 -m scripts.gpu_kit wheels "$dir"
