#!/usr/bin/env bash
# One device session for the engine: GPU tests first (correctness), then the rollout
# benchmark on the Qwen3-8B shape and the Qwen3-30B-A3B shape. Logs go to $OUT.
# Usage (device tool): bash bench/engine_gpu.sh [8b-batches] [moe-layers]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pytest -q tests/formats/test_gpu_reference.py tests/engine/test_gpu_engine.py -p no:cacheprovider 2>&1 | tee "$OUT/engine_gpu_tests.log" | tail -15
python3 bench/profile_decode.py 8 1,16,64 2>&1 | tee "$OUT/profile.log" | grep -v Warn
python3 -m quantroll bench rollout --shape qwen3-8b --batches "${1:-1,16,64,256}" --json "$OUT/rollout_8b.json" 2>&1 \
  | tee "$OUT/rollout_8b.log" | grep -v '^{'
python3 -m quantroll bench rollout --shape qwen3-30b-a3b --layers "${2:-24}" --batches 1,16,64 --json "$OUT/rollout_moe.json" 2>&1 \
  | tee "$OUT/rollout_moe.log" | grep -v '^{'
