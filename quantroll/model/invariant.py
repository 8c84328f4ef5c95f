"""Batch-invariant forms of every op of the Qwen3 forward pass (``--true-on-policy-mode``).

A value computed here depends only on the values it is a function of, never on how many
other rows share the call, where its row sits, or how long the padded axis it is reduced
over is. Three rules make that hold:

- On a CPU, reductions (sums over the hidden size, the vocabulary, the keys) are ``tree_sum``: adjacent
  pairs (2i, 2i+1) added level by level with elementwise adds, so the order is fixed by the
  elements' absolute indices. Padding with -0.0 (the exact identity of IEEE addition) at the
  end changes nothing, which is what lets a one-token decode over a cache of C keys, a
  prefill chunk and the trainer's causal pass over L keys add the same terms in the same
  order: a key's place in the tree is its absolute position. On a GPU with Triton, norms and
  log-softmax run one program a row and attention the paged prefill kernel with one tile
  shape (kernels/invariant_rows.py, kernels/paged_attention.invariant_attention): a fixed
  reduction per row, whatever the launch around it.
- Elementwise math uses correctly rounded ops (+ - * / sqrt, casts) and torch's exp / log /
  cos / sin, whose per-element result on the CPU does not depend on the element's index
  (verified at startup by model/invariance_probe.py; torch's own sigmoid and silu do depend
  on it, so silu is built from exp and a division here).
- A GEMM is cut into tiles of exactly ``rows`` rows (the last one zero-padded), each one
  BLAS call of the same shape: the library's choice of kernel, blocking and K order then
  cannot depend on the batch (MKL computes a row differently at 1-11 rows than at 12+;
  measured), and a row's result does not depend on its place in the tile (probed). On a
  GPU with Triton it is one launch of a GEMM with one fixed tile (kernels/invariant_gemm.py).

The trainer's backward may use ordinary kernels: ``straight_through`` runs the invariant
forward and backpropagates through the ordinary formula of the same function.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from quantroll.kernels.quantize import triton_available

NEG_ZERO = -0.0  # x + (-0.0) == x for every x, +0.0 and -0.0 included
# the trainer recipes (format names) whose forward these ops are proven invariant for, engine and trainer
# alike (tests/rl/test_true_on_policy.py); the mode refuses the others (rl/true_on_policy.py)
TESTED_RECIPES = ("fp8",)


def tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum along ``dim`` in pairs of adjacent elements, level by level (see the module
    docstring): the result depends on the elements and their indices only."""
    dim = dim % x.dim()
    if x.shape[dim] == 0:
        return x.sum(dim, keepdim=keepdim)
    while x.shape[dim] > 1:
        if x.shape[dim] % 2:
            pad = list(x.shape)
            pad[dim] = 1
            x = torch.cat([x, x.new_full(pad, NEG_ZERO)], dim)
        pairs = x.unflatten(dim, (x.shape[dim] // 2, 2))
        x = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
    return x if keepdim else x.squeeze(dim)


class _StraightThrough(torch.autograd.Function):
    """Forward: ``fast(*tensors)``; backward: the gradient of ``reference(*tensors)``."""

    @staticmethod
    def forward(ctx, fast, reference, *tensors):
        ctx.reference = reference
        ctx.save_for_backward(*tensors)
        return fast(*tensors)

    @staticmethod
    def backward(ctx, grad):
        needs = ctx.needs_input_grad[2:]
        inputs = [t.detach().requires_grad_(n) for t, n in zip(ctx.saved_tensors, needs)]
        with torch.enable_grad():
            out = ctx.reference(*inputs)
            grads = iter(torch.autograd.grad(out, [t for t, n in zip(inputs, needs) if n], grad))
        return (None, None, *[next(grads) if n else None for n in needs])


def straight_through(fast: Callable, reference: Callable, *tensors: torch.Tensor) -> torch.Tensor:
    """``fast(*tensors)``, differentiable through ``reference`` where autograd needs it."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _StraightThrough.apply(fast, reference, *tensors)
    return fast(*tensors)


def _on_gpu_kernels(x: torch.Tensor) -> bool:
    """Whether the Triton forms run (one fixed launch shape each) instead of the torch ones."""
    return x.is_cuda and triton_available()


# -- GEMM ----------------------------------------------------------------------------------
def matmul_tiles(x: torch.Tensor, w: torch.Tensor, rows: int) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T in x's dtype, one BLAS call per tile of exactly ``rows`` rows."""
    shape = x.shape
    k, n = shape[-1], w.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    tiles = -(-m // rows)
    padded = x2.new_zeros(tiles * rows, k)  # fresh, so that every tile starts 64-byte aligned
    padded[:m] = x2
    out = x2.new_empty(tiles * rows, n)
    wt = w.to(x2.dtype).t()
    for i in range(tiles):
        torch.mm(padded[i * rows:(i + 1) * rows], wt, out=out[i * rows:(i + 1) * rows])
    return out[:m].reshape(*shape[:-1], n)


def matmul(x: torch.Tensor, w: torch.Tensor, kernels) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T in x's dtype, batch-invariant: on a GPU with Triton one launch
    with one fixed tile (kernels/invariant_gemm.py, ``kernels.invariant_gemm``), elsewhere
    BLAS calls on tiles of ``kernels.gemm_rows`` rows (matmul_tiles)."""
    if _on_gpu_kernels(x):
        from quantroll.kernels.invariant_gemm import invariant_gemm

        return invariant_gemm(x, w, kernels.invariant_gemm)
    return matmul_tiles(x, w, kernels.gemm_rows)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, kernels) -> torch.Tensor:
    """y = x W^T (+ b): the invariant GEMM forward, F.linear's gradient."""
    y = straight_through(lambda a, b: matmul(a, b, kernels), lambda a, b: F.linear(a, b), x, w)
    return y if bias is None else y + bias


# -- norms and activations --------------------------------------------------------------------
def _rms_norm_tree(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    ms = tree_sum(h * h, -1, keepdim=True) / h.shape[-1]
    return weight * (h / torch.sqrt(ms + eps)).to(dtype)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in ordinary ops: the default kernels' form, and the invariant forms' gradient."""
    h = x.to(torch.float32)
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)), the mean a fixed-order float32 sum: on a GPU
    with Triton one program a row (kernels/invariant_rows.py, the ordinary formula's
    gradient), elsewhere the tree sum."""
    if _on_gpu_kernels(x):
        from quantroll.kernels import invariant_rows

        return straight_through(lambda a, w: invariant_rows.rms_norm(a, w, eps),
                                lambda a, w: rms_norm_reference(a, w, eps), x, weight)
    return _rms_norm_tree(x, weight, eps)


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each head's RMSNorm then rotary (x [B, T, H, D], cos / sin [B, T, D]): on a GPU with
    Triton one program a head (kernels/invariant_rows.norm_rope; the ordinary formulas'
    gradient), elsewhere rms_norm then model/rope.apply_rotary."""
    from quantroll.model.rope import apply_rotary

    if _on_gpu_kernels(x) and x.shape[-1] & (x.shape[-1] - 1) == 0:
        from quantroll.kernels import invariant_rows

        return straight_through(lambda a, w: invariant_rows.norm_rope(a, w, eps, cos, sin),
                                lambda a, w: apply_rotary(rms_norm_reference(a, w, eps), cos, sin), x, weight)
    return apply_rotary(rms_norm(x, weight, eps), cos, sin)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, each rounded to gate's dtype: on a GPU with Triton one kernel
    (kernels/invariant_rows.silu_mul; F.silu's gradient), elsewhere ``silu(gate) * up``."""
    if _on_gpu_kernels(gate):
        from quantroll.kernels import invariant_rows

        return straight_through(invariant_rows.silu_mul, lambda g, u: F.silu(g) * u, gate, up)
    return silu(gate) * up


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) as x / (1 + exp(-x)) in float32, rounded once to x's dtype."""
    h = x.to(torch.float32)
    return (h / (1.0 + torch.exp(-h))).to(x.dtype)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis in float32."""
    h = x.to(torch.float32)
    e = torch.exp(h - h.amax(-1, keepdim=True))
    return e / tree_sum(e, -1, keepdim=True)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last axis (the full vocabulary) in float32: z - log(sum exp z)
    with z = x - max; on a GPU with Triton one program a row (kernels/invariant_rows.py,
    torch's gradient), elsewhere the tree sum."""
    if _on_gpu_kernels(x):
        from quantroll.kernels import invariant_rows

        return straight_through(invariant_rows.log_softmax, lambda a: torch.log_softmax(a, -1), x.to(torch.float32))
    z = x.to(torch.float32)
    z = z - z.amax(-1, keepdim=True)
    return z - torch.log(tree_sum(torch.exp(z), -1, keepdim=True))


def top_k(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last axis, largest first, ties to the lowest index
    (argmax returns the first maximum): a choice that no kernel heuristic can reorder."""
    work, picked = x, []
    for _ in range(k):
        i = torch.argmax(work, dim=-1, keepdim=True)
        picked.append(i)
        work = work.scatter(-1, i, float("-inf"))
    return torch.cat(picked, -1)


# -- attention ------------------------------------------------------------------------------
def _attention_block(q, k, v, visible, scale):
    """q [S, Hkv, G, T, D], k/v [S, Hkv, 1, C, D] float32, visible [S, 1, 1, T, C] -> [S, Hkv, G, T, D]."""
    scores = tree_sum(q[..., :, None, :] * k[..., None, :, :], -1) * scale  # [S, Hkv, G, T, C]
    scores = torch.where(visible, scores, float("-inf"))
    m = scores.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)  # a padded query that sees no key: any finite value
    e = torch.where(visible, torch.exp(scores - m), NEG_ZERO)
    total = tree_sum(e, -1)[..., None]
    terms = torch.where(visible[..., None], e[..., None] * v[..., None, :, :], NEG_ZERO)  # [S, Hkv, G, T, C, D]
    return tree_sum(terms, -2) / total


def _attention_fast(q, k, v, query_pos, max_elements):
    s, t, h, d = q.shape
    c, hkv = k.shape[1], k.shape[2]
    g = h // hkv
    scale = d ** -0.5
    qf = q.to(torch.float32).reshape(s, t, hkv, g, d).permute(0, 2, 3, 1, 4)
    kf = k.to(torch.float32).permute(0, 2, 1, 3)[:, :, None]
    vf = v.to(torch.float32).permute(0, 2, 1, 3)[:, :, None]
    keys = torch.arange(c, device=q.device)
    visible = (keys[None, None, :] <= query_pos[:, :, None])[:, None, None]  # [S, 1, 1, T, C]
    out = torch.empty(s, hkv, g, t, d, dtype=torch.float32, device=q.device)
    per_query = max(h * c * d, 1)
    rows = max(1, max_elements // per_query)  # queries of one chunk (a query's value never depends on it)
    t_step = min(t, rows)
    s_step = max(1, rows // t_step)
    for s0 in range(0, s, s_step):
        for t0 in range(0, t, t_step):
            sl, tl = slice(s0, s0 + s_step), slice(t0, t0 + t_step)
            out[sl, :, :, tl] = _attention_block(qf[sl, :, :, tl], kf[sl], vf[sl], visible[sl, :, :, tl], scale)
    return out.permute(0, 3, 1, 2, 4).reshape(s, t, h, d).to(q.dtype)


def _attention_reference(q, k, v, query_pos):
    """The same function in ordinary ops (its gradient is the trainer's backward)."""
    s, t, h, d = q.shape
    c, hkv = k.shape[1], k.shape[2]
    kh = k.repeat_interleave(h // hkv, dim=2).to(torch.float32)
    vh = v.repeat_interleave(h // hkv, dim=2).to(torch.float32)
    scores = torch.einsum("sthd,schd->shtc", q.to(torch.float32), kh) * d ** -0.5
    visible = torch.arange(c, device=q.device)[None, None, :] <= query_pos[:, :, None]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return torch.einsum("shtc,schd->sthd", torch.softmax(scores, -1), vh).to(q.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_pos: torch.Tensor,
              max_elements: int = 1 << 24) -> torch.Tensor:
    """Attention of q [S, T, H, D] over k, v [S, C, Hkv, D] (key j of a sequence is its
    absolute position j), each query seeing the keys j <= its own position ``query_pos``
    [S, T]: softmax(q k^T / sqrt(D)) v with every reduction a tree sum over absolute indices,
    so the cache's padding, the chunk a query was prefilled in and the length of the
    trainer's sequence change no bit. Computed in float32, returned in q's dtype."""
    return straight_through(lambda a, b, c: _attention_fast(a, b, c, query_pos, max_elements),
                            lambda a, b, c: _attention_reference(a, b, c, query_pos), q, k, v)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_elements: int = 1 << 24) -> torch.Tensor:
    """The trainer's causal attention over whole sequences (positions 0 .. T-1 in every row)."""
    s, t = q.shape[:2]
    positions = torch.arange(t, device=q.device).expand(s, t)
    return attention(q, k, v, positions, max_elements)
