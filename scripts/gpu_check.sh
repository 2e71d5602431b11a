#!/usr/bin/env bash
# The GPU check in one command: unpack what travels (.gpu/site-cp312.tar.xz, from scripts/gpu_pack.py), say
# what the machine has, run tests/gpu (serve_app on Ray, and the local server), scripts/bench_gpu (on Ray),
# scripts/bench_cores (throughput against gateways), and write the logs and a summary to OUT.
#   scripts/gpu_check.sh [--dry-run] [OUT]     (OUT: the argument, else $OUT, else ./gpu-check-out)
# PYTHON names the interpreter (default python3); STEPS the steps to run (default "tests bench cores").
# Triton's rows need tritonserver, which travels in a second run of its own: scripts/gpu_triton.sh.
# --dry-run: on a machine without CUDA, run the same steps on the CPU (a pretend GPU for Ray, small
# models, short windows) and print what would run on the GPU machine.
# Each step has its own time limit (1 + 4 + 3 + 4 minutes), so the whole check ends within 13 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
out="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"  # the interpreter with PyTorch
steps="${STEPS:-tests bench cores}"
site="${SERVE_APP_GPU_SITE:-/tmp/serve_app_gpu_site}"
archive=.gpu/site-cp312.tar.xz
dry_flag=()
if [ "$dry" = 1 ]; then
    dry_flag=(--dry-run)
    export SERVE_APP_GPU_DRY_RUN=1
    unset CUDA_VISIBLE_DEVICES  # Ray's pretend GPU must not be hidden (a caller's "" would refuse it)
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "dry run: on the GPU machine this runs, from the repository's root:"
    echo "  unpack $archive into $site && export PYTHONPATH=$site:\$PWD PATH=$site/bin:\$PATH"
    echo "  python3 -m scripts.gpu_kit preflight"
    echo "  python3 -m pytest tests/gpu (CUDA: a GPU nvidia-smi lists that PyTorch can't use fails the check)"
    echo "  python3 -m scripts.bench_gpu (serve_app on Ray: TorchScript and torch in a Python model on cuda:0)"
    echo "  python3 -m scripts.bench_cores (--gateway-replicas 1, 2, 4, 8; the load generator on cores of its own)"
    if [ -f "$archive" ]; then
        "$py" -m scripts.gpu_kit wheels
    else
        echo "no $archive here: python -m scripts.gpu_pack site builds it"
    fi
    echo "dry run: the same steps on the CPU now"
else
    if [ ! -f "$archive" ]; then
        echo "error: no $archive (python -m scripts.gpu_pack site, and carry it)" | tee "$out/summary.txt"
        exit 1
    fi
    if [ ! -f "$site/.unpacked" ] || [ "$archive" -nt "$site/.unpacked" ]; then
        rm -rf "$site" && mkdir -p "$site"
        t0=$(date +%s)
        "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
            "$archive" "$site" || { echo "error: unpacking $archive failed" | tee "$out/summary.txt"; exit 1; }
        touch "$site/.unpacked"
        echo "unpacked $archive in $(( $(date +%s) - t0 ))s"
    fi
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
fi

rc=0
step() {  # name seconds command... (a dry run shares two slow cores with CI: no step limit under 10 minutes)
    local name=$1 limit=$2; shift 2
    if [ "$dry" = 1 ] && [ "$limit" -lt 600 ]; then limit=600; fi
    echo "+ $name"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1 || rc=1
    tail -n "${TAIL:-14}" "$out/$name.log"
}
step preflight 60 "$py" -m scripts.gpu_kit preflight "${dry_flag[@]}"
if [ "$rc" = 0 ]; then
    case " $steps " in *" tests "*)
        SERVE_APP_GPU_LOGS="$out" step pytest 240 "$py" -m pytest tests/gpu -q -rA -p no:cacheprovider \
            -W ignore::pytest.PytestConfigWarning ;;
    esac
    case " $steps " in *" bench "*)
        step bench 180 "$py" -m scripts.bench_gpu "${dry_flag[@]}" --out "$out/bench.json" --log-dir "$out" \
            --profile-dir "$out" ;;
    esac
    case " $steps " in *" cores "*)
        step cores 240 "$py" -m scripts.bench_cores "${dry_flag[@]}" --out "$out/cores.json" --log-dir "$out" ;;
    esac
fi
echo "+ summary ($out/summary.txt)"
"$py" -m scripts.gpu_kit summary "$out"
echo "gpu check exit $rc"
exit "$rc"
