"""Every engine Triton kernel compiles for Hopper (sm_90) on a machine without a GPU.

CI has no GPU and Triton's CPU interpreter executes kernels without compiling them, so a
kernel that only the GPU compiles (a GPU-only branch, a constexpr combination the
interpreter tests do not take, a layout the MMA lowering rejects) would otherwise fail
first on the device. Here each kernel goes through Triton's full pipeline to a cubin
(PTX and the ptxas Triton ships) for the configurations the engine launches. Local
Triton may be newer than the device's; the device tests remain the word on that."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re

import pytest

from quantroll.kernels.invariant_gemm import InvariantGemmTiles

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

_TILE = InvariantGemmTiles()  # the one tile KernelConfig ships

FLOAT_ARGS = {"eps", "sm_scale", "temperature", "inv_temperature", "h_float"}

DECODE_GEMM_POINTERS = {"a_ptr": "fp8e4nv", "as_ptr": "fp32", "w_ptr": "fp8e4nv", "ws_ptr": "fp32",
                        "part_ptr": "fp32", "c_ptr": "bf16", "lock_ptr": "i32"}

# (module, kernel, pointer dtypes by argument, constexprs, launch options): the engine's
# configurations (Qwen3-8B and 30B-A3B shapes: head_dim 128, 128 experts top-8).
CASES = [
    ("fp8_gemm_triton", "act_quant_fp8_kernel", {"x_ptr": "bf16", "q_ptr": "fp8e4nv", "s_ptr": "fp32"},
     dict(BLOCK=128), {}),
    ("fp8_gemm_triton", "fp8_block_gemm_kernel", {"a_ptr": "fp8e4nv", "as_ptr": "fp32", "w_ptr": "fp8e4nv",
                                                   "ws_ptr": "fp32", "c_ptr": "bf16"},
     dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, DOT_F16=True), dict(num_warps=8, num_stages=3)),
    *[("fp8_gemm_triton", "fp8_decode_gemm_kernel", DECODE_GEMM_POINTERS,
       dict(BLOCK_M=bm, BLOCK_N=32, BLOCK_K=128, K_BLOCKS_PER_SPLIT=32 // split, SPLIT=split, DOT_F16=False,
            IMPRECISE_ACC=32), dict(num_warps=2, num_stages=stages))
      for bm, split, stages in ((16, 1, 5), (16, 4, 3), (64, 4, 3))],
    *[("fp8_gemm_triton", "fp8_decode_gemm_kernel", DECODE_GEMM_POINTERS,  # the table's FP8 warpgroup-MMA tiles
       dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, K_BLOCKS_PER_SPLIT=8, SPLIT=4, DOT_F16=False, IMPRECISE_ACC=128),
       dict(num_warps=4, num_stages=stages)) for bm, stages in ((32, 4), (64, 4), (128, 3))],
    *[("fused_triton", "add_rmsnorm_kernel", {"x_ptr": "bf16", "d_ptr": "bf16", "w_ptr": "bf16", "res_ptr": "bf16",
                                              "y_ptr": "bf16", "q_ptr": "fp8e4nv", "s_ptr": "fp32"},
       dict(HAS_DELTA=True, QUANT=quant, BLOCK=4096, STORE_Y=store_y, RELEASE=quant), dict(num_warps=16))
      for quant, store_y in ((False, True), (True, False), (True, True))],
    *[("fused_triton", "silu_mul_kernel", {"gu_ptr": "bf16", "y_ptr": "bf16", "q_ptr": "fp8e4nv", "s_ptr": "fp32"},
       dict(QUANT=quant, BLOCK=1024, RELEASE=quant), {}) for quant in (False, True)],
    *[("paged_attention_triton", "paged_decode_kernel",
       {"q_ptr": "bf16", "k_ptr": kv, "v_ptr": kv, "ks_ptr": "fp32", "vs_ptr": "fp32", "table_ptr": "i32",
        "len_ptr": "i32", "o_ptr": "bf16", "po_ptr": "fp32", "pml_ptr": "fp32", "c_ptr": "fp8e4nv", "cs_ptr": "fp32"},
       dict(HKV=8, D=128, D_PAD=128, GROUP=4, G_PAD=16, BLOCK_SIZE=16, BLOCK_S=64 if kv == "bf16" else 128,
            SPLITS=splits, FP8=kv == "fp8e4nv", IEEE=False, QUANT_OUT=quant),
       dict(num_warps=4, num_stages=3))  # the engine's tiles
      for kv in ("bf16", "fp8e4nv") for splits in (1, 8)
      for quant in ((False, True) if splits == 1 else (False,))],
    *[("paged_attention_triton", "merge_splits_kernel",
       {"po_ptr": "fp32", "pml_ptr": "fp32", "o_ptr": "bf16", "c_ptr": "fp8e4nv", "cs_ptr": "fp32"},
       dict(H=32, D=128, D_PAD=128, SPLITS=8, S_PAD=8, QUANT_OUT=quant), {}) for quant in (False, True)],
    *[("paged_attention_triton", "paged_prefill_kernel",
       {"q_ptr": "bf16", "k_ptr": kv, "v_ptr": kv, "ks_ptr": "fp32", "vs_ptr": "fp32", "table_ptr": "i32",
        "start_ptr": "i32", "ctx_ptr": "i32", "o_ptr": "bf16"},
       dict(HKV=8, D=128, D_PAD=128, GROUP=4, BLOCK_SIZE=16, BLOCK_M=64, BLOCK_N=64, FP8=kv == "fp8e4nv",
            IEEE=False), dict(num_warps=4, num_stages=2))
      for kv in ("bf16", "fp8e4nv")],
    ("invariant_gemm_triton", "invariant_gemm_kernel", {"x_ptr": "bf16", "w_ptr": "bf16", "y_ptr": "bf16"},
     dict(BLOCK_M=_TILE.block_m, BLOCK_N=_TILE.block_n, BLOCK_K=_TILE.block_k, IEEE=False),
     dict(num_warps=_TILE.warps, num_stages=_TILE.stages)),  # KernelConfig's tile
    *[("invariant_rows_triton", "rms_norm_rows_kernel", {"x_ptr": "bf16", "w_ptr": "bf16", "y_ptr": "bf16"},
       dict(BLOCK=block), dict(num_warps=warps)) for block, warps in ((128, 1), (4096, 8))],
    ("invariant_rows_triton", "norm_rope_rows_kernel",
     {"x_ptr": "bf16", "w_ptr": "bf16", "cos_ptr": "bf16", "sin_ptr": "bf16", "y_ptr": "bf16"}, dict(HALF=64),
     dict(num_warps=1)),
    ("invariant_rows_triton", "silu_mul_rows_kernel", {"g_ptr": "bf16", "u_ptr": "bf16", "y_ptr": "bf16"},
     dict(BLOCK=1024), dict(num_warps=4)),
    *[("invariant_rows_triton", "log_softmax_rows_kernel",
       {"x_ptr": "fp32", "y_ptr": "fp32", "seeds_ptr": "i64", "positions_ptr": "i64", "tokens_ptr": "i64",
        "token_lp_ptr": "fp32"}, dict(BLOCK=4096, STORE=store, SAMPLE=not store, GREEDY=greedy), dict(num_warps=8))
      for store, greedy in ((True, False), (False, False), (False, True))],
    ("paged_attention_triton", "paged_prefill_kernel",  # the batch-invariant attention's one tile (KernelConfig)
     {"q_ptr": "bf16", "k_ptr": "bf16", "v_ptr": "bf16", "ks_ptr": "bf16", "vs_ptr": "bf16", "table_ptr": "i32",
      "start_ptr": "i32", "ctx_ptr": "i32", "o_ptr": "bf16"},
     dict(HKV=8, D=128, D_PAD=128, GROUP=2, BLOCK_SIZE=16, BLOCK_M=16, BLOCK_N=64, FP8=False, IEEE=False),
     dict(num_warps=4, num_stages=2)),
    *[("kv_store_triton", "store_kv_kernel",  # QK_NORM False: the families without QK-norm
       {p: "bf16" for p in ("qkv_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "q_ptr")}
       | {"k_ptr": kv, "v_ptr": kv, "ks_ptr": "fp32", "vs_ptr": "fp32", "slot_ptr": "i64"},
       dict(HQ=32, HKV=8, D=128, FP8=kv == "fp8e4nv", BLOCK_SIZE=16, QK_NORM=qk_norm), dict(num_warps=1))
      for kv in ("bf16", "fp8e4nv") for qk_norm in (True, False)],
    *[("moe_triton", "grouped_gemm_kernel", {"a_ptr": a, "as_ptr": "fp32", "w_ptr": a, "ws_ptr": "fp32",
                                             "c_ptr": "bf16", "sorted_ptr": "i64", "block_expert_ptr": "i64"},
       dict(A_ROW_IS_TOKEN=True, FP8=a == "fp8e4nv", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128),
       dict(num_warps=4, num_stages=3)) for a in ("bf16", "fp8e4nv")],
    ("moe_triton", "moe_align_kernel", {"ids_ptr": "i64", "sorted_ptr": "i64", "block_expert_ptr": "i64"},
     dict(P_PAD=2048, E_PAD=256, BLOCK_M=16, ROWS=1024, BLOCKS=32), dict(num_warps=4)),
    ("moe_triton", "moe_route_kernel", {"logits_ptr": "bf16", "idx_ptr": "i64", "w_ptr": "bf16"},
     dict(TOP_K=8, K_PAD=8, E_PAD=128, NORM=True), dict(num_warps=1)),
    ("copy_check_triton", "copy_flag_kernel", {"src_ptr": "bf16", "dst_ptr": "bf16", "flag_ptr": "i32"},
     dict(BLOCK=8192), dict(num_warps=8)),
    ("copy_check_triton", "copy_flag_many_kernel", {"src_table_ptr": "i64", "dst_table_ptr": "i64", "sizes_ptr": "i64",
                                                    "flag_index_ptr": "i32", "flag_ptr": "i32"},
     dict(BLOCK=8192), dict(num_warps=8)),
    ("moe_triton", "moe_combine_kernel", {"y_ptr": "bf16", "w_ptr": "bf16", "out_ptr": "bf16"},
     dict(TOP_K=8, BLOCK=1024), {}),
]


# Arguments the engine's launches pass as 1 (contiguous rows, outer-dim-major scales):
# Triton specializes them to constants, as it takes every pointer and every other integer
# here to be a multiple of 16; without that the loads neither vectorize nor pipeline and
# the compile would not be the one the device runs.
UNIT_ARGS = {"fp8_decode_gemm_kernel": ("s_ak", "s_asm", "s_wk", "s_wsk", "s_cn"),
             "fp8_block_gemm_kernel": ("s_ak", "s_asm", "s_wk", "s_wsk", "s_cn"),
             "grouped_gemm_kernel": ("s_wk", "s_asm", "s_wsk"),
             "invariant_gemm_kernel": ("s_xk", "s_wk", "s_yn")}


def _signature(fn, pointers: dict, constexprs: dict) -> dict:
    sig = {}
    for p in fn.params:
        if p.name in constexprs:
            sig[p.name] = "constexpr"
        elif p.name.endswith("_ptr"):
            sig[p.name] = "*" + pointers[p.name]
        else:
            sig[p.name] = "fp32" if p.name in FLOAT_ARGS else "i32"
    return sig


def _compile(module, kernel, pointers, constexprs, options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(f"quantroll.kernels.{module}"), kernel)
    names = [p.name for p in fn.params]
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.name not in constexprs
                and p.default is not inspect.Parameter.empty}  # constexprs a launch leaves at their defaults
    constexprs = {**defaults, **constexprs, **{name: 1 for name in UNIT_ARGS.get(kernel, ())}}
    signature = _signature(fn, pointers, constexprs)
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                           if signature[n] != "constexpr" and signature[n] != "fp32"})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


@pytest.mark.parametrize("module,kernel,pointers,constexprs,options", CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_kernel_compiles_for_sm90(module, kernel, pointers, constexprs, options):
    compiled = _compile(module, kernel, pointers, constexprs, options)
    assert len(compiled.asm["cubin"]) > 0
    if kernel in UNIT_ARGS and options.get("num_stages", 1) > 1:  # the weight stream is software-pipelined
        assert "cp.async" in compiled.asm["ptx"], "no asynchronous copies: the K loop is not pipelined"
    ptx = compiled.asm["ptx"]  # programmatic dependent launch: present exactly when asked for (fp8_gemv.py)
    assert ("griddepcontrol.launch_dependents" in ptx) == bool(constexprs.get("RELEASE"))
    assert "griddepcontrol.wait" not in ptx  # only the CUDA decode GEMM waits


@pytest.mark.parametrize("kernel", ["paged_decode_kernel", "paged_prefill_kernel"])
def test_fp8_values_reach_the_tensor_cores_without_byte_loads(kernel):
    """An FP8 cache stores values positions-minor (engine/paged_cache.py): the P.V operand
    is then read from shared memory in words, not one byte at a time (positions-major FP8
    values compiled to 128 ld.shared.b8 per thread per 128-key tile, ~1.9x the bytes' time)."""
    case = next(c for c in CASES if c[1] == kernel and c[3]["FP8"])
    ptx = _compile(*case).asm["ptx"]
    assert "ld.shared.b8" not in ptx and "cvt.rn.f16x2.e4m3x2" in ptx
    # nor from global memory: through the block table the compiler sees no contiguity unless told, and a
    # per-position mask kept the value loads at one byte each (2.6x slower again, measured)
    assert not re.search(r"ld\.global(\.[a-z0-9]+)*\.[bus]8\b", ptx)


@pytest.mark.parametrize("block_m", [16, 64])
def test_decode_tiles_multiply_on_float16_mma_sync(block_m):
    """The decode tiles (2 warps: 32 rows with FP8 dots, 64 with float16 dots) lower to
    mma.sync on float16 operands: exact float16 products of the codes summed in float32,
    which the FP8 warpgroup MMA (e4m3 operands, narrower accumulation) is not."""
    for block_n, dot_f16 in ((32, False), (64, True)):
        consts = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, K_BLOCKS_PER_SPLIT=8, SPLIT=4, DOT_F16=dot_f16,
                      IMPRECISE_ACC=32)
        ptx = _compile("fp8_gemm_triton", "fp8_decode_gemm_kernel", DECODE_GEMM_POINTERS, consts,
                       dict(num_warps=2, num_stages=3)).asm["ptx"]
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx and "wgmma" not in ptx, (block_n, dot_f16)
