"""One CPU numerics rule for every command: `generate`, the RL loop's engine and its trainer
compute BF16 weights the same way by default (quantroll/compute.py), so they give the
same greedy answers on the shipped model.

The prompts checked through the CLI are the held-out problems whose greedy answer
changes between bfloat16 and float32 compute (a few percent of them): exactly where a
command that computed by another rule would disagree."""

import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.cli import main
from quantroll.compute import resolve_compute_dtype
from quantroll.engine import Engine, SamplingParams
from tests.greedy_reference import greedy_full_forward
from quantroll.tasks.arithmetic import ArithmeticTask
from quantroll.trainer.policy import load_policy
from quantroll.sft import decode, encode, held_out_problems

MAX_NEW = 5


def _text(tokens) -> str:
    return decode(tokens).replace("<|endoftext|>", "")


def _generate_cli(prompt: str, capsys) -> str:
    assert main(["generate", "--hf-checkpoint", str(builtin_checkpoint()), "--prompt", prompt, "--temperature", "0",
                 "--max-new-tokens", str(MAX_NEW), "--device", "cpu"]) == 0
    return capsys.readouterr().out.splitlines()[-1][len(prompt):]  # the sample line: prompt + decoded tokens


def test_generate_the_engine_and_the_trainer_agree_on_greedy_answers(capsys):
    path, dtype = builtin_checkpoint(), resolve_compute_dtype("cpu")
    prompts = ["12+34="] + [p.prompt for p in held_out_problems(ArithmeticTask(), 128, seed=0)]
    ids = [encode(p) for p in prompts]
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    engine = Engine(path, dtype=dtype)  # as the RL loop builds it
    trainer = [_text(t) for t in greedy_full_forward(load_policy(path, dtype=dtype), ids, MAX_NEW,
                                                set(engine.default_stop_ids))]
    assert [_text(r.tokens) for r in engine.generate(ids, greedy)] == trainer
    bf16 = [_text(r.tokens) for r in Engine(path, dtype=torch.bfloat16).generate(ids, greedy)]
    sensitive = [i for i in range(1, len(prompts)) if bf16[i] != trainer[i]]
    assert sensitive, "no prompt tells the two compute rules apart: the CLI check below would prove nothing"
    for i in [0] + sensitive[:6]:
        assert _generate_cli(prompts[i], capsys) == trainer[i], prompts[i]


def test_the_default_is_float32_compute_on_cpu_and_bfloat16_on_gpu():
    assert resolve_compute_dtype("cpu") == torch.float32
    assert resolve_compute_dtype("cuda") == torch.bfloat16
