"""What reading N bytes costs a plain kernel, under the same timing as the attention bench:
the reference for bench/paged_attention.py's "x" column at small sizes, where a launch's
fixed costs (its start, the first bytes' latency, the last wave's tail) are a visible share
of the time and no kernel reaches the copy rate of a 2 GB copy.

    python bench/read_floor.py --shape qwen3-8b --cases 16x2048,16x16384,64x2048

Per case: the bytes an FP8 cache's decode reads (keys, values and scales of every position),
then a full-read reduction (torch.sum) over that many bytes, one graph replay per call over
4 distinct buffers (graph_time.graph_time_us), and its time over the bytes at the copy
bandwidth (bytes read + written a second of a 4 GB copy), the attention bench's floor.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.roofline import copy_bandwidth
from quantroll.bench.shapes import shape_config
from quantroll.engine.paged_cache import kv_bytes_per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--cases", default="16x2048,16x16384,64x2048,64x8192,128x2048,256x1024")
    ap.add_argument("--kv", default="fp8_e4m3")
    args = ap.parse_args()
    cfg = dataclasses.replace(shape_config(args.shape), num_hidden_layers=1)
    rate = copy_bandwidth("cuda")  # bytes read + written per second: the attention bench's floor rate
    print(f"copy bandwidth {rate / 1e12:.2f} TB/s; {args.shape}, {args.kv} cache, one layer")
    print(f"{'batch':>6} {'ctx':>6} {'MB':>8} {'floor us':>9} {'read us':>8} {'x floor':>8}")
    for text in args.cases.split(","):
        batch, ctx = (int(x) for x in text.split("x"))
        nbytes = int(batch * ctx * kv_bytes_per_token(cfg, args.kv, torch.bfloat16))
        buffers = [torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_() for _ in range(4)]
        us = graph_time_us(lambda j: buffers[j].sum(), len(buffers))
        floor = nbytes / rate * 1e6
        print(f"{batch:>6} {ctx:>6} {nbytes / 1e6:>8.1f} {floor:>9.1f} {us:>8.1f} {us / floor:>8.2f}")
        buffers.clear()  # freed before the next case allocates


if __name__ == "__main__":
    main()
