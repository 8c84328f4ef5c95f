"""Whether CUDA launches may be programmatic dependent launches (kernels/cuda_jit.py): a
fact about the device and its driver, decided once per device by ``early_launch_accepted``
(no module flag switched at run time). CPU: the rule against a stand-in driver; GPU: the
device's own answer, asked once."""

from __future__ import annotations

import logging

import pytest
import torch

from quantroll.kernels import cuda_jit


class _FakeLib:
    def __init__(self, version: int):
        self.version = version

    def cuDriverGetVersion(self, out):  # noqa: N802 (the driver API's name)
        out._obj.value = self.version  # out: ctypes.byref(c_int)
        return 0


class _FakeDriver:
    def __init__(self, version: int):
        self.lib = _FakeLib(version)

    def check(self, result: int, what: str) -> None:
        assert result == 0, what


@pytest.mark.parametrize("version, capability, accepted", [
    (12040, (9, 0), True), (12030, (9, 0), True), (12020, (9, 0), False), (12080, (8, 9), False),
    (12080, (10, 0), True)])
def test_early_launch_needs_hopper_and_a_driver_of_cuda_12_3(monkeypatch, caplog, version, capability, accepted):
    monkeypatch.setattr(cuda_jit, "driver", lambda: _FakeDriver(version))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    with caplog.at_level(logging.WARNING, logger=cuda_jit.__name__):
        assert cuda_jit.early_launch_accepted.__wrapped__(0) is accepted  # the rule itself, past the cache
    refused_for_driver = capability >= (9, 0) and not accepted
    assert ("launching plainly" in caplog.text) == refused_for_driver


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_device_answers_once():
    index = torch.cuda.current_device()
    first = cuda_jit.early_launch_accepted(index)
    hits = cuda_jit.early_launch_accepted.cache_info().hits
    assert cuda_jit.early_launch_accepted(index) is first
    assert cuda_jit.early_launch_accepted.cache_info().hits == hits + 1
    if torch.cuda.get_device_capability(index) >= (9, 0):
        assert first  # the project's Hopper machines run CUDA >= 12.3 drivers: decode GEMMs launch early there
