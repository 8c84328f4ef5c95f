#!/usr/bin/env bash
# One device session for the engine: GPU tests first (correctness), then the GEMM studies and
# the rollout benchmark's default study (8B, 1.7B) and the Qwen3-30B-A3B shape. Logs go to $OUT.
# Usage (device tool): bash bench/engine_gpu.sh [batches] [moe-layers]
#   SKIP_GEMM_STUDIES=1   leave out bench/gemm_decode.py and bench/gemm_native_fp8.py
#   SKIP_TESTS=1          leave out the GPU tests (a second call of the same session)
#   SKIP_ROLLOUT=1        leave out the shipped-settings rollout benches (8B and MoE)
#   TESTS="a.py b.py"     run only these GPU test files; T_FILE: each file's time limit in seconds
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
ALL_TESTS="tests/formats/test_gpu_reference.py tests/kernels/test_quantize_gpu.py
  tests/engine/test_gpu_engine.py tests/engine/test_fused_quant.py tests/engine/test_sampling_fused.py
  tests/engine/test_paged_attention_gpu.py tests/kernels/test_fp8_gemv.py tests/kernels/test_fp8_gemm_rule_gpu.py
  tests/sync/test_direct_gpu.py tests/engine/test_true_on_policy_gpu.py
  tests/kernels/test_quantize_api.py tests/rl/test_gpu_train.py"
# one pytest per file, each with its own limit, so that a call cut short still reports every file it ran
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for f in ${TESTS:-$ALL_TESTS}; do
    echo "== $f"
    tail_lines=$(timeout "${T_FILE:-240}" python3 -m pytest -q -p no:cacheprovider "$f" -rxXf 2>&1 \
      | tee -a "$OUT/engine_gpu_tests.log" | tail -6)
    grep -E "passed|failed|skipped|error|FAILED|ERROR|no tests" <<< "$tail_lines" \
      || echo "   (no summary: cut at ${T_FILE:-240} s)"
  done
fi
if [ "${SKIP_GEMM_STUDIES:-0}" != 1 ]; then  # skip them to fit one call
  python3 bench/gemm_decode.py --quick --json "$OUT/gemm_decode.json" 2>&1 | grep -v Warn | tail -14
  python3 bench/gemm_native_fp8.py --json "$OUT/gemm_native_fp8.json" 2>&1 | grep -v Warn | tail -14
fi
if [ "${SKIP_ROLLOUT:-0}" != 1 ]; then
python3 -m quantroll bench rollout ${1:+--batches $1} --repeats 2 --json "$OUT/rollout.json" \
  2>&1 | tee "$OUT/rollout.log" | grep -v '^{'  # the default study: 8B and 1.7B
fi
if [ "${SKIP_ROLLOUT:-0}" != 1 ]; then
python3 -m quantroll bench rollout --shape qwen3-30b-a3b --layers "${2:-24}" --batches 1,16,64 --repeats 2 \
  --json "$OUT/rollout_moe.json" 2>&1 | tee "$OUT/rollout_moe.log" | grep -v '^{'
fi
