#!/usr/bin/env python3
"""Loads a kernel issues above its PDL wait (ACQBULK) that are not its weights: in
`kernel_sass.py` output, per kernel, the read-only-path loads (`LDG.E.CONSTANT`,
`LDG.E.64.CONSTANT`, ... without `.NA`) before the first ACQBULK. kiln's streaming
GEMVs preload weights with `.NA` loads and their norm weights with plain `LDG.E`;
a `.CONSTANT` load without `.NA` above the wait is either a load-time table read with
`__ldg` on purpose (the float norm kernels' weights: `mvfn*`'s `gs`, whose address comes
from the `nw` parameter) or data a kernel before may still be writing, moved there by ptxas
(NOTES.md item 111: the post-norm staging's x and y in `mvqsgq4_q4_0r` once no
launch_dependents followed the wait). So it lists candidates: check each one's parameter
(the `c[0x0][...]` its address is built from, in `kernel_sass.py` without --loads).

  python3 bench/cuda/pdl_hoist_check.py SASS.txt
"""
import re
import sys

cur, seen, bad = None, False, {}
for line in open(sys.argv[1]):
    if line.startswith("## "):
        cur, seen = line[3:].strip(), False
        continue
    if cur is None or seen:
        continue
    if "ACQBULK" in line:
        seen = True
    elif re.search(r"\bLDG\.E(\.\d+)?\.CONSTANT\b", line):
        bad.setdefault(cur, []).append(line.strip())
for k, v in bad.items():
    print(f"{k}: {len(v)} read-only loads above the wait")
print(f"{len(bad)} kernels with read-only loads above the PDL wait")
