"""A save stopped dead at every filesystem operation it makes (``os._exit`` there, no
cleanup, as ``kill -9`` would) leaves a directory whose pointer names a complete state,
the old one or the new one, that loads with exactly its tensors; the next start removes
what the stopped save left."""

from __future__ import annotations

import random
import shutil

import torch

from quantroll.rl import savedir
from quantroll.rl.state import load_state
from tests.safety.child import forkserver, save_stopping_at, tiny_trainer


def _run(ctx, *args) -> None:
    proc = ctx.Process(target=save_stopping_at, args=args)
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_save_stopped_at_any_point_leaves_the_old_or_the_new_state(tmp_path):
    ctx = forkserver()
    first = tmp_path / "first"
    _run(ctx, str(first), 0, -1, str(tmp_path / "count0"))
    probe = tmp_path / "probe"
    shutil.copytree(first, probe)
    _run(ctx, str(probe), 1, -1, str(tmp_path / "count"))
    operations = int((tmp_path / "count").read_text())
    assert operations >= 10  # directories, files, fsyncs, renames, the pointer, the old version's deletion
    expected = {step: _weights(tiny_trainer(step)[0]) for step in (0, 1)}
    seen = set()
    for stop in range(operations + 1):
        d = tmp_path / f"stop{stop}"
        shutil.copytree(first, d)
        _run(ctx, str(d), 1, stop, str(tmp_path / f"count{stop}"))
        model, optimizer, rng = tiny_trainer(7)  # other weights, overwritten by the load
        step = load_state(d, model, optimizer, random.Random(0))
        seen.add(step)
        for name, value in expected[step].items():
            assert torch.equal(model.state_dict()[name], value), (stop, step, name)
        savedir.clean(d)  # what the next start does, under the lock
        assert sorted(p.name for p in d.iterdir()) == sorted([".quantroll", savedir.POINTER,
                                                              savedir.latest(d).path.name]), stop
    assert seen == {0, 1}  # stopped early, the old state; late, the new one
