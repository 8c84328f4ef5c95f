#!/usr/bin/env bash
# The RL loop and `quantroll compare` on the device GPU. Logs and tarred study outputs go to $OUT.
#   bash bench/rl_gpu.sh check    # GPU tests of the weight sync and of train (bf16, mode 1, mode 2)
#   bash bench/rl_gpu.sh study    # compare on the built-in warm-started model (learning) and on a
#                                 # random Qwen3-1.7B-shaped model (time and mismatch at a real size)
#   bash bench/rl_gpu.sh study-1.7b   # the second part alone (~6 min: the rollout-speed column)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
pack() {  # study dir -> $OUT/NAME.tgz without the converted checkpoints
  tar czf "$OUT/$2.tgz" -C "$1" --exclude=checkpoints . && ls -la "$OUT/$2.tgz"
}
if [ "${1:-check}" = check ]; then
  python3 -m pytest -q -p no:cacheprovider tests/rl/test_gpu_train.py \
    "tests/engine/test_gpu_engine.py::test_weight_sync_gpu_path_equals_the_reference" \
    "tests/engine/test_gpu_engine.py::test_trainer_fp8_forward_on_gpu_matches_emulation_and_keeps_bf16_backward" \
    2>&1 | tee "$OUT/rl_gpu_tests.log" | tail -25
  exit 0
fi
date -u +"%F %T UTC"
if [ "$1" = study ]; then
# 1. learning: the built-in model, bf16 vs fp8 mode 1 vs fp8 mode 2, none/tis, two seeds
time python3 -m quantroll compare --output-dir /tmp/tiny --precisions bf16,fp8 --modes 1,2 \
  --corrections none,tis --seeds 1,2 --num-rollout "${TINY_STEPS:-25}" 2>&1 | tee "$OUT/compare_tiny.log" | tail -45
pack /tmp/tiny compare_tiny
elif [ "$1" != study-1.7b ]; then
  echo "usage: bash bench/rl_gpu.sh check|study|study-1.7b" >&2; exit 2
fi
# 2. a real size: random Qwen3-1.7B shape, 256-token responses, modes 1 and 2
python3 bench/write_shape_checkpoint.py --shape qwen3-1.7b --out /tmp/q17
time python3 -m quantroll compare --output-dir /tmp/q17study --hf-checkpoint /tmp/q17 --precisions bf16,fp8 \
  --modes 1,2 --corrections none,tis --seeds 1 --num-rollout "${BIG_STEPS:-4}" --rollout-max-response-len 256 \
  --train-args "--rollout-batch-size 16 --n-samples-per-prompt 8 --global-batch-size 32 --rollout-ignore-eos --lr 1e-6" \
  2>&1 | tee "$OUT/compare_1.7b.log" | tail -45
pack /tmp/q17study compare_1.7b
