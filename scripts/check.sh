#!/usr/bin/env bash
# The project's checks, as CI runs them (.ci/run): install the test extra into the virtualenv
# (scripts/install.sh), then lint, the import contract, strict types, declared dependencies and the tests.
# Arguments go to pytest, e.g. `bash scripts/check.sh -m "not e2e"` for the fast suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

bash scripts/install.sh test
# shellcheck disable=SC1091
source "${VENV:-.venv}/bin/activate"
ruff check .
lint-imports
mypy
deptry .
python -m pytest -q "$@"
