#!/usr/bin/env python3
"""One `cuda_check --logits` output against its own kiln-cpu block: the largest
|difference| of each GPU block (prefill, decode with 8-bit x, decode without
graphs) from the CPU's rows. A check that needs no second build: a decode
block far from the CPU (item 111: 4-6 against 1e-2 on the tiny Gemma) is wrong.

  python3 bench/cuda/blocks_vs_cpu.py LOGITS.bin ROWS
"""
import sys
from array import array
a=array('f'); a.frombytes(open(sys.argv[1],'rb').read())
n=int(sys.argv[2]); V=len(a)//(4*n)
def blk(b): return a[b*n*V:(b+1)*n*V]
cpu=blk(3); mx=max(abs(x) for x in cpu)
for b in range(3):
    d=max(abs(x-y) for x,y in zip(blk(b),cpu))
    print(f"block{b}-cpu {d:.3e}", end='  ')
print(f"V={V}")
