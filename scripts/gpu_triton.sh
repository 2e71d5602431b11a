#!/usr/bin/env bash
# Triton's rows beside serve_app's, on the GPU machine, in the run after scripts/gpu_check.sh (the machine
# still warm: serve_app's packages stay unpacked in /tmp): unpack .gpu/triton.tar.xz (tritonserver, its
# python backend, the libraries they load; from scripts/gpu_pack.py triton), then Triton's rows of
# scripts/bench_gpu (the same model.py running torch on cuda:0) and of scripts/bench_cores (the
# yardstick's Python models on the same cores), and the summary of both runs.
#   scripts/gpu_triton.sh [OUT]     (OUT: the argument, else $OUT, else ./gpu-check-out)
# Each step has its own time limit (1 + 2 + 2 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
site="${SERVE_APP_GPU_SITE:-/tmp/serve_app_gpu_site}"
triton="${SERVE_APP_TRITON_DIR:-/tmp/serve_app_triton}"
archive=.gpu/triton.tar.xz
if [ ! -f "$archive" ]; then
    echo "error: no $archive (python -m scripts.gpu_pack triton, and carry it)" | tee -a "$out/summary.txt"
    exit 1
fi
rm -rf "$triton" && mkdir -p "$triton"
"$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$archive" "$triton" \
    || { echo "error: unpacking $archive failed" | tee -a "$out/summary.txt"; exit 1; }
if [ -f "$site/.unpacked" ]; then
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else  # a fresh machine: the client needs only numpy, grpcio (the image's) and protobuf (in the archive)
    echo "note: $site is gone (a fresh machine): Triton's rows only, with the image's packages"
    export PYTHONPATH="$triton/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
rc=0
step() {  # name seconds command...
    local name=$1 limit=$2; shift 2
    echo "+ $name"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1 || rc=1
    tail -n "${TAIL:-14}" "$out/$name.log"
}
# every library tritonserver and the python backend load resolves (the stub's libpython is the machine's)
step triton-libs 60 bash -c "export LD_LIBRARY_PATH='$triton/libs'; for f in '$triton'/tritonserver/bin/tritonserver \
    '$triton'/tritonserver/backends/python/*.so; do ldd \"\$f\"; done | sort -u | grep -v '=> /' ; ! ldd \
    '$triton/tritonserver/bin/tritonserver' | grep -q 'not found'"
step bench-triton 120 "$py" -m scripts.bench_gpu --triton "$triton" --only triton --out "$out/bench-triton.json" \
    --log-dir "$out"
step cores-triton 120 "$py" -m scripts.bench_cores --triton "$triton" --only triton --out "$out/cores-triton.json" \
    --log-dir "$out"
"$py" -m scripts.gpu_kit summary "$out"
echo "gpu triton exit $rc"
exit "$rc"
