"""Starting the test workers under torchrun (CPU, gloo), as a user would start quantroll."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONUNBUFFERED"] = "1"  # the log lines a test waits for arrive as they are written
    e.pop("WORLD_SIZE", None)
    return e


def torchrun(nproc: int, args: list[str], timeout: float = 540, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout, **kwargs)


def popen(nproc: int, args: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)
