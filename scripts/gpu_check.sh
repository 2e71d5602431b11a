#!/usr/bin/env bash
# The GPU check in one command: install the wheels that travel (.whl/, from scripts/gpu_wheels.sh), say
# what the machine has, run tests/gpu and scripts/bench_gpu, and write the logs and a summary to OUT.
#   scripts/gpu_check.sh [--dry-run] [OUT]     (OUT: the argument, else $OUT, else ./gpu-check-out)
# PYTHON names the interpreter (default python3).
# --dry-run: on a machine without CUDA, run the same steps on the CPU (tests/gpu on a CPU-sized model,
# the benchmark without figures) and print what would run on the GPU machine.
# Each step has its own time limit (1 + 4 + 3 minutes), so the whole check ends within about 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
out="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"  # the interpreter with PyTorch
site="${SERVE_APP_GPU_SITE:-/tmp/serve_app_gpu_site}"
install=("$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site")
dry_flag=()
if [ "$dry" = 1 ]; then
    dry_flag=(--dry-run)
    export SERVE_APP_GPU_DRY_RUN=1
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "dry run: on the GPU machine this runs, from the repository's root:"
    echo "  ${install[*]} .whl/*.whl && export PYTHONPATH=$site:\$PWD"
    echo "  python3 -m scripts.gpu_kit preflight"
    echo "  python3 -m pytest tests/gpu (CUDA: a GPU nvidia-smi lists that PyTorch can't use fails the check)"
    echo "  python3 -m scripts.bench_gpu (TorchScript on cuda:0, ~2 minutes)"
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$py" -m scripts.gpu_kit wheels .whl
    else
        echo "no .whl/ here: scripts/gpu_wheels.sh downloads what the GPU machine needs"
    fi
    echo "dry run: the same steps on the CPU now"
else
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "error: no wheels in .whl/ (run scripts/gpu_wheels.sh, and carry .whl)" | tee "$out/summary.txt"
        exit 1
    fi
    "${install[@]}" .whl/*.whl || { echo "error: installing .whl/ failed" | tee "$out/summary.txt"; exit 1; }
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

rc=0
echo "+ preflight"
timeout 60 "$py" -m scripts.gpu_kit preflight "${dry_flag[@]}" >"$out/preflight.log" 2>&1 || rc=1
cat "$out/preflight.log"
if [ "$rc" = 0 ]; then
    echo "+ tests/gpu"
    SERVE_APP_GPU_LOGS="$out" timeout 240 "$py" -m pytest tests/gpu -q -rA -p no:cacheprovider \
        -W ignore::pytest.PytestConfigWarning >"$out/pytest.log" 2>&1 || rc=1
    tail -n 3 "$out/pytest.log"
    echo "+ scripts/bench_gpu"
    timeout 180 "$py" -m scripts.bench_gpu "${dry_flag[@]}" --out "$out/bench.json" --log-dir "$out" \
        >"$out/bench.log" 2>&1 || rc=1
    tail -n 12 "$out/bench.log"
fi
echo "+ summary ($out/summary.txt)"
"$py" -m scripts.gpu_kit summary "$out"
echo "gpu check exit $rc"
exit "$rc"
