"""Bounded load test for `kiln serve` (standard library only).

    python tests/server/load_test.py --url http://127.0.0.1:8080 --concurrency 1,4,8 \
        --requests 16 --max-tokens 32 [--pid SERVER_PID]

For each concurrency level C it runs C client threads issuing `--requests`
streamed chat requests in total (greedy, ignore_eos so every reply has
exactly max_tokens tokens) and reports requests/s, TTFT p50/p99 and aggregate
generated tokens/s. It checks that every response completes with the right
token count, that each greedy reply equals the reply to the same prompt sent
alone, and (with --pid) that the server's RSS does not grow between levels
by more than --rss-slack-mib. Exit status 1 on any failed check.
"""

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is 12 times 12?",
    "Name a color.",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
    "Give me a word that rhymes with moon.",
    "What is the capital of Italy?",
]


def stream_chat(host, port, prompt, max_tokens):
    """Returns (ttft_s, total_s, text, completion_tokens)."""
    body = json.dumps({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
    ttft, text, usage, done = None, "", None, False
    buf = b""
    while not done:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            line = ev.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            v = json.loads(data)
            if v.get("usage"):
                usage = v["usage"]
            for ch in v.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text += piece
    conn.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return ttft or 0.0, time.perf_counter() - t0, text, usage["completion_tokens"] if usage else -1


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--rss-slack-mib", type=float, default=64)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("load_test.py only talks to a loopback server")
    ok = True

    reference = {}
    for p in PROMPTS:
        reference[p] = stream_chat(host, port, p, a.max_tokens)[2]
    rss = [rss_mib(a.pid)] if a.pid else []
    print("| streams | requests | req/s | TTFT p50 (ms) | TTFT p99 (ms) | aggregate tok/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c in [int(x) for x in a.concurrency.split(",")]:
        results, errors = [], []
        lock = threading.Lock()
        counter = iter(range(a.requests))

        def worker():
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                p = PROMPTS[i % len(PROMPTS)]
                try:
                    r = stream_chat(host, port, p, a.max_tokens)
                    with lock:
                        results.append((p, r))
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(repr(e))

        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker) for _ in range(c)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        if errors or len(results) != a.requests:
            print(f"FAIL c={c}: {len(results)} of {a.requests} completed; errors: {errors[:3]}")
            ok = False
            continue
        bad_count = [r for _, r in results if r[3] != a.max_tokens]
        mismatch = [p for p, r in results if r[2] != reference[p]]
        if bad_count:
            print(f"FAIL c={c}: {len(bad_count)} replies without {a.max_tokens} tokens")
            ok = False
        if mismatch:
            print(f"FAIL c={c}: {len(mismatch)} greedy replies differ from the single-request reply")
            ok = False
        ttfts = [r[0] * 1e3 for _, r in results]
        toks = sum(r[3] for _, r in results)
        print(f"| {c} | {a.requests} | {a.requests / wall:.2f} | {pct(ttfts, 50):.0f} | "
              f"{pct(ttfts, 99):.0f} | {toks / wall:.1f} |", flush=True)
        if a.pid:
            rss.append(rss_mib(a.pid))
    if a.pid:
        print(f"server RSS (MiB) after warm-up and each level: {', '.join(f'{x:.0f}' for x in rss)}")
        if max(rss) - rss[0] > a.rss_slack_mib:
            print(f"FAIL: RSS grew by {max(rss) - rss[0]:.0f} MiB")
            ok = False
    print("load test passed" if ok else "load test FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
