#!/usr/bin/env python3
"""Lays out a decode step's kernels in time from a timeline build's stamps.

A timeline build (`KILN_CUDA_TIMELINE=FIRST[:COUNT]`, kernels compiled with
-DKILN_TIMELINE) has warp 0 of every block stamp the global nanosecond clock
before and after its programmatic-dependent-launch wait and at its phase
marks (`tl_mark`), into a slot per (grid launch number mod 256, block), with
its grid's shape and SM; `kiln` writes them for the chosen decode steps to
$KILN_CUDA_TIMELINE_OUT (steps of at most 256 kernels). A grid's earliest release from the
wait is when the grid before it finished (and its writes became visible), so
consecutive releases price each kernel on the step's critical path, boundary
included; how long a grid's blocks sat resident before that release says how
much of its prologue (weight preloads) overlapped the kernel before.

usage: timeline.py STAMPS.tsv [--per-layer K [--skip S]] [--by-sm N] [--quiet]
  --per-layer K: kernels a layer (groups the middle of the step by position
  in the layer, e.g. 5 for a fused 1B Q4_0 layer); --skip S: kernels before
  the first layer (1 there: embed)
  --by-sm N: for every grid of N stamped blocks, its blocks' arrivals and
  marks 1 and 2 after its release (10/50/90% and last), how many SMs held
  how many of its blocks, and when each group's SMs were done (mark 2)
"""
import argparse
import statistics
from collections import defaultdict


def load(path):
    """Rows [grid slot, block, before, after, m1..m5, shape] -> grids by release."""
    grids = defaultdict(list)
    with open(path) as f:
        next(f)
        for line in f:
            v = [int(x) for x in line.split()]
            grids[v[0]].append(v)
    out = []
    for gid, rows in grids.items():
        shape = rows[0][9]
        marks = defaultdict(list)
        for r in rows:
            for m in range(1, 6):
                if r[3 + m]:
                    marks[m].append(r[3 + m])
        out.append(
            {
                "gid": gid,
                "blocks": shape >> 41,
                "threads": (shape >> 30) & 0x7FF,
                "stamped": len(rows),
                "first_in": min(r[2] for r in rows),
                "last_in": max(r[2] for r in rows),
                "release": min(r[3] for r in rows),
                "last_out": max(r[3] for r in rows),
                "sms": len({(r[9] >> 22) & 0xFF for r in rows}),
                "marks": marks,
                "rows": rows,
            }
        )
    out.sort(key=lambda g: g["release"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stamps")
    ap.add_argument("--per-layer", type=int, default=0)
    ap.add_argument("--skip", type=int, default=0, help="kernels before the first layer")
    ap.add_argument("--quiet", action="store_true", help="summary only")
    ap.add_argument("--by-sm", type=int, default=0, help="grids of this many stamped blocks, by SM")
    a = ap.parse_args()
    g = load(a.stamps)
    if not g:
        print("no stamps")
        return
    print(f"{len(g)} grids")
    t_start = g[0]["first_in"]
    print(
        "  #  blocks thr stamped sms   start   release  +crit   resident-before  arrivals-after"
    )
    prev = None
    crit = []
    for i, k in enumerate(g):
        d = k["release"] - prev if prev is not None else 0
        crit.append(d)
        prev = k["release"]
        if not a.quiet:
            print(
                f"{i:3d} {k['blocks']:7d} {k['threads']:4d} {k['stamped']:6d} {k['sms']:4d}"
                f" {(k['first_in'] - t_start) / 1e3:8.2f} {(k['release'] - t_start) / 1e3:8.2f}"
                f" {d / 1e3:6.2f} {(k['release'] - k['first_in']) / 1e3:10.2f}"
                f" {(k['last_in'] - k['release']) / 1e3:14.2f}"
            )
    total = g[-1]["last_out"] - t_start
    print(f"first arrival to last release: {total / 1e3:.1f} us")
    if a.per_layer:
        # crit[i] is kernel i-1's time on the critical path (release to release).
        fam = defaultdict(list)
        n = a.per_layer
        for i in range(a.skip + 1, len(g)):
            j = i - 1 - a.skip
            if j < 0:
                continue
            fam[j % n].append(
                (
                    crit[i] / 1e3,
                    (g[i - 1]["release"] - g[i - 1]["first_in"]) / 1e3,
                    (g[i - 1]["last_in"] - g[i - 1]["release"]) / 1e3,
                    g[i - 1]["blocks"],
                    g[i - 1]["threads"],
                    {
                        m: (
                            (statistics.median(ts) - g[i - 1]["release"]) / 1e3,
                            (max(ts) - g[i - 1]["release"]) / 1e3,
                        )
                        for m, ts in g[i - 1]["marks"].items()
                    },
                )
            )
        print("position in layer: median us release-to-next-release, resident-before, arrivals-after")
        for j in sorted(fam):
            v = fam[j]
            print(
                f"  {j}: {len(v):3d} kernels, grid {v[0][3]}x{v[0][4]}:"
                f" crit {statistics.median(x[0] for x in v):6.2f}"
                f" (min {min(x[0] for x in v):.2f}, max {max(x[0] for x in v):.2f}),"
                f" resident {statistics.median(x[1] for x in v):6.2f},"
                f" late {statistics.median(x[2] for x in v):6.2f}"
            )
            ids = sorted({m for x in v for m in x[5]})
            for m in ids:
                med = [x[5][m][0] for x in v if m in x[5]]
                mx = [x[5][m][1] for x in v if m in x[5]]
                print(
                    f"      mark {m}: after release, median block {statistics.median(med):6.2f},"
                    f" last block {statistics.median(mx):6.2f} (medians over kernels)"
                )
    if a.by_sm:
        by_sm(g, a.by_sm)


def by_sm(g, n):
    """--by-sm: the grids of n stamped blocks, block by block and SM by SM."""

    def q(v):
        v = sorted(v)
        return " ".join(f"{v[int(p * (len(v) - 1))]:6.2f}" for p in (0.1, 0.5, 0.9, 1.0)) if v else "-"

    print(f"grids of {n} blocks, us after release: 10% / median / 90% / last")
    for i, k in enumerate(g):
        if k["stamped"] != n:
            continue
        rel = k["release"]
        after = lambda col: [(r[col] - rel) / 1e3 for r in k["rows"] if r[col]]
        nxt = (g[i + 1]["release"] - rel) / 1e3 if i + 1 < len(g) else 0.0
        print(f"  grid {i}: next release {nxt:6.2f}")
        for name, col in (("arrival", 2), ("mark 1", 4), ("mark 2", 5)):
            print(f"    {name:8s} {q(after(col))}")
        per_sm = defaultdict(list)
        for r in k["rows"]:
            per_sm[(r[9] >> 22) & 0xFF].append(r)
        held = defaultdict(list)
        for rs in per_sm.values():
            if all(r[5] for r in rs):
                held[len(rs)].append(max((r[5] - rel) / 1e3 for r in rs))
        for b in sorted(held):
            print(f"    {len(held[b]):3d} SMs with {b} blocks done {q(held[b])}")


if __name__ == "__main__":
    main()
