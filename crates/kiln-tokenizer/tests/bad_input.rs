//! Bad tokenizer descriptions end in a clean error that names the file and
//! the problem; nothing panics.

mod common;

use common::*;
use kiln_format::gguf::{Array, Gguf, GgufWriter, Value};
use kiln_tokenizer::{Error, Tokenizer};

const NAME: &str = "bad-vocab.gguf";

fn s(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|x| x.to_string()).collect()))
}

/// A small valid byte-level BPE vocabulary to start from.
fn bpe() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.pre", Value::String("gpt-2".into()))
        .set(
            "tokenizer.ggml.tokens",
            s(&["a", "b", "ab", "<|endoftext|>"]),
        )
        .set(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1, 1, 3])),
        )
        .set("tokenizer.ggml.merges", s(&["a b"]))
        .set("tokenizer.ggml.eos_token_id", Value::U32(3))
        .set("tokenizer.ggml.bos_token_id", Value::U32(3));
    w
}

/// A small valid SentencePiece vocabulary.
fn spm() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Value::String("llama".into()))
        .set(
            "tokenizer.ggml.tokens",
            s(&["<unk>", "<s>", "</s>", "▁a", "a", "▁"]),
        )
        .set(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0])),
        )
        .set(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![2, 3, 3, 1, 1, 1])),
        );
    w
}

fn load(w: &GgufWriter) -> Result<Tokenizer, Error> {
    let g = Gguf::from_bytes(NAME, w.to_bytes()).expect("writer output parses");
    Tokenizer::from_gguf(&g)
}

fn err(w: &GgufWriter) -> String {
    let e = load(w).expect_err("must fail").to_string();
    assert!(e.contains(NAME), "error names the file: {e}");
    e
}

#[test]
fn valid_small_vocabularies_load() {
    let t = load(&bpe()).unwrap();
    assert_eq!(t.encode("ab", false, false).unwrap(), vec![2]);
    assert_eq!(t.encode("<|endoftext|>", false, true).unwrap(), vec![3]);
    assert!(t.is_eos(3));
    let t = load(&spm()).unwrap();
    assert_eq!(t.encode("a", true, true).unwrap(), vec![1, 3]);
    assert_eq!(t.decode(&[1, 3], true).unwrap(), "a");
}

#[test]
fn missing_model_key() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.tokens", s(&["a"]));
    assert!(err(&w).contains("tokenizer.ggml.model"));
}

#[test]
fn missing_tokens_array() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    assert!(err(&w).contains("tokenizer.ggml.tokens"));
}

#[test]
fn tokens_of_wrong_type() {
    let mut w = bpe();
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::I32(vec![1, 2])),
    );
    let e = err(&w);
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("array of strings"),
        "{e}"
    );
    let mut w = bpe();
    w.set("tokenizer.ggml.tokens", Value::String("a".into()));
    assert!(err(&w).contains("tokenizer.ggml.tokens"));
}

#[test]
fn empty_vocabulary() {
    let mut w = bpe();
    w.set("tokenizer.ggml.tokens", s(&[]));
    assert!(err(&w).contains("empty"));
}

#[test]
fn duplicate_token() {
    let mut w = bpe();
    w.set("tokenizer.ggml.tokens", s(&["a", "b", "ab", "a"]));
    assert!(err(&w).contains("appears twice"));
}

#[test]
fn scores_length_mismatch() {
    let mut w = spm();
    w.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32(vec![0.0, 1.0])),
    );
    let e = err(&w);
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("2 entries") && e.contains("6 tokens"),
        "{e}"
    );
}

#[test]
fn scores_missing_for_sentencepiece() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Value::String("llama".into()))
        .set("tokenizer.ggml.tokens", s(&["<unk>", "<s>", "</s>"]));
    assert!(err(&w).contains("tokenizer.ggml.scores"));
}

#[test]
fn token_type_length_mismatch() {
    let mut w = bpe();
    w.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1])),
    );
    assert!(err(&w).contains("tokenizer.ggml.token_type"));
}

#[test]
fn merges_missing() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.tokens", s(&["a", "b"]));
    assert!(err(&w).contains("tokenizer.ggml.merges"));
}

#[test]
fn merge_with_unknown_token() {
    let mut w = bpe();
    w.set("tokenizer.ggml.merges", s(&["a b", "a zz"]));
    let e = err(&w);
    assert!(
        e.contains("merge #1") && e.contains("\"zz\"") && e.contains("not in the vocabulary"),
        "{e}"
    );
}

#[test]
fn merge_result_not_in_vocab() {
    let mut w = bpe();
    w.set("tokenizer.ggml.merges", s(&["b a"]));
    assert!(err(&w).contains("\"ba\""));
}

#[test]
fn merge_without_space() {
    let mut w = bpe();
    w.set("tokenizer.ggml.merges", s(&["ab"]));
    assert!(err(&w).contains("not two tokens"));
}

#[test]
fn special_id_out_of_range() {
    let mut w = bpe();
    w.set("tokenizer.ggml.eos_token_id", Value::U32(99));
    let e = err(&w);
    assert!(
        e.contains("tokenizer.ggml.eos_token_id") && e.contains("99"),
        "{e}"
    );
}

#[test]
fn add_bos_without_bos() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.pre", Value::String("gpt-2".into()))
        .set("tokenizer.ggml.tokens", s(&["a", "b"]))
        .set("tokenizer.ggml.merges", s(&[]))
        .set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    assert!(err(&w).contains("add_bos_token"));
}

#[test]
fn unsupported_models_and_pre_tokenizers() {
    for m in ["t5", "rwkv", "unheard-of"] {
        let mut w = bpe();
        w.set("tokenizer.ggml.model", Value::String(m.into()));
        let e = load(&w).expect_err("unsupported");
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains(m), "{e}");
    }
    let mut w = bpe();
    w.set("tokenizer.ggml.pre", Value::String("no-such-pre".into()));
    let e = err(&w);
    assert!(e.contains("no-such-pre"), "{e}");
}

#[test]
fn broken_template_is_reported_at_render_not_at_load() {
    let mut w = bpe();
    w.set(
        "tokenizer.chat_template",
        Value::String("{% for m in messages %}{{ m.content ".into()),
    );
    let t = load(&w).expect("the tokenizer itself is fine");
    assert!(t.chat_template().is_none());
    assert!(t.summary().chat_template_error.is_some());
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let e = t
        .render_chat(&msgs, true)
        .expect_err("no silent fallback")
        .to_string();
    assert!(e.contains("chat template error") && e.contains(NAME), "{e}");
}

#[test]
fn template_runtime_failure_is_an_error() {
    let mut w = bpe();
    w.set(
        "tokenizer.chat_template",
        Value::String("{{ raise_exception('Conversation roles must alternate') }}".into()),
    );
    let t = load(&w).unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let e = t.render_chat(&msgs, true).unwrap_err().to_string();
    assert!(
        e.contains("Conversation roles must alternate") && e.contains(NAME),
        "{e}"
    );
    // Malformed messages are errors too.
    let e = t
        .render_chat(&serde_json::json!([{"content": "no role"}]), true)
        .unwrap_err();
    assert!(e.to_string().contains("role"), "{e}");
    let e = t
        .render_chat(&serde_json::json!("just a string"), true)
        .unwrap_err();
    assert!(e.to_string().contains("messages"), "{e}");
}

#[test]
fn hf_folder_problems() {
    let dir = std::env::temp_dir().join(format!("kiln-tok-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let e = Tokenizer::load(&dir).unwrap_err().to_string();
    assert!(e.contains("no tokenizer.json"), "{e}");
    std::fs::write(dir.join("tokenizer.json"), b"{ not json").unwrap();
    let e = Tokenizer::load(&dir).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    // A valid tokenizer.json with a broken tokenizer_config.json.
    let tj = read_maybe_gz(&tok_fixtures().join("hf/smollm2/tokenizer.json.gz"));
    std::fs::write(dir.join("tokenizer.json"), &tj).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), b"{\"eos_token\": 5").unwrap();
    let e = Tokenizer::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("not valid JSON"),
        "{e}"
    );
    std::fs::write(
        dir.join("tokenizer_config.json"),
        b"{\"eos_token\": \"<nope>\"}",
    )
    .unwrap();
    let e = Tokenizer::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("<nope>") && e.contains("not in the vocabulary"),
        "{e}"
    );
    let e = Tokenizer::load(dir.join("missing.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.gguf"), "{e}");
    // Not a GGUF at all.
    std::fs::write(dir.join("junk.gguf"), b"JUNKJUNKJUNK").unwrap();
    let e = Tokenizer::load(dir.join("junk.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("junk.gguf"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
