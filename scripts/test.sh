#!/usr/bin/env bash
# The test command: set up .venv if needed, lint, run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
lint-imports
python -m pytest "$@"
