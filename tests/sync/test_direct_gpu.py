"""The direct one-GPU weight update (run on the device; skipped on CPU): bitwise equal to
the quantize-then-load path, on the fused engine, for fp8, mxfp8 and a BF16 engine; the
first-update check passes bitwise through it; a NaN is named."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from quantroll.builtin import builtin_checkpoint  # noqa: E402
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint  # noqa: E402
from quantroll.engine import Engine  # noqa: E402
from quantroll.errors import NonFiniteError  # noqa: E402
from quantroll.sync import WeightSync, check_weight_update  # noqa: E402
from quantroll.trainer.policy import load_policy  # noqa: E402


@pytest.fixture(scope="module")
def engine_dirs(tmp_path_factory):
    out = {"bf16": builtin_checkpoint("dense")}
    for fmt in ("fp8", "mxfp8"):
        out[fmt] = tmp_path_factory.mktemp(fmt) / fmt
        convert_checkpoint(out["bf16"], out[fmt], ConvertConfig(format=fmt, progress=False))
    return out


def _moved_policy():
    policy = load_policy(builtin_checkpoint("dense"), device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g, device="cuda"))
    return policy


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "bf16"])
def test_direct_update_is_bitwise_the_general_path(engine_dirs, fmt):
    policy = _moved_policy()
    named = dict(policy.named_parameters())
    direct, general = Engine(engine_dirs[fmt], device="cuda"), Engine(engine_dirs[fmt], device="cuda")
    sync = WeightSync(direct)
    for _ in range(2):  # the second push replays the graphs built by the first
        timing = sync.push(named)
    assert sync._direct is not None, "the direct path did not apply"
    WeightSync(general, direct=False).push(named)
    a, b = direct.state(), general.state()
    for name in b:
        assert torch.equal(a[name].reshape(-1).view(torch.uint8), b[name].reshape(-1).view(torch.uint8)), name
    assert timing.version == 2


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_an_engine_on_the_invariant_kernels_takes_the_direct_path_and_samples_the_new_weights(engine_dirs, fmt):
    """True on-policy mode: the forward runs the invariant kernels (no ``gpu_kernels``), the
    update still goes through the direct path, and the forward after it computes what an
    engine loaded by the general path computes (an emulated layer's dequantized cache
    dropped)."""
    from quantroll.model.kernel_config import INVARIANT_KERNELS

    policy = _moved_policy()
    named = dict(policy.named_parameters())
    direct = Engine(engine_dirs[fmt], device="cuda", kernels=INVARIANT_KERNELS)
    general = Engine(engine_dirs[fmt], device="cuda", kernels=INVARIANT_KERNELS)
    assert not direct.gpu_kernels
    ids = torch.tensor([[3, 17, 29, 5, 11]], device="cuda")
    with torch.no_grad():
        before = direct.model(ids).clone()  # fills any dequantized caches from the checkpoint's weights
    sync = WeightSync(direct)
    sync.push(named)
    assert sync._direct is not None, "the direct path did not apply"
    WeightSync(general, direct=False).push(named)
    for name, t in general.state().items():
        assert torch.equal(direct.state()[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
    with torch.no_grad():
        after, want = direct.model(ids), general.model(ids)
    assert not torch.equal(after, before)
    assert torch.equal(after, want)


def test_first_update_check_passes_bitwise_on_the_direct_path(engine_dirs):
    engine = Engine(engine_dirs["fp8"], device="cuda")
    policy = load_policy(builtin_checkpoint("dense"), device="cuda", dtype=torch.bfloat16)
    sync = WeightSync(engine)
    errors = check_weight_update(engine, lambda: sync.push(dict(policy.named_parameters())), allow_quant_error=False)
    assert errors and max(errors.values()) == 0.0


@pytest.mark.parametrize("name", ["model.layers.1.mlp.down_proj.weight", "model.norm.weight"])
def test_a_nan_is_named(engine_dirs, name):
    engine = Engine(engine_dirs["fp8"], device="cuda")
    policy = load_policy(builtin_checkpoint("dense"), device="cuda", dtype=torch.bfloat16)
    named = dict(policy.named_parameters())
    sync = WeightSync(engine)
    sync.push(named)
    with torch.no_grad():
        named[name].view(-1)[3] = float("nan")
    with pytest.raises(NonFiniteError, match=name.replace(".", r"\.")):
        sync.push(named)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8"])
def test_a_source_with_its_engine_on_the_meta_device_quantizes_the_same_bits_on_its_gpu(engine_dirs, fmt):
    """The weight broadcast's source (engines on ranks of their own) holds no engine
    weights: it quantizes on its GPU with the Triton plan, and must send exactly what an
    engine on that GPU would have quantized."""
    from quantroll.sync.update_quantizer import UpdateQuantizer

    named = {n: p.detach() for n, p in _moved_policy().named_parameters()}
    source = UpdateQuantizer(Engine(engine_dirs[fmt], device="meta"), "cuda")
    assert source.gpu_path
    got = source.quantize(named)
    want = WeightSync(Engine(engine_dirs[fmt], device="cuda")).quantize(named)
    assert set(got) == set(want)
    for name, w in want.items():
        if isinstance(w, torch.Tensor):
            assert torch.equal(got[name], w), name
        else:
            assert torch.equal(got[name].data.view(torch.uint8), w.data.view(torch.uint8)), name
            assert torch.equal(got[name].scale, w.scale), name
