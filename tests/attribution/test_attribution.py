"""Attribution on the built-in (trained) dense and MoE models: a layer made sensitive on
purpose (outliers planted inside its 128x128 blocks) ranks first, the unmodified checkpoint
does not single it out, the full hybrid is the engine's rollout, and the proposal, applied
through convert + engine + trainer on fresh seeds, lowers the gap beyond 2x its spread."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantroll.attribution.hybrid import Hybrid
from quantroll.attribution.plant import plant_checkpoint
from quantroll.attribution.run import AttributeConfig, run_attribution
from quantroll.builtin import builtin_checkpoint
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.model.loader import load_model

PLANTED = 2  # a middle layer: neither first-N nor last-N rules would find it
SMALL = dict(prompts=16, samples=4, seeds=(1, 2))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    return {kind: plant_checkpoint(builtin_checkpoint(kind), root / kind, PLANTED) for kind in ("dense", "moe")}


class _Lazy(dict):
    """(kind, planted?) -> the attribution result, computed on first use: unmodified ranked
    only; planted with the proposal, verified on fresh seeds. The MoE model's per-seed gap is
    heavy-tailed (a few tokens dominate a batch), so its planted run samples twice the prompts
    and verifies on four seeds."""

    def __init__(self, planted):
        super().__init__()
        self.planted = planted

    def __missing__(self, key):
        kind, is_planted = key
        quiet = dict(log=lambda *_: None, progress=False)
        if not is_planted:
            r = run_attribution(AttributeConfig(builtin_model=kind, propose=False, verify_seeds=(), **SMALL), **quiet)
        else:
            size = dict(SMALL, prompts=32) if kind == "moe" else SMALL
            seeds = (11, 12, 13, 14) if kind == "moe" else (11, 12, 13)
            r = run_attribution(AttributeConfig(hf_checkpoint=str(self.planted[kind]), verify_seeds=seeds, **size),
                                **quiet)
        self[key] = r
        return r


@pytest.fixture(scope="module")
def results(planted):
    return _Lazy(planted)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_planted_outliers_leave_the_bf16_function_alone(planted, kind, tmp_path):
    """The outliers multiply exact zeros: removing them again gives bit-identical logits."""
    weights = load_file(str(planted[kind] / "model.safetensors"))
    n = 0
    for name, w in weights.items():
        if f"layers.{PLANTED}." in name and w.dim() == 2:
            big = w.float().abs() > 100 * w.float().abs().median()
            n += int(big.sum())
            w[big] = 0
    assert n > 0
    clean = tmp_path / "clean"
    clean.mkdir()
    for f in planted[kind].iterdir():
        if f.name != "model.safetensors":
            (clean / f.name).write_bytes(f.read_bytes())
    save_file(weights, str(clean / "model.safetensors"), metadata={"format": "pt"})
    ids = torch.tensor([[2, 30, 31, 40, 35, 33, 12, 50]])
    a, _ = load_model(planted[kind], "cpu", torch.float32)
    b, _ = load_model(clean, "cpu", torch.float32)
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_planted_layer_ranks_first(results, kind):
    r = results[kind, True]
    assert r["rank_layers"][0] == PLANTED, r["rank_layers"]
    layer = {c["key"]: c for c in r["contributions"] if c["level"] == "layer"}
    others = max(layer[i]["only"]["mean"] for i in layer if i != PLANTED)
    assert layer[PLANTED]["only"]["mean"] > others  # first by both exact measures
    assert r["rank_cells"][0][0] == PLANTED
    assert PLANTED in {c[0] for c in r["proposal"]["cells"]}


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_unmodified_checkpoint_does_not_single_out_that_layer(results, kind):
    r = results[kind, False]
    assert r["rank_layers"][0] != PLANTED, r["rank_layers"]
    layer = {c["key"]: c for c in r["contributions"] if c["level"] == "layer"}
    assert layer[PLANTED]["saved"]["mean"] < max(layer[i]["saved"]["mean"] for i in layer)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_full_hybrid_is_the_engines_rollout(results, kind):
    """The teacher-forced gap with every linear low precision equals the gap against the
    engine's own reported logprobs (KV-cache decode vs one forward: float32 rounding)."""
    r = results[kind, False]
    assert all(g > 1e-3 for g in r["gap_full_per_seed"])
    assert r["gap_engine"]["mean"] == pytest.approx(r["gap_full"]["mean"], rel=1e-3)


def test_moe_router_is_a_unit_of_its_own(results):
    r = results["moe", False]
    router = next(c for c in r["contributions"] if c["key"] == "router")
    flips = r["cheap"]["routing_flips"].values()
    assert all(0 <= v < 1 for v in flips) and max(flips) > 0
    # the full conversion's flipped choices, replayed into the BF16 model, change its logprobs
    assert router["only"]["mean"] > 0
    assert all(c[1] != "router" for c in results["moe", True]["proposal"]["cells"])  # BF16 already


def test_hybrid_swaps_back(tmp_path):
    src = builtin_checkpoint("dense")
    convert_checkpoint(src, tmp_path / "fp8", ConvertConfig(format="fp8", progress=False))
    bf16, _ = load_model(src, "cpu", torch.float32)
    fp8, _ = load_model(tmp_path / "fp8", "cpu", torch.float32)
    h = Hybrid(bf16, fp8)
    ids = torch.tensor([[2, 30, 31, 40, 35, 33]])
    with torch.no_grad():
        before = bf16(ids)
        with h.low_precision(h.quantized) as m:
            low = m(ids)
            assert torch.allclose(low, fp8(ids), atol=1e-5, rtol=0)  # the converted model's numerics
        assert torch.equal(bf16(ids), before) and not torch.equal(low, before)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_proposal_verified_beyond_twice_the_spread(results, kind):
    """The proposal's flags through convert + engine + BF16 trainer on three fresh seeds."""
    r = results[kind, True]
    v = r["verification"]
    assert v["spread"] is not None and v["reduction"] > 2 * v["spread"], json.dumps(v)
    assert v["significant"] is True
    assert r["proposal"]["reached"] and r["proposal"]["extra_bytes"] > 0
