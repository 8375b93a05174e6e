#!/usr/bin/env bash
# The main job: prepare data, train, average the last checkpoints, choose the final model on the
# validation set (best.pt or the average), evaluate it on the test set.
# Any arguments are Hydra overrides for training. Environment: RUN_DIR (default outputs/run-DATE),
# AVERAGE_LAST (default 5) step checkpoints averaged, ALPHAS (e.g. "[0.6,1.0,2.0]") length
# penalties also tried on valid (default: the training config's final.alphas). E.g.
#   bash scripts/run.sh                           # default config: WMT14 en->de through Hugging Face datasets
#   bash scripts/run.sh experiment=multi30k_cpu   # Multi30k (fetched once, then offline), an hour on the CPU
#   bash scripts/run.sh experiment=multi30k_cpu trainer.init_from=outputs/m30k/checkpoints/final.pt \
#       optim.lr=1e-3 optim.warmup_steps=500   # fine-tune that model (docs/finetuning.md)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
RUN_DIR=${RUN_DIR:-outputs/run-$(date +%Y%m%d-%H%M%S)}
# A re-run in the same RUN_DIR resumes: its training prepares what it needs (a fine-tune's tokenizer
# comes from the run's own checkpoint, the parent may be gone).
if [ ! -f "$RUN_DIR/checkpoints/last.pt" ]; then
    python scripts/prepare_data.py "$@" hydra.run.dir="$RUN_DIR/prepare"
fi
python scripts/train.py "$@" hydra.run.dir="$RUN_DIR"
python scripts/average_checkpoints.py run_dir="$RUN_DIR" last="${AVERAGE_LAST:-5}"
python scripts/select_final.py run_dir="$RUN_DIR" ${ALPHAS:+"alphas=$ALPHAS"}
python scripts/evaluate.py checkpoint="$RUN_DIR/checkpoints/final.pt" data.split=test eval.tb_dir="$RUN_DIR"
