#!/usr/bin/env bash
# The main job: prepare data, train, average the last checkpoints, evaluate on the test set.
# Any arguments are Hydra overrides for training, e.g.
#   bash scripts/run.sh                           # default config: WMT14 en->de through Hugging Face datasets
#   bash scripts/run.sh experiment=multi30k_cpu   # offline: the shared Multi30k data, 40 minutes on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
RUN_DIR=${RUN_DIR:-outputs/run-$(date +%Y%m%d-%H%M%S)}
python scripts/prepare_data.py "$@" hydra.run.dir="$RUN_DIR/prepare"
python scripts/train.py "$@" hydra.run.dir="$RUN_DIR"
python scripts/average_checkpoints.py run_dir="$RUN_DIR"
python scripts/evaluate.py checkpoint="$RUN_DIR/checkpoints/averaged.pt" data.split=test eval.tb_dir="$RUN_DIR"
