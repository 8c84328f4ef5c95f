"""How much of the copy rate a stream of one Qwen3-8B layer's FP8 weights keeps as four
launches (one per decode GEMM: qkv, o, gate_up, down), plainly or launched early as the
decode GEMMs are (first loads requested, then griddepcontrol.wait), against one launch
streaming the four matrices one after another: without waiting between them, with a grid
barrier between them (what a persistent decode layer pays: each GEMM needs all of the one
before), and with each block requesting its first loads of the next matrix before the
barrier. Pure loads (bench/persistent_stream.cu), no arithmetic: the floor under the
decode GEMMs' per-layer times with per-GEMM launches, and what one launch per layer could
at most save on the weight stream (docs/history.md: nothing, against early launches).

GPU time per layer set in a CUDA graph over 2 weight copies (386 MB, past L2), median of 20;
per shape (the row-tiled loads) over 8 copies of that shape.

    python bench/persistent_stream.py [--blocks-per-sm 1,2,4]
"""
import argparse
import ctypes
import pathlib

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.rollout import copy_bandwidth
from quantroll.bench.shapes import EIGHT_B_GEMMS
from quantroll.kernels import cuda_jit

SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
COPIES = 2
COLUMNS = ("4 launches", "4 early", "1 launch", "1, barriers", "1, barr.+pref.")  # launch structures timed
# (row tiles, warps, K splits) of the row-tiled loads
TILINGS = [(1, 4, 1), (1, 8, 1), (2, 4, 1), (2, 8, 1), (1, 4, 2), (1, 8, 2), (2, 4, 2), (2, 8, 2), (2, 8, 4)]


def resident_blocks(module: cuda_jit.CudaModule, name: str) -> int:
    """How many 256-thread blocks of kernel ``name`` one SM holds at once (the driver's
    occupancy calculator: registers, shared memory, threads)."""
    count = ctypes.c_int()
    drv = cuda_jit.driver()
    drv.check(drv.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(count), module.function(name), 256,
                                                                  ctypes.c_size_t(0)), f"occupancy of {name}")
    return count.value


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--blocks-per-sm", default="1,2,4")
    args = p.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    cubin = cuda_jit.compile_cubin(pathlib.Path(__file__).with_name("persistent_stream.cu"),
                                   torch.cuda.get_device_capability(dev))
    module = cuda_jit.CudaModule(cubin, dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    weights = [[torch.empty(n * k, dtype=torch.uint8, device=dev).random_(0, 255) for n, k in SHAPES.values()]
               for _ in range(COPIES)]
    words = [w.numel() // 16 for w in weights[0]]
    out = torch.zeros(64 * sms, dtype=torch.int32, device=dev)
    total = sum(w.numel() for w in weights[0])
    bandwidth = copy_bandwidth(dev)  # the rate the engine's roofline reads weights at
    print(f"one layer set: {total / 1e6:.1f} MB, {total / bandwidth * 1e6:.1f} us at the copy bandwidth "
          f"({bandwidth / 1e12:.2f} TB/s)", flush=True)
    rows = launch_structures(module, sms, weights, words, out, dev,
                             tuple(int(b) for b in args.blocks_per_sm.split(",")))
    row_tilings(module, dev, out, bandwidth)
    print("\nus per layer set (% of the copy bandwidth):")
    print(f"{'blocks/SM':>9s} " + " ".join(f"{c:>16s}" for c in COLUMNS))
    for per_sm, *times in rows:
        print(f"{per_sm:9d} " + " ".join(f"{t:8.1f} ({total / bandwidth / (t * 1e-6) * 100:3.0f}%)" for t in times))


def launch_structures(module, sms: int, weights, words, out, dev, blocks_per_sm=(1, 2, 4)) -> list[tuple]:
    """(blocks per SM, us per layer set for each of COLUMNS) of the grid-stride stream."""
    sync = torch.zeros(2, dtype=torch.int32, device=dev)  # grid barrier: arrivals, generation
    max_per_sm = min(resident_blocks(module, name) for name in ("stream_four_barrier", "stream_four_barrier_prefetch"))
    print(f"barrier kernels: at most {max_per_sm} resident blocks per SM", flush=True)
    rows = []
    for per_sm in blocks_per_sm:
        if per_sm > max_per_sm:  # the barrier needs every block resident
            raise SystemExit(f"--blocks-per-sm {per_sm}: at most {max_per_sm} blocks of the barrier kernels fit an SM")
        grid = (sms * per_sm, 1, 1)

        def four_launches(j, kernel="stream_one", early=False):
            for w, n in zip(weights[j], words):
                module.launch(kernel, grid, (256, 1, 1), w, n, out, early=early)

        def one_launch(j, kernel="stream_four"):
            module.launch(kernel, grid, (256, 1, 1), *[x for w, n in zip(weights[j], words) for x in (w, n)], sync, out)

        times = [graph_time_us(four_launches, COPIES),
                 graph_time_us(lambda j: four_launches(j, "stream_one_early", True), COPIES),
                 graph_time_us(one_launch, COPIES),
                 graph_time_us(lambda j: one_launch(j, "stream_four_barrier"), COPIES),
                 graph_time_us(lambda j: one_launch(j, "stream_four_barrier_prefetch"), COPIES)]
        torch.cuda.synchronize()
        if sync[0].item() != 0:
            raise SystemExit(f"grid barrier left {sync[0].item()} arrivals counted (expected 0)")
        rows.append((per_sm, *times))
        print(f"{per_sm} blocks/SM: " + ", ".join(f"{c} {t:.1f}" for c, t in zip(COLUMNS, times)), flush=True)
    return rows


def row_tilings(module, dev, out, bandwidth: float) -> None:
    """The decode GEMM's row tiling, pure loads, launched early, per tiling and shape (over
    8 copies of each shape, so that o_proj's 8 x 16.8 MB are well past L2): the table and
    the best tiling per shape summed over the layer set, with whole K and with any split."""
    shape_copies = 8
    copies = [[torch.empty(n * k, dtype=torch.uint8, device=dev).random_(0, 255) for n, k in SHAPES.values()]
              for _ in range(shape_copies)]
    per_shape = {}
    for rt, warps, splits in TILINGS:
        name = f"stream_rows_rt{rt}_w{warps}"
        for i, (layer, (n, k)) in enumerate(SHAPES.items()):
            per_shape[(layer, rt, warps, splits)] = graph_time_us(
                lambda j: module.launch(name, (n // (16 * rt), splits, 1), (32 * warps, 1, 1), copies[j][i], k, out,
                                        early=True), shape_copies)
    print("\nrow-tiled loads (the decode GEMM's tiling; sN: K split over N blocks), early launch, us per call:")
    print(f"{'layer':8s} {'bytes':>6s} " + " ".join(f"{f'rt{rt} w{w} s{sp}':>11s}" for rt, w, sp in TILINGS))
    for layer, (n, k) in SHAPES.items():
        print(f"{layer:8s} {n * k / bandwidth * 1e6:6.1f} " + " ".join(f"{per_shape[(layer, *c)]:11.1f}" for c in TILINGS))
    for label, keep in (("whole K per block", lambda c: c[2] == 1), ("any split", lambda c: True)):
        best = sum(min(per_shape[(layer, *c)] for c in TILINGS if keep(c)) for layer in SHAPES)
        print(f"best tiling per shape, {label}, summed over the layer set: {best:.1f} us (one launch each)")


if __name__ == "__main__":
    main()
