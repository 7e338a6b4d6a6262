#!/usr/bin/env python3
"""Generate chat-template reference renderings with PyPI `transformers`.

Writes tests/data/chat_templates/:
  <name>.jinja   the template source (SmolLM2 and Qwen2.5-Coder: read from the
                 GGUF's tokenizer.chat_template; pycompat: written here to
                 exercise the Python-compatible template features)
  refs.json      per template: bos/eos token strings and, per conversation,
                 the exact `apply_chat_template(..., tokenize=False)` output,
                 or the error transformers raised.

Usage (no torch needed):
  python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install transformers jinja2 gguf
  /tmp/tvenv/bin/python tools/gen_chat_template_refs.py [MODELS_DIR]
MODELS_DIR defaults to $KILN_MODELS or ~/.cache/kiln-test-models. The tokenizer
used for apply_chat_template is the fixture tokenizer.json of the same model
(tests/data/fixtures/tokenizer/hf/<name>/tokenizer.json.gz).
"""
import gzip
import json
import os
import sys
from pathlib import Path

import gguf
import jinja2
import transformers
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/data/chat_templates"
FIX = ROOT / "tests/data/fixtures/tokenizer/hf"

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}

PYCOMPAT = """\
{%- set ns = namespace(n=0, sys='') -%}
{%- if messages[0].role == 'system' -%}{%- set ns.sys = messages[0].content.strip() -%}{%- endif -%}
{%- for m in messages -%}
  {%- if m.role not in ['system', 'user', 'assistant', 'tool'] -%}
    {{- raise_exception('Unknown role: ' + m.role) -}}
  {%- endif -%}
  {%- if m.role == 'system' -%}{%- continue -%}{%- endif -%}
  {%- if loop.index0 > 5 -%}{%- break -%}{%- endif -%}
  {%- set ns.n = ns.n + 1 -%}
  [{{ ns.n }}|{{ m.role.upper() }}|{{ loop.index }}/{{ loop.length }}]
  {%- if m.content is string -%}
    {%- set c = m.content.strip() -%}
    {%- if c.startswith('/') %} cmd={{ c[1:].split(' ')[0] }} args={{ c.split(' ')[1:] | join(',') }}
    {%- else %} {{ c | replace('\\n', ' ') }} words={{ c.split() | length }} q={{ 'Y' if c.endswith('?') else 'N' }} {{ c.lower().title() }}
    {%- endif -%}
  {%- endif -%}
  {%- if m.tool_calls is defined -%}
    {%- for tc in m.tool_calls %} call={{ tc.function.name }} {{ tc.function.arguments | tojson }}
{{ tc.function.arguments | tojson(indent=2) }}
    {%- endfor -%}
  {%- endif %}

{% endfor -%}
{%- if tools -%}tools={{ tools | tojson(sort_keys=true) }}
{% endif -%}
sys={{ ns.sys | tojson }} n={{ ns.n }}
{%- for k, v in {'a': 1, 'b': [1.5, none, true, 'ü"\\\\']}.items() %} {{ k }}={{ v | tojson }}{%- endfor %}
{%- if add_generation_prompt %}
GEN {{ bos_token }}{{ eos_token }}
{%- endif %}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]

SYSTEM = {"role": "system", "content": "You are a terse assistant."}

CONVERSATIONS = [
    ("system_user", [SYSTEM, {"role": "user", "content": "What is 2+2?"}], None, True),
    ("user_only", [{"role": "user", "content": "Hello!"}], None, True),
    (
        "multi_turn",
        [
            SYSTEM,
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Another one?"},
        ],
        None,
        True,
    ),
    (
        "multi_turn_no_gen",
        [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
        ],
        None,
        False,
    ),
    (
        "unicode",
        [{"role": "user", "content": "  Grüße 🌍 👨‍👩‍👧 你好 مرحبا\n\tline two  "}],
        None,
        True,
    ),
    (
        "tools",
        [
            {"role": "user", "content": "What's the weather in Zürich and Bern?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}},
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}},
                ],
            },
            {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"sunny\"}"},
            {"role": "tool", "name": "get_weather", "content": "{\"temp\": 19, \"sky\": \"cloudy\"}"},
            {"role": "assistant", "content": "Zürich 21.5 °C, Bern 19 °C."},
            {"role": "user", "content": "/weather Basel now"},
            {"role": "user", "content": "Thanks!"},
        ],
        TOOLS,
        True,
    ),
    (
        "system_tools",
        [SYSTEM, {"role": "user", "content": "Weather in Oslo?"}],
        TOOLS,
        True,
    ),
    (
        "assistant_last",
        [SYSTEM, {"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}],
        None,
        False,
    ),
    # The template itself fails: content is null (TypeError in Jinja's `+`).
    ("error_null_content", [{"role": "user", "content": None}], None, True),
    # raise_exception in the pycompat template (other templates just print the role).
    ("error_unknown_role", [{"role": "robot", "content": "beep"}], None, True),
]


def gguf_chat_info(path):
    r = gguf.GGUFReader(str(path))

    def field_str(name):
        f = r.fields[name]
        return bytes(f.parts[f.data[0]]).decode("utf-8")

    tokens_f = r.fields["tokenizer.ggml.tokens"]

    def tok(i):
        return bytes(tokens_f.parts[tokens_f.data[i]]).decode("utf-8")

    def field_int(name):
        f = r.fields[name]
        return int(f.parts[f.data[0]][0])

    return (
        field_str("tokenizer.chat_template"),
        tok(field_int("tokenizer.ggml.bos_token_id")),
        tok(field_int("tokenizer.ggml.eos_token_id")),
    )


def make_tokenizer(name, bos, eos):
    raw = gzip.decompress((FIX / name / "tokenizer.json.gz").read_bytes()).decode("utf-8")
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(raw), bos_token=bos, eos_token=eos)


def render_all(tok, template):
    cases = []
    for cname, msgs, tools, gen in CONVERSATIONS:
        case = {"name": cname, "messages": msgs, "tools": tools, "add_generation_prompt": gen}
        try:
            case["expected"] = tok.apply_chat_template(
                msgs, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=gen
            )
        except Exception as e:  # the reference: transformers refused to render
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    return cases


def main():
    models = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(
        os.environ.get("KILN_MODELS", Path.home() / ".cache/kiln-test-models")
    )
    refs = {
        "generator": "tools/gen_chat_template_refs.py",
        "versions": {"transformers": transformers.__version__, "jinja2": jinja2.__version__},
        "templates": {},
    }
    for name, file in MODELS.items():
        template, bos, eos = gguf_chat_info(models / file)
        (OUT / f"{name}.jinja").write_text(template, encoding="utf-8")
        tok = make_tokenizer(name, bos, eos)
        refs["templates"][name] = {
            "file": f"{name}.jinja",
            "source": f"{file}: tokenizer.chat_template",
            "bos_token": bos,
            "eos_token": eos,
            "cases": render_all(tok, template),
        }
    (OUT / "pycompat.jinja").write_text(PYCOMPAT, encoding="utf-8")
    tok = make_tokenizer("smollm2", "<s>", "</s>")
    refs["templates"]["pycompat"] = {
        "file": "pycompat.jinja",
        "source": "written for kiln (tools/gen_chat_template_refs.py)",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "cases": render_all(tok, PYCOMPAT),
    }
    (OUT / "refs.json").write_text(json.dumps(refs, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for name, t in refs["templates"].items():
        n_err = sum("error" in c for c in t["cases"])
        print(f"{name}: {len(t['cases'])} cases, {n_err} errors")


if __name__ == "__main__":
    main()
