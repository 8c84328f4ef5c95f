"""The weight broadcast over NCCL (run on a device with 2 GPUs; skipped elsewhere): two
ranks, each a trainer shard and an engine on its own GPU, rank 0 quantizing on its GPU
and broadcasting FP8 codes + scales; every engine bitwise equal to a one-process sync on
one GPU. (NCCL refuses two ranks on one GPU, "Duplicate GPU detected", so one GPU cannot
host this exchange over NCCL.)"""

import pytest
import torch

pytestmark = pytest.mark.gpu
if torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA GPUs", allow_module_level=True)
pytest.importorskip("triton")

from quantroll.rl.placement import OneProcess  # noqa: E402
from tests.dist import compare, scenarios  # noqa: E402
from tests.dist.launch import torchrun  # noqa: E402


def test_nccl_broadcast_leaves_both_engines_bitwise_equal_to_one_process(engines, tmp_path):
    done = torchrun(2, ["-m", "tests.dist.gpu_worker", str(tmp_path), str(engines["fp8"])])
    assert done.returncode == 0, done.stderr[-6000:]
    results, tensors = compare.load(tmp_path)
    got = results["sync/fp8"]
    assert len(set(got["digests"])) == 1 and got["check_worst"] == 0.0
    ref = scenarios.sync_case(OneProcess(), engines["fp8"], True, device="cuda", dtype=torch.bfloat16)
    for n, t in ref["state"].items():
        assert torch.equal(tensors[f"sync/fp8/{n}"].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), n
    timing = got["timing"]
    assert 0 < timing["weight_update_bytes"] < timing["weight_update_bf16_bytes"]
