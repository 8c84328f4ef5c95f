"""A trainer process and an engine process on one device exchange weights through shared
memory (quantroll/sync/shared.py): the engine's process, updated twice from the trainer's
tensors, ends bitwise equal to an engine updated in the trainer's own process; a trainer
that does not hold the engine's weights is refused with their name. CPU here (shared
memory); on a GPU the same through CUDA IPC handles (the test below the CPU one)."""

import torch
import torch.multiprocessing as mp
import pytest
from safetensors.torch import load_file

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.engine import Engine
from quantroll.errors import QuantrollError
from quantroll.sync import WeightSync
from quantroll.sync.shared import SharedWeightsSender
from tests.sync.shared_child import engine_side


@pytest.fixture(scope="module")
def dirs(tiny_checkpoint, tmp_path_factory):
    bf16 = tiny_checkpoint()
    fp8 = tmp_path_factory.mktemp("fp8") / "fp8"
    convert_checkpoint(bf16, fp8, ConvertConfig(format="fp8", allow_partial_blocks=True, progress=False))
    return bf16, fp8


def _weights(bf16_dir, device) -> dict[str, torch.Tensor]:
    with CheckpointReader(bf16_dir) as reader:
        return {n: t.to(device) for n, t in reader.iter_tensors()}


def _step(weights: dict[str, torch.Tensor], k: int) -> None:
    """An optimizer step's kind of change, in place (the storage the engine reads stays)."""
    with torch.no_grad():
        for i, t in enumerate(weights.values()):
            if i % 3 == k % 3:
                t.copy_((t.float() * (1 + 2**-5) + 2**-9).to(t.dtype))


def _exchange(dirs, device, drop: str | None = None):
    bf16, fp8 = dirs
    ctx = mp.get_context("spawn")
    trainer_end, engine_end = ctx.Pipe()
    out = fp8.parent / f"shared-state-{device}.safetensors"
    child = ctx.Process(target=engine_side, args=(str(fp8), device, engine_end, str(out)))
    child.start()
    weights = _weights(bf16, device)
    if drop:
        weights.pop(drop)
    try:
        sender = SharedWeightsSender(weights, trainer_end)
        answers = []
        for version in (1, 2):
            _step(weights, version)
            answers.append(sender.publish(version))
        sender.close()
    finally:
        child.join(120)
        if child.is_alive():
            child.kill()
    return weights, answers, out


def _check_equal_to_one_process(dirs, device):
    weights, answers, out = _exchange(dirs, device)
    assert [a["trainer_version"] for a in answers] == [1, 2]
    assert all(a["weight_load_time"] >= 0 and a["weight_copy_time"] > 0 for a in answers)
    reference = Engine(dirs[1], device=device)
    WeightSync(reference).push(weights)
    got = load_file(str(out))
    expected = {k: v.cpu() for k, v in reference.state().items()}
    assert set(got) == set(expected)
    for name, t in expected.items():
        assert torch.equal(got[name].reshape(-1).view(torch.uint8), t.contiguous().reshape(-1).view(torch.uint8)), name


def test_engine_process_updated_through_shared_memory_equals_one_process(dirs):
    _check_equal_to_one_process(dirs, "cpu")


def test_a_trainer_without_the_engines_weights_is_refused(dirs):
    with pytest.raises(QuantrollError, match="the trainer lacks model.layers.1.mlp.down_proj.weight"):
        _exchange(dirs, "cpu", drop="model.layers.1.mlp.down_proj.weight")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_engine_process_updated_through_cuda_ipc_equals_one_process(dirs):
    _check_equal_to_one_process(dirs, "cuda")
