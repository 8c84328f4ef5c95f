"""Building and loading the CUTLASS blockwise FP8 GEMM library (kernels/cuda/cutlass_fp8_gemm.cu).

Why a shared library and not a cubin (cuda_jit.py): CUTLASS 3.x kernels take their TMA
descriptors from host code (cuTensorMapEncodeTiled on the problem's pointers and strides),
so the host side is compiled with them. Why not a torch extension: it would compile
PyTorch's headers too; a plain .so with ``extern "C"`` entry points on raw pointers and a
cudaStream_t builds faster and is loaded with ctypes.

The build: the source is compiled once per kernel configuration (-DQR_PART=<id>,
-DQR_OUT=<output type>, one kernel per object, the objects built in parallel) plus once for
the entry points, and linked with nvcc -shared (the CUDA runtime linked statically). The
result is cached as ``$QUANTROLL_CACHE_DIR/cuda/cutlass_fp8_gemm-<key>.so`` (else
~/.cache/quantroll/cuda), key = hash of the source, the flags, nvcc's version and CUTLASS's
version (not the include path, so a cache directory carried to another machine with the
same nvcc and CUTLASS hits). ``$QUANTROLL_CUTLASS_LIB`` names a prebuilt .so directly (no
nvcc or CUTLASS headers needed then); either way the library must report the hash of the
source it was built from, and a stale one is refused. Builds are serialised by a file lock
beside the cache, written under a temporary name and renamed.

Headers: ``$QUANTROLL_CUTLASS_INCLUDE`` (directories separated by ':'), else the installed
``nvidia-cutlass`` package (``pip install 'quantroll[gpu]'``): its
cutlass_library/source/include and .../tools/util/include.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from quantroll.kernels.cuda_jit import SOURCE_DIR, CompileError, cache_dir, find_nvcc

SOURCE = SOURCE_DIR / "cutlass_fp8_gemm.cu"
STEM = "cutlass_fp8_gemm"
ARCH = "-gencode=arch=compute_90a,code=sm_90a"  # wgmma and setmaxnreg exist only on sm_90a
FLAGS = ("-O3", "-std=c++17", "--expt-relaxed-constexpr", ARCH, "-DNDEBUG", "-Xcompiler=-fPIC", "-Xptxas=-v")
OUT_TYPES = ("bf16", "f32")  # QR_OUT values: the engine's BF16 output, float32 for the numerics rule
ABI_VERSION = 2  # bump with any change of the extern "C" signatures (2: qr_cutlass_fp8_gemm's pdl)


class CutlassUnavailable(RuntimeError):
    """Why the CUTLASS GEMMs cannot be built or loaded here, in one line."""


def include_dirs() -> list[Path]:
    """CUTLASS's header directories, or CutlassUnavailable saying how to get them."""
    env = os.environ.get("QUANTROLL_CUTLASS_INCLUDE")
    if env:
        dirs = [Path(d) for d in env.split(":") if d]
        if not any((d / "cutlass" / "version.h").is_file() for d in dirs):
            raise CutlassUnavailable(f"$QUANTROLL_CUTLASS_INCLUDE={env} holds no cutlass/version.h")
        return dirs
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.origin:
        raise CutlassUnavailable("the nvidia-cutlass package is not installed (pip install 'quantroll[gpu]', "
                                 "or set QUANTROLL_CUTLASS_INCLUDE to CUTLASS's include directories)")
    source = Path(spec.origin).parent / "source"
    dirs = [source / "include", source / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "version.h").is_file():
        raise CutlassUnavailable(f"nvidia-cutlass at {source.parent} holds no C++ headers under source/include")
    return dirs


def cutlass_version(dirs: list[Path]) -> str:
    """CUTLASS's version from cutlass/version.h, e.g. '4.2.0'."""
    text = next(d / "cutlass" / "version.h" for d in dirs if (d / "cutlass" / "version.h").is_file()).read_text()
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def source_hash(text: str | None = None) -> str:
    """The hash the library reports (qr_cutlass_source_key): of the .cu text alone."""
    return hashlib.sha256((SOURCE.read_text() if text is None else text).encode()).hexdigest()[:16]


def num_configs(text: str | None = None) -> int:
    """kNumConfigs in the source: the number of -DQR_PART objects to build per output type."""
    found = re.search(r"enum : int \{ kNumConfigs = (\d+) \};", SOURCE.read_text() if text is None else text)
    if not found:
        raise CompileError(f"{SOURCE.name}: no 'enum : int {{ kNumConfigs = N }};' line")
    return int(found.group(1))


@dataclass(frozen=True)
class BuildPlan:
    """What one build compiles: the nvcc command lines of its objects and the link."""

    nvcc: str
    includes: tuple[Path, ...]
    key: str
    parts: tuple[tuple[str, ...], ...]  # the -D flags of each object

    @property
    def library(self) -> Path:
        return cache_dir() / f"{STEM}-{self.key}.so"


def build_plan(nvcc: str | None = None, dirs: list[Path] | None = None) -> BuildPlan:
    """The build of the current source with ``nvcc`` and CUTLASS's headers ``dirs``."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CutlassUnavailable("nvcc not found (set CUDA_HOME or QUANTROLL_NVCC to a CUDA toolkit >= 12.3)")
    dirs = dirs if dirs is not None else include_dirs()
    text = SOURCE.read_text()
    parts = [("-DQR_PART=-1",)] + [(f"-DQR_PART={i}", f"-DQR_OUT={o}") for o in range(len(OUT_TYPES))
                                   for i in range(num_configs(text))]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    key_text = "\0".join([text, *FLAGS, *(" ".join(p) for p in parts), version, cutlass_version(dirs),
                          str(ABI_VERSION)])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
    return BuildPlan(nvcc, tuple(dirs), key, tuple(parts))


@contextmanager
def _build_lock(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{STEM}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another process building the same library waits here
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile_object(plan: BuildPlan, defines: tuple[str, ...], out: Path) -> str:
    cmd = [plan.nvcc, *FLAGS, *defines, f"-DQR_SOURCE_KEY=0x{source_hash()}ULL", f"-DQR_ABI={ABI_VERSION}",
           *(f"-I{d}" for d in plan.includes), "-c", str(SOURCE), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"nvcc failed on {SOURCE.name} ({' '.join(defines)}): {done.stderr.strip()[-2000:]}")
    return f"== {' '.join(defines)}\n{done.stderr}"


def build(plan: BuildPlan | None = None, jobs: int | None = None) -> Path:
    """The library of ``plan`` (default: the current source here), built once and cached.
    Its build log (ptxas' registers and spills per kernel) is kept beside it as .log."""
    plan = plan or build_plan()
    out = plan.library
    if out.exists():
        return out
    with _build_lock(out.parent):
        if out.exists():  # built by another process while this one waited
            return out
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{STEM}-") as tmp:
            objects = [Path(tmp) / f"part{i}.o" for i in range(len(plan.parts))]
            jobs = max(1, min(jobs or os.cpu_count() or 1, len(objects)))
            with ThreadPoolExecutor(jobs) as pool:
                logs = list(pool.map(lambda io: _compile_object(plan, plan.parts[io], objects[io]),
                                     range(len(objects))))
            library = Path(tmp) / out.name
            done = subprocess.run([plan.nvcc, "-shared", ARCH, "-o", str(library), *map(str, objects)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise CompileError(f"linking {out.name} failed: {done.stderr.strip()[-2000:]}")
            (Path(tmp) / "build.log").write_text("".join(logs))
            os.replace(Path(tmp) / "build.log", out.with_suffix(".log"))
            os.replace(library, out)
    return out


def c7510_warnings(log_text: str) -> list[str]:
    """ptxas' 'wgmma serialized' warnings (C7510) in a build log: each one costs a kernel
    its overlap of MMAs, so a build that has any is not the one to time."""
    return [line for line in log_text.splitlines() if "C7510" in line]


class Library:
    """The loaded .so, typed."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        i, ll, p, sz = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_size_t
        problem = [i, i, i, p, ll, p, ll, i, p, ll, p, ll, p, ll, i, i]  # m, n, k, a.., y, ldy, splits, device
        lib.qr_cutlass_fp8_gemm.argtypes = [i, i, *problem, p, sz, p, i]
        lib.qr_cutlass_can_implement.argtypes = [i, i, *problem]
        lib.qr_cutlass_workspace_size.argtypes = [i, i, i, i, i, ll, ll, i, ll, ll, ll, i, i, ctypes.POINTER(sz)]
        lib.qr_cutlass_status_string.argtypes = [i]
        lib.qr_cutlass_status_string.restype = ctypes.c_char_p
        lib.qr_cutlass_source_key.restype = ctypes.c_ulonglong
        for name in ("qr_cutlass_fp8_gemm", "qr_cutlass_can_implement", "qr_cutlass_workspace_size",
                     "qr_cutlass_num_configs", "qr_cutlass_abi_version"):
            getattr(lib, name).restype = i
        if lib.qr_cutlass_abi_version() != ABI_VERSION or lib.qr_cutlass_source_key() != int(source_hash(), 16):
            raise CutlassUnavailable(f"{path} was built from another version of {SOURCE.name} (rebuild it, or unset "
                                     "QUANTROLL_CUTLASS_LIB)")
        self.lib, self.path = lib, path

    def status_string(self, status: int) -> str:
        return self.lib.qr_cutlass_status_string(status).decode()


def load_library() -> Library:
    """$QUANTROLL_CUTLASS_LIB if set, else the cached build of the current source (built
    now if missing). CutlassUnavailable or CompileError say why not."""
    prebuilt = os.environ.get("QUANTROLL_CUTLASS_LIB")
    if prebuilt:
        if not Path(prebuilt).is_file():
            raise CutlassUnavailable(f"$QUANTROLL_CUTLASS_LIB={prebuilt} is not a file")
        return Library(Path(prebuilt))
    return Library(build())


def copy_library(library: Path, dest: Path) -> Path:
    """Copy a built library (and its build log) to ``dest`` (a directory), for carrying."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, dest / library.name)
    if library.with_suffix(".log").exists():
        shutil.copy2(library.with_suffix(".log"), dest / library.with_suffix(".log").name)
    return dest / library.name
