"""Units, flag sets and the greedy proposal: pure functions, checked against convert's own
planner (the flags must keep exactly the cells asked for) and against hand-made answers."""

import random

import numpy as np
import pytest
import torch

from quantroll.attribution.divergence import relative_error, routing_flips
from quantroll.attribution.flagset import FlagSet, kept_modules, parse, render
from quantroll.attribution.propose import greedy
from quantroll.attribution.units import cell_of, cells_of, kind_of
from quantroll.builtin import builtin_checkpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.errors import QuantrollError


def shapes_of(kind):
    with CheckpointReader(builtin_checkpoint(kind)) as r:
        return {n: i.shape for n, i in r.tensors.items()}, r.config["num_hidden_layers"]


def quantized_modules(shapes, num_layers):
    everything = {n[: -len(".weight")] for n in shapes if n.endswith(".weight")}
    return everything - kept_modules(FlagSet(), shapes, "fp8", num_layers)


def test_kinds_of_qwen3_names():
    assert kind_of("model.layers.3.self_attn.k_proj") == "qkv"
    assert kind_of("model.layers.3.self_attn.o_proj") == "o"
    assert kind_of("model.layers.3.mlp.up_proj") == "gate_up"
    assert kind_of("model.layers.3.mlp.down_proj") == "down"
    assert kind_of("model.layers.3.mlp.experts.7.down_proj") == "experts"
    assert kind_of("model.layers.3.mlp.gate") is None  # the router: never quantized
    assert cell_of("lm_head") is None and cell_of("model.layers.12.mlp.gate_proj") == (12, "gate_up")


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_rendered_flags_keep_exactly_the_cells_asked_for(kind):
    """Every kept set, rendered as flags and applied by convert's planner, keeps those cells'
    modules and quantizes every other cell: random sets plus whole layers, prefixes, suffixes,
    one kind in every layer and everything."""
    shapes, num_layers = shapes_of(kind)
    modules = quantized_modules(shapes, num_layers)
    cells = cells_of(modules)
    all_cells = set(cells)
    rng = random.Random(0)
    sets = [set(), all_cells, {c for c in all_cells if c[0] == 0}, {c for c in all_cells if c[0] in (0, 3)},
            {c for c in all_cells if c[0] in (1, 2)}, {c for c in all_cells if c[1] == "qkv"},
            {c for c in all_cells if c[1] == "o" or c[0] == 3}]
    sets += [set(rng.sample(sorted(all_cells), rng.randint(1, len(all_cells)))) for _ in range(25)]
    for kept in sets:
        flags = render(kept, all_cells, num_layers)
        want = {m for c in kept for m in cells[c]}
        got = kept_modules(parse(flags.text()), shapes, "fp8", num_layers) & modules
        assert got == want, (sorted(kept), flags.text())


def test_render_uses_layer_counts_and_kind_patterns():
    shapes, num_layers = shapes_of("dense")
    all_cells = set(cells_of(quantized_modules(shapes, num_layers)))
    flags = render({c for c in all_cells if c[0] in (0, 3)}, all_cells, num_layers)
    assert (flags.num_layers_at_start_in_bf16, flags.num_layers_at_end_in_bf16, flags.skip) == (1, 1, ())
    flags = render({c for c in all_cells if c[1] == "down"}, all_cells, num_layers)
    assert flags.skip == ("*.mlp.down_proj",)
    assert render(set(), all_cells, num_layers).empty


@pytest.mark.parametrize("text", ["--skip", "--num-layers-at-start-in-bf16 x", "--lr 1e-4", "--skip 'a",
                                  "--num-layers-at-end-in-bf16 -1"])
def test_parse_refuses_what_is_not_a_flag_set(text):
    with pytest.raises(QuantrollError, match="--bf16-exceptions"):
        parse(text)


def test_parse_round_trips_text():
    f = FlagSet(1, 2, ("model.layers.2.*", "*.self_attn.[qkv]_proj"))
    assert parse(f.text()) == f


def test_greedy_on_an_additive_gap():
    """Gap = sum of the weights of the cells not kept: the greedy picks the largest first and
    stops at the target; among candidates that reach it, the cheapest in bytes."""
    weight = {(0, "qkv"): 5.0, (1, "qkv"): 3.0, (2, "qkv"): 1.0, (3, "qkv"): 0.5}
    gap = lambda kept: sum(v for c, v in weight.items() if c not in kept)  # noqa: E731
    cost = dict.fromkeys(weight, 1)
    steps, start = greedy(list(weight), gap, target=2.0, cost=cost)
    assert start == 9.5 and [s.cell for s in steps] == [(0, "qkv"), (1, "qkv")] and steps[-1].gap == 1.5
    cost[(0, "qkv")] = 10  # (0) and (1) each alone do not reach 4.6; reaching is only possible later
    steps, _ = greedy(list(weight), gap, target=4.6, cost=cost)
    assert [s.cell for s in steps] == [(0, "qkv")]  # the only one reaching 4.6 in one step
    steps, _ = greedy(list(weight), gap, target=6.6, cost=cost)
    assert [s.cell for s in steps] == [(1, "qkv")]  # both reach 6.6: the cheaper one
    assert greedy(list(weight), gap, target=10.0, cost=cost)[0] == []


def test_relative_error_and_flips_against_numpy():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 5, 7, generator=g), torch.randn(6, 5, 7, generator=g)
    valid = torch.rand(6, 5, generator=g) > 0.3
    an, bn, vn = a.numpy().astype(np.float64), b.numpy().astype(np.float64), valid.numpy()
    want = np.linalg.norm(an[vn] - bn[vn]) / np.linalg.norm(bn[vn])
    assert relative_error(a, b, valid) == pytest.approx(want, rel=1e-12)
    x = torch.tensor([[0, 1], [2, 3], [4, 5], [1, 0]])
    y = torch.tensor([[1, 0], [2, 4], [4, 5], [7, 0]])
    assert routing_flips(x, y, torch.tensor([True, True, True, False])) == pytest.approx(1 / 3)
