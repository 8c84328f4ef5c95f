"""The frozen forward plan (model/kernel_config.ForwardPlan): chosen once where an engine
(engine/plan.py) or a trainer (load_policy) is built, handed to the model once
(CausalLM.prepare_), read by every module. Two engines and a trainer in one process,
each on its own plan, compute exactly what each computes alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.engine import Engine, SamplingParams
from quantroll.engine.plan import engine_plan, linear_backend
from quantroll.errors import QuantrollError
from quantroll.formats import get_format
from quantroll.model.kernel_config import (DEFAULT_KERNELS, DEFAULT_PLAN, INVARIANT_KERNELS, ForwardPlan,
                                           TrainFormat)
from quantroll.model.linear import QLinear
from quantroll.model.loader import load_model
from quantroll.trainer.policy import load_policy

PROMPTS = [[5, 9, 17], [3, 1, 4, 1, 5, 9, 2, 6], [42, 7]]
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(), seed=11)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def fp8_dir(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "fp8"
    convert_checkpoint(tiny_qwen3_dir, out, ConvertConfig(format="fp8", progress=False))
    return out


def test_the_plan_and_what_modules_read_from_it_cannot_be_assigned(tiny_qwen3_dir):
    plan = ForwardPlan(linear_backend="emulated")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.linear_backend = "fp8"
    train = TrainFormat(get_format("fp8"), frozenset({"a"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        train.real_fp8 = True
    model, _ = load_model(tiny_qwen3_dir, dtype=torch.float32)
    layer = model.model.layers[0].self_attn.q_proj
    for name, value in (("backend", "fp8"), ("kernels", INVARIANT_KERNELS)):
        with pytest.raises(AttributeError):
            setattr(layer, name, value)  # read from the plan: no setter
    with pytest.raises(AttributeError):
        model.kernels = INVARIANT_KERNELS


def test_bad_plans_are_refused_in_one_line():
    with pytest.raises(QuantrollError, match="must be a KernelConfig"):
        ForwardPlan(kernels="invariant")
    with pytest.raises(QuantrollError, match="batch-invariant kernels replace the fused"):
        ForwardPlan(kernels=INVARIANT_KERNELS, fused_ops=True)
    with pytest.raises(QuantrollError, match="frozenset of layer names"):
        TrainFormat(get_format("fp8"), {"model.layers.0.mlp.up_proj"})


def test_a_model_is_prepared_once(tiny_qwen3_dir):
    model, _ = load_model(tiny_qwen3_dir, dtype=torch.float32)
    assert model.plan is DEFAULT_PLAN  # not yet handed one
    plan = ForwardPlan(fuse_projections=True)
    model.prepare_(plan)
    fused = model.model.layers[0].self_attn.qkv_proj
    assert fused is not None and fused.plan is plan  # the fused linears take the plan too
    assert all(m.plan is plan for m in model.modules() if hasattr(m, "plan"))
    model.prepare_(ForwardPlan(fuse_projections=True))  # an equal plan: nothing to do
    assert model.model.layers[0].self_attn.qkv_proj is fused
    with pytest.raises(QuantrollError, match="already prepared with another forward plan"):
        model.prepare_(ForwardPlan(kernels=INVARIANT_KERNELS))
    assert all(m.plan is plan for m in model.modules() if hasattr(m, "plan"))  # the refusal changed nothing
    with pytest.raises(QuantrollError, match="takes a ForwardPlan"):
        model.prepare_(INVARIANT_KERNELS)


def test_the_engine_plans_from_device_format_and_options(fp8_dir, tiny_qwen3_dir):
    engine = Engine(fp8_dir, dtype=torch.float32)
    assert engine.plan == ForwardPlan(kernels=DEFAULT_KERNELS, linear_backend="emulated", fuse_projections=True)
    assert all(m.plan is engine.plan for m in engine.model.modules() if hasattr(m, "plan"))
    assert engine.precision == "fp8 (emulated)" and engine.fused_projections
    invariant = Engine(tiny_qwen3_dir, dtype=torch.float32, kernels=INVARIANT_KERNELS)
    # on the CPU the invariant GEMM's blocking follows the shape: q/k/v and gate/up stay apart
    assert invariant.plan == ForwardPlan(kernels=INVARIANT_KERNELS) and not invariant.fused_projections
    assert invariant.precision == "bfloat16 (float32 compute)"
    cfg = engine.config
    assert engine_plan(DEFAULT_KERNELS, cfg, get_format("fp8"), CPU, fp8_kernels=True, fused_kernels=True) == \
        ForwardPlan(fuse_projections=True)  # a CPU engine never takes GPU kernels, asked or not


def test_the_linear_backend_is_the_formats_real_gemm_only_where_asked_and_served():
    cuda, fp8, nvfp4 = torch.device("cuda"), get_format("fp8"), get_format("nvfp4")
    assert linear_backend(fp8, cuda, True, True) == "fp8"
    assert linear_backend(fp8, cuda, True, False) == "emulated"  # --fp8-kernels off: exact emulation
    assert linear_backend(fp8, cuda, False, True) == "emulated"  # no GPU kernels (no Triton, invariant)
    assert linear_backend(nvfp4, cuda, True, True) == "emulated"  # no hardware GEMM for the format
    assert linear_backend(None, cuda, True, True) == "emulated"
    if not torch.cuda.is_available():
        assert linear_backend(fp8, cuda, True, None) == "emulated"  # None: whether the device has them


def _generate(engine: Engine) -> list[tuple[list[int], list[float]]]:
    return [(r.tokens, r.logprobs) for r in engine.generate(PROMPTS, PARAMS)]


def _logits(policy) -> torch.Tensor:
    ids = torch.tensor([[5, 9, 17, 3, 1, 4, 1, 5]])
    with torch.no_grad():
        return policy(ids)


def test_engines_and_a_trainer_on_different_plans_in_one_process_keep_their_own_forward(fp8_dir, tiny_qwen3_dir):
    """Each built alone, then all built together and run interleaved: the same bits. The
    plans differ where it shows (the trainer's FP8 forward moves its logits)."""
    names = frozenset(Engine(fp8_dir, dtype=torch.float32).quantized_layers())
    train = TrainFormat(get_format("fp8"), names)

    def emulated():
        return Engine(fp8_dir, dtype=torch.float32)

    def invariant():
        return Engine(fp8_dir, dtype=torch.float32, kernels=INVARIANT_KERNELS)

    def mode2():
        return load_policy(tiny_qwen3_dir, dtype=torch.float32, train=train)

    def plain():
        return load_policy(tiny_qwen3_dir, dtype=torch.float32)

    alone = {"emulated": _generate(emulated()), "invariant": _generate(invariant()),
             "mode2": _logits(mode2()), "plain": _logits(plain())}
    assert not torch.equal(alone["mode2"], alone["plain"])
    together = {"emulated": emulated(), "invariant": invariant(), "mode2": mode2(), "plain": plain()}
    for _ in range(2):
        for name in ("emulated", "invariant"):
            assert _generate(together[name]) == alone[name], name
        for name in ("mode2", "plain"):
            assert torch.equal(_logits(together[name]), alone[name]), name
    layers = {m.name: m for m in together["mode2"].modules() if isinstance(m, QLinear)}
    assert names < set(layers) and all(layers[n].plan.train_format_of(n) is train.format for n in names)
    assert layers["lm_head"].plan.train_format_of("lm_head") is None  # BF16 on the engine: BF16 here


def test_the_engine_logs_which_attention_and_linears_run_and_why(fp8_dir, tiny_qwen3_dir, caplog):
    """Issue 40's dependency rule: the engine says once, at build, which attention and which
    linear path it runs, and why (here: the CPU's reference paths, and an emulated FP8)."""
    import logging

    from quantroll.engine.plan import describe_attention, describe_linears

    with caplog.at_level(logging.INFO, logger="quantroll.engine.engine"):
        Engine(fp8_dir, device="cpu")
    lines = [r.getMessage() for r in caplog.records]
    assert "attention: torch reference attention over the bf16 cache (no CUDA device)" in lines
    assert "linears: fp8: exact emulation (no CUDA device); numbers labelled emulated" in lines
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="quantroll.engine.engine"):
        Engine(tiny_qwen3_dir, device="cpu", kernels=INVARIANT_KERNELS)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("attention: batch-invariant torch attention") for line in lines), lines
    assert "linears: BF16 checkpoint: torch GEMMs" in lines
    fp8 = get_format("fp8")
    plan = ForwardPlan(linear_backend="emulated")
    assert describe_linears(plan, fp8, CPU, False).endswith("(no CUDA device); numbers labelled emulated")
    assert "fp8_e4m3 cache" in describe_attention(plan, CPU, "fp8_e4m3")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_engine_logs_its_kernels(fp8_dir, caplog):
    import logging

    from quantroll.kernels import triton_available

    if not triton_available():
        pytest.skip("needs Triton")
    with caplog.at_level(logging.INFO, logger="quantroll.engine.engine"):
        Engine(fp8_dir, device="cuda", cache=None)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("attention: Triton paged attention over the bf16 cache") for line in lines), lines
    major, _ = torch.cuda.get_device_capability()
    if major >= 9:
        assert any(line.startswith("linears: fp8: real GEMMs") for line in lines), lines
