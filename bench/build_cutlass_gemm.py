"""Build the CUTLASS blockwise FP8 GEMM library (kernels/cuda/cutlass_fp8_gemm.cu) now,
print ptxas' registers and spills per kernel, and fail on any C7510 warning (wgmma
serialized): such a build is not one to time. With --out DIR the library is copied there,
for carrying to a GPU machine that then sets QUANTROLL_CUTLASS_LIB=DIR/<name>.so.

    python bench/build_cutlass_gemm.py [--jobs 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from quantroll.kernels import cutlass_build


def ptxas_summary(log_text: str) -> list[tuple[str, str, int, int, int]]:
    """(part's -D flags, kernel schedule, registers, spill stores, spill loads) per kernel."""
    rows, part, kernel, spills = [], "?", "?", (0, 0)
    for line in log_text.splitlines():
        if line.startswith("== "):
            part = line[3:].strip()
        elif "Compiling entry function" in line:
            found = re.search(r"(KernelTmaWarpSpecialized\w+?FP8Blockwise)", line)
            kernel = found.group(1) if found else line.split("'")[1][:40]
        elif "spill stores" in line:
            found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            spills = (int(found.group(1)), int(found.group(2))) if found else (-1, -1)
        elif "Used" in line and "registers" in line:
            rows.append((part, kernel, int(re.search(r"Used (\d+) registers", line).group(1)), *spills))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=None, help="objects compiled at once (default: all CPUs)")
    p.add_argument("--out", type=Path, default=None, help="copy the library and its build log here")
    args = p.parse_args()
    plan = cutlass_build.build_plan()
    cached = plan.library.exists()
    start = time.time()
    library = cutlass_build.build(plan, args.jobs)
    print(f"{library} ({'cached' if cached else f'built in {time.time() - start:.0f} s'}; "
          f"CUTLASS {cutlass_build.cutlass_version(list(plan.includes))})")
    log_text = library.with_suffix(".log").read_text()
    for part, kernel, regs, stores, loads in ptxas_summary(log_text):
        print(f"  {part:26s} {kernel:50s} {regs:4d} registers, spills {stores}/{loads} bytes")
    if args.out:
        print(f"copied to {cutlass_build.copy_library(library, args.out)}")
    serialized = cutlass_build.c7510_warnings(log_text)
    for line in serialized:
        print(f"C7510: {line}", file=sys.stderr)
    return 1 if serialized else 0


if __name__ == "__main__":
    sys.exit(main())
