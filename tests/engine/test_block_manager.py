"""The block manager and the scheduler as pure policy: no model, no tensors."""

import pytest

from quantroll.engine.block_manager import SCRATCH_BLOCK, BlockManager
from quantroll.engine.scheduler import Decode, Prefill, Scheduler, SchedulerConfig
from quantroll.engine.sequence import Sequence, Status
from quantroll.errors import QuantrollError


def seq(i, prompt, new=4):
    return Sequence(i, list(prompt), new, seed=i)


def test_shared_prefix_blocks_are_counted_once_and_freed_last():
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b = seq(0, range(10)), seq(1, range(10))
    plan = bm.prefix_plan(a)
    assert plan.shared == () and not plan.pending
    assert bm.admit(a, plan)
    assert len(a.block_table) == 3 and SCRATCH_BLOCK not in a.block_table
    # a's first two blocks are named but not written yet: b must wait rather than recompute them
    assert bm.prefix_plan(b).pending
    a.num_computed = 10
    bm.mark_computed(a)
    plan = bm.prefix_plan(b)
    assert plan.shared == tuple(a.block_table[:2]) and not plan.pending
    assert bm.admit(b, plan)
    assert b.num_computed == b.num_shared == 8 and b.block_table[2] != a.block_table[2]
    assert bm.num_used == 4
    bm.release(a)
    assert bm.num_used == 3  # the shared blocks stay with b
    bm.release(b)
    assert bm.num_used == 0 and bm.peak_used == 4


def test_the_block_of_the_last_prompt_position_is_never_shared():
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b = seq(0, range(8)), seq(1, range(8))  # two full blocks; position 7 must be computed by each
    assert bm.admit(a, bm.prefix_plan(a))
    a.num_computed = 8
    bm.mark_computed(a)
    plan = bm.prefix_plan(b)
    assert plan.shared == (a.block_table[0],)


def test_freed_blocks_keep_their_prefix_until_reused_and_reset_forgets_it():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(0, range(9))
    bm.admit(a, bm.prefix_plan(a))
    a.num_computed = 9
    bm.mark_computed(a)
    first = a.block_table[:2]
    bm.release(a)
    b = seq(1, range(9))
    assert bm.prefix_plan(b).shared == tuple(first)  # a later call with the same prompt still hits
    bm.reset_prefix_cache()
    assert bm.prefix_plan(b).shared == ()


def test_an_unwritten_block_loses_its_name_when_freed():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(0, range(9))
    bm.admit(a, bm.prefix_plan(a))
    bm.release(a)  # preempted before its prefill ran
    assert bm.prefix_plan(seq(1, range(9))) .shared == () and not bm.prefix_plan(seq(1, range(9))).pending


def test_admission_fails_cleanly_when_the_pool_is_short():
    bm = BlockManager(num_blocks=3, block_size=4)  # 2 usable
    a = seq(0, range(12))
    assert not bm.admit(a, bm.prefix_plan(a)) and a.block_table == [] and bm.num_free == 2


def test_admission_leaves_the_running_room_and_preemption_takes_the_newest():
    bm = BlockManager(num_blocks=5, block_size=2)  # 4 usable blocks
    sched = Scheduler(bm, SchedulerConfig(decode_steps=1, max_num_batched_tokens=64), max_new_tokens=6)
    a, b, c = seq(0, [1, 2], new=6), seq(1, [3, 4], new=6), seq(2, [5, 6], new=6)
    for s in (a, b, c):
        sched.add(s)
    work = sched.schedule()
    assert isinstance(work, Prefill) and [ch.seq for ch in work.chunks] == [a, b]  # c: no room left to decode
    sched.prefilled(work.chunks)
    for step in range(2):
        for s in (a, b):
            s.append(7, -0.1, frozenset())
        work = sched.schedule()
        assert isinstance(work, Decode) and work.seqs == (a, b)
        for s in work.seqs:
            sched.decoded(s, 1)
    for s in (a, b):
        s.append(7, -0.1, frozenset())
    work = sched.schedule()  # a needs a third block for position 4 and none is free: b, the newest, gives way
    assert isinstance(work, Decode) and work.seqs == (a,)
    assert b.status is Status.WAITING and b.preemptions == 1 and sched.preemptions == 1
    assert list(sched.waiting)[:2] == [b, c] and b.tokens == [7, 7, 7] and b.block_table == []
    assert b.prefill_target == 4  # recomputed without its newest token, which the next step feeds


def test_long_prompts_prefill_in_chunks_of_the_token_budget():
    bm = BlockManager(num_blocks=20, block_size=4)
    sched = Scheduler(bm, SchedulerConfig(decode_steps=1, max_num_batched_tokens=5), max_new_tokens=2)
    a = seq(0, range(12), new=2)
    sched.add(a)
    spans = []
    while True:
        work = sched.schedule()
        if not isinstance(work, Prefill):
            break
        spans += [(c.start, c.count, c.completes) for c in work.chunks]
        sched.prefilled(work.chunks)
    assert spans == [(0, 5, False), (5, 5, False), (10, 2, True)]


def test_a_prompt_larger_than_the_pool_is_refused_naming_the_budget():
    bm = BlockManager(num_blocks=3, block_size=4)
    sched = Scheduler(bm, SchedulerConfig(decode_steps=1), max_new_tokens=8)
    with pytest.raises(QuantrollError, match="prompt 0 needs 4 KV blocks.*--kv-cache-memory-gb"):
        sched.add(seq(0, range(9), new=8))


def test_static_policy_runs_one_group_to_its_longest_row():
    bm = BlockManager(num_blocks=30, block_size=4)
    sched = Scheduler(bm, SchedulerConfig(decode_steps=1, policy="static"), max_new_tokens=8)
    a, b = seq(0, [1, 2], new=2), seq(1, [3, 4], new=8)
    sched.add(a)
    sched.add(b)
    work = sched.schedule()
    assert [c.seq for c in work.chunks] == [a, b]
    assert len(a.block_table) == 3  # 2 + 8 - 1 positions reserved for everyone
    sched.prefilled(work.chunks)
    a.append(1, 0.0, frozenset())
    b.append(1, 0.0, frozenset())
    a.append(1, 0.0, frozenset())
    sched.finish(a)
    work = sched.schedule()
    assert isinstance(work, Decode) and set(work.seqs) == {a, b}  # a still computed until b ends
    assert bm.num_used == 6


def test_bad_scheduler_settings_are_refused():
    with pytest.raises(QuantrollError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(QuantrollError, match="policy"):
        SchedulerConfig(policy="fifo")


def test_marking_from_a_position_marks_the_blocks_it_filled():
    """A decode chunk marks from the positions known written before it: the block it
    completed (filled partly before) and the full ones after, none before, none partial."""
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq(0, range(5))
    assert bm.admit(a, bm.prefix_plan(a)) and bm.grow(a, 16)
    ready = lambda: [bm.blocks[b].ready for b in a.block_table]  # noqa: E731
    a.num_computed = 5
    bm.mark_computed(a)
    assert ready() == [True, False, False, False]
    bm.blocks[a.block_table[0]].ready = False  # to see that since=5 leaves block 0 alone
    a.num_computed = 13
    bm.mark_computed(a, since=5)
    assert ready() == [False, True, True, False]


@pytest.mark.parametrize("before,chunk,cap,stop,kept,reason", [
    ([], [5, 6, 7, 8], 10, frozenset(), [5, 6, 7, 8], None),          # all taken
    ([1], [5, 2, 7, 8], 10, frozenset({2}), [1, 5, 2], "stop"),       # up to and including the first stop id
    ([1, 1], [5, 6, 7, 8], 4, frozenset({9}), [1, 1, 5, 6], "length"),  # cut at the length cap
    ([], [2, 6], 1, frozenset({2}), [2], "stop"),                     # a stop id that is also the last allowed token
    ([], [5, 6, 2, 2], 3, frozenset({2}), [5, 6, 2], "stop"),         # the stop id at the cap
    ([], [], 3, frozenset({2}), [], None),                            # nothing decoded
])
def test_extend_takes_a_chunk_as_appends_one_by_one_would(before, chunk, cap, stop, kept, reason):
    """By hand (kept tokens, finish reason), and against the same tokens appended one by one."""
    a, b = seq(0, [1], new=cap), seq(1, [1], new=cap)
    for s in (a, b):
        s.tokens, s.logprobs = list(before), [-0.5] * len(before)
    lps = [-float(i + 1) for i in range(len(chunk))]
    ended = False
    for token, logprob in zip(chunk, lps):
        if a.append(token, logprob, stop):
            ended = True
            break
    assert b.extend(chunk, lps, stop) == ended == (reason is not None)
    assert (b.tokens, b.finish_reason) == (kept, reason)
    assert b.logprobs == [-0.5] * len(before) + lps[:len(kept) - len(before)]
    assert (b.tokens, b.logprobs, b.finish_reason) == (a.tokens, a.logprobs, a.finish_reason)
