#!/usr/bin/env bash
# One device session for the engine: GPU tests first (correctness), then the GEMM studies and
# the rollout benchmark on the Qwen3-8B and Qwen3-30B-A3B shapes. Logs go to $OUT.
# Usage (device tool): bash bench/engine_gpu.sh [8b-batches] [moe-layers]
#   SWITCH_AB=1           the 8B FP8 decode step with each experimental switch on (bench/switch_ab.py; batches 1,16,64)
#   SWITCH_AB_OTHERS=1    the BF16 8B step and the MoE shape (shipped settings, via bench/switch_ab.py)
#   SKIP_GEMM_STUDIES=1   leave out bench/gemm_decode.py and bench/gemm_native_fp8.py
#   SKIP_TESTS=1          leave out the GPU tests (a second call of the same session)
#   SKIP_ROLLOUT=1        leave out the shipped-settings rollout benches (8B and MoE)
#   TESTS="a.py b.py"     run only these GPU test files; T_TESTS, T_SWITCH,
#                         T_BF16_SWITCH, T_MOE_SWITCH: the steps' time limits in seconds (to fit one call)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
ALL_TESTS="tests/formats/test_gpu_reference.py tests/kernels/test_quantize_gpu.py
  tests/engine/test_gpu_engine.py tests/engine/test_fused_quant.py tests/engine/test_sampling_fused.py
  tests/engine/test_paged_attention_gpu.py tests/kernels/test_fp8_gemv.py"
# shellcheck disable=SC2086
[ "${SKIP_TESTS:-0}" = 1 ] || timeout "${T_TESTS:-540}" python3 -m pytest -q -p no:cacheprovider ${TESTS:-$ALL_TESTS} -rxXf --durations=8 2>&1 | tee "$OUT/engine_gpu_tests.log" | tail -30
if [ "${SKIP_GEMM_STUDIES:-0}" != 1 ]; then  # measured 2026-12-01; skip them to fit the A/B runs in one call
  python3 bench/gemm_decode.py --quick --json "$OUT/gemm_decode.json" 2>&1 | grep -v Warn | tail -14
  python3 bench/gemm_native_fp8.py --json "$OUT/gemm_native_fp8.json" 2>&1 | grep -v Warn | tail -14
fi
if [ "${SKIP_ROLLOUT:-0}" != 1 ]; then
python3 -m quantroll bench rollout --shape qwen3-8b --batches "${1:-1,16,64,256}" --repeats 2 --json "$OUT/rollout_8b.json" \
  2>&1 | tee "$OUT/rollout_8b.log" | grep -v '^{'
fi
if [ "${SWITCH_AB:-0}" = 1 ]; then
  timeout "${T_SWITCH:-560}" python3 bench/switch_ab.py --batches 1,16,64 \
    --variant norm8:fused.NORM_WARPS=8 \
    --approx norm8 2>&1 | grep -v Warn | tee "$OUT/switch_ab.log" | tail -24
fi
if [ "${SWITCH_AB_OTHERS:-0}" = 1 ]; then
  timeout "${T_BF16_SWITCH:-300}" python3 bench/switch_ab.py --precision bf16 --batches 1,16,64 \
    2>&1 | grep -v Warn | tee "$OUT/switch_ab_bf16.log" | tail -9
  timeout "${T_MOE_SWITCH:-300}" python3 bench/switch_ab.py --shape qwen3-30b-a3b --layers 24 --batches 1,16,64 \
    2>&1 | grep -v Warn | tee "$OUT/switch_ab_moe.log" | tail -8
fi
if [ "${SKIP_ROLLOUT:-0}" != 1 ]; then
python3 -m quantroll bench rollout --shape qwen3-30b-a3b --layers "${2:-24}" --batches 1,16,64 --repeats 2 \
  --json "$OUT/rollout_moe.json" 2>&1 | tee "$OUT/rollout_moe.log" | grep -v '^{'
fi
