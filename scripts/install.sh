#!/usr/bin/env bash
# Install serve_app, editable, into a virtualenv of its own: `bash scripts/install.sh [EXTRA...]`, e.g.
# `examples` or `test`.  A system Python marked externally managed (Debian 12, Ubuntu 24.04) refuses
# packages outside a virtualenv, so the script makes one ($VENV, by default .venv) with `python3 -m venv`.
# With the `test` or `torch` extra, PyTorch's CPU build is installed first, from $TORCH_INDEX_URL (PyTorch's
# CPU wheel index unless set; empty: pip's own indexes), so that pip doesn't pull the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_VERSION=2.13.0  # the torch extra's pin in pyproject.toml
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
extras=$(IFS=,; echo "$*")
if [[ ",$extras," == *,test,* || ",$extras," == *,torch,* ]]; then
    # torch alone from that index; its dependencies come with the package below, from pip's own indexes
    "${pip[@]}" --no-deps ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
fi
"${pip[@]}" -e ".${extras:+[$extras]}"
