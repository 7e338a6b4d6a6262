"""kiln serve against the official `openai` Python client.

Run by crates/kiln-server/tests/real.rs (which starts the server) or by hand:

    KILN_BASE_URL=http://127.0.0.1:8080/v1 KILN_MODEL=<id> python tests/server/test_openai_client.py

Traffic goes to the given loopback server only. Every check is an assert;
the script prints one line per check and exits non-zero on the first failure.
"""

import os
import sys

import openai
from openai import OpenAI

BASE = os.environ.get("KILN_BASE_URL", "http://127.0.0.1:8080/v1")
MODEL = os.environ.get("KILN_MODEL", "")
# With a real chat model the replies can be checked for content.
REAL = os.environ.get("KILN_REAL_MODEL", "0") == "1"

client = OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=300)
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def test_models():
    ids = [m.id for m in client.models.list().data]
    check("models.list", MODEL in ids, ids)


def test_chat_whole():
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    c = r.choices[0]
    check("chat: object", r.object == "chat.completion", r.object)
    check("chat: role", c.message.role == "assistant", c.message.role)
    check("chat: finish", c.finish_reason in ("stop", "length"), c.finish_reason)
    check("chat: usage", r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
          and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    if REAL:
        check("chat: Paris", "Paris" in c.message.content, c.message.content)
    return c.message.content


def test_chat_stream(whole):
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True})
    text, finish, usage, n = "", None, None, 0
    for chunk in stream:
        n += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check("chat stream: same text as whole", text == whole, (text, whole))
    check("chat stream: finish", finish in ("stop", "length"), finish)
    check("chat stream: usage chunk", usage is not None and usage.completion_tokens > 0, usage)
    check("chat stream: several chunks", n > 2, n)


def test_completions():
    r = client.completions.create(model=MODEL, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    check("completions: object", r.object == "text_completion", r.object)
    check("completions: text", isinstance(r.choices[0].text, str) and r.usage.completion_tokens > 0,
          r)
    text = ""
    for chunk in client.completions.create(model=MODEL, prompt="The capital of France is",
                                           max_tokens=8, temperature=0, stream=True):
        text += chunk.choices[0].text if chunk.choices else ""
    check("completions stream = whole", text == r.choices[0].text, (text, r.choices[0].text))


def test_stop():
    base = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=24,
                                     temperature=0, extra_body={"ignore_eos": True})
    full = base.choices[0].text
    if len(full) < 6:
        check("stop: base text long enough", False, full)
    stop = full[3:5]
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=24,
                                  temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    cut = full[:full.index(stop)]
    check("stop: text cut before the stop sequence", r.choices[0].text == cut,
          (r.choices[0].text, cut, stop))
    check("stop: finish_reason stop", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0,
                                          stop=["\n", "."], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    check("stop: streamed chat has no stop text", "\n" not in text and "." not in text, text)


def test_seed():
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
              max_tokens=16, temperature=1.0, seed=1234)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    check("seed: same seed same text", a == b, (a, b))
    kw["seed"] = 99
    texts = {client.chat.completions.create(**kw).choices[0].message.content}
    kw["seed"] = 100
    texts.add(client.chat.completions.create(**kw).choices[0].message.content)
    texts.add(a)
    check("seed: other seeds differ", len(texts) > 1, texts)
    r = client.chat.completions.create(n=2, **kw)
    check("n=2: two choices", [c.index for c in r.choices] == [0, 1], r.choices)


def test_logprobs():
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs.content
    check("logprobs: one per token", len(lp) == r.usage.completion_tokens, len(lp))
    check("logprobs: greedy = top", all(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6 for t in lp), lp)


def test_errors():
    try:
        client.chat.completions.create(model="no-such-model", messages=CHAT)
        check("unknown model raises", False)
    except openai.NotFoundError as e:
        check("unknown model: 404 NotFoundError", e.status_code == 404 and e.code == "model_not_found", e)
    try:
        client.chat.completions.create(model=MODEL, messages=CHAT, temperature=5)
        check("bad temperature raises", False)
    except openai.BadRequestError as e:
        check("bad temperature: 400 with param", e.status_code == 400 and e.param == "temperature", e)
    try:
        client.completions.create(model=MODEL, prompt="x " * 100000, max_tokens=1)
        check("long prompt raises", False)
    except openai.BadRequestError as e:
        check("prompt past context: 400 context_length_exceeded", e.code == "context_length_exceeded", e)


if __name__ == "__main__":
    test_models()
    whole = test_chat_whole()
    test_chat_stream(whole)
    test_completions()
    test_stop()
    test_seed()
    test_logprobs()
    test_errors()
    print("all openai client checks passed", flush=True)
