//! Special/stop tokens, special-token parsing, streaming edge cases and the
//! HF folder chat-template precedence.

mod common;

use common::*;
use kiln_format::gguf::Gguf;
use kiln_tokenizer::{TemplateOrigin, Tokenizer};

fn llamacpp_vocab(name: &str) -> Tokenizer {
    let dir = tok_fixtures().join("llamacpp");
    let plain = dir.join(format!("ggml-vocab-{name}.gguf"));
    let path = if plain.is_file() {
        plain
    } else {
        dir.join(format!("ggml-vocab-{name}.gguf.gz"))
    };
    let g = Gguf::from_bytes(&path, read_maybe_gz(&path)).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

#[test]
fn stop_tokens_of_real_models() {
    for (file, stops, bos, add_bos) in [
        (
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            vec![("<|im_end|>", true), ("<|endoftext|>", true)],
            Some(1),
            false,
        ),
        (
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            vec![
                ("<|im_end|>", true),
                ("<|endoftext|>", true),
                ("<|im_start|>", false),
            ],
            Some(151643),
            false,
        ),
        (
            "gemma-3-270m-q4_k_m.gguf",
            vec![
                ("<eos>", true),
                ("<end_of_turn>", true),
                ("<start_of_turn>", false),
            ],
            Some(2),
            true,
        ),
    ] {
        let Some(path) = real_model(file, "stop_tokens_of_real_models") else {
            continue;
        };
        let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        eprintln!("{file}:\n{}", tok.summary());
        for (text, is_stop) in stops {
            let id = tok
                .token_to_id(text)
                .unwrap_or_else(|| panic!("{text} in vocab"));
            assert_eq!(tok.is_eos(id), is_stop, "{file}: {text}");
        }
        assert_eq!(tok.bos_id(), bos, "{file}");
        assert_eq!(tok.add_bos(), add_bos, "{file}");
        let ids = tok.encode("Hi", true, true).unwrap();
        assert_eq!(ids.first().copied() == tok.bos_id(), add_bos, "{file}");
    }
}

#[test]
fn stop_tokens_from_tokenizer_json() {
    let tok = hf_tokenizer("qwen2.5-coder");
    for t in ["<|im_end|>", "<|endoftext|>"] {
        assert!(tok.is_eos(tok.token_to_id(t).unwrap()), "{t}");
    }
    assert!(!tok.is_eos(tok.token_to_id("<|im_start|>").unwrap()));
    let tok = hf_tokenizer("lenml-llama3");
    for t in ["<|eot_id|>", "<|end_of_text|>"] {
        assert!(tok.is_eos(tok.token_to_id(t).unwrap()), "{t}");
    }
    assert_eq!(tok.bos_id(), tok.token_to_id("<|begin_of_text|>"));
    // This tokenizer.json's post-processor adds no BOS; add_bos says so.
    assert!(!tok.add_bos());
    assert_eq!(
        tok.encode("x", true, true).unwrap(),
        tok.encode("x", false, true).unwrap()
    );
}

#[test]
fn special_tokens_parsed_only_on_request() {
    let tok = hf_tokenizer("qwen2.5-coder");
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(tok.encode("<|im_end|>", false, true).unwrap(), vec![im_end]);
    let plain = tok.encode("<|im_end|>", false, false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&im_end), "{plain:?}");
    assert_eq!(tok.decode(&plain, false).unwrap(), "<|im_end|>");
    // Same for a GGUF vocabulary (control tokens).
    let tok = llamacpp_vocab("llama-bpe");
    let eot = tok.token_to_id("<|eot_id|>").unwrap();
    assert_eq!(
        tok.encode("a<|eot_id|>", false, true).unwrap().last(),
        Some(&eot)
    );
    assert!(!tok
        .encode("a<|eot_id|>", false, false)
        .unwrap()
        .contains(&eot));
    assert!(tok.is_special(eot) && tok.is_eos(eot));
    assert_eq!(tok.decode(&[eot], true).unwrap(), "");
    assert_eq!(tok.decode(&[eot], false).unwrap(), "<|eot_id|>");
}

#[test]
fn stream_holds_back_partial_byte_fallback() {
    let tok = llamacpp_vocab("llama-spm");
    // U+10000 is not in the llama vocabulary: four <0xNN> byte tokens.
    let ids = tok.encode("a𐀀b", false, false).unwrap();
    let pieces: Vec<&str> = ids.iter().map(|&i| tok.token_piece(i).unwrap()).collect();
    assert!(
        pieces.iter().filter(|p| p.starts_with("<0x")).count() == 4,
        "{pieces:?} {ids:?}"
    );
    let mut st = tok.stream_decoder(false);
    let mut out = Vec::new();
    for &id in &ids {
        out.push(st.step(id).unwrap());
    }
    assert_eq!(st.finish().unwrap(), None);
    let emitted: Vec<String> = out.iter().flatten().cloned().collect();
    assert_eq!(emitted.concat(), "a𐀀b");
    assert!(
        emitted.iter().all(|p| !p.contains('\u{FFFD}')),
        "{emitted:?}"
    );
    assert!(emitted.contains(&"𐀀".to_string()), "{emitted:?}");
    // A sequence cut in the middle of a character: finish() flushes it as
    // the full decode shows it.
    let cut = &ids[..ids.len() - 2];
    check_stream(&tok, cut, false).unwrap();
    let mut st = tok.stream_decoder(false);
    let mut s = String::new();
    for &id in cut {
        if let Some(p) = st.step(id).unwrap() {
            s.push_str(&p);
        }
    }
    assert_eq!(s, "a");
    assert!(st.finish().unwrap().unwrap().contains('\u{FFFD}'));
}

#[test]
fn stream_byte_level_split_characters() {
    // Byte-level BPE: CJK and emoji often split inside a UTF-8 sequence.
    let tok = llamacpp_vocab("gpt-2");
    let text = "日本語のテキスト 👨‍👩‍👧 ok";
    let ids = tok.encode(text, false, false).unwrap();
    check_stream(&tok, &ids, false).unwrap();
    let mut st = tok.stream_decoder(false);
    let mut held = 0;
    for &id in &ids {
        match st.step(id).unwrap() {
            Some(p) => assert!(!p.contains('\u{FFFD}'), "{p:?}"),
            None => held += 1,
        }
    }
    assert!(held > 0, "some tokens ended inside a character");
}

#[test]
fn hf_folder_config_and_template_precedence() {
    let dir = std::env::temp_dir().join(format!("kiln-tok-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tj = read_maybe_gz(&tok_fixtures().join("hf/smollm2/tokenizer.json.gz"));
    std::fs::write(dir.join("tokenizer.json"), &tj).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "chat_template": "config {{ bos_token }}"}"#,
    )
    .unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "jinja").unwrap();
    std::fs::write(
        dir.join("chat_template.json"),
        r#"{"chat_template": "json"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": "x"}]);

    let tok = Tokenizer::load(&dir).unwrap();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(tok.is_eos(0) && tok.is_eos(2));
    assert_eq!(
        tok.chat_template().unwrap().origin(),
        &TemplateOrigin::TokenizerConfig
    );
    assert_eq!(tok.render_chat(&msgs, true).unwrap(), "config <|im_start|>");

    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    assert_eq!(
        tok.chat_template().unwrap().origin(),
        &TemplateOrigin::ChatTemplateJinja
    );
    assert_eq!(tok.render_chat(&msgs, true).unwrap(), "jinja");

    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    let tok = Tokenizer::load(dir.join("tokenizer.json")).unwrap();
    assert_eq!(
        tok.chat_template().unwrap().origin(),
        &TemplateOrigin::ChatTemplateJson
    );
    assert_eq!(tok.render_chat(&msgs, true).unwrap(), "json");

    // A list of named templates: "default" is the template, "tool_use" is used with tools.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T{{ tools | length }}"}]}"#,
    )
    .unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    assert_eq!(tok.render_chat(&msgs, true).unwrap(), "D");
    let tools = serde_json::json!([{"type": "function"}]);
    let req = kiln_tokenizer::ChatRequest {
        messages: &msgs,
        tools: Some(&tools),
        add_generation_prompt: true,
        extra: None,
    };
    assert_eq!(tok.render_chat_request(&req).unwrap(), "T1");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn summaries() {
    for name in ["llama-spm", "llama-bpe", "bert-bge"] {
        let tok = llamacpp_vocab(name);
        let s = tok.summary();
        assert_eq!(s.vocab_size, tok.vocab_size());
        eprintln!("{name}:\n{s}");
    }
    let tok = llamacpp_vocab("bert-bge");
    // [CLS] text [SEP]
    let ids = tok.encode("hello", true, false).unwrap();
    assert_eq!(ids.first(), Some(&101));
    assert_eq!(ids.last(), Some(&102));
}
