"""``quantroll compare``: the study that says which precision mode and which correction.

Runs, on the same prompts, BF16 rollout and each low-precision rollout (mode 1, and the
unified modes 2-4 with --modes), each with each correction, over several seeds: every
run an ordinary ``quantroll train`` process with its own metrics file. The report opens
with the answer, one line per mode: whether the mode is acceptable against BF16 and
which correction to use, by a rule it states. Then the train/rollout gap at step 0, over
the steps and by response length, rewards and held-out accuracy of both policies (step 0
and every --eval-interval steps), what each checkpoint kept in BF16, time per step, the
rollout speedup against BF16 and whether it pays for the re-quantization of every update
(break-even), and each group by length bucket (reward, held-out accuracy, every gap
metric). Rerunning the same command continues an interrupted compare: finished runs are
kept, and each unfinished one resumes from its last saved step (--save-interval); failed
runs are listed. --groups names the groups one by one instead of the matrix of
--precisions x --corrections x --modes x --kv-cache-dtypes.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
from pathlib import Path

import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.commands.bf16_exceptions import auto_exceptions, low_precisions, parse_exceptions
from quantroll.commands.compare_flags import add_flags, recipe
from quantroll.commands.helpformat import HelpFormatter
from quantroll.compare.parallel import placement_for
from quantroll.durable import remove_empty_dirs, writing
from quantroll.errors import QuantrollError
from quantroll.locks import OutputLock
from quantroll.outputs import MARKER, check_output_dir, list_files, record_owned, refuse_foreign
from quantroll.trainer.policy import refuse_quantized

# what a compare writes in --output-dir, listed in its marker (quantroll/outputs.py)
OWNED_FILES = ("summary.json", "report.md", "report.html", "checkpoints.json")
OWNED_DIRS = ("runs", "checkpoints", "plots", "attribution")


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="study: gap, reward, speed and break-even per precision mode and "
                              "correction; report.md/html with plots", description=__doc__,
                              formatter_class=HelpFormatter)
    add_flags(p)
    p.set_defaults(func=run)


def _source(args) -> tuple[Path, str, bool]:
    if args.hf_checkpoint and args.builtin_model != "dense":  # was ignored silently
        raise QuantrollError(f"--builtin-model {args.builtin_model} picks the model when --hf-checkpoint is not "
                             "given; drop one of them")
    if args.hf_checkpoint:
        source = Path(args.hf_checkpoint)
        refuse_quantized(source, "--hf-checkpoint")
        label = str(source)
    else:
        source = builtin_checkpoint(args.builtin_model)
        label = f"built-in tiny Qwen3 ({args.builtin_model}, warm-started)"
    from quantroll.model.config import load_model_config

    return source, label, load_model_config(source).num_experts > 0


def _train_args(text: str) -> tuple[str, ...]:
    try:
        extra = tuple(shlex.split(text))
    except ValueError as err:
        raise QuantrollError(f"--train-args {text!r}: {err}") from None
    owned = {"--hf-checkpoint", "--ref-load", "--seed", "--metrics-file", "--num-rollout", "--device",
             "--rollout-max-response-len", "--use-tis", "--tis-mode", "--fp8-recipe", "--fp4-recipe",
             "--use-rollout-routing-replay", "--rollout-precision", "--load", "--save", "--eval-interval",
             "--compute-dtype", "--skip", "--save-interval", "--force", "--config"}
    clash = sorted(owned & {a.split("=")[0] for a in extra})
    if clash:
        raise QuantrollError(f"--train-args may not set {', '.join(clash)}: compare sets them per run "
                             "(use compare's own flags)")
    return extra


@functools.cache
def _parser():
    from quantroll.cli import build_parser

    return build_parser()


def train_config(argv: list[str]):
    """The TrainConfig `quantroll train` makes of ``argv`` (flags and TrainConfig's checks)."""
    from quantroll.commands.train import config_from_args

    try:
        parsed = _parser().parse_args(argv)
    except QuantrollError as err:  # argparse's refusal, one line (cli.UsageError)
        raise QuantrollError(f"`quantroll train` refuses its command line ({err}); fix --train-args or the sweep "
                             "flags") from None
    return config_from_args(parsed)


class SavedStates:
    """The runs' --save directories as train writes them (rl/savedir.py): compare.runner's RunStates."""

    @staticmethod
    def saved_step(directory: Path) -> int | None:
        from quantroll.rl import savedir

        try:
            saved = savedir.latest(directory)
        except QuantrollError:  # a damaged pointer: the fresh start that follows replaces it
            return None
        return saved.step if saved else None

    @staticmethod
    def wipe(directory: Path) -> None:
        from quantroll.rl import savedir

        savedir.wipe(directory)


def _check_runs(setup, specs) -> None:
    """Every run's configuration made now, as `quantroll train` will make it, so that a bad
    value fails here, before any run or output."""
    from quantroll.compare.runner import command_for
    from quantroll.rl.memory import check_fits

    placeholders = {spec.checkpoint_key: setup.source for spec in specs}
    for spec in specs:
        argv = command_for(setup, spec, placeholders, setup.out_dir / spec.run_id)[3:]  # after "python -m quantroll"
        try:
            check_fits(train_config(argv), setup.source)  # and the sizes fit, as `train` will check
        except QuantrollError as err:
            raise QuantrollError(f"run {spec.run_id}: {err}") from None


def run(args: argparse.Namespace) -> int:
    from quantroll.compare.matrix import build_matrix
    from quantroll.compare.runner import CompareSetup

    if args.num_rollout < 1 or args.sweep_num_rollout < 1:
        raise QuantrollError("--num-rollout and --sweep-num-rollout must be >= 1")
    if args.eval_interval < 0:
        raise QuantrollError(f"--eval-interval must be >= 0, got {args.eval_interval}")
    if args.save_interval < 0:
        raise QuantrollError(f"--save-interval must be >= 0, got {args.save_interval}")
    source, label, moe = _source(args)
    exceptions = parse_exceptions(args.bf16_exceptions)
    if args.groups is not None:
        specs = _grouped(args, moe, exceptions is not None)
    else:
        specs = build_matrix(args.precisions, args.corrections, args.modes, args.seeds, args.rollout_max_response_len,
                             moe, args.sweep_response_len, args.kv_cache_dtypes, args.true_on_policy,
                             bf16_exceptions=exceptions is not None)
    out = Path(args.output_dir)
    check_output_dir("--output-dir", args.output_dir)
    refuse_foreign(f"--output-dir {out}", out, writes=OWNED_FILES + OWNED_DIRS)
    extra = _train_args(args.train_args)
    placement = placement_for(args.device, args.jobs, args.gpus, extra,
                              torch.cuda.device_count() if args.device.startswith("cuda") else 0)
    common = ("--compute-dtype", args.compute_dtype) + recipe(extra) + extra
    sweep = ("--rollout-batch-size", str(args.sweep_rollout_batch_size),
             "--n-samples-per-prompt", str(args.sweep_n_samples_per_prompt))
    setup = CompareSetup(out, source, label, moe, args.device, args.num_rollout, args.sweep_num_rollout, common, sweep,
                         {"num_layers_at_start_in_bf16": args.num_layers_at_start_in_bf16,
                          "num_layers_at_end_in_bf16": args.num_layers_at_end_in_bf16,
                          **({"skip": tuple(args.skip)} if args.skip else {})}, args.eval_interval,
                         {p: exceptions.convert_fields() for p in low_precisions(specs)}
                         if exceptions not in (None, "auto") else {}, args.save_interval, SavedStates())
    _check_runs(setup, specs)
    fresh = not out.exists()
    with OutputLock(out, f"--output-dir {out}", log=print):  # one compare at a time per directory
        try:
            with writing(f"--output-dir {out}"):  # a full disk or a read-only filesystem: one line
                refuse_foreign(f"--output-dir {out}", out)  # again, now that no other compare writes there
                record_owned(out, files=OWNED_FILES, dirs=OWNED_DIRS)
                return _run_matrix(setup, specs, label, args, placement)
        except BaseException:
            if fresh:
                remove_empty_dirs(out)  # the run directories of a compare that failed before writing them
                if not list_files(out):
                    (out / MARKER).unlink(missing_ok=True)
            raise


MATRIX_FLAGS = ("precisions", "corrections", "modes", "kv_cache_dtypes", "true_on_policy")


def _grouped(args, moe: bool, bf16_exceptions: bool) -> list:
    """--groups: the runs of the named groups; the matrix flags beside it, or a correction
    level in --train-args (it would reach every group), are refused."""
    from quantroll.compare.groupspec import build_groups_matrix

    defaults = _parser().parse_args(["compare"])  # compare's own defaults: the matrix the flags would give
    given = [k for k in MATRIX_FLAGS if getattr(args, k) != getattr(defaults, k)]
    if given:
        raise QuantrollError(f"--groups names every group; drop {', '.join('--' + k.replace('_', '-') for k in given)} "
                             "(write kvfp8, a correction or top into the groups, e.g. fp8+kvfp8, fp8-m2+top)")
    if {"--tis-level", "--tis-mode", "--use-tis"} & {a.split("=")[0] for a in _train_args(args.train_args)}:
        raise QuantrollError("--train-args may not set the correction's level or mode with --groups: name it in the "
                             "group (fp8+tis-seq, fp8+tis-geo, fp8+mask-seq, ...)")
    return build_groups_matrix(args.groups, args.seeds, args.rollout_max_response_len, moe, args.sweep_response_len,
                               bf16_exceptions)


def _run_matrix(setup, specs, label, args, placement) -> int:
    from quantroll.compare.current import note_stale, split_current
    from quantroll.compare.inventory import load_inventory, write_inventory
    from quantroll.compare.parallel import run_all
    from quantroll.compare.report import terminal_tables, write_report
    from quantroll.compare.runner import prepare_checkpoints, run_one
    from quantroll.compare.summary import load_runs, summarize

    out = setup.out_dir
    print(f"compare: {len(specs)} runs on {label} ({args.device}), {args.num_rollout} steps each -> {out}")
    if args.bf16_exceptions is not None and args.bf16_exceptions.strip() == "auto":
        import dataclasses

        setup = dataclasses.replace(setup, exceptions=auto_exceptions(setup, specs, args))
    checkpoints = prepare_checkpoints(setup, specs)
    write_inventory(out, checkpoints)
    start = time.perf_counter()
    numbered = list(enumerate(specs, 1))

    def one(item, slot, stop):
        i, spec = item
        where = f", GPU {placement.gpu(slot)}" if placement.gpu(slot) is not None else ""
        print(f"[{i}/{len(specs)}] {spec.run_id} ({time.perf_counter() - start:.0f} s{where})", flush=True)
        record = run_one(setup, spec, checkpoints, train_config, log=print, env=placement.env(slot),
                         placed=placement.record(slot), stop=stop)
        if record["status"] == "failed":
            print(f"  {spec.run_id} failed: {record['error']}")
        return record

    try:
        run_all(numbered, one, placement)
        current, stale = split_current(load_runs(out), specs)
        summary = note_stale(summarize(current, load_inventory(out)), stale)
        paths = write_report(out, summary)
    except KeyboardInterrupt:  # the report too: rerunning writes it from the kept runs
        print(f"quantroll compare: interrupted: finished runs are kept in {out}; run the same command again to "
              "continue", file=sys.stderr)
        return 130
    print()
    print(terminal_tables(summary))
    print(f"\nreport: {paths.get('report.md')}  {paths.get('report.html')}  ({time.perf_counter() - start:.0f} s)")
    failed = [r for r in summary.get("runs", []) if r.get("status") == "failed"]
    if failed:  # the report covers the others; the exit status tells scripts that something broke
        print(f"{len(failed)} of {len(specs)} runs failed (errors in the report); rerun to retry them", file=sys.stderr)
        return 1
    return 0
