"""Long SFT's pieces without a training run: shapes, token-sized steps, length-bucketed
micro-batches, gradient accumulation against one forward, and the NLL by length bucket."""

import pytest
import torch
import torch.nn.functional as F

from quantroll.builtin import qwen3_weights, write_tiny_qwen3
from quantroll.errors import QuantrollError
from quantroll.evaluation.heldout import Scored, summarize
from quantroll.longsft.batches import micro_batches, step_examples
from quantroll.longsft.quality import nll_by_length
from quantroll.longsft.run import _step
from quantroll.longsft.shapes import SHAPES, parameter_count, parse_shape
from quantroll.sft import IGNORE, build_batch, held_out_problems, sft_example
from quantroll.tasks.trace import FibTraceTask
from quantroll.trainer.optimizer import MasterWeightAdamW
from quantroll.trainer.policy import load_policy

SMALL = "tiny,num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=2,head_dim=32"
TASK = FibTraceTask(length=60, digits=2)


def test_the_long_shape_fits_the_studys_budget_and_the_count_is_the_checkpoints():
    for shape in SHAPES.values():
        assert parameter_count(shape) == sum(t.numel() for t in qwen3_weights(shape).values())
    long = SHAPES["long"]
    assert parameter_count(long) <= 8_000_000 and 2 * parameter_count(long) <= 16_000_000
    assert long.max_position_embeddings >= 20_000 > FibTraceTask(length=16384).max_response_tokens + 64


def test_shape_overrides_and_their_errors():
    shape = parse_shape("long,num_hidden_layers=2,rope_theta=1e4,tie_word_embeddings=true", context=32768)
    assert (shape.num_hidden_layers, shape.rope_theta, shape.tie_word_embeddings, shape.max_position_embeddings) == \
        (2, 1e4, True, 32768)
    for bad, words in [("huge", "unknown shape"), ("tiny,layers=2", "not field=value"),
                       ("tiny,hidden_size=big", "must be a int"), ("tiny,num_key_value_heads=3", "multiple"),
                       ("tiny,head_dim=0", "head_dim must be >= 1")]:
        with pytest.raises(QuantrollError, match=words):
            parse_shape(bad)


def test_a_step_is_token_sized_fresh_per_step_and_reproducible():
    exclude = {p.prompt for p in held_out_problems(TASK, 8, 0)}
    a = step_examples(TASK, 0, 5, 500, exclude)
    assert a == step_examples(TASK, 0, 5, 500, exclude)  # (seed, step) alone decide it: resume needs no RNG state
    assert a != step_examples(TASK, 0, 6, 500, exclude)
    sizes = [len(p) + len(t) for p, t in a]
    assert sum(sizes) <= 500 < sum(sizes) + max(sizes) + TASK.line_tokens  # full up to about one example
    assert not {_prompt(p) for p, _ in a} & exclude
    with pytest.raises(QuantrollError, match="tokens-per-batch 20 is smaller than one example"):
        step_examples(TASK, 0, 0, 20, set())


def _prompt(ids):
    from quantroll.tasks.tokenizer import decode
    return decode(ids)


def test_micro_batches_group_similar_lengths_within_the_budget():
    examples = step_examples(TASK, 1, 0, 2000, set())
    groups = micro_batches(examples, 150)
    assert sorted(map(str, (e for g in groups for e in g))) == sorted(map(str, examples))
    lengths = [[len(p) + len(t) - 1 for p, t in g] for g in groups]
    flat = [n for g in lengths for n in g]
    assert flat == sorted(flat, reverse=True)  # longest first, so neighbours in length share a forward
    for g in lengths:
        assert len(g) * max(g) <= 150  # padded positions within the budget
        assert build_batch(groups[lengths.index(g)])[0].numel() == len(g) * max(g)
    assert len(groups) > 1
    with pytest.raises(QuantrollError, match="micro-batch-tokens 10"):
        micro_batches(examples, 10)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    path = write_tiny_qwen3(tmp_path_factory.mktemp("m") / "small", parse_shape(SMALL, 256), seed=3)
    return path


def test_accumulated_micro_batches_give_the_one_forward_loss_and_gradient(small_model):
    examples = step_examples(TASK, 2, 0, 600, set())
    results = []
    for budget in (10_000, 120):  # one forward of the whole step, then several micro-batches
        model = load_policy(small_model, dtype=torch.float32)
        opt = MasterWeightAdamW(model.parameters(), lr=1e-3, weight_dtype=None)
        loss = _step(model, opt, examples, budget, "cpu")
        results.append((loss, [g.clone() for g in opt._gradients()]))
    assert len(micro_batches(examples, 120)) > 1
    (one, g1), (many, g2) = results
    # the reference: the token-mean cross-entropy of one padded batch, as quantroll.sft computes it
    model = load_policy(small_model, dtype=torch.float32)
    ids, labels = build_batch(examples)
    logits = model(ids).float()
    ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE).item()
    assert one == pytest.approx(ref, rel=1e-6) and many == pytest.approx(ref, rel=1e-6)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_nll_by_length_recombines_to_the_token_mean(small_model):
    model = load_policy(small_model, dtype=torch.float32)
    problems = held_out_problems(FibTraceTask(length=120, digits=2, spread=0.6), 12, 0)
    out = nll_by_length(model, problems, 200)
    ids, labels = build_batch([sft_example(p) for p in problems])
    with torch.no_grad():
        logits = model(ids).float()
    ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE).item()
    assert out["nll"] == pytest.approx(ref, rel=1e-5)
    assert len(out["by_len"]) > 1
    tokens = sum(b["tokens"] for b in out["by_len"].values())
    assert tokens == int((labels != IGNORE).sum())
    assert sum(b["nll"] * b["tokens"] for b in out["by_len"].values()) / tokens == pytest.approx(out["nll"], rel=1e-9)


def test_summary_by_reference_length_bucket():
    scored = [Scored(1.0, [1] * 5, 40), Scored(0.5, [1] * 70, 40), Scored(0.0, [1], 70), Scored(1.0, [1] * 70, 70)]
    s = summarize(scored)
    assert s["reward"] == pytest.approx(2.5 / 4) and s["accuracy"] == 0.5 and s["response_tokens"] == 36.5
    assert s["by_len"] == {"32": {"n": 2, "reward": 0.75, "accuracy": 0.5}, "64": {"n": 2, "reward": 0.5, "accuracy": 0.5}}
