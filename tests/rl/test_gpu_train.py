"""The RL loop on a GPU (run on the device; skipped on CPU): BF16, mode 1 with real FP8
GEMMs in the engine, and mode 2 with real FP8 GEMMs in the trainer's forward too, on the
built-in warm-started model, with the first-update check on."""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from quantroll.rl.config import TrainConfig  # noqa: E402
from quantroll.rl.loop import run_training  # noqa: E402

SMALL = dict(device="cuda", num_rollout=3, rollout_batch_size=8, n_samples_per_prompt=4, eval_interval=3, eval_size=16)


def _run(**kw):
    return run_training(TrainConfig.of(**{**SMALL, **kw}), progress=False)


def test_bf16_mode1_and_mode2_train_on_gpu_with_real_fp8():
    bf16 = _run()
    mode1 = _run(rollout_precision="fp8", use_tis=True, check_weight_update_equal=True)
    mode2 = _run(rollout_precision="fp8", train_recipe="fp8", check_weight_update_equal=True)
    assert bf16[0]["rollout_precision"] == "bfloat16"
    assert mode1[0]["rollout_precision"] == mode2[0]["rollout_precision"] == "fp8"  # real kernels, not emulated
    for history in (bf16, mode1, mode2):
        assert [r["step"] for r in history] == [0, 1, 2]
        for r in history:
            for key in ("train_rollout_logprob_abs_diff", "loss", "grad_norm", "rollout_time", "train_time",
                        "weight_quantize_time", "weight_load_time"):
                assert math.isfinite(r[key]), key
        assert "eval_engine_accuracy" in history[-1]
    # FP8 rollout adds a gap that BF16 rollout does not have; unified FP8 shrinks it
    assert mode1[0]["train_rollout_logprob_abs_diff"] > 3 * bf16[0]["train_rollout_logprob_abs_diff"]
    assert mode2[0]["train_rollout_logprob_abs_diff"] < mode1[0]["train_rollout_logprob_abs_diff"]
