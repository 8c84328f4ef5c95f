"""Which FP8 GEMM a product takes (fp8_linear.gemm_path), decided without a GPU: cuBLAS'
blockwise GEMM only where it was verified (Hopper, torch >= 2.9, shapes that cuBLAS
computed right), the Triton prefill GEMM everywhere else."""

import pytest
import torch

from quantroll.kernels import cutlass_gemm, fp8_gemv, fp8_linear, scaled_mm


@pytest.fixture
def gpu(monkeypatch):
    """A pretend CUDA device of the given capability under the given torch version, without
    (or, cutlass=True, with) the CUTLASS GEMM library."""
    def make(capability, version="2.11.0+cu128", cutlass=False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(fp8_gemv, "usable", lambda device: False)  # no nvcc question here
        monkeypatch.setattr(cutlass_gemm, "available", lambda device=None: cutlass and capability == (9, 0))
        return torch.device("cuda", 0)
    return make


def test_cublas_takes_prefill_only_on_hopper_with_torch_2_9_or_newer(gpu):
    shape = (4096, 4096, 4096)
    assert fp8_linear.gemm_path(*shape, gpu((9, 0))) == "cublas"
    assert fp8_linear.gemm_path(*shape, gpu((9, 0), "2.9.1")) == "cublas"
    assert fp8_linear.gemm_path(*shape, gpu((9, 0), "2.8.0+cu126")) == "triton prefill"  # no blockwise scaling
    assert fp8_linear.gemm_path(*shape, gpu((8, 9))) == "triton prefill"  # Ada: not implemented by cuBLAS here
    assert fp8_linear.gemm_path(*shape, gpu((10, 0))) == "triton prefill"  # Blackwell: not verified
    assert fp8_linear.gemm_path(4096, 384, 4096, gpu((9, 0))) == "triton prefill"  # 3 scale blocks: wrong columns


def test_small_batches_stay_on_the_decode_kernels(gpu):
    device = gpu((9, 0))
    assert fp8_linear.gemm_path(64, 4096, 4096, device) == "triton decode"
    assert fp8_linear.gemm_path(65, 4096, 4096, device) == "cublas"


def test_cpu_devices_never_take_cublas():
    assert not scaled_mm.scaled_mm_verified_on(torch.device("cpu"))


def test_the_table_picks_by_rows_and_weight_shape(gpu):
    from quantroll.kernels.gemm_plan import FP8_GEMMS, NARROW_DECODE, NATIVE_DECODE

    device = gpu((9, 0))
    assert fp8_linear.decode_config(1, 4096, 4096).num_stages == 5  # one row: a deeper weight stream
    assert fp8_linear.decode_config(16, 4096, 4096) == NARROW_DECODE  # without nvcc: float16-widened mma.sync
    assert fp8_linear.decode_config(17, 4096, 4096) == NATIVE_DECODE
    assert fp8_linear.gemm_path(96, 4096, 4096, device) == "cublas"
    assert fp8_linear.gemm_path(96, 2048, 6144, device) == "triton decode"  # Qwen3-1.7B down_proj
    assert fp8_linear.decode_config(96, 2048, 6144).block_m == 128
    assert fp8_linear.gemm_path(129, 2048, 6144, device) == "cublas"
    assert FP8_GEMMS.choose(4096, 384, 4096, device).kernel == "triton prefill"


def test_split_k_fills_the_programs_the_row_asks_for():
    from quantroll.kernels.gemm_plan import NATIVE_DECODE, DecodeGemmConfig

    # Qwen3-8B qkv at 64 rows: 96 tiles of 64 weight rows; 384 programs want 4 splits of K = 4096
    assert NATIVE_DECODE.for_shape(64, 6144, 4096).split_k == 4
    # gate_up (N = 24576): 384 tiles already, one split
    assert NATIVE_DECODE.for_shape(64, 24576, 4096).split_k == 1
    # down at 32 rows (N = 4096, K = 12288): 64 tiles -> 8 splits (the cap)
    assert NATIVE_DECODE.for_shape(32, 4096, 12288).split_k == 8
    # K of 384 (3 blocks): a split keeps two blocks at least, so none
    assert NATIVE_DECODE.for_shape(64, 256, 384).split_k == 1
    fixed = DecodeGemmConfig(split_k=3)
    assert fixed.for_shape(64, 6144, 4096) is fixed


def test_a_plan_must_end_in_the_kernel_that_takes_everything():
    from quantroll.kernels.gemm_plan import GemmPlan, GemmRow, NATIVE_DECODE, PrefillGemmConfig

    with pytest.raises(ValueError, match="last row"):
        GemmPlan((GemmRow("cublas"),))
    with pytest.raises(ValueError, match="one of"):
        GemmRow("deepgemm")
    with pytest.raises(ValueError, match="tiles must be CutlassTiles"):
        GemmRow("cutlass")
    with pytest.raises(ValueError, match="tiles must be DecodeGemmConfig"):
        GemmRow("triton decode", tiles=PrefillGemmConfig())
    with pytest.raises(ValueError, match="tiles must be None"):
        GemmRow("cublas", tiles=NATIVE_DECODE)


def test_an_excluded_kernel_gives_way_to_the_next_row(gpu, monkeypatch):
    """fp8_gemm excludes the CUDA kernel for operands it cannot load: the row after it runs."""
    from quantroll.kernels.gemm_plan import FP8_GEMMS, NARROW_DECODE

    device = gpu((9, 0))
    monkeypatch.setattr(fp8_gemv, "usable", lambda device: True)
    assert FP8_GEMMS.choose(16, 4096, 4096, device).kernel == "cuda decode"
    row = FP8_GEMMS.choose(16, 4096, 4096, device, exclude=("cuda decode",))
    assert row.kernel == "triton decode" and row.tiles == NARROW_DECODE


def test_cutlass_rows_take_their_shapes_and_rows_only_where_the_library_runs(gpu):
    from quantroll.kernels.gemm_plan import FP8_GEMMS, CutlassTiles

    with_lib = gpu((9, 0), cutlass=True)
    row = FP8_GEMMS.choose(64, 4096, 12288, with_lib)  # Qwen3-8B down_proj
    assert (row.kernel, row.tiles) == ("cutlass", CutlassTiles("swap-128x16-sk", 1))
    assert FP8_GEMMS.choose(16, 4096, 12288, with_lib).kernel == "triton decode"  # the CUDA kernel's rows (no nvcc)
    assert FP8_GEMMS.choose(200, 4096, 12288, with_lib).tiles == CutlassTiles("64x128-pingpong", 0)
    assert FP8_GEMMS.choose(300, 4096, 12288, with_lib).kernel == "cublas"  # measured no faster there
    assert FP8_GEMMS.choose(64, 4096, 4608, with_lib).kernel == "triton decode"  # a shape never measured
    without = gpu((9, 0), cutlass=False)
    assert FP8_GEMMS.choose(64, 4096, 12288, without).kernel == "triton decode"  # today's path
    assert FP8_GEMMS.choose(200, 4096, 12288, without).kernel == "cublas"


def test_every_cutlass_row_names_a_built_config():
    from quantroll.kernels.gemm_plan import FP8_GEMMS

    rows = [r for r in FP8_GEMMS.rows if r.kernel == "cutlass"]
    assert rows and all(cutlass_gemm.config(r.tiles.config).name == r.tiles.config for r in rows)
    assert all(r.tiles.splits <= 1 or cutlass_gemm.config(r.tiles.config).stream_k for r in rows)


def test_the_engine_log_line_says_which_kernel_each_row_range_takes(gpu):
    from quantroll.kernels.gemm_plan import FP8_GEMMS, describe_choices

    lines = describe_choices(FP8_GEMMS, {"down_proj": (4096, 12288)}, gpu((9, 0), cutlass=True), max_rows=1024)
    assert lines["down_proj"] == ("1-16 triton decode; 17-64 cutlass swap-128x16-sk; 65-128 cutlass swap-128x32-sk; "
                                  "129-256 cutlass 64x128-pingpong; 257- cublas")
    lines = describe_choices(FP8_GEMMS, {"down_proj": (4096, 12288)}, gpu((9, 0)), max_rows=1024)
    assert lines["down_proj"] == "1-64 triton decode; 65- cublas"
