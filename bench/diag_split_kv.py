"""Where SPLIT_KV_ATTENTION goes wrong on the GPU: the same 2-layer FP8 engine
(tests/engine/switches.py's model and prompts) with the split off and on, CUDA graphs off
and on; prints per setting whether the tokens match and the mean |logprob difference|.
The kernel-level split check (test_kernels_on_gpu) passes on the H200; the engine test does
not (2026-12-01). Usage: python bench/diag_split_kv.py"""
import dataclasses

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format
from quantroll.kernels import decode_attention

fp8 = get_format("fp8")
cfg = dataclasses.replace(shape_config("qwen3-8b", 2), vocab_size=4096)
model = random_model(cfg, "cuda", fmt=fp8)
params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=(), seed=5)
prompts = [list(range(1, 73)), list(range(100, 131)), list(range(200, 264))]
out = {}
for graphs in (False, True):
    for split in (False, True):
        decode_attention.SPLIT_KV_ATTENTION = split
        out[graphs, split] = Engine.from_model(model, fp8, "cuda", cuda_graphs=graphs).generate(prompts, params)
decode_attention.SPLIT_KV_ATTENTION = False
ref = out[False, False]
for key, res in out.items():
    same = all(a.tokens == b.tokens for a, b in zip(ref, res))
    first = [next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None) for a, b in zip(ref, res)]
    d = [abs(x - y) for a, b in zip(ref, res) for x, y in zip(a.logprobs, b.logprobs)]
    # before the first differing token both engines scored the same tokens in the same context
    pre = [abs(x - y) for a, b, f in zip(ref, res, first) for x, y in list(zip(a.logprobs, b.logprobs))[:f]]
    print(f"graphs={key[0]!s:5s} split={key[1]!s:5s} tokens same {same} first differing step per prompt {first} "
          f"mean |dlogprob| {sum(d) / len(d):.2e}; on shared contexts mean {sum(pre) / len(pre):.2e} max {max(pre):.2e}")
