"""``quantroll compare``'s command line: its flags with their defaults and help, and the
study's recipe, the `quantroll train` flags every run gets before the user's --train-args.
Kept apart from the command (commands/compare.py), which checks and runs what they say."""

from __future__ import annotations

import torch

from quantroll.builtin import BUILTIN_MODELS
from quantroll.compute import COMPUTE_DTYPE_HELP, COMPUTE_DTYPES

DEFAULT_NUM_ROLLOUT = 30
DEFAULT_EVAL_INTERVAL = 10
DEFAULT_SAVE_INTERVAL = 5
# The study's recipe, on top of `quantroll train`'s defaults and before --train-args (which override it): with
# train's --lr 2e-4 and a pool of 64 problems the BF16 baseline's held-out accuracy fell 0.45 -> 0.25 in 30 steps
# (it fit its pool), and a baseline that unlearns cannot rank corrections. At 5e-5 on a pool of 2048 (disjoint from
# the held-out problems, as every pool is) it rose to 0.5-0.6 on the built-in model (seeds 1, 2; measured for
# issue 41); CI checks it holds (quantroll/compare/heldout_check.py). The pool size was measured for the built-in
# task (2-digit arithmetic), so another task (--task, --digits, --count-span, --prompt-data in --train-args) keeps
# train's own pool; a flag that --train-args sets replaces the recipe's.
RECIPE = {"--lr": "5e-5", "--train-problems": "2048"}
TASK_FLAGS = ("--task", "--digits", "--count-span", "--prompt-data")


def recipe(extra: tuple[str, ...]) -> tuple[str, ...]:
    """The recipe's flags that ``extra`` (the user's --train-args) leaves to compare (see RECIPE)."""
    given = {a.split("=")[0] for a in extra if a.startswith("--")}
    skip = given | ({"--train-problems"} if given & set(TASK_FLAGS) else set())
    return tuple(x for flag, value in RECIPE.items() if flag not in skip for x in (flag, value))


def add_flags(p) -> None:
    """compare's flags on its parser ``p``."""
    p.add_argument("--output-dir", default="quantroll-compare", help="where runs, summary.json, report.md, "
                   "report.html and plots/ go; rerunning continues what is there. It must be new, empty or one "
                   "compare wrote (listed in its .quantroll): a directory holding other files is refused")
    p.add_argument("--hf-checkpoint", default=None, help="BF16 HF checkpoint to study (converted once per "
                   "precision); default: the built-in warm-started tiny Qwen3")
    p.add_argument("--builtin-model", default="dense", choices=sorted(BUILTIN_MODELS), help="which built-in model "
                   "when --hf-checkpoint is not given (moe adds the r3 correction)")
    p.add_argument("--precisions", default="bf16,fp8", help="rollout precisions, of bf16,fp8,mxfp8,nvfp4 (mxfp8 "
                   "and nvfp4 are emulated on hardware without them, Hopper included, and labelled so)")
    p.add_argument("--corrections", default="none,tis", help="corrections per low precision, of none,tis,mask "
                   "(r3 is added for MoE models)")
    p.add_argument("--modes", default="1,2", help="1 = low-precision rollout, BF16 training; 2/3/4 = unified "
                   "fp8/mxfp8/nvfp4 (the trainer's forward quantized too), each for its precision; modes 3/4 need "
                   "--precisions with mxfp8/nvfp4, e.g. --precisions bf16,fp8,mxfp8,nvfp4 --modes 1,2,3,4")
    p.add_argument("--kv-cache-dtypes", default="bf16", help="the engine's KV cache dtypes, of bf16,fp8: each "
                   "repeats the matrix with that cache, so that the report shows what FP8 weights, an FP8 KV cache "
                   "and both add to the gap apart")
    p.add_argument("--groups", default=None, metavar="GROUP,...", help="run these groups instead of the matrix of "
                   "--precisions/--corrections/--modes/--kv-cache-dtypes (leave those out). GROUP = BASE[+MOD...][@N]: "
                   "BASE bf16 | fp8, mxfp8, nvfp4 (mode 1) | fp8-m2, mxfp8-m3, nvfp4-m4 (unified); MOD kvfp8 (FP8 KV "
                   "cache), top (true on-policy), or one correction: tis, tis-seq, tis-geo (TIS at token / sequence / "
                   "geometric level), mask, mask-seq, mask-geo, r3 (MoE); @N: the first N of --seeds. A correction's "
                   "flags reach only the groups that name it. E.g. the long-response study: --seeds 1,2 --groups "
                   "bf16,fp8,fp8+tis@1,fp8+tis-seq@1,fp8+mask@1,fp8-m2@1,fp8+kvfp8@1")
    p.add_argument("--true-on-policy", action="store_true", help="add the true-on-policy group: the bf16 baseline "
                   "and mode 2 (with --modes 2) again with `train --true-on-policy-mode` (CPU), reported beside the "
                   "same runs without it, gap and cost side by side")
    p.add_argument("--seeds", default="1,2", help="seeds; with several, differences are judged against the spread")
    p.add_argument("--num-rollout", type=int, default=DEFAULT_NUM_ROLLOUT, help="RL steps per run")
    p.add_argument("--rollout-max-response-len", type=int, default=8, help="response length of the main runs")
    p.add_argument("--eval-interval", type=int, default=DEFAULT_EVAL_INTERVAL, help="held-out greedy accuracy of "
                   "the engine's and the trainer's policy (problems outside the training pool) at step 0, every N "
                   "steps and at the last step of each main run (0: never)")
    p.add_argument("--save-interval", type=int, default=DEFAULT_SAVE_INTERVAL, help="each run saves its trainer "
                   "state every N steps and at its end (OUT/runs/RUN/state, `train --save`); rerunning the same "
                   "command resumes each unfinished run from its last save and skips finished ones, and with a larger "
                   "--num-rollout continues finished runs from their last step, also after OUT was moved (0: no saves, an "
                   "interrupted run starts again at step 0)")
    p.add_argument("--sweep-response-len", default=None, help="also measure the gap at these response lengths "
                   "(comma-separated, e.g. 1024,4096,8192,16384): responses sampled to full length, ignoring EOS")
    p.add_argument("--sweep-num-rollout", type=int, default=1, help="RL steps per sweep run (1: the gap at step 0)")
    p.add_argument("--sweep-rollout-batch-size", type=int, default=4, help="prompts per sweep step")
    p.add_argument("--sweep-n-samples-per-prompt", type=int, default=2, help="samples per prompt in sweep runs")
    p.add_argument("--num-layers-at-start-in-bf16", type=int, default=0, help="keep the first N layers BF16 "
                   "(both sides)")
    p.add_argument("--num-layers-at-end-in-bf16", type=int, default=0, help="keep the last N layers BF16 (both sides)")
    p.add_argument("--skip", nargs="+", action="extend", default=[], metavar="PATTERN", help="keep matching modules "
                   "BF16 in every low-precision run (both sides), as `quantroll convert --skip` does")
    p.add_argument("--bf16-exceptions", default=None, metavar="auto|FLAGS", help="opt-in group: repeat every "
                   "low-precision run on a checkpoint that keeps these BF16 exceptions too; auto = measure them "
                   "first with `quantroll attribute` (per precision, report under OUT/attribution/), or paste the "
                   "flags it printed, e.g. \"--num-layers-at-start-in-bf16 1 --skip 'model.layers.2.*'\"")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device of every run")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each its own process: on a GPU machine spread "
                   "over --gpus (one GPU each); more jobs than GPUs share them, which suits small models (each run "
                   "then needs --kv-cache-memory-gb in --train-args, and its times include the others' work: the "
                   "report says so)")
    p.add_argument("--gpus", default=None, metavar="ID,...", help="the GPUs the runs go on, one each, spread by "
                   "--jobs (with --jobs 1 the first); default: every visible one as CUDA_VISIBLE_DEVICES names them, "
                   "and a run alone sees them all")
    p.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    p.add_argument("--train-args", default="", help="more flags for every run, as one string (e.g. \"--lr 1e-4 "
                   f"--rollout-batch-size 32 --task count\"); compare's recipe ({' '.join(recipe(()))}; the pool only for "
                   "the built-in arithmetic task) fills in what they leave out; every flag and its default: "
                   "quantroll train --help")
