"""CUDA C++ kernels of quantroll: compiled by nvcc into a cubin at first use (cached on
disk), loaded and launched through the CUDA driver API (ctypes on libcuda).

Why not a torch C++ extension: building one compiles PyTorch's headers (a minute or more
per machine) for kernels that need none of them. A cubin of plain CUDA builds in seconds,
and a launch through ``cuLaunchKernel`` on torch's current stream is recorded by CUDA
graph capture like any other kernel, which is all the decode step needs.

Nothing here falls back silently: ``available()`` says whether nvcc and the driver are
there, ``unavailable_reason()`` says why not, and callers log which path they took.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from quantroll.kernels.launch import interpreting

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "cuda"


def cache_dir() -> Path:
    """Where compiled cubins live: $QUANTROLL_CACHE_DIR/cuda, else ~/.cache/quantroll/cuda."""
    root = os.environ.get("QUANTROLL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "quantroll")
    return Path(root) / "cuda"


def find_nvcc() -> str | None:
    """$QUANTROLL_NVCC, $CUDA_HOME/bin/nvcc, nvcc on PATH, /usr/local/cuda/bin/nvcc."""
    candidates = [os.environ.get("QUANTROLL_NVCC")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def arch_flag(capability: tuple[int, int]) -> str:
    major, minor = capability
    return f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"


class CompileError(RuntimeError):
    pass


def compile_cubin(source: Path, capability: tuple[int, int], nvcc: str | None = None) -> Path:
    """The cubin of ``source`` for ``capability``, compiled once and cached by the hash of
    the source, the headers beside it, the flags and nvcc's version (written to a
    temporary name, then renamed, so a crash leaves no half-written cubin)."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CompileError("nvcc not found: set CUDA_HOME or QUANTROLL_NVCC to a CUDA toolkit >= 12.1")
    flags = ["-cubin", "-O3", "-std=c++17", arch_flag(capability), f"-I{source.parent}"]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    texts = [source.read_text()] + [h.read_text() for h in sorted(source.parent.glob("*.cuh"))]
    key = hashlib.sha256("\0".join([*texts, *flags[:-1], version]).encode()).hexdigest()[:24]
    out = cache_dir() / f"{source.stem}-{key}.cubin"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".cubin", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([nvcc, *flags, "-o", tmp, str(source)], capture_output=True, text=True)
        if done.returncode != 0:
            raise CompileError(f"nvcc failed on {source.name}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union (cuda.h)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64),
                ("value_pad", ctypes.c_char * 56)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
EARLY_LAUNCH_DRIVER = 12030  # cuDriverGetVersion of CUDA 12.3: programmatic dependent launch in CUDA graphs too


class _Driver:
    """The few driver-API entry points used here, typed."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        self.lib = lib
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(p), p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(p), p, ctypes.c_char_p]
        lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, ctypes.POINTER(p), ctypes.POINTER(p)]
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), p, ctypes.POINTER(p), ctypes.POINTER(p)]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(p)]
        lib.cuGetErrorString.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuFuncSetAttribute.argtypes = [p, i, i]
        lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(i)]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(i), p, i, ctypes.c_size_t]
        for name in ("cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel", "cuLaunchKernelEx", "cuCtxGetCurrent",
                     "cuFuncSetAttribute", "cuDriverGetVersion", "cuOccupancyMaxActiveBlocksPerMultiprocessor"):
            getattr(lib, name).restype = i

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise RuntimeError(f"CUDA driver: {what} failed: {(text.value or b'?').decode()} ({result})")


_driver: _Driver | None = None
_lock = threading.Lock()


def driver() -> _Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


@functools.cache
def early_launch_accepted(device_index: int) -> bool:
    """Whether launches on this device may be programmatic dependent launches: a Hopper or
    newer GPU (compute capability >= 9.0) and a driver that takes them in CUDA graphs too
    (CUDA >= 12.3; older drivers refuse the launch attribute). A fact about the device and
    the driver, so decided once per device (and logged when refused), never switched while
    kernels run."""
    drv = driver()
    version = ctypes.c_int()
    drv.check(drv.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    capability = torch.cuda.get_device_capability(device_index)
    if capability < (9, 0):
        return False
    if version.value < EARLY_LAUNCH_DRIVER:
        log.warning("CUDA driver %d.%d takes no programmatic dependent launch in CUDA graphs (12.3 does): "
                    "launching plainly on cuda:%d", version.value // 1000, version.value % 1000 // 10, device_index)
        return False
    return True


class CudaModule:
    """A cubin loaded into the current device's context; ``launch`` runs one of its
    kernels on torch's current stream. Arguments: tensors (their data pointer) and ints
    (passed as 64-bit: every kernel here takes ``long long``)."""

    def __init__(self, cubin: Path, device: torch.device):
        drv = driver()
        with torch.cuda.device(device):
            torch.cuda.current_stream(device)  # make torch's (primary) context current here
            ctx = ctypes.c_void_p()
            drv.check(drv.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
            if not ctx.value:
                raise RuntimeError(f"CUDA driver: no current context on {device} after torch initialised it")
            self._image = cubin.read_bytes()  # the driver may keep a pointer into it
            module = ctypes.c_void_p()
            drv.check(drv.lib.cuModuleLoadData(ctypes.byref(module), self._image), f"loading {cubin.name}")
        self.module, self.device, self._functions, self._shared_limits = module, device, {}, {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self._functions:
            fn = ctypes.c_void_p()
            driver().check(driver().lib.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()),
                           f"finding kernel {name}")
            self._functions[name] = fn
        return self._functions[name]

    def allow_shared(self, name: str, shared_bytes: int) -> None:
        """Let kernel ``name`` take ``shared_bytes`` of dynamic shared memory (above 48 KB
        the driver needs the kernel's limit raised first)."""
        if self._shared_limits.get(name, 0) < shared_bytes:
            driver().check(driver().lib.cuFuncSetAttribute(self.function(name), MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                           shared_bytes), f"raising {name}'s shared memory")
            self._shared_limits[name] = shared_bytes

    def resident_blocks(self, name: str, threads: int, shared_bytes: int) -> int:
        """How many blocks of kernel ``name`` (``threads`` each, ``shared_bytes`` of dynamic
        shared memory) an SM holds at once: the driver's answer from the kernel's registers
        and shared memory, which a launch rule needs to count its waves."""
        if shared_bytes > 48 * 1024:
            self.allow_shared(name, shared_bytes)
        blocks = ctypes.c_int()
        driver().check(driver().lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), self.function(name), threads, shared_bytes), f"occupancy of {name}")
        return blocks.value

    def launch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], *args,
               early: bool = False, shared_bytes: int = 0) -> None:
        """``early``: programmatic dependent launch (the kernel may start before the previous
        one on the stream has finished and must wait for it itself: griddepcontrol.wait).
        ``shared_bytes``: dynamic shared memory of each block."""
        holders = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_longlong(int(a))
                   for a in args]
        params = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        if torch.cuda.current_device() != self.device.index:  # the module's context must be current
            with torch.cuda.device(self.device):
                return self.launch(name, grid, block, *args, early=early, shared_bytes=shared_bytes)
        stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        drv = driver()
        if shared_bytes > 48 * 1024:
            self.allow_shared(name, shared_bytes)
        if not early or not early_launch_accepted(self.device.index):
            drv.check(drv.lib.cuLaunchKernel(self.function(name), *grid, *block, shared_bytes, stream, params, None),
                      f"launching {name}")
            return
        attr = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        config = _LaunchConfig(*grid, *block, shared_bytes, stream, ctypes.pointer(attr), 1)
        drv.check(drv.lib.cuLaunchKernelEx(ctypes.byref(config), self.function(name), params, None),
                  f"launching {name} (programmatic dependent launch)")


_modules: dict[tuple[str, int], CudaModule] = {}


def load(source_name: str, device: torch.device) -> CudaModule:
    """The module of ``cuda/<source_name>`` on ``device`` (compiled and loaded once)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (source_name, index)
    with _lock:
        module = _modules.get(key)
    if module is None:
        cubin = compile_cubin(SOURCE_DIR / source_name, torch.cuda.get_device_capability(index))
        module = CudaModule(cubin, torch.device("cuda", index))
        with _lock:
            _modules[key] = _modules.get(key) or module
    return _modules[key]


def unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """None when quantroll's CUDA kernels can run on ``device``, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "the GPU has no FP8 conversion instructions (compute capability < 8.9)"
    if find_nvcc() is None:
        return "nvcc not found (set CUDA_HOME or QUANTROLL_NVCC)"
    try:
        driver()
    except OSError as err:
        return f"libcuda.so.1 not loadable: {err}"
    return None


_usable: dict[tuple[str, str], bool] = {}


def usable(source_name: str, device: torch.device, what: str, fallback: str) -> bool:
    """Whether the kernels of ``cuda/<source_name>`` can run on ``device``: a CUDA device
    (not under Triton's interpreter, which runs the GPU branches on CPU tensors), the
    requirements of ``unavailable_reason``, and a successful build and load. Decided once per
    source and device, and logged: "<what>: CUDA kernel ..." or "<what>: <fallback> (...)"."""
    if device.type != "cuda" or interpreting():
        return False
    key = (source_name, str(device))
    if key not in _usable:
        reason = unavailable_reason(device)
        if reason is None:
            try:
                load(source_name, device)
            except (CompileError, RuntimeError, OSError) as err:
                reason = f"building {source_name} failed: {err}"
        if reason is None:
            log.info("%s: CUDA kernel %s on %s", what, source_name, device)
        else:
            log.warning("%s: %s (the CUDA kernel is unavailable: %s)", what, fallback, reason)
        _usable[key] = reason is None
    return _usable[key]
