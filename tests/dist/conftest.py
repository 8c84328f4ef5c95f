import pytest

from quantroll.builtin import builtin_checkpoint
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint


@pytest.fixture(scope="session")
def engines(tmp_path_factory):
    """The built-in model converted to fp8 and nvfp4: the engines of the multi-process tests."""
    out = {}
    for fmt in ("fp8", "nvfp4"):
        out[fmt] = tmp_path_factory.mktemp("engine") / fmt
        convert_checkpoint(builtin_checkpoint("dense"), out[fmt], ConvertConfig(format=fmt, progress=False))
    return out
