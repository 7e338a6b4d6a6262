//! Loading a Hugging Face tokenizer: `tokenizer.json` (any model the
//! `tokenizers` crate reads: BPE, byte-fallback BPE, WordPiece, Unigram,
//! WordLevel) plus the folder's `tokenizer_config.json`,
//! `generation_config.json`, `config.json` and chat template files.

use std::path::Path;

use tokenizers::ModelWrapper;

use crate::chat::TemplateOrigin;
use crate::error::{Error, Result};
use crate::{Built, ModelKind};

/// Special-token names tried when no config names BOS / EOS.
const BOS_GUESSES: &[&str] = &[
    "<|begin_of_text|>",
    "<s>",
    "<bos>",
    "<|startoftext|>",
    "[CLS]",
];
const EOS_GUESSES: &[&str] = &["<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "[SEP]"];

/// Build from the text of a `tokenizer.json`; `origin` names it in errors.
pub(crate) fn build_from_json(bytes: &[u8], origin: &str) -> Result<Built> {
    let tk = tokenizers::Tokenizer::from_bytes(bytes)
        .map_err(|e| Error::invalid(origin, format!("cannot read tokenizer.json: {e}")))?;
    let mut b = Built::new(origin.to_string());
    b.use_post_processor = true;
    b.kind = match tk.get_model() {
        ModelWrapper::BPE(m) if m.byte_fallback => ModelKind::SentencePieceBpe,
        ModelWrapper::BPE(_) => ModelKind::ByteLevelBpe,
        ModelWrapper::WordPiece(_) => ModelKind::WordPiece,
        ModelWrapper::Unigram(_) => ModelKind::Unigram,
        ModelWrapper::WordLevel(_) => ModelKind::WordLevel,
    };
    let added = tk.get_added_tokens_decoder();
    let model_n = tokenizers::Model::get_vocab_size(tk.get_model());
    let max_added = added.keys().map(|&k| k as usize + 1).max().unwrap_or(0);
    let n = model_n.max(max_added);
    b.n_vocab = n;
    b.pieces = (0..n as u32)
        .map(|i| tk.id_to_token(i).unwrap_or_default())
        .collect();
    let mut specials: Vec<u32> = added
        .iter()
        .filter(|(_, t)| t.special)
        .map(|(&i, _)| i)
        .collect();
    specials.sort_unstable();
    b.special_ids = specials;
    let special_named = |name: &str| -> Option<u32> {
        tk.token_to_id(name)
            .filter(|id| b.special_ids.binary_search(id).is_ok())
    };
    b.bos = BOS_GUESSES.iter().find_map(|n| special_named(n));
    b.eos = EOS_GUESSES.iter().find_map(|n| special_named(n));
    b.unk = ["<unk>", "[UNK]", "<|unk|>"]
        .iter()
        .find_map(|n| tk.token_to_id(n));
    b.pad = ["<pad>", "[PAD]", "<|pad|>"]
        .iter()
        .find_map(|n| special_named(n));
    b.hf = Some(tk);
    Ok(b)
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display(), e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::invalid(path.display(), format!("not valid JSON: {e}")))
}

/// A special-token entry of tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id` may be an integer or a list of integers.
fn ids_of(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .into_iter()
            .collect(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Build from a model folder (or a `tokenizer.json` file with its siblings).
pub(crate) fn build_from_dir(dir: &Path, tokenizer_json: &Path) -> Result<Built> {
    if !tokenizer_json.is_file() {
        return Err(Error::invalid(
            dir.display(),
            "no tokenizer.json (kiln reads the Hugging Face fast-tokenizer file)",
        ));
    }
    let bytes =
        std::fs::read(tokenizer_json).map_err(|e| Error::io(tokenizer_json.display(), e))?;
    let mut b = build_from_json(&bytes, &tokenizer_json.display().to_string())?;
    let n = b.n_vocab;
    let lookup =
        |b: &Built, text: &str| -> Option<u32> { b.hf.as_ref().and_then(|t| t.token_to_id(text)) };

    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = read_json(&cfg_path)?;
    if let Some(cfg) = &cfg {
        for (key, slot) in [
            ("bos_token", 0usize),
            ("eos_token", 1),
            ("unk_token", 2),
            ("pad_token", 3),
        ] {
            if let Some(v) = cfg.get(key) {
                if v.is_null() {
                    match slot {
                        0 => b.bos = None,
                        1 => b.eos = None,
                        _ => {}
                    }
                    continue;
                }
                let text = token_text(v).ok_or_else(|| {
                    Error::invalid(
                        cfg_path.display(),
                        format!("{key} is neither a string nor {{\"content\": ...}}"),
                    )
                })?;
                let id = lookup(&b, &text).ok_or_else(|| {
                    Error::invalid(
                        cfg_path.display(),
                        format!("{key} {text:?} is not in the vocabulary"),
                    )
                })?;
                match slot {
                    0 => b.bos = Some(id),
                    1 => b.eos = Some(id),
                    2 => b.unk = Some(id),
                    _ => b.pad = Some(id),
                }
            }
        }
    }
    // Generation stops at every eos_token_id the model declares.
    for f in ["generation_config.json", "config.json"] {
        let p = dir.join(f);
        if let Some(v) = read_json(&p)? {
            for id in ids_of(v.get("eos_token_id")) {
                if (id as usize) < n {
                    b.extra_stop.push(id);
                }
            }
            if b.bos.is_none() {
                if let Some(id) = ids_of(v.get("bos_token_id")).first() {
                    if (*id as usize) < n {
                        b.bos = Some(*id);
                    }
                }
            }
        }
    }

    // Chat template precedence: tokenizer_config.json, chat_template.jinja, chat_template.json.
    if let Some(t) = cfg.as_ref().and_then(|c| c.get("chat_template")) {
        match t {
            serde_json::Value::String(s) => {
                b.chat_template = Some(s.clone());
            }
            serde_json::Value::Array(list) => {
                for item in list {
                    let name = item.get("name").and_then(|v| v.as_str());
                    let tmpl = item.get("template").and_then(|v| v.as_str());
                    match (name, tmpl) {
                        (Some("default"), Some(t)) => b.chat_template = Some(t.to_string()),
                        (Some(n), Some(t)) => {
                            b.named_templates.push((n.to_string(), t.to_string()))
                        }
                        _ => {
                            return Err(Error::invalid(
                                cfg_path.display(),
                                "chat_template list entries need \"name\" and \"template\" strings",
                            ))
                        }
                    }
                }
                if b.chat_template.is_none() {
                    if let Some((_, t)) = b.named_templates.first() {
                        b.chat_template = Some(t.clone());
                    }
                }
            }
            serde_json::Value::Null => {}
            _ => {
                return Err(Error::invalid(
                    cfg_path.display(),
                    "chat_template is neither a string nor a list of named templates",
                ))
            }
        }
        if b.chat_template.is_some() {
            b.template_origin = TemplateOrigin::TokenizerConfig;
            b.template_location = cfg_path.display().to_string();
        }
    }
    if b.chat_template.is_none() {
        let p = dir.join("chat_template.jinja");
        if p.is_file() {
            let s = std::fs::read_to_string(&p).map_err(|e| Error::io(p.display(), e))?;
            b.chat_template = Some(s);
            b.template_origin = TemplateOrigin::ChatTemplateJinja;
            b.template_location = p.display().to_string();
        }
    }
    if b.chat_template.is_none() {
        let p = dir.join("chat_template.json");
        if let Some(v) = read_json(&p)? {
            let s = v
                .get("chat_template")
                .and_then(|t| t.as_str())
                .ok_or_else(|| Error::invalid(p.display(), "no \"chat_template\" string"))?;
            b.chat_template = Some(s.to_string());
            b.template_origin = TemplateOrigin::ChatTemplateJson;
            b.template_location = p.display().to_string();
        }
    }
    Ok(b)
}
