#!/usr/bin/env bash
# The warpgroup-MMA decode GEMMs (quantroll/kernels/fp8_wgmma.py) on the device, in two calls
# of at most 600 s each. Logs go to $OUT.
#   bash bench/wgmma_gpu.sh                         GPU tests (stop on failure), then the GEMM study
#   SKIP_TESTS=1 SWITCH=1 bash bench/wgmma_gpu.sh   the study again, then the 8B decode step with its
#                                                   winners switched in (bench/switch_ab.py), if any won
# Arguments: [Ms of the study, default 16,32,64] [step batches, default 16,64]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${T_TESTS:-330}" python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_fp8_wgmma.py -rxXf \
    --durations=5 2>&1 | tee "$OUT/wgmma_tests.log" | tail -15
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "GPU tests failed: no timings"; exit 1; }
fi
timeout "${T_STUDY:-240}" python3 bench/wgmma_decode.py --ms "${1:-16,32,64}" --json "$OUT/wgmma_decode.json" 2>&1 \
  | grep -v Warn | tee "$OUT/wgmma_decode.log" | tail -40
variant=$(grep -o "^switch_ab.py: .*" "$OUT/wgmma_decode.log" | sed 's/^switch_ab.py: //')
if [ "${SWITCH:-0}" = 1 ] && [ -n "$variant" ]; then
  eval "timeout ${T_SWITCH:-300} python3 bench/switch_ab.py --batches ${2:-16,64} $variant" 2>&1 | grep -v Warn \
    | tee "$OUT/wgmma_switch_ab.log" | tail -20
fi
