"""How much of the copy rate a stream of one Qwen3-8B layer's FP8 weights keeps as four
launches (one per decode GEMM: qkv, o, gate_up, down) against one launch streaming the
four matrices one after another. Pure loads (bench/persistent_stream.cu), no arithmetic
and no waiting between the matrices: the floor under the decode GEMMs' per-layer times
with per-GEMM launches, and what one launch per layer could at most save on the weight
stream (docs/PERFORMANCE.md, session 12).

GPU time per layer set in a CUDA graph over 2 weight copies (386 MB, past L2), median of 20.

    python bench/persistent_stream.py [--blocks-per-sm 1,2,4]
"""
import argparse
import pathlib

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.rollout import copy_bandwidth
from quantroll.bench.shapes import EIGHT_B_GEMMS
from quantroll.kernels import cuda_jit

SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
COPIES = 2


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
    rows = []
    for per_sm in (int(b) for b in args.blocks_per_sm.split(",")):
        grid = (sms * per_sm, 1, 1)

        def four_launches(j):
            for w, n in zip(weights[j], words):
                module.launch("stream_one", grid, (256, 1, 1), w, n, out)

        def one_launch(j):
            module.launch("stream_four", grid, (256, 1, 1), *[x for w, n in zip(weights[j], words) for x in (w, n)],
                          out)

        rows.append((per_sm, graph_time_us(four_launches, COPIES), graph_time_us(one_launch, COPIES)))
    print("\nus per layer set (% of the copy bandwidth):")
    print(f"{'blocks/SM':>9s} {'4 launches':>16s} {'1 launch':>16s}")
    for per_sm, *times in rows:
        print(f"{per_sm:9d} " + " ".join(f"{t:8.1f} ({total / bandwidth / (t * 1e-6) * 100:3.0f}%)" for t in times))


if __name__ == "__main__":
    main()
