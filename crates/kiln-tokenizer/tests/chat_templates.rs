//! Chat templates render byte-identical to transformers' apply_chat_template
//! (references in tests/data/chat_templates/refs.json, made by
//! tools/gen_chat_template_refs.py), and fail where transformers fails.

mod common;

use common::*;
use kiln_format::gguf::Gguf;
use kiln_tokenizer::{ChatRequest, ChatTemplate, TemplateOrigin, Tokenizer};

fn refs() -> serde_json::Value {
    let p = data_dir().join("chat_templates/refs.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn template(name: &str) -> ChatTemplate {
    let r = refs();
    let t = &r["templates"][name];
    let path = data_dir()
        .join("chat_templates")
        .join(t["file"].as_str().unwrap());
    let src = std::fs::read_to_string(&path).unwrap();
    ChatTemplate::new(
        src,
        TemplateOrigin::Custom,
        path.display(),
        t["bos_token"].as_str().unwrap(),
        t["eos_token"].as_str().unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn check_cases(name: &str, tmpl: &ChatTemplate) -> usize {
    let r = refs();
    let cases = r["templates"][name]["cases"].as_array().unwrap();
    let mut fails = Vec::new();
    for c in cases {
        let cname = c["name"].as_str().unwrap();
        let tools = if c["tools"].is_null() {
            None
        } else {
            Some(&c["tools"])
        };
        let req = ChatRequest {
            messages: &c["messages"],
            tools,
            add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
            extra: None,
        };
        let got = tmpl.render(&req);
        match (c.get("expected").and_then(|e| e.as_str()), got) {
            (Some(want), Ok(got)) if want == got => {}
            (Some(want), Ok(got)) => {
                fails.push(format!("{cname}:\n--- want\n{want}\n--- got\n{got}\n---"))
            }
            (Some(_), Err(e)) => fails.push(format!("{cname}: unexpected error {e}")),
            (None, Ok(got)) => fails.push(format!(
                "{cname}: transformers failed ({}) but kiln rendered {got:?}",
                c["error"]
            )),
            (None, Err(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("chat template error"), "{msg}");
                eprintln!("{name}/{cname}: error as expected: {msg}");
            }
        }
    }
    eprintln!(
        "{name}: {}/{} conversations match transformers",
        cases.len() - fails.len(),
        cases.len()
    );
    assert!(
        fails.is_empty(),
        "{name}: {} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
    cases.len()
}

#[test]
fn smollm2_template_matches_transformers() {
    check_cases("smollm2", &template("smollm2"));
}

#[test]
fn qwen25_coder_template_matches_transformers() {
    check_cases("qwen2.5-coder", &template("qwen2.5-coder"));
}

#[test]
fn pycompat_template_matches_transformers() {
    check_cases("pycompat", &template("pycompat"));
}

#[test]
fn raise_exception_names_the_template_and_message() {
    let t = template("pycompat");
    let msgs = serde_json::json!([{"role": "robot", "content": "beep"}]);
    let e = t.render_messages(&msgs, true).unwrap_err().to_string();
    assert!(e.contains("Unknown role: robot"), "{e}");
    assert!(e.contains("pycompat.jinja"), "{e}");
}

/// The same references through the real GGUFs: template and bos/eos strings
/// come from the model file.
fn check_gguf(name: &str, file: &str, test: &str) {
    let Some(path) = real_model(file, test) else {
        return;
    };
    let g = Gguf::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let t = tok.chat_template().expect("model has a chat template");
    assert_eq!(t.origin(), &TemplateOrigin::Gguf);
    let committed =
        std::fs::read_to_string(data_dir().join(format!("chat_templates/{name}.jinja"))).unwrap();
    assert_eq!(
        t.source(),
        committed,
        "committed template equals the GGUF's"
    );
    check_cases(name, t);
    // render_chat goes through the same template.
    let msgs = serde_json::json!([{"role": "user", "content": "Hello!"}]);
    let r = refs();
    let want = r["templates"][name]["cases"][1]["expected"]
        .as_str()
        .unwrap();
    assert_eq!(tok.render_chat(&msgs, true).unwrap(), want);
}

#[test]
fn smollm2_gguf_template() {
    check_gguf(
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2_gguf_template",
    );
}

#[test]
fn qwen25_coder_gguf_template() {
    check_gguf(
        "qwen2.5-coder",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen25_coder_gguf_template",
    );
}

#[test]
fn gemma3_has_no_template_and_uses_chatml_fallback() {
    let Some(path) = real_model("gemma-3-270m-q4_k_m.gguf", "gemma3_has_no_template") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
    assert!(tok.chat_template().is_none());
    assert_eq!(tok.summary().chat_template, TemplateOrigin::ChatMlFallback);
    let msgs = serde_json::json!([{"role": "user", "content": "Hi"}]);
    assert_eq!(
        tok.render_chat(&msgs, true).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}
