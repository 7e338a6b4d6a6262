//! Tests on SmolLM2-135M-Instruct (skipped visibly when absent) and the
//! official `openai` Python client against a live server.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use common::*;
use serde_json::{json, Value};

/// A real chat answer, and greedy batch invariance on a real model: four
/// different chats alone, then all at once, give the same token ids.
#[test]
fn smollm2_chat_and_batch_invariance() {
    let Some(model) = smollm2() else { return };
    let model_path = model.clone();
    let mut cfg = config(model);
    cfg.threads = Some(2);
    cfg.ctx = Some(1024);
    cfg.parallel = 4;
    cfg.batch_size = 32; // chunked prefill interleaved with decode
    cfg.prefix_cache = false;
    let s = start(cfg);
    let a = s.addr;
    let msgs =
        json!([{"role": "user", "content": "What is the capital of France? Answer in one word."}]);
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 24, "temperature": 0, "return_token_ids": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    // The same as kiln's single-sequence generation (Engine::generate).
    let served: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
    assert_eq!(
        served,
        engine_generate(&s.state.tok, &model_path, &msgs, 24)
    );

    let questions = [
        "Write a haiku about the sea.",
        "List three prime numbers.",
        "What is 12 times 12? Explain step by step in detail, please.",
        "Name a color.",
    ];
    let bodies: Vec<Value> = questions
        .iter()
        .map(|q| {
            json!({"messages": [{"role": "user", "content": q}], "max_tokens": 24,
                   "temperature": 0, "ignore_eos": true, "return_token_ids": true})
        })
        .collect();
    let ids = |a, b: &Value| -> Vec<u32> {
        let r = post(a, "/v1/chat/completions", b);
        assert_eq!(r.status, 200, "{}", r.body);
        serde_json::from_value(r.json()["choices"][0]["token_ids"].clone()).unwrap()
    };
    let t = Instant::now();
    let alone: Vec<Vec<u32>> = bodies.iter().map(|b| ids(a, b)).collect();
    let t_alone = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let together: Vec<Vec<u32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies.iter().map(|b| sc.spawn(move || ids(a, b))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let t_together = t.elapsed().as_secs_f64();
    assert_eq!(alone, together);
    eprintln!(
        "SmolLM2 4 chats × 24 tokens: one at a time {t_alone:.2}s, concurrently {t_together:.2}s"
    );
}

/// Greedy tokens from `Engine::generate` (one sequence, whole-prompt prefill).
fn engine_generate(
    tok: &kiln_tokenizer::Tokenizer,
    path: &std::path::Path,
    msgs: &Value,
    n: usize,
) -> Vec<u32> {
    use kiln_core::{ArchDescriptor, Engine, KvLayout, Sampler, SamplerParams};
    let model = std::sync::Arc::new(kiln_format::Model::open(path).unwrap());
    let desc = ArchDescriptor::from_model(&model).unwrap();
    let layout = KvLayout::plan(&desc, 1024, 1, 16, 256);
    let backend = kiln_cpu::CpuBackend::new(
        model,
        desc,
        layout.clone(),
        256,
        kiln_cpu::CpuOptions { threads: 2 },
    )
    .unwrap();
    let mut engine = Engine::new(backend, layout);
    let prompt = tok
        .encode_chat_prompt(&tok.render_chat(msgs, true).unwrap())
        .unwrap();
    let mut sampler = Sampler::new(SamplerParams::greedy(), engine.vocab_size());
    let is_stop = |id: u32| tok.is_eos(id);
    engine
        .generate(0, &prompt, &mut sampler, n, false, &is_stop, &mut |_| {
            kiln_core::engine::Control::Continue
        })
        .unwrap()
        .tokens
}

fn python() -> Option<PathBuf> {
    let require = std::env::var("KILN_REQUIRE_REFS").as_deref() == Ok("1");
    let skip = |why: String| {
        if require {
            panic!("{why} (KILN_REQUIRE_REFS=1)");
        }
        eprintln!("SKIPPED openai client test: {why}");
        None
    };
    let venv = std::env::var_os("KILN_PYENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln-pyenv")))?;
    let py = venv.join("bin/python");
    if !py.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return skip(format!("cannot make a venv in {}", venv.display()));
        }
    }
    let has = |py: &PathBuf| {
        Command::new(py)
            .args(["-c", "import openai"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(&py) {
        eprintln!("installing openai into {}", venv.display());
        let ok = Command::new(&py)
            .args(["-m", "pip", "install", "-q", "openai"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok || !has(&py) {
            return skip("pip install openai failed (no network?)".into());
        }
    }
    Some(py)
}

/// The official `openai` package as the client: chat and completions,
/// whole and streamed, stop sequences, seeds, logprobs, errors.
#[test]
fn openai_python_client() {
    let Some(py) = python() else { return };
    let (model, real) = match smollm2() {
        Some(m) => (m, true),
        None => (tiny_llama(), false),
    };
    let mut cfg = config(model);
    cfg.threads = Some(2);
    cfg.ctx = Some(1024);
    let s = start(cfg);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/server/test_openai_client.py");
    let out = Command::new(py)
        .arg(script)
        .env("KILN_BASE_URL", format!("http://{}/v1", s.addr))
        .env("KILN_MODEL", &s.state.model_id)
        .env("KILN_REAL_MODEL", if real { "1" } else { "0" })
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openai client checks failed");
    assert!(stdout.contains("all openai client checks passed"));
}
