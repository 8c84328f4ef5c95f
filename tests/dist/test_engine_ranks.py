"""Engines on ranks of their own (``--rollout-num-gpus`` without ``--colocate``), on the CPU
(gloo, started by torchrun): 2 trainer ranks with 1 engine rank, and with 2. Against one
process on the same inputs: FSDP2 over the trainer ranks only, the engine ranks' gathered
samples, and the weight broadcast from trainer rank 0 to every engine rank (FP8 with the
first-update check, NVFP4) bitwise."""

import pytest

from tests.dist import compare
from tests.dist.launch import torchrun

pytestmark = pytest.mark.slow

# (trainer ranks, engine ranks) -> the training cases run (CI time: 2 cores)
PLACEMENTS = {(2, 1): ["dense", "mode2-fp8", "moe-replay"], (2, 2): ["dense-minibatches"]}


@pytest.fixture(scope="module", params=list(PLACEMENTS), ids=["2-trainers-1-engine", "2-trainers-2-engines"])
def ranks(request, engines, tmp_path_factory):
    trainers, engine_ranks = request.param
    out = tmp_path_factory.mktemp(f"t{trainers}e{engine_ranks}")
    done = torchrun(trainers + engine_ranks, ["-m", "tests.dist.worker", str(out), str(engines["fp8"]),
                                              str(engines["nvfp4"]), ",".join(PLACEMENTS[request.param]),
                                              str(engine_ranks)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    results, tensors = compare.load(out)
    assert results["world"] == trainers + engine_ranks and results["engine_ranks"] == engine_ranks
    return results, tensors, request.param


def test_fsdp2_over_the_trainer_ranks_matches_one_process(ranks):
    results, tensors, placement = ranks
    for case in PLACEMENTS[placement]:
        compare.check_training(results, tensors, case)


def test_engine_ranks_samples_equal_one_engine(ranks, engines):
    compare.check_generation(ranks[0], engines["fp8"])


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_broadcast_leaves_every_engine_rank_bitwise_equal_to_one_process(ranks, engines, fmt):
    results, tensors, (_, engine_ranks) = ranks
    assert len(results[f"sync/{fmt}"]["digests"]) == engine_ranks  # every engine rank took the update
    compare.check_sync(results, tensors, fmt, engines[fmt], check=fmt == "fp8")
    timing = results[f"sync/{fmt}"]["timing"]
    assert timing["weight_load_time"] > 0 and timing["weight_quantize_time"] > 0  # the engines' load reached rank 0


@pytest.mark.parametrize("mode", ["push", "check"])
def test_a_refusal_at_the_source_stops_every_rank_with_its_reason(mode):
    """Trainer rank 1 is outside the broadcast group: without the source's verdict over the
    trainer group it waited in the next unit's unshard until the collective timeout (10
    minutes; the subprocess limit here is 3)."""
    lines = _refusal_lines(mode, "source")
    assert lines["0"].startswith("QuantrollError: injected refusal at the source, unit 1")
    for rank in ("1", "2"):
        assert lines[rank].startswith("PeerFailed: rank 0:") and "injected refusal" in lines[rank], lines


@pytest.mark.parametrize("mode", ["push", "check"])
def test_a_load_refused_on_an_engine_rank_stops_every_rank_naming_it(mode):
    """The engine rank (2) refuses its second bucket: the unit's load verdict, agreed over
    the broadcast group, stops the source at that unit; trainer rank 0 says the engine
    rank's reason once (it had been left to the heartbeat, which names only a death)."""
    lines = _refusal_lines(mode, "engine")
    assert lines["0"].startswith("QuantrollError: rank 2: injected load refusal on an engine"), lines
    for rank in ("1", "2"):
        assert lines[rank].startswith("PeerFailed: ") and "rank 2: injected load refusal" in lines[rank], lines


def test_a_non_finite_load_on_an_engine_rank_stops_every_rank_naming_it():
    """The agreement hands an engine's NonFiniteError to the source under its own type; the
    source still tells trainer rank 1, outside the broadcast group (it used to wait in the
    next unit's unshard until the collective timeout)."""
    lines = _refusal_lines("push", "engine-nonfinite")
    assert lines["0"].startswith("QuantrollError: rank 2: injected non-finite load"), lines
    for rank in ("1", "2"):
        assert "rank 2: injected non-finite load" in lines[rank], lines


def test_a_non_finite_bf16_weight_stops_every_rank_at_the_source():
    """model.norm.weight travels as BF16 (no quantizer checks it): the source names it
    before sending, and every rank leaves with its name."""
    lines = _refusal_lines("push", "nan")
    assert lines["0"].startswith("NonFiniteError: weight update: tensor 'model.norm.weight' holds NaN/Inf"), lines
    for rank in ("1", "2"):
        assert "rank 0: weight update: tensor 'model.norm.weight' holds NaN/Inf" in lines[rank], lines


@pytest.mark.parametrize("mode", ["push", "check"])
def test_a_load_refused_on_one_colocated_rank_is_said_by_that_rank(mode):
    """Every rank a trainer and an engine; rank 1 refuses a bucket: it says its own reason,
    the others leave quietly at the same unit, naming it."""
    lines = _refusal_lines(mode, "colocated")
    assert lines["1"].startswith("QuantrollError: injected load refusal on an engine"), lines
    for rank in ("0", "2"):
        assert lines[rank].startswith("PeerFailed: rank 1: injected load refusal"), lines


def test_an_engine_rank_whose_layout_differs_is_named_before_any_byte_travels():
    """The layout is computed on each side from its own engine (the source's on the meta
    device): a receiver that differs would load bytes into the wrong tensors."""
    lines = _refusal_lines("push", "layout")
    assert lines["0"].startswith("QuantrollError: rank 2: the weight update's layout differs from the source's: "
                                 "this rank lays out '0 0 "), lines
    for rank in ("1", "2"):
        assert lines[rank].startswith("PeerFailed: ") and "rank 2: the weight update's layout differs" in lines[rank]


def test_an_engine_rank_that_lacks_a_tensor_is_named_before_any_byte_travels():
    """Its layout cannot be built: it says why inside the layout's agreement (it used to
    leave the sync request, and the others learned only that it died)."""
    lines = _refusal_lines("push", "missing")
    assert lines["0"].startswith("QuantrollError: rank 2: the trainer's model.norm.weight has no counterpart in the "
                                 "engine"), lines
    for rank in ("1", "2"):
        assert "rank 2: the trainer's model.norm.weight has no counterpart" in lines[rank], lines


def _refusal_lines(mode: str, where: str) -> dict[str, str]:
    import re

    done = torchrun(3, ["-m", "tests.dist.refusal_worker", mode, where], timeout=180)
    lines = dict(re.findall(r"^rank (\d): (.*)$", done.stdout, re.M))
    assert done.returncode != 0 and set(lines) == {"0", "1", "2"}, done.stdout[-3000:] + done.stderr[-3000:]
    return lines
