#!/usr/bin/env bash
# One device call for the warpgroup-MMA decode GEMMs (quantroll/kernels/fp8_wgmma.py): their
# GPU tests (correctness first; stop on failure), the GEMM study against the shipped decode
# GEMM, then the 8B decode step with the study's winners switched in (bench/switch_ab.py),
# if any won. Logs go to $OUT.
# Usage (device tool): bash bench/wgmma_gpu.sh [Ms of the study, default 16,32,64] [step batches, default 16,64]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout "${T_TESTS:-200}" python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_fp8_wgmma.py -rxXf 2>&1 \
  | tee "$OUT/wgmma_tests.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || { echo "GPU tests failed: no timings"; exit 1; }
timeout "${T_STUDY:-300}" python3 bench/wgmma_decode.py --ms "${1:-16,32,64}" --json "$OUT/wgmma_decode.json" 2>&1 \
  | grep -v Warn | tee "$OUT/wgmma_decode.log" | tail -40
variant=$(grep -o "^switch_ab.py: .*" "$OUT/wgmma_decode.log" | sed 's/^switch_ab.py: //')
if [ -n "$variant" ]; then
  eval "timeout ${T_SWITCH:-400} python3 bench/switch_ab.py --batches ${2:-16,64} $variant" 2>&1 | grep -v Warn \
    | tee "$OUT/wgmma_switch_ab.log" | tail -20
fi
