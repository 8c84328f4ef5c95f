"""``quantroll train``: the RL loop, one verb per stage.

    for step in range(num_rollout):
        batch   = rollout(engine, ...)                # rollout precision
        metrics = train_on_batch(policy, batch, ...)  # old logprobs, gap, corrections, update
        timing  = sync.push(policy weights)           # re-quantize into the engine, in place
        sink.write(metrics)                           # one JSON line, flushed

Step 0's gap is measured on a rollout of the initial weights, before any update.
Held-out evaluation (--eval-interval N) runs at the start of a step, on the weights
that step's rollout samples from: step 0 (the initial weights), every N steps, and the
last step, so that a reward curve can always be read against held-out accuracy.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from quantroll.compute import resolve_compute_dtype
from quantroll.engine import Engine, SamplingParams
from quantroll.errors import QuantrollError
from quantroll.formats import recipe_args
from quantroll.metrics.sink import JsonlSink
from quantroll.metrics.tensorboard import TensorBoardSink
from quantroll.rl.checkpoints import resolve_checkpoints
from quantroll.rl.config import TrainConfig
from quantroll.rl.memory import engine_memory, peak_memory_gib, trainer_memory
from quantroll.rl.rollout import build_task, rewards_by_length, rollout
from quantroll.rl.evaluate import engine_is_trainer_policy, evaluate
from quantroll.evaluation.policy_engine import PolicyEngine
from quantroll.builtin import builtin_checkpoint
from quantroll.durable import writing
from quantroll.engine.sampling import SEED_LIMIT
from quantroll.kernels.quantize import triton_available
from quantroll.model.kernel_config import DEFAULT_KERNELS, INVARIANT_KERNELS, TrainFormat
from quantroll.rl.claim import start_over
from quantroll.rl.metricsfile import continue_after
from quantroll.rl.state import changed_settings, load_state, save_state
from quantroll.rl.step import train_on_batch
from quantroll.rl.placement import OneProcess
from quantroll.trainer.export import save_hf_checkpoint
from quantroll.trainer.policy import load_policy


def _train_format(cfg: TrainConfig, engine: Engine) -> TrainFormat | None:
    """Modes 2-4: the trainer's forward uses the engine's quantization on the layers the
    engine holds quantized (so first/last BF16 layers match on both sides); part of the
    policy's forward plan (load_policy)."""
    if not cfg.precision.train_recipe:
        return None
    if engine.format is None or engine.format.name != cfg.precision.train_recipe:
        recipe = cfg.precision.train_recipe  # named as the user typed it: '--fp8-recipe blockwise', not 'fp8'
        raise QuantrollError(f"{' '.join(recipe_args(recipe))} needs the engine in {recipe}: add "
                             f"--rollout-precision {recipe} or give an {recipe} --hf-checkpoint; the engine's "
                             f"checkpoint holds {engine.format.name if engine.format else 'bf16'}")
    fmt = engine.format
    # the trainer's device decides (a trainer rank's engine may be a description on the meta
    # device); the GPU kernels run where an engine on this device would run them
    real = (not fmt.emulated_only and torch.device(cfg.models.device).type == "cuda" and triton_available()
            and not cfg.precision.true_on_policy_mode)
    return TrainFormat(fmt, frozenset(engine.quantized_layers()), real)


def _tokenizer(checkpoint: str | Path):
    from quantroll.tasks.tokenizer import load_tokenizer

    try:
        return load_tokenizer(Path(checkpoint))
    except QuantrollError:
        raise
    except Exception as err:  # the tokenizers library's own errors: a damaged tokenizer.json
        raise QuantrollError(f"{Path(checkpoint) / 'tokenizer.json'} cannot be read as a tokenizer ({err}); "
                             "restore it from the checkpoint's source") from None


def run_training(cfg: TrainConfig, progress: bool = True, log=print, engine_ranks: int = 0) -> list[dict]:
    """Run ``cfg.rollout.num_rollout`` RL steps; returns the metrics records (also written to
    ``cfg.output.metrics_file``). Everything that can be checked is checked before anything is
    written: flags, output paths, the prompt data (rows, types, lengths in tokens), the
    locks and the state of the outputs (quantroll/rl/claim.py). ``engine_ranks``: in a
    multi-process run, how many of the last ranks hold an engine only (--rollout-num-gpus
    without --colocate; 0: colocated)."""
    from quantroll.distributed.context import from_environ
    from quantroll.rl.claim import claim_outputs
    from quantroll.rl.preflight import check_memory, check_outputs

    if (ctx := from_environ(cfg.models.device, engine_ranks)) is not None:  # a rank of a torchrun / Ray run
        from quantroll.rl.ranks import run_rank

        return run_rank(cfg, ctx, _train, _serve, _check_prompt_lengths, progress, log)
    check_outputs(cfg)
    check_memory(cfg)
    task, eval_problems = build_task(cfg.rollout)
    _check_prompt_lengths(cfg, task, eval_problems)
    with claim_outputs(cfg, log) as claim:
        with resolve_checkpoints(cfg) as (engine_dir, trainer_dir):
            return _train(cfg, engine_dir, trainer_dir, progress, task, eval_problems, claim, log)


def _check_prompt_lengths(cfg: TrainConfig, task, eval_problems) -> None:
    """Every prompt of the user's data fits the model's context with its response, and a
    built-in task's text is spelled by the checkpoint's tokenizer: one line naming the first
    that does not, before any model is loaded."""
    from quantroll.model.config import load_model_config
    from quantroll.tasks.data import check_prompt_lengths, check_spelled

    source = Path(cfg.models.hf_checkpoint) if cfg.models.hf_checkpoint else builtin_checkpoint(cfg.models.builtin_model)
    context = load_model_config(source).max_position_embeddings  # config.json first: the checkpoint's core
    tokenizer = _tokenizer(source)
    if not cfg.rollout.prompt_data:  # a built-in task: the checkpoint's tokenizer spells it, its answers fit
        rng = random.Random(0)
        sampled = [task.sample(rng) for _ in range(8)]
        check_spelled(sampled, tokenizer, str(source), cfg.rollout.task)
        check_prompt_lengths(sampled, tokenizer, context, cfg.rollout.rollout_max_response_len,
                             f"--task {cfg.rollout.task}")
    if cfg.rollout.prompt_data:
        check_prompt_lengths(task.problems, tokenizer, context, cfg.rollout.rollout_max_response_len, "--prompt-data")
    if cfg.rollout.eval_data and eval_problems:
        check_prompt_lengths(eval_problems, tokenizer, context, cfg.rollout.rollout_max_response_len, "--eval-data")


ARCHITECTURE_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                      "moe_intermediate_size", "tie_word_embeddings")


def _check_same_architecture(cfg: TrainConfig, engine_cfg, policy_cfg) -> None:
    """The trainer must train the model the engine samples from, and MoE-only switches need
    a MoE model: refused before any step, naming the field."""
    for name in ARCHITECTURE_FIELDS:
        if getattr(engine_cfg, name) != getattr(policy_cfg, name):
            raise QuantrollError(f"--ref-load's {name} is {getattr(policy_cfg, name)} but --hf-checkpoint's is "
                                 f"{getattr(engine_cfg, name)}: the trainer must hold the model the engine runs")
    if (cfg.correction.rollout_routing_replay or cfg.correction.routing_replay) and not engine_cfg.num_experts:
        raise QuantrollError("--use-rollout-routing-replay/--use-routing-replay need a MoE model; this one is dense")


def _engine(cfg: TrainConfig, engine_dir: Path, device: str | None = None) -> Engine:
    """The rollout engine the settings ask for (its KV pool is allocated at its first generate);
    ``device``: where it lives when not --device (the meta device: a description only)."""
    dtype = resolve_compute_dtype(cfg.models.device, cfg.models.compute_dtype)
    kernels = INVARIANT_KERNELS if cfg.precision.true_on_policy_mode else DEFAULT_KERNELS
    return Engine(engine_dir, device=device or cfg.models.device, dtype=dtype, kernels=kernels,
                  cache=cfg.engine.cache(), scheduler=cfg.engine.scheduler())


def _serve(cfg: TrainConfig, engine_dir: Path, place) -> None:
    """An engine rank of a run whose engines have ranks of their own: load the engine and
    serve the trainer ranks' requests (rollouts, weight updates) until the run ends."""
    torch.manual_seed(cfg.rollout.seed)
    place.serve(_engine(cfg, engine_dir))


def _train(cfg: TrainConfig, engine_dir: Path, trainer_dir: Path, progress: bool, task, eval_problems, claim,
           log, place=None) -> list[dict]:
    """``place``: where the pieces run (quantroll/rl/placement.py; default this process).
    With engines on ranks of their own, ``engine`` here is a description on the meta
    device, never sampled from: it answers for the checkpoint (format, stop tokens,
    config) and describes the format to the weight broadcast; the engine ranks sample,
    and ``engines`` carries what they compute in (precision, KV cache)."""
    place = place or OneProcess()
    torch.manual_seed(cfg.rollout.seed)
    dtype = resolve_compute_dtype(cfg.models.device, cfg.models.compute_dtype)
    if torch.device(cfg.models.device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(cfg.models.device)
    kernels = INVARIANT_KERNELS if cfg.precision.true_on_policy_mode else DEFAULT_KERNELS
    engine = _engine(cfg, engine_dir, place.engine_device(cfg.models.device))
    policy = load_policy(trainer_dir, device=cfg.models.device, dtype=dtype, kernels=kernels,
                         train=_train_format(cfg, engine))
    _check_same_architecture(cfg, engine.config, policy.config)
    if cfg.precision.true_on_policy_mode:
        from quantroll.rl import true_on_policy

        true_on_policy.check_engine(engine, cfg.precision.train_recipe)
        true_on_policy.probe(engine, policy)
        for line in true_on_policy.notes(cfg, bool(engine.config.moe_layers)):
            log(line)
    ref_policy = place.ref_policy(policy) if cfg.optimizer.use_kl_loss else None
    place.shard(policy)
    if ref_policy is not None:
        place.shard(ref_policy)
    optimizer = place.optimizer(policy, cfg.optimizer.lr)
    with place.stage("the weight sync's set-up"):
        push = place.sync(engine, policy)
        engines = place.engines(engine)
    memory = engine_memory(engine)
    tokenizer = _tokenizer(engine_dir)
    rng = random.Random(cfg.rollout.seed)
    first_step = 0
    if cfg.output.load:
        source = ("--ref-load" if cfg.models.ref_load else "--hf-checkpoint" if cfg.models.hf_checkpoint
                  else f"the built-in {cfg.models.builtin_model} model")
        first_step = place.agree(lambda: load_state(cfg.output.load, policy, optimizer, rng, source)) + 1
        changed = changed_settings(cfg.output.load, cfg) if place.writes else []
        if changed:
            log(f"--load {cfg.output.load}: resumed with settings other than the saved run's: {'; '.join(changed)}")
        if place.writes and not cfg.output.save:
            log(f"--load {cfg.output.load} without --save: the steps from here on are not saved (add --save "
                f"{cfg.output.load} to go on saving where the run was)")
        if place.writes:
            continue_after(cfg.output.metrics_file, first_step - 1, log)
    elif claim.replaces_run:
        start_over(cfg, log)
    sink = JsonlSink(cfg.output.metrics_file if place.writes else None, append=bool(cfg.output.load))
    board = TensorBoardSink(cfg.output.tensorboard_dir if place.writes else None)

    with place.stage("the first weight update"):
        if cfg.sync.check_weight_update_equal and not cfg.output.load:
            place.check_weight_update(engine, push, cfg.sync.check_weight_update_allow_quant_error)
        elif cfg.output.load:
            push()  # the engine starts from the resumed weights
    history, bad, trainer_copy = [], 0, None
    same_policy = engine_is_trainer_policy(engine.format, cfg.engine.kv_cache_dtype, cfg.precision.true_on_policy_mode)
    bar = _progress(cfg.rollout.num_rollout - first_step, progress and place.writes)
    try:
        for step in range(first_step, cfg.rollout.num_rollout):
            held_out = {}
            if eval_problems and eval_due(step, cfg.rollout.eval_interval, cfg.rollout.num_rollout):
                started = time.perf_counter()
                with place.stage("evaluation", step):
                    if trainer_copy is None and not same_policy:  # the trainer's weights, a BF16 engine (once)
                        trainer_copy = PolicyEngine(trainer_dir, cfg.models.device, dtype, cfg.engine.cache(),
                                                    cfg.engine.scheduler())
                    held_out = evaluate(engines, trainer_copy, policy, tokenizer, task, eval_problems,
                                        cfg.rollout.rollout_max_response_len)
                held_out["eval_time"] = time.perf_counter() - started
            ro = cfg.rollout
            params = SamplingParams(temperature=ro.rollout_temperature, top_p=ro.rollout_top_p,
                                    max_new_tokens=ro.rollout_max_response_len,
                                    seed=(ro.seed * 1_000_003 + step * 100_003) % SEED_LIMIT,
                                    stop_token_ids=() if ro.rollout_ignore_eos else None)
            with place.stage("the rollout", step):
                batch = rollout(engines, tokenizer, task, rng, ro.rollout_batch_size, ro.n_samples_per_prompt, params)
            if engine.device.type == "cuda" and not cfg.engine.keep_kv_cache:
                engine.release_kv_cache()  # colocated: the trainer's step gets the KV pool's memory
            with place.stage("the training step", step):
                metrics = train_on_batch(cfg, policy, ref_policy, optimizer, batch, place.rows)
            if metrics.get("skipped_nonfinite"):
                bad += 1
                if bad >= cfg.output.max_bad_steps:
                    raise QuantrollError(f"{bad} steps in a row had a NaN/Inf loss or gradient (last at step {step}); "
                                         "lower --lr or check the data")
            else:
                bad = 0
            with place.stage("the weight update", step):
                timing = push()
            record = {
                "step": step, "rollout_precision": engines.precision, "kv_cache_dtype": engines.kv_cache_label,
                "loss_agg": cfg.optimizer.loss_agg, **({"true_on_policy": True} if cfg.precision.true_on_policy_mode else {}),
                "reward_mean": float(batch.rewards.mean()), "reward_std": float(batch.rewards.std()),
                "accuracy": float((batch.rewards >= 1.0).float().mean()),
                "reward_by_len": rewards_by_length(batch, tokenizer),
                "response_len_mean": batch.num_tokens / len(batch.results),
                **metrics, **held_out,
                "rollout_time": batch.seconds, "rollout_tokens_per_s": batch.num_tokens / batch.seconds,
                **memory, **batch.engine_stats,  # the engines' measured KV capacity over the local estimate
                **timing.metrics(), "peak_memory_gib": peak_memory_gib(torch.device(cfg.models.device)),
                **trainer_memory(policy, trainer_dir, optimizer),
            }
            with writing(f"--metrics-file {cfg.output.metrics_file}"):
                sink.write(record)
            board.write(record)
            history.append(record)
            if cfg.precision.true_on_policy_mode:
                from quantroll.rl.true_on_policy import broken

                if (failure := broken(record)) is not None:
                    raise QuantrollError(failure)
            out = cfg.output
            if out.save and out.save_interval and ((step + 1) % out.save_interval == 0 or step + 1 == ro.num_rollout):
                with writing(f"--save {cfg.output.save}"), place.stage("the save", step):
                    save_state(cfg.output.save, policy, optimizer, step, rng, cfg, write=place.writes)
            if bar is not None:
                bar.set_postfix(reward=f"{record['reward_mean']:.2f}",
                                gap=f"{record['train_rollout_logprob_abs_diff']:.2e}")
                bar.update(1)
        if cfg.output.save_hf:
            with writing(f"--save-hf {cfg.output.save_hf}"), place.stage("the export"):
                whole = place.exportable(policy, trainer_dir, dtype)
                if whole is not None:
                    save_hf_checkpoint(whole, trainer_dir, cfg.output.save_hf, force=cfg.output.force,
                                       what=f"--save-hf {cfg.output.save_hf}")
    except BaseException:
        if bar is not None:
            bar.leave = False  # a failure's one line is the error, not a half-full bar above it
        raise
    finally:
        sink.close()
        board.close()
        if bar is not None:
            bar.close()
    return history


def eval_due(step: int, interval: int, num_rollout: int) -> bool:
    """Held-out evaluation at the start of ``step``: step 0, every ``interval`` steps, and
    the last step (interval 0: never)."""
    return bool(interval) and (step % interval == 0 or step == num_rollout - 1)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="rl steps", unit="step", disable=None)  # None: only on a terminal


__all__ = ["run_training"]
