"""Bounded load test for `kiln serve` (standard library only).

Against a running server:

    python tests/server/load_test.py --url http://127.0.0.1:8080 --concurrency 1,4,8 \
        --requests 16 --max-tokens 32 [--pid SERVER_PID]

or starting one (on a free loopback port; stopped with SIGTERM at the end,
which must exit 0):

    python tests/server/load_test.py --kiln target/release/kiln --model MODEL.gguf \
        --server-args "--parallel 64 -t 2" --concurrency 1,8,32,64 --requests-per-stream 4

For each concurrency level C it runs C client threads issuing `--requests`
(or C × `--requests-per-stream`) streamed chat requests in total (greedy,
ignore_eos so every reply has exactly max_tokens tokens) over `--prompts`
distinct prompts, and reports requests/s, TTFT p50/p99, aggregate generated
tokens/s, and the load average. It checks that every response completes
(`[DONE]`, finish_reason "length") with the right token count, that each
greedy reply equals the reply to the same prompt sent alone, and (with --pid
or --kiln) that the server's RSS, sampled during every level, does not grow
by more than --rss-slack-mib in a level no larger than an earlier one
(repeat a level to test it: `--concurrency 1,8,32,64,64`). Exit status 1 on any
failed check.
"""

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import subprocess
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


def prompt_set(n):
    """`n` distinct prompts: the base ones, then numbered variants."""
    return [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" (variant {i // len(PROMPTS)})")
            for i in range(n)]


# --completions: /v1/completions with the raw prompt (models without a chat
# template, e.g. `kiln synth` shapes on the GPU machine).
COMPLETIONS = False


def stream_chat(host, port, prompt, max_tokens):
    """Returns (ttft_s, total_s, text, completion_tokens, finish_reasons)."""
    req = {
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if COMPLETIONS:
        req["prompt"] = prompt
    else:
        req["messages"] = [{"role": "user", "content": prompt}]
    body = json.dumps(req)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    path = "/v1/completions" if COMPLETIONS else "/v1/chat/completions"
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
    ttft, text, usage, done, finish = None, "", None, False, []
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
            if "error" in v:
                raise RuntimeError(f"error event: {v['error']}")
            for ch in v.get("choices", []):
                if ch.get("finish_reason"):
                    finish.append(ch["finish_reason"])
                piece = ch.get("text") if COMPLETIONS else ch.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text += piece
    conn.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return (ttft or 0.0, time.perf_counter() - t0, text,
            usage["completion_tokens"] if usage else -1, finish)


def start_server(kiln, model, extra):
    """Starts `kiln serve` on a free loopback port; returns (process, host, port)."""
    cmd = [kiln, "serve", model, "--host", "127.0.0.1", "--port", "0"] + shlex.split(extra)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        m = re.search(r"on http://([0-9.]+):([0-9]+)", line)
        if m:
            # Keep draining stderr so the server never blocks on it.
            threading.Thread(target=lambda: [sys.stderr.write(x) for x in proc.stderr],
                             daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    proc.wait()
    sys.exit(f"kiln serve exited ({proc.returncode}) before serving: {' '.join(cmd)}")


class RssSampler:
    """Largest RSS of `pid` seen while running (sampled every 50 ms)."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            self.stop.wait(0.05)

    def done(self):
        self.stop.set()
        self.t.join()
        return max(self.peak, rss_mib(self.pid))


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
    ap.add_argument("--requests", type=int, default=16, help="requests per level")
    ap.add_argument("--requests-per-stream", type=int,
                    help="requests per level = this × the level's streams (overrides --requests)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="distinct prompts")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--kiln", help="start this kiln binary's server instead of using --url")
    ap.add_argument("--model", help="model for --kiln")
    ap.add_argument("--server-args", default="", help="more `kiln serve` arguments for --kiln")
    ap.add_argument("--rss-slack-mib", type=float, default=64)
    ap.add_argument("--completions", action="store_true",
                    help="use /v1/completions with the raw prompt (models without a chat template)")
    a = ap.parse_args()
    global COMPLETIONS
    COMPLETIONS = a.completions
    proc = None
    if a.kiln:
        if not a.model:
            sys.exit("--kiln needs --model")
        proc, host, port = start_server(a.kiln, a.model, a.server_args)
        a.pid = proc.pid
    else:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port or 80
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("load_test.py only talks to a loopback server")
    try:
        ok = run_levels(a, host, port)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "killed after 120 s"
    if proc:
        print(f"server stopped on SIGTERM with status {rc}")
        if rc != 0:
            ok = False
    print("load test passed" if ok else "load test FAILED")
    sys.exit(0 if ok else 1)


def run_levels(a, host, port):
    ok = True
    prompts = prompt_set(max(1, a.prompts))
    reference = {}
    for p in prompts:
        reference[p] = stream_chat(host, port, p, a.max_tokens)[2]
    rss = [rss_mib(a.pid)] if a.pid else []
    print("| streams | requests | req/s | TTFT p50 (ms) | TTFT p99 (ms) | aggregate tok/s | load avg (1 min) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c in [int(x) for x in a.concurrency.split(",")]:
        n_req = a.requests_per_stream * c if a.requests_per_stream else a.requests
        results, errors = [], []
        lock = threading.Lock()
        counter = iter(range(n_req))

        def worker():
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                p = prompts[i % len(prompts)]
                try:
                    r = stream_chat(host, port, p, a.max_tokens)
                    with lock:
                        results.append((p, r))
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(repr(e))

        sampler = RssSampler(a.pid) if a.pid else None
        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker) for _ in range(c)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()[0]
        if sampler:
            rss.append(sampler.done())
        if errors or len(results) != n_req:
            print(f"FAIL c={c}: {len(results)} of {n_req} completed; errors: {errors[:3]}")
            ok = False
            continue
        bad_count = [r for _, r in results if r[3] != a.max_tokens or r[4] != ["length"]]
        mismatch = [p for p, r in results if r[2] != reference[p]]
        if bad_count:
            print(f"FAIL c={c}: {len(bad_count)} replies without {a.max_tokens} tokens "
                  f"and finish_reason length")
            ok = False
        if mismatch:
            print(f"FAIL c={c}: {len(mismatch)} greedy replies differ from the single-request reply")
            ok = False
        ttfts = [r[0] * 1e3 for _, r in results]
        toks = sum(r[3] for _, r in results)
        print(f"| {c} | {n_req} | {n_req / wall:.2f} | {pct(ttfts, 50):.0f} | "
              f"{pct(ttfts, 99):.0f} | {toks / wall:.1f} | {load1:.1f} |", flush=True)
    if a.pid:
        print(f"server RSS (MiB) after the single-request warm-up, then the peak during each level: "
              f"{', '.join(f'{x:.0f}' for x in rss)}")
        # Memory may grow while levels get larger (more of the preallocated
        # KV pool and scratch touched), but a level no larger than an
        # earlier one (e.g. `--concurrency 1,8,64,64`) must stay within the
        # slack of what was already reached.
        levels = [int(x) for x in a.concurrency.split(",")]
        for i, c in enumerate(levels):
            if i + 1 < len(rss) and any(p >= c for p in levels[:i]):
                before = max(rss[: i + 1])
                if rss[i + 1] - before > a.rss_slack_mib:
                    print(f"FAIL: RSS grew from {before:.0f} to {rss[i + 1]:.0f} MiB "
                          f"in a repeated level of {c} streams")
                    ok = False
    return ok


if __name__ == "__main__":
    main()
