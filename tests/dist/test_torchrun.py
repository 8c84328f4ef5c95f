"""Across processes on the CPU (gloo, started by torchrun, 2 and 4 ranks) against one
process on the same inputs: FSDP2 training (dense, minibatches with TIS, mode 2's FP8
forward, MoE with routing replay), data-parallel engines, and the bucketed weight
broadcast (FP8 with the first-update check, NVFP4)."""

import pytest

from tests.dist import compare, scenarios
from tests.dist.launch import torchrun

pytestmark = pytest.mark.slow


# 4 ranks on a 2-core CI machine are slow: there, the cases where 4 shares differ most from 2
# (one row per rank and micro-batch; MoE experts unused on some ranks)
CASES = {2: [c[0] for c in scenarios.TRAIN_CASES], 4: ["dense-minibatches", "moe-replay"]}


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def ranks(request, engines, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"ranks{request.param}")
    done = torchrun(request.param, ["-m", "tests.dist.worker", str(out), str(engines["fp8"]), str(engines["nvfp4"]),
                                    ",".join(CASES[request.param])])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    results, tensors = compare.load(out)
    assert results["world"] == request.param
    return results, tensors


@pytest.mark.parametrize("case", [c[0] for c in scenarios.TRAIN_CASES])
def test_fsdp2_training_matches_one_process(ranks, case):
    if case not in CASES[ranks[0]["world"]]:
        pytest.skip(f"not run on {ranks[0]['world']} ranks (CI time)")
    compare.check_training(*ranks, case)


def test_data_parallel_engines_match_one_engine(ranks, engines):
    compare.check_generation(ranks[0], engines["fp8"])


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_broadcast_sync_leaves_every_engine_bitwise_equal_to_one_process(ranks, engines, fmt):
    compare.check_sync(*ranks, fmt, engines[fmt], check=fmt == "fp8")
