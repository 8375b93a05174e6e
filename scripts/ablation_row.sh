#!/usr/bin/env bash
# One row of a validation-only ablation: prepare, train with the given Hydra overrides, average the
# last step checkpoints, and score best.pt and the average on valid (never on test).
#   ROW=tiny bash scripts/ablation_row.sh experiment=multi30k_cpu model=transformer_tiny
# Environment: ROW (run dir outputs/ablation/ROW), AVERAGE_LAST (default 5). Pin and cap it from
# outside, e.g. `taskset -c 1 env OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
RUN_DIR=outputs/ablation/${ROW:?set ROW to the row name}
python scripts/prepare_data.py "$@" hydra.run.dir="$RUN_DIR/prepare"
python scripts/train.py "$@" hydra.run.dir="$RUN_DIR" trainer.progress=false
python scripts/average_checkpoints.py run_dir="$RUN_DIR" last="${AVERAGE_LAST:-5}"
python scripts/select_final.py run_dir="$RUN_DIR" output=selected.pt
