#!/usr/bin/env bash
# The long-response study (issue 42) on the device GPU, one job per call (docs/long-study.md):
#   bash bench/long_study.sh sft        # fine-tune the study model on fib at 4K/8K/16K (resumable, ~2 calls)
#   bash bench/long_study.sh calibrate  # sampled pass rate / rewards / entropy per candidate --trace-len
#   bash bench/long_study.sh gap        # step-0 and step-1 gap at 4K/8K/16K: bf16, fp8, fp8-m2, fp8+kvfp8
#   bash bench/long_study.sh learn-4k   # the learning runs at 4K (resumable, several calls)
#   bash bench/long_study.sh learn-16k  # the learning runs at 16K (resumable, several calls)
#   bash bench/long_study.sh report     # docs/reports/long-responses/ from what the jobs saved (CPU is enough)
# Each call works at most LONG_STUDY_CALL_SECONDS (540) and exits 0 when its job is done, 75 when the
# job needs another call of the same JOB (it resumes), 1 when a command failed, 2 on a bad JOB.
# State lives in $LONG_STUDY_DIR (.long_study/, ignored); a job's small results are packed to
# $OUT/JOB.tgz after every call. A new (bare) machine continues a job from JOB.tgz files copied
# into $LONG_STUDY_CARRIED (.long_study_in/, tracked: commit each JOB.tgz there, and it travels with the tree).
# LONG_STUDY_SMOKE=1: the tiny CPU versions of every knob (tests/test_long_study_jobs.py).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD

# ---- the study's knobs (issue 42; estimates in docs/long-study.md) ----
TERMS=2                              # fib terms per line (3: the harder task)
MODEL_NAME=fib-qwen3-long            # where the committed study model lives: quantroll/data/$MODEL_NAME
SFT_LENGTHS=4096,8192,16384          # one SFT over the studied lengths (each its own counter width)
SFT_SHAPE=long SFT_CONTEXT=20480     # 7.4M parameters, 14.8 MB in BF16
SFT_TOKENS=65536 SFT_MICRO=32768     # tokens per optimizer step, positions per forward
SFT_STEPS=1500 SFT_LR=2e-3 SFT_SEED=0
SFT_SAVE_EVERY=25 SFT_CHECK_EVERY=100 SFT_VAL=24 SFT_EVAL=24
SFT_TARGET=0.6                       # mixture pass rate; ~0.79 / 0.62 / 0.39 at 4K/8K/16K if errors compound per token
SFT_EXPORT_MARGIN=90                 # seconds kept for the final evaluation and the export
CAL_LENGTHS=3072,4096,6144,8192,12288,16384 CAL_PROBLEMS=32
GAP_LENGTHS="4096 8192 16384" GAP_GROUPS="bf16 fp8 fp8-m2 fp8+kvfp8" GAP_STEPS=2
GAP_PROMPTS=16 GAP_SAMPLES=4 GAP_MICRO=8
# the longest length: a second seed for FP8 KV, whose step-0 token KL there stood out on seed 1 (2.2e-4 against
# ~4e-5 in every other cell, H100, 2026-12-06); the other groups keep their one seed
GAP_LONGEST_GROUPS="bf16@1 fp8@1 fp8-m2@1 fp8+kvfp8" GAP_LONGEST_SEEDS=1,2
RL_LR=5e-5                           # compare's recipe
RL_REWARD=--trace-partial-credit      # calibrate (H100, 2026-12-06): exact reward 0.19 / 0.06 at 8K / 16K, partial credit 0.51 / 0.39 / 0.28 at 4K / 8K / 16K
SEEDS=1,2
LEARN_4K_LEN=4096 LEARN_4K_STEPS=20 LEARN_4K_PROMPTS=64 LEARN_4K_SAMPLES=4 LEARN_4K_MICRO=32 LEARN_4K_EVAL=64
LEARN_4K_GROUPS="bf16 fp8 fp8+tis@1 fp8+tis-seq@1 fp8+mask@1 fp8-m2@1"
LEARN_16K_LEN=16384 LEARN_16K_STEPS=20 LEARN_16K_PROMPTS=16 LEARN_16K_SAMPLES=4 LEARN_16K_MICRO=8 LEARN_16K_EVAL=32
# in this order (compare runs them as written; a group written again runs once): BF16 and FP8 seed 1 first,
# then their seeds 2, then the corrections, so that the runs a session finishes answer the most they can
LEARN_16K_GROUPS="bf16@1 fp8@1 bf16 fp8 fp8+tis@1 fp8+tis-seq@1 fp8-m2@1"
# 32 decode steps between the host's looks at 16K (the engine's default 8 at 4K, whose runs began with it):
# the host's 3-5 ms a chunk (bench/engine_host.py, 64 x 16K, the 2-core CPU), paid while the GPU waits, against
# ~1-2 ms a decode step of this model (gap's 16K: 2.3-2.6 ms a step, host included): one chunk of 32 pays it once
LEARN_4K_ENGINE="" LEARN_16K_ENGINE="--num-continuous-decode-steps 32"
LEARN_EVAL_INTERVAL=10 LEARN_SAVE_INTERVAL=2
# runs at once on the GPU (compare --jobs): a 7M-parameter model leaves most of an H100 idle at 4K; each run's
# KV pool is then fixed (4 KB a token: 5.2 GB for 256 x 4.9K, 4.3 GB for 64 x 16.4K) beside its
# training (~0.5-0.85 GB a 4.9K-token sequence of a micro-batch, measured on a CPU), so 2 fit 80 GB.
# learn-16k: one at a time, since a pair made no more steps a second (H100: 2 x 9 steps in 580 s, alone 19-20 in
# 560-570 s; the GPU 92-94% busy alone) and a session's cut then loses one run, not two
LEARN_4K_JOBS=${LONG_STUDY_LEARN_JOBS:-2} LEARN_16K_JOBS=${LONG_STUDY_LEARN_JOBS:-1}
LEARN_KV_GB=8  # measured peak 21 GiB a 4K run (H100): 3 fit 80 GB
DEVICE=cuda
if [ "${LONG_STUDY_SMOKE:-0}" = 1 ]; then  # tiny shape, ~64-token traces, 2 steps, on the CPU
  SFT_LENGTHS=48,64 SFT_SHAPE=tiny,num_hidden_layers=1 SFT_CONTEXT=256 SFT_TOKENS=512 SFT_MICRO=256 SFT_STEPS=2
  SFT_SAVE_EVERY=1 SFT_CHECK_EVERY=1 SFT_VAL=2 SFT_EVAL=2 SFT_EXPORT_MARGIN=0
  CAL_LENGTHS=48,64 CAL_PROBLEMS=2 GAP_LENGTHS=64 GAP_PROMPTS=2 GAP_SAMPLES=2 GAP_MICRO=2
  LEARN_4K_LEN=48 LEARN_16K_LEN=64 LEARN_4K_STEPS=2 LEARN_16K_STEPS=2 LEARN_EVAL_INTERVAL=1 LEARN_SAVE_INTERVAL=1
  LEARN_4K_PROMPTS=2 LEARN_16K_PROMPTS=2 LEARN_4K_SAMPLES=2 LEARN_16K_SAMPLES=2 LEARN_4K_MICRO=2 LEARN_16K_MICRO=2
  LEARN_4K_EVAL=2 LEARN_16K_EVAL=2 LEARN_KV_GB=0.25 DEVICE=cpu
fi
DEVICE=${LONG_STUDY_DEVICE:-$DEVICE}  # LONG_STUDY_SMOKE=1 LONG_STUDY_DEVICE=cuda: the tiny jobs on the GPU (~3 min)

JOB=${1:-}
ROOT=${LONG_STUDY_DIR:-.long_study}
CARRIED=${LONG_STUDY_CARRIED:-.long_study_in}
REPORT_DIR=${LONG_STUDY_REPORT_DIR:-docs/reports/long-responses}
MIN_START=${LONG_STUDY_MIN_START:-45}    # no compare is started with fewer seconds left
START=$(date +%s)
CALL_SECONDS=${LONG_STUDY_CALL_SECONDS:-540}
DEADLINE=$((START + CALL_SECONDS))
case "$JOB" in
  sft|calibrate|gap|learn-4k|learn-16k|report) ;;
  *) echo "usage: bash bench/long_study.sh sft|calibrate|gap|learn-4k|learn-16k|report" >&2; exit 2 ;;
esac
D=$ROOT/$JOB
OUTDIR=${OUT:-}
remaining() { local r=$((DEADLINE - $(date +%s))); echo $((r > 0 ? r : 0)); }

seed_from_carried() {  # a bare machine: continue a job from the results a former call packed
  local job=$1
  if [ ! -d "$ROOT/$job" ] && [ -f "$CARRIED/$job.tgz" ]; then
    mkdir -p "$ROOT" && tar xzf "$CARRIED/$job.tgz" -C "$ROOT" && echo "$job: continued from $CARRIED/$job.tgz"
  fi
}
seed_from_carried "$JOB"
mkdir -p "$D" && ROOT=$(cd "$ROOT" && pwd) && D=$ROOT/$JOB
# compare's runs key on their command lines, which hold the output folder's absolute path and the
# model's: both are reached through $FIXED, the same path on every machine, so a bare machine keeps
# the runs a former one finished
FIXED=${LONG_STUDY_FIXED:-/tmp/quantroll-long-study}
mkdir -p "$FIXED" && ln -sfn "$ROOT" "$FIXED/work"
LOG=$D/log.txt CMDS=$D/commands.this-call
: >"$CMDS"
exec 3>&1 4>&2 > >(tee -a "$LOG") 2>&1
TEE=$!
echo "== long_study $JOB: $(date -u +'%F %T UTC'), $(remaining) s for this call, smoke ${LONG_STUDY_SMOKE:-0}"

run() {  # the command is recorded, then run under the call's deadline (SIGTERM: compare saves and stops)
  local left; left=$(remaining)
  [ "$left" -gt 0 ] || { echo "not run, the call's time is up: $*"; return 124; }  # (timeout 0 would not limit)
  echo "$*" >>"$CMDS"
  echo "+ $*"
  timeout -s TERM -k 30 "$left" "$@"
}

model() {  # the study model, copied where its path is the same on every machine (compare's runs key on it)
  local src=${LONG_STUDY_MODEL:-quantroll/data/$MODEL_NAME}
  if [ ! -f "$src/model.safetensors" ]; then
    echo "long_study $JOB: no study model in $src: commit the sft job's model there, or set" \
      "LONG_STUDY_MODEL=$ROOT/sft/model to use the one the sft job left on this machine" >&2
    return 1
  fi
  local sha; sha=$(sha256sum "$src/model.safetensors" | cut -c1-12)
  MODEL=$FIXED/model-$sha
  if [ ! -f "$MODEL/.copied" ]; then rm -rf "$MODEL" && mkdir -p "$MODEL" && cp -r "$src/." "$MODEL/" && touch "$MODEL/.copied"; fi
  echo "study model: $src (model.safetensors sha256 $sha...), as $MODEL" | tee -a "$CMDS"
}

max_len() { python3 -c "from quantroll.tasks.trace import FibTraceTask as F; print(F(length=$1, terms=$TERMS).max_response_tokens + 16)"; }

NOT_DONE=0 FAILED=0
unit() {  # one compare over a part of the matrix, skipped when done, not started when the call cannot hold it
  local dir=$1 key=$2 groups=$3 seeds=$4; shift 4
  local marker=$dir/units/$key.done same; same=$(echo "$groups $seeds $*" | sha256sum | cut -c1-16)
  # done with these knobs (a knob changed, e.g. more steps: compare runs it again and extends what it can)
  [ -f "$marker" ] && [ "$(cut -d' ' -f2 "$marker")" = "$same" ] && { echo "$key: done earlier"; return 0; }
  local need; need=$(cut -d' ' -f1 "$dir"/units/*.done 2>/dev/null | sort -n | tail -1)  # the longest part so far
  [ -n "$need" ] && [ "$need" -gt $((CALL_SECONDS / 2)) ] && need=$((CALL_SECONDS / 2))  # parts span calls
  # 0 starts (resumes) every part a call can: one cut at the call's end resumes in the next call on the same
  # machine, and one the machine cannot finish would be lost whether started or not
  need=${LONG_STUDY_PART_SECONDS:-$need}
  if [ "$(remaining)" -le 0 ] || [ "$(remaining)" -lt "$MIN_START" ] || { [ -n "$need" ] && [ "$(remaining)" -lt "$need" ]; }; then
    echo "$key: not started, $(remaining) s left (a part needs ${need:-?} s: LONG_STUDY_PART_SECONDS, else the longest so far, at most half a call)"; NOT_DONE=1; return 1
  fi
  mkdir -p "$dir/units"
  local t0; t0=$(date +%s)
  run python3 -m quantroll compare --output-dir "$FIXED/work/${dir#"$ROOT"/}/compare" --groups "$groups" --seeds "$seeds" "$@" \
    > "$dir/units/$key.log" 2>&1
  local rc=$?
  grep -E "done earlier|resuming|extending|^report:|error" "$dir/units/$key.log" | tail -n 8
  if [ $rc = 0 ]; then echo "$(($(date +%s) - t0)) $same" >"$marker"; return 0; fi
  if [ $rc = 124 ] || [ $rc = 137 ]; then echo "$key: stopped at the call's deadline (resumes next call)"; NOT_DONE=1
  else echo "$key: compare failed (exit $rc): $dir/units/$key.log"; FAILED=1; fi
  return 1
}

matrix() {  # dir prefix seeds jobs "GROUP[@N] ..." compare-args...: each group x seed a unit, then the whole
  # matrix; with jobs > 1, one compare of the whole matrix, that many runs at once (each resumes from its last save)
  local dir=$1 prefix=$2 seeds=$3 jobs=$4 groups=$5; shift 5
  local g base n s all=""
  if [ "$jobs" -gt 1 ]; then
    unit "$dir" "$prefix-all" "$(echo $groups | tr ' ' ,)" "$seeds" --jobs "$jobs" "$@"; return
  fi
  for g in $groups; do
    base=${g%@*}; n=$([ "$base" = "$g" ] && echo 99 || echo "${g#*@}")
    all=${all:+$all,}$g
    for s in $(echo "$seeds" | tr , ' ' | cut -d' ' -f1-"$n"); do
      unit "$dir" "$prefix-$base-seed$s" "$base" "$s" "$@" || [ $FAILED = 0 ] || return 1
    done
  done
  [ $NOT_DONE = 0 ] || return 1
  unit "$dir" "$prefix-all" "$all" "$seeds" "$@"
}

train_args() {  # len prompts samples micro eval-size [kv-pool-GiB]
  echo "--task fib --trace-len $1 --trace-terms $TERMS --rollout-batch-size $2 --n-samples-per-prompt $3" \
    "--micro-batch-size $4 --eval-size $5 --lr $RL_LR${RL_REWARD:+ $RL_REWARD}${6:+ --kv-cache-memory-gb $6}"
}

rc=0
case "$JOB" in calibrate|gap|learn-*) model || FAILED=1 ;; esac
[ $FAILED = 0 ] && case "$JOB" in
  sft)
    if [ -f "$D/model/model.safetensors" ]; then echo "sft: the model was exported earlier: $D/model"
    else
      resume=(); [ -f "$D/state/state/record.json" ] && resume=(--resume)
      limit=$(( $(remaining) - SFT_EXPORT_MARGIN )); [ $limit -lt 0 ] && limit=0
      limit=${LONG_STUDY_SFT_TIME_LIMIT:-$limit}  # the smoke test's 0: one step per call
      run python3 -m quantroll sft --save "$D/model" --task fib --trace-len "$SFT_LENGTHS" --trace-terms $TERMS \
        --shape "$SFT_SHAPE" --context $SFT_CONTEXT --tokens-per-batch $SFT_TOKENS --micro-batch-tokens $SFT_MICRO \
        --state-dir "$D/state" --steps $SFT_STEPS --lr $SFT_LR --seed $SFT_SEED --save-every $SFT_SAVE_EVERY \
        --check-every $SFT_CHECK_EVERY --val-size $SFT_VAL --eval-size $SFT_EVAL --target-pass-rate $SFT_TARGET \
        --device $DEVICE --time-limit $limit "${resume[@]}"
      rc=$?
      if [ $rc = 3 ] || [ $rc = 124 ] || [ $rc = 137 ]; then NOT_DONE=1
      elif [ $rc != 0 ]; then FAILED=1; fi
    fi
    if [ -f "$D/model/model.safetensors" ]; then
      { echo "command: $(grep -h '^python3 -m quantroll sft' "$D"/commands.* 2>/dev/null | tail -1 \
          | sed -e 's/ --time-limit [0-9]*//' -e 's/ --resume//') (one call, uninterrupted, makes the same)"
        echo "seed: $SFT_SEED"; (cd "$D/model" && sha256sum -- * | sed 's/^/sha256: /'); } >"$D/model.txt"
      cat "$D/model.txt"
    fi ;;
  calibrate)
    run python3 bench/long_study_sample.py sample --model "$MODEL" --lengths $CAL_LENGTHS --terms $TERMS \
      --problems $CAL_PROBLEMS --device $DEVICE --json "$D/calibrate.json"
    rc=$?
    if [ $rc = 124 ] || [ $rc = 137 ]; then NOT_DONE=1; elif [ $rc != 0 ]; then FAILED=1; fi ;;
  gap)
    for L in $GAP_LENGTHS; do
      [ $FAILED = 0 ] || break
      g=$GAP_GROUPS s=1
      [ "$L" = "${GAP_LENGTHS##* }" ] && g=$GAP_LONGEST_GROUPS s=$GAP_LONGEST_SEEDS
      matrix "$D/$L" "gap$L" "$s" 1 "$g" --hf-checkpoint "$MODEL" --num-rollout $GAP_STEPS --eval-interval 0 \
        --save-interval 1 --rollout-max-response-len "$(max_len $L)" --device $DEVICE \
        --train-args "$(train_args $L $GAP_PROMPTS $GAP_SAMPLES $GAP_MICRO 1)"
    done ;;
  learn-4k|learn-16k)
    if [ "$JOB" = learn-4k ]; then
      L=$LEARN_4K_LEN S=$LEARN_4K_STEPS P=$LEARN_4K_PROMPTS N=$LEARN_4K_SAMPLES M=$LEARN_4K_MICRO E=$LEARN_4K_EVAL
      G=$LEARN_4K_GROUPS X=$LEARN_4K_ENGINE LEARN_JOBS=$LEARN_4K_JOBS
    else
      L=$LEARN_16K_LEN S=$LEARN_16K_STEPS P=$LEARN_16K_PROMPTS N=$LEARN_16K_SAMPLES M=$LEARN_16K_MICRO E=$LEARN_16K_EVAL
      G=$LEARN_16K_GROUPS X=$LEARN_16K_ENGINE LEARN_JOBS=$LEARN_16K_JOBS
    fi
    # a fixed KV pool when runs share the GPU; learn-16k has it always, so that its runs' commands (which
    # key them) stay the same whether a call runs them alone (the default) or 2 at once
    kv=""; { [ "$LEARN_JOBS" -gt 1 ] || [ "$JOB" = learn-16k ]; } && kv=$LEARN_KV_GB
    matrix "$D" learn "$SEEDS" "$LEARN_JOBS" "$G" --hf-checkpoint "$MODEL" --num-rollout $S \
      --eval-interval $LEARN_EVAL_INTERVAL --save-interval $LEARN_SAVE_INTERVAL --rollout-max-response-len "$(max_len $L)" \
      --device $DEVICE --train-args "$(train_args $L $P $N $M $E $kv)${X:+ $X}" ;;
  report)
    for j in sft calibrate gap learn-4k learn-16k; do seed_from_carried $j; done
    m=${LONG_STUDY_MODEL:-quantroll/data/$MODEL_NAME} margs=()
    if [ -f "$m/config.json" ]; then margs=(--model "$m"); else echo "report: no study model in $m: its recipe is left out"; fi
    run python3 bench/long_study_report.py --root "$ROOT" --out "$REPORT_DIR" "${margs[@]}"
    rc=$?; [ $rc != 0 ] && FAILED=1 ;;
esac

status=done; code=0
if [ $FAILED = 1 ]; then status=failed; code=1; elif [ $NOT_DONE = 1 ]; then status=continue; code=75; fi
python3 bench/long_study_sample.py record --job "$JOB" --file "$D/calls.jsonl" --rc $code \
  --seconds $(($(date +%s) - START)) --status $status --commands "$CMDS"
cat "$CMDS" >>"$D/commands.all"
case $status in
  done) echo "long_study $JOB: done" ;;
  continue) echo "long_study $JOB: not done: call 'bash bench/long_study.sh $JOB' again (exit 75)" ;;
  failed) echo "long_study $JOB: FAILED (see the log above)" ;;
esac
exec 1>&3 2>&4 3>&- 4>&-
wait "$TEE" 2>/dev/null  # the log is whole before it is copied
if [ -n "$OUTDIR" ]; then  # small results only: no training states, no converted checkpoints (8 files at most)
  mkdir -p "$OUTDIR"
  tar czf "$OUTDIR/$JOB.tgz" -C "$ROOT" --exclude="$JOB/state" --exclude="$JOB/model" --exclude='*/runs/*/state' \
    --exclude='*/compare/checkpoints' "$JOB"
  cp "$LOG" "$OUTDIR/$JOB.log"
  if [ "$JOB" = sft ] && [ -f "$D/model/model.safetensors" ]; then
    tar czf "$OUTDIR/sft-model.tgz" -C "$D" model && cp "$D/model.txt" "$OUTDIR/sft-model.txt"
  fi
  [ "$JOB" = report ] && tar czf "$OUTDIR/report.tgz" -C "$(dirname "$REPORT_DIR")" "$(basename "$REPORT_DIR")"
fi
exit $code
