"""GPU time of a call as a decode step sees it: replayed inside a CUDA graph (launch
overhead excluded, as under the engine's graphs), over several distinct weights so that
no call finds its operands in L2."""

from __future__ import annotations

from typing import Callable

import torch


def graph_time_us(fn: Callable[[int], object], copies: int, reps: int = 20) -> float:
    """Median over ``reps`` replays of one graph holding fn(0) .. fn(copies - 1), divided
    by ``copies``: microseconds per call. fn(j) must use the j-th copy of its weights."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compilation, allocator) outside the capture
        for j in range(copies):
            fn(j)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(copies):
            fn(j)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / copies)
    return sorted(times)[len(times) // 2]
