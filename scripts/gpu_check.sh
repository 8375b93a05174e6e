#!/usr/bin/env bash
# The one-command GPU check, for anyone with a CUDA GPU (not part of CI; about 5 minutes on an H100/H200):
# the CUDA-only tests, 300 bf16 and 300 fp16 training steps of transformer_base (the shared WMT14 text
# when ../shared/data is there, else the toy task) with the loss falling, greedy and beam decoding,
# and the benchmark table, ending in a one-screen summary. Without a GPU it skips in one line.
#   bash scripts/gpu_check.sh                 # results under outputs/gpu_check (GPU_CHECK_DIR)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
. .venv/bin/activate
if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: skipped: no CUDA GPU here (torch.cuda.is_available() is False)"
  exit 0
fi
OUT=${GPU_CHECK_DIR:-outputs/gpu_check}
mkdir -p "$OUT"
if [ -d ../shared/data/wmt14-de-en ]; then
  DATA=(data=local data.dir=../shared/data/wmt14-de-en "data.extra_train=[extra-newstest2008-2012]")
else
  DATA=(experiment=toy)
fi
SHORT=(model=transformer_base trainer.max_steps=300 trainer.valid_every=300 trainer.log_every=50
       trainer.valid_bleu_sentences=200 trainer.progress=false)
failed=()
check() {  # check NAME COMMAND...: run, keep the log, note a failure and go on
  local name=$1; shift
  printf '%-12s ' "$name"
  if "$@" > "$OUT/$name.log" 2>&1; then echo ok; else echo "FAILED (see $OUT/$name.log)"; failed+=("$name"); fi
}
check cuda_tests python -m pytest -q -m cuda -p no:cacheprovider
for precision in bf16 fp16; do
  check "train_$precision" python scripts/train.py "${DATA[@]}" "${SHORT[@]}" trainer.precision=$precision \
    hydra.run.dir="$OUT/train_$precision"
done
for beam in 1 4; do
  check "decode_beam$beam" python scripts/evaluate.py checkpoint="$OUT/train_bf16/checkpoints/last.pt" \
    data.split=valid decoding.beam_size=$beam eval.out="$OUT/decode_beam$beam.hyp"
done
check benchmark python scripts/benchmark.py "${DATA[@]}" model=transformer_base trainer.precision=bf16 \
  "bench.precisions=[bf16,fp16]" bench.decode_sentences=500 hydra.run.dir="$OUT/benchmark"

echo; echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
for precision in bf16 fp16; do
  log="$OUT/train_$precision/train.log"
  [ -f "$log" ] || continue
  # "step N: loss X lr Y tok_s Z" lines: the first and the last loss, and the last throughput
  summary=$(grep -o 'step [0-9]*: loss [0-9.]* lr [^ ]* tok_s [0-9]*' "$log" | awk '
    NR == 1 {first = $4} {last = $4; tok = $8}
    END {if (NR) printf "%s -> %s, %s tokens/s, %s", first, last, tok, (last < first) ? "falling" : "NOT FALLING"}')
  echo "$precision training loss: ${summary:-no log lines}"
  [[ "$summary" == *falling && "$summary" != *"NOT FALLING" ]] || failed+=("loss_$precision")
done
for beam in 1 4; do
  [ -f "$OUT/decode_beam$beam.log" ] && echo "beam $beam: $(grep -E '^BLEU|sent/s' "$OUT/decode_beam$beam.log" | tr '\n' ' ')"
done
[ -f "$OUT/benchmark.log" ] && sed -n '/^ceiling/,$p' "$OUT/benchmark.log"
if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}"; exit 1; fi
echo "all GPU checks passed"
