"""One rank of ``quantroll train`` across processes: what ``run_training`` does in one
process, with the checks agreed between ranks and the outputs written by rank 0 only.

Started by torchrun (``torchrun --nproc-per-node N -m quantroll train ...``) or by the Ray
launcher (quantroll/distributed/ray_launch.py); both give every rank the same flags. Every rank
takes part in the checks before the run. Colocated, every rank then runs the loop: it
loads the engine and the trainer, and shards the trainer. With engines on ranks of their
own (``--rollout-num-gpus R``), the trainer ranks run the loop and the last R ranks serve
their requests (quantroll/distributed/engine_ranks.py) until trainer rank 0 says stop. Rank 0
alone holds the locks of the outputs, writes the metrics, the saves and the export.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import replace

from quantroll.distributed.context import DistContext, destroy_process_group, init_process_group
from quantroll.distributed.liveness import Heartbeat, Stopped, stop_on_sigterm
from quantroll.distributed.groups import RankGroups
from quantroll.distributed.placement import Ranks
from quantroll.distributed.trainer_rows import check_divisible
from quantroll.rl.config import TrainConfig


def _store():
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def run_rank(cfg: TrainConfig, ctx: DistContext, train, serve, check_prompt_lengths, progress: bool = True,
             log=print, bucket_bytes: int | None = None) -> list[dict]:
    """``train``, ``serve`` (an engine rank's part) and ``check_prompt_lengths``: the loop's own
    steps (rl/loop.py passes them, so that this module, which the loop dispatches to, does not
    import the loop back). An engine rank returns no metrics."""
    from quantroll.rl.checkpoints import resolve_checkpoints
    from quantroll.rl.claim import Claim, claim_outputs
    from quantroll.rl.preflight import check_memory, check_outputs
    from quantroll.rl.rollout import build_task

    stop_on_sigterm()
    init_process_group(ctx)
    store = _store()
    beat = Heartbeat(store, ctx.rank)
    groups = RankGroups.of(ctx)
    print(f"quantroll: rank {ctx.rank} of {ctx.world_size} (pid {os.getpid()}) on {ctx.device}, {ctx.backend}, "
          f"{groups.role}", file=sys.stderr, flush=True)
    place = Ranks(ctx, store, bucket_bytes, groups)
    quiet = log if ctx.is_source else (lambda *args, **kwargs: None)
    # the conversion (--rollout-precision) is made by every rank into its own temporary directory,
    # except rank 0's, which goes to --convert-dir when given
    cfg = replace(cfg, models=replace(cfg.models, device=str(ctx.device),
                                      convert_dir=cfg.models.convert_dir if ctx.is_source else None))
    finished = False
    try:
        def prepare():
            check_divisible(cfg.rollout.rollout_batch_size * cfg.rollout.n_samples_per_prompt,
                            cfg.optimizer.global_batch_size, ctx.world_size - ctx.engine_ranks)
            if ctx.is_source:
                check_outputs(cfg)
            check_memory(cfg, shards=max(1, ctx.world_size - ctx.engine_ranks))
            task, eval_problems = build_task(cfg.rollout)
            check_prompt_lengths(cfg, task, eval_problems)
            return task, eval_problems

        task, eval_problems = place.agree_all(prepare)
        with contextlib.ExitStack() as stack:
            claim = place.agree_all(lambda: stack.enter_context(claim_outputs(cfg, quiet)) if ctx.is_source
                                    else Claim(None, False))
            engine_dir, trainer_dir = place.agree_all(lambda: stack.enter_context(resolve_checkpoints(cfg)))
            if groups.is_engine_rank:
                serve(cfg, engine_dir, place)
                history = []
            else:
                try:
                    history = train(cfg, engine_dir, trainer_dir, progress, task, eval_problems, claim, quiet, place)
                except BaseException as err:
                    place.release_engines(err)
                    raise
                place.release_engines(None)
        finished = True
        return history
    except Stopped:  # stopped outside any stage (start-up, between stages)
        raise place.failure("the run") from None
    finally:
        beat.stop()
        if finished:  # after a failure a peer may be gone: leave the group to the process's exit
            destroy_process_group()
