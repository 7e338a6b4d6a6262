"""Rows of bench/cuda/peers.sh's table from kiln bench / hf_peer.py JSON.

  table.py kiln NAME KILN_BENCH_JSON     one model's row (decode, prefill, floor)
  table.py peer HF_PEER_JSON             transformers' row
  table.py batch KILN_BENCH_BATCH_JSON   the --batch table
"""
import json, sys


def load(s):
    try:
        return json.loads(s)
    except Exception:
        return None


kind = sys.argv[1]
if kind == "kiln":
    name, recs = sys.argv[2], load(sys.argv[3]) or []
    pre = next((r["avg_ts"] for r in recs if r.get("n_gen") == 0), 0.0)
    dec = next((r["avg_ts"] for r in recs if r.get("n_prompt") == 0), 0.0)
    tg = next((r for r in recs if r.get("n_prompt") == 0), {})
    wb = tg.get("bytes_per_token", 0) + tg.get("kv_bytes_per_token", 0)
    # kiln's own floor: the bytes over the copy rate it measured at start.
    floor, bw = tg.get("floor_ts", 0.0), tg.get("read_bandwidth_gbs", 0.0)
    pct = f"{100 * dec / floor:.0f}%" if floor else "—"
    print(f"| {name} | {wb / 1e6:.0f} MB | {floor:.0f} ({bw / 1e3:.2f} TB/s) | {dec:.0f} | {pct} | {pre:.0f} |")
elif kind == "peer":
    p = load(sys.argv[2])
    if p:
        print(f"| transformers {p.get('dtype')} (hf_peer.py) | {p.get('weight_bytes', 0) / 1e6:.0f} MB (all parameters) | — | "
              f"eager {p.get('decode_eager_tok_s', 0):.0f} / static+compile {p.get('decode_compiled_tok_s', 0):.0f} | — | "
              f"{p.get('prefill_tok_s', 0):.0f} |")
elif kind == "batch":
    recs = load(sys.argv[2]) or []
    print("| sequences | prompt tok/s | generation tok/s | aggregate tok/s |")
    print("|---|---|---|---|")
    for r in recs:
        print(f"| {r['pl']} | {r['speed_pp']:.0f} | {r['speed_tg']:.0f} | {r['speed']:.0f} |")
