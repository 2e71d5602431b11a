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
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) apart, in python3-venv: make the virtualenv
        # without pip, then fetch pip's wheel from PyPI and let it install itself (pip's documented bootstrap).
        echo "python3 -m venv has no pip to install here (no python3-venv): installing pip from PyPI" >&2
        rm -rf "$VENV"
        python3 -m venv --without-pip "$VENV"
        wheel_dir=$(mktemp -d)
        "$VENV/bin/python" - "$wheel_dir" <<'PY'
import json, sys, urllib.parse, urllib.request
api = "https://pypi.org/pypi/pip/json"
release = json.load(urllib.request.urlopen(api, timeout=60))
wheel = next(u for u in release["urls"] if u["packagetype"] == "bdist_wheel")
urllib.request.urlretrieve(urllib.parse.urljoin(api, wheel["url"]), f"{sys.argv[1]}/{wheel['filename']}")
PY
        whl=("$wheel_dir"/pip-*.whl)
        "$VENV/bin/python" "${whl[0]}/pip" install --quiet --disable-pip-version-check --no-index "${whl[0]}"
        rm -rf "$wheel_dir"
    fi
fi
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
extras=$(IFS=,; echo "$*")
if [[ ",$extras," == *,test,* || ",$extras," == *,torch,* ]]; then
    # torch alone from that index; its dependencies come with the package below, from pip's own indexes
    "${pip[@]}" --no-deps ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
fi
"${pip[@]}" -e ".${extras:+[$extras]}"
