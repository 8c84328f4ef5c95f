#!/usr/bin/env bash
# The rollout engine's RL-workload figures (docs/PERFORMANCE.md) on the device GPU: 64 prompts
# x 8 samples, 512-token prompts, long-tail lengths (mean 2048, cap 8192), random weights.
# Logs and JSON go to $OUT. One part per call (each within the device tool's 10 minutes):
#   bash bench/rl_workload_gpu.sh 8b-bf16  # Qwen3-8B: bf16 + bf16 KV (~3 min of ~4 with set-up)
#   bash bench/rl_workload_gpu.sh 8b-fp8   # Qwen3-8B: fp8 + fp8 KV
#   bash bench/rl_workload_gpu.sh 8b-fp8-triton  # the same, the FP8 cache's decode on the Triton tiles
#   bash bench/rl_workload_gpu.sh 16k      # Qwen3-8B: 64 sequences of 16K tokens resident (fp8 + fp8 KV)
#   bash bench/rl_workload_gpu.sh 1.7b     # Qwen3-1.7B: the four weight x KV precision pairs
#   bash bench/rl_workload_gpu.sh static   # Qwen3-1.7B, bf16 + bf16 KV, the static policy (continuous: 1.7b)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
rl() {  # name, then bench rollout flags
  local name=$1; shift
  date -u +"%F %T UTC"
  python3 -m quantroll bench rollout --workload rl --json "$OUT/$name.json" "$@" 2>&1 \
    | tee "$OUT/$name.log" | grep -v '^{'
}
case "${1:-}" in
  8b-bf16)
    rl 8b-bf16 --shape qwen3-8b --precisions bf16 --kv-cache-dtypes bf16 ;;
  8b-fp8)
    rl 8b-fp8 --shape qwen3-8b --precisions fp8 --kv-cache-dtypes fp8_e4m3 ;;
  8b-fp8-triton)
    rl 8b-fp8-triton --shape qwen3-8b --precisions fp8 --kv-cache-dtypes fp8_e4m3 --fp8-kv-attention triton ;;
  16k)
    rl 8b-16k --shape qwen3-8b --precisions fp8 --kv-cache-dtypes fp8_e4m3 --prompts 64 --samples 1 \
      --new-tokens 16384 --mean-len 16384 ;;
  1.7b)
    rl 1.7b --shape qwen3-1.7b --precisions bf16,fp8 --kv-cache-dtypes bf16,fp8_e4m3 ;;
  static)
    rl 1.7b-static --shape qwen3-1.7b --precisions bf16 --kv-cache-dtypes bf16 --policies static ;;
  *) echo "usage: bash bench/rl_workload_gpu.sh 8b-bf16|8b-fp8|8b-fp8-triton|16k|1.7b|static" >&2; exit 2 ;;
esac
