"""Which dtype the BF16 sides compute in.

On a GPU, BF16 weights compute in BF16: that is what a user's engine and trainer do,
and what the train/rollout gap must include. On a CPU without native BF16 matrix
instructions (AVX2 machines such as CI), a BF16 matmul runs 10-100x slower than a
float32 one, which would make the built-in RL loop take an hour instead of minutes.
There the default is float32 arithmetic on weights whose values stay BF16 (loaded from
BF16, and the optimizer rounds every update to BF16), so the weights, the weight sync
and the quantized formats are exactly what they are on a GPU, while the BF16 sides'
activations are not rounded to BF16. Reports label such runs "float32 compute".

Every command that runs a model (generate, demo, sft, train, compare) takes
``--compute-dtype`` with this one default, so that on one machine they all compute the
same numbers: greedy answers agree between ``generate``, the engine and the trainer.
"""

from __future__ import annotations

import torch

from quantroll.errors import QuantrollError

COMPUTE_DTYPES = ("auto", "bfloat16", "float32")
COMPUTE_DTYPE_HELP = ("what BF16 weights compute in: auto = bfloat16 on GPU, float32 on CPU (the weights keep "
                      "their BF16 values either way; CPUs without BF16 matrix units are 10-100x slower in bfloat16)")


def resolve_compute_dtype(device: str | torch.device, name: str = "auto") -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; or the dtype named."""
    if name not in COMPUTE_DTYPES:
        raise QuantrollError(f"compute dtype {name!r} is not one of {', '.join(COMPUTE_DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return getattr(torch, name)
