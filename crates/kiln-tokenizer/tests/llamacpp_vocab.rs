//! llama.cpp's tokenizer test vectors (tests/test-tokenizer-0): vocab-only
//! GGUFs with `.inp` (strings separated by `__ggml_vocab_test__` lines) and
//! `.out` (expected ids, no BOS, no special-token parsing).

mod common;

use common::*;
use kiln_format::gguf::Gguf;
use kiln_tokenizer::Tokenizer;

fn run_vocab(name: &str) {
    let dir = tok_fixtures().join("llamacpp");
    let plain = dir.join(format!("ggml-vocab-{name}.gguf"));
    let gz = dir.join(format!("ggml-vocab-{name}.gguf.gz"));
    let path = if plain.is_file() { plain.clone() } else { gz };
    let g = Gguf::from_bytes(&path, read_maybe_gz(&path)).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{e}"));
    let inp =
        String::from_utf8(std::fs::read(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap())
            .unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""), "inp ends with a separator");
    let expected: Vec<&str> = out.split('\n').collect();
    assert!(expected.len() > texts.len());
    let mut fails = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let want: Vec<u32> = expected[i]
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let got = tok
            .encode(text, false, false)
            .unwrap_or_else(|e| panic!("{e}"));
        if got != want {
            fails.push(format!("#{i} {text:?}\n   want {want:?}\n   got  {got:?}"));
        }
        if let Err(e) = check_stream(&tok, &got, false) {
            fails.push(format!("#{i} {text:?}: stream: {e}"));
        }
    }
    eprintln!(
        "{name}: {}/{} strings match",
        texts.len() - fails.len(),
        texts.len()
    );
    assert!(
        fails.is_empty(),
        "{name}: {} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn llama_spm() {
    run_vocab("llama-spm");
}

#[test]
fn llama_bpe() {
    run_vocab("llama-bpe");
}

#[test]
fn qwen2() {
    run_vocab("qwen2");
}

#[test]
fn gpt_2() {
    run_vocab("gpt-2");
}

#[test]
fn bert_bge() {
    run_vocab("bert-bge");
}

#[test]
fn phi_3() {
    run_vocab("phi-3");
}
