#!/usr/bin/env bash
# The test suite on the lowest torch that pyproject.toml declares (torch>=2.4), in its own .venv-min,
# so that the declared minimum stays true. PyPI's torch 2.4 for Linux is a CUDA build: the first run
# downloads about 3 GB. Extra arguments go to pytest.
#   bash scripts/test_min_torch.sh            # MIN_TORCH=2.4.1 by default
set -euo pipefail
cd "$(dirname "$0")/.."
MIN_TORCH=${MIN_TORCH:-2.4.1}
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-min/bin/python ]; then
  "$PYTHON" -m venv .venv-min
fi
. .venv-min/bin/activate
pip install --quiet --disable-pip-version-check "torch==$MIN_TORCH" -e ".[dev]"
python -c "import torch; print('torch', torch.__version__)"
python -m pytest "$@"
