#!/usr/bin/env bash
# Create .venv (once) and install the project into it, with its dev tools.
# torch is declared as torch>=2.4; when it is missing, TORCH_SPEC (default torch==2.13.0, a CPU build on
# our machines) is installed first, so pip never resolves the bare requirement to a multi-GB CUDA wheel.
# GPU users: install your own torch build into .venv first (or set TORCH_SPEC), then run this.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  pip install --quiet --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
fi
if ! python -c "import nmt, pytest, ruff" 2>/dev/null || [ pyproject.toml -nt .venv/.installed ]; then
  pip install --quiet --disable-pip-version-check -e ".[dev]"
  touch .venv/.installed
fi
