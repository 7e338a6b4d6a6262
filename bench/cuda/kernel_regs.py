"""Registers, shared memory and spills of kiln's CUDA kernels, without a GPU.

Compiles crates/kiln-cuda/kernels/*.cu (in the backend's order) with NVRTC and
`-Xptxas=-v` and prints ptxas's report for the kernels whose name matches a regex.

  python3 bench/cuda/kernel_regs.py [REGEX] [--arch sm_90]

NVRTC comes from the PyPI wheel nvidia-cuda-nvrtc (13.0.x, see GPU.md): its lib
folder is taken from $NVRTC_LIB, else found under site-packages.
"""

import ctypes
import glob
import os
import re
import site
import sys

ORDER = [
    "common.cu", "quant.cu", "repack.cu", "mm.cu", "matmul.cu", "gemv.cu", "mmq.cu", "ops.cu",
    "attention.cu", "attention_f32.cu", "attention_f16.cu", "flash.cu",
]


def nvrtc_dir():
    if os.environ.get("NVRTC_LIB"):
        return os.environ["NVRTC_LIB"]
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(sp, "nvidia", "cu*", "lib", "libnvrtc.so.*"))
        hits += glob.glob(os.path.join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
        if hits:
            return os.path.dirname(hits[0])
    sys.exit("libnvrtc not found: pip install nvidia-cuda-nvrtc, or set NVRTC_LIB")


def compile_kernels(arch, extra=()):
    """NVRTC over crates/kiln-cuda/kernels (the backend's order): (lib, prog, log)."""
    lib_dir = nvrtc_dir()
    for b in sorted(glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so*"))):
        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(lib_dir, "libnvrtc.so*")))[0])
    root = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "kiln-cuda", "kernels")
    src = "".join(open(os.path.join(root, f)).read() + "\n" for f in ORDER)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kiln.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device"] + [o.encode() for o in extra]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode()
    if rc != 0:
        sys.exit(log)
    return lib, prog, log


def arch_arg(args):
    """--arch ARCH out of args (default sm_90)."""
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i : i + 2]
        return arch
    return "sm_90"


def main():
    args = sys.argv[1:]
    arch = arch_arg(args)
    pat = re.compile(args[0] if args else "")
    _, _, log = compile_kernels(arch, ["-Xptxas=-v"])
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
        elif cur and pat.search(cur):
            if "registers" in line:
                print(cur, line.split("ptxas info    : ")[-1].strip())
            elif "spill" in line and " 0 bytes spill stores, 0 bytes spill loads" not in line:
                print(cur, line.strip())


if __name__ == "__main__":
    main()
