"""GPU: the long SFT and the engine-copy evaluation run on CUDA in BF16 (the study's path).
Measurements of learning are the GPU study's; these only check that the path works and that
a resumed run continues from its state."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from quantroll.evaluation.heldout import greedy, score  # noqa: E402
from quantroll.evaluation.policy_engine import PolicyEngine  # noqa: E402
from quantroll.longsft.run import LongSFTConfig, long_sft  # noqa: E402
from quantroll.longsft.shapes import parse_shape  # noqa: E402
from quantroll.sft import decode, encode, held_out_problems  # noqa: E402
from quantroll.tasks.trace import FibTraceTask  # noqa: E402
from quantroll.trainer.policy import load_policy  # noqa: E402
from tests.greedy_reference import greedy_full_forward  # noqa: E402

TASK = FibTraceTask(length=1024)
SHAPE = parse_shape("tiny,num_hidden_layers=2", 4096)
CFG = LongSFTConfig(steps=6, tokens_per_batch=8192, micro_batch_tokens=4096, warmup=2, save_every=2, check_every=3,
                    val_size=8, eval_size=8, target_pass_rate=None)


def test_long_sft_runs_and_resumes_on_the_gpu(tmp_path):
    class Killed(Exception):
        pass

    def kill(step, loss):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        long_sft(tmp_path / "out", TASK, SHAPE, CFG, tmp_path / "state", device="cuda", on_step=kill, log=print)
    stats = long_sft(tmp_path / "out", TASK, SHAPE, CFG, tmp_path / "state", resume=True, device="cuda", log=print)
    assert stats["train_dtype"] == "bfloat16" and stats["resumed_at"] == 4 and len(stats["losses"]) == 6
    assert stats["losses"][-1] < stats["losses"][0]
    assert (tmp_path / "out/model.safetensors").is_file()


def test_the_engine_copy_matches_full_forward_greedy_on_the_gpu(tmp_path):
    from quantroll.builtin import write_tiny_qwen3

    path = write_tiny_qwen3(tmp_path / "m", SHAPE, seed=1)
    policy = load_policy(path, device="cuda", dtype=torch.bfloat16)
    problems = held_out_problems(FibTraceTask(length=64), 8, seed=0)
    copy = PolicyEngine(path, "cuda", torch.bfloat16)
    got = [s.tokens for s in score(copy.engine_for(policy), TASK, problems, encode, decode, greedy(24))]
    ref = greedy_full_forward(policy, [encode(p.prompt) for p in problems], 24, set(copy.engine.default_stop_ids))
    # BF16 kernels differ between a decode step and a full forward: most rows agree token for token
    assert sum(a == b for a, b in zip(got, ref)) >= len(problems) // 2
