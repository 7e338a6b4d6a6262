"""SASS of kiln's CUDA kernels, without a GPU: NVRTC's cubin through nvdisasm.

Shows how ptxas scheduled a kernel: whether a lane's loads are issued together
(`LDG` lines in a row) or one round trip after another (each behind a branch),
where the barriers and shuffles fall. Compare two versions of a kernel before
spending device time on them.

  python3 bench/cuda/kernel_sass.py REGEX [--arch sm_90] [--loads]

--loads keeps the lines that order the kernel in time: loads and stores,
barriers, shuffles, branches, f64 math, the PDL wait (ACQBULK) and release
(PREEXIT). NVRTC as in kernel_regs.py; nvdisasm from the PyPI wheel
nvidia-cuda-nvdisasm (its nvidia/cu13/bin folder is found under site-packages,
or set $NVDISASM to the binary).
"""

import glob
import os
import re
import site
import subprocess
import sys
import tempfile
import ctypes

sys.path.insert(0, os.path.dirname(__file__))
from kernel_regs import arch_arg, compile_kernels  # noqa: E402

KEEP = re.compile(r"\b(LDG|STG|LDS|STS|LD|ST|ATOM|RED|BAR|SHFL|BRA|EXIT|DFMA|DADD|ACQBULK|PREEXIT|MEMBAR)\b")


def nvdisasm():
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(sp, "nvidia", "cu*", "bin", "nvdisasm"))
        if hits:
            return hits[0]
    sys.exit("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or set NVDISASM")


def main():
    args = sys.argv[1:]
    arch = arch_arg(args)
    loads = "--loads" in args
    args = [a for a in args if a != "--loads"]
    pat = re.compile(args[0] if args else "")
    lib, prog, _ = compile_kernels(arch)
    n = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, buf)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.raw)
        f.flush()
        out = subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout
    for m in re.finditer(r"^\.text\.(\w+):\n(.*?)(?=^//-----|\Z)", out, re.S | re.M):
        name, body = m.group(1), m.group(2)
        if not pat.search(name):
            continue
        print(f"## {name}")
        for line in body.splitlines():
            if "/*" not in line or (loads and not KEEP.search(line)):
                continue
            print(re.sub(r"\s+", " ", line.split(";")[0]).strip())


if __name__ == "__main__":
    main()
