#!/usr/bin/env bash
# Create .venv (once) and install the project into it, with its dev tools.
# torch is declared as torch>=2.4; when it is missing, TORCH_SPEC (default torch==2.13.0) is installed
# first, from TORCH_INDEX: by default PyTorch's CPU wheel index on a machine without an NVIDIA GPU (no
# nvidia-smi), so pip never pulls the multi-GB CUDA build there, and the default index (PyPI's CUDA
# build on Linux) where nvidia-smi is found. TORCH_INDEX= (empty) means the default index; where the
# CPU index cannot be reached, the default index is used and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CPU_INDEX=https://download.pytorch.org/whl/cpu
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  spec=${TORCH_SPEC:-torch==2.13.0}
  if [ -z "${TORCH_INDEX+set}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then TORCH_INDEX=""; else TORCH_INDEX=$CPU_INDEX; fi
  fi
  index=()
  if [ -n "$TORCH_INDEX" ]; then
    if python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=20)" \
      "$TORCH_INDEX" 2>/dev/null; then
      index=(--index-url "$TORCH_INDEX")
    else
      echo "setup.sh: $TORCH_INDEX cannot be reached: installing $spec from the default index instead" >&2
    fi
  fi
  pip install --quiet --disable-pip-version-check ${index[@]+"${index[@]}"} "$spec"
fi
if ! python -c "import nmt, pytest, ruff" 2>/dev/null || [ pyproject.toml -nt .venv/.installed ]; then
  pip install --quiet --disable-pip-version-check -e ".[dev]"
  touch .venv/.installed
fi
