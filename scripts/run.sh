#!/usr/bin/env bash
# The main job: prepare data, train, average the last checkpoints, choose the final model on the
# validation set (best.pt or the average), evaluate it on the test set: scripts/pipeline.py, one Hydra job.
# Any arguments are Hydra overrides for training. Environment: RUN_DIR (default outputs/run-DATE; with -m
# the sweep's folder, each job in a subfolder), AVERAGE_LAST (default 5) step checkpoints averaged, ALPHAS
# (e.g. "[0.6,1.0,2.0]") length penalties also tried on valid (default: the training config's
# final.alphas). E.g.
#   bash scripts/run.sh                           # default config: WMT14 en->de through Hugging Face datasets
#   bash scripts/run.sh experiment=multi30k_cpu   # Multi30k (fetched once, then offline), an hour on the CPU
#   bash scripts/run.sh experiment=multi30k_cpu trainer.init_from=outputs/m30k/checkpoints/final.pt \
#       optim.lr=1e-3 optim.warmup_steps=500   # fine-tune that model (docs/finetuning.md)
#   bash scripts/run.sh -m experiment=multi30k_cpu optim.lr=3e-3,5e-3   # a sweep: each job trained and tested
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
RUN_DIR=${RUN_DIR:-outputs/run-$(date +%Y%m%d-%H%M%S)}
where="hydra.run.dir=$RUN_DIR"
for arg in "$@"; do
    if [[ $arg == -m || $arg == --multirun || $arg == hparams_search=* ]]; then where="hydra.sweep.dir=$RUN_DIR"; fi
done
python scripts/pipeline.py "$@" "$where" pipeline.average_last="${AVERAGE_LAST:-5}" ${ALPHAS:+"pipeline.alphas=$ALPHAS"}
