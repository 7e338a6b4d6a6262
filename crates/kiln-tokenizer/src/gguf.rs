//! Building a tokenizer from GGUF metadata (`tokenizer.ggml.*`).
//!
//! The vocabulary is turned into a Hugging Face `tokenizers` pipeline that
//! reproduces llama.cpp's tokenizers:
//!
//! * `gpt2` (BPE): the merges from `tokenizer.ggml.merges`, llama.cpp's
//!   pre-tokenizer regexes for `tokenizer.ggml.pre` (applied one after the
//!   other, matches isolated), then byte-level mapping. `llama3`-family
//!   vocabularies ignore merges for words that are whole tokens.
//! * `llama` (SentencePiece): BPE whose merges are derived from the token
//!   scores (a pair merges if the merged piece is a token; higher score first),
//!   byte fallback to `<0xNN>`, spaces escaped to `▁`, and a `▁` prefixed to
//!   every text fragment when `add_space_prefix` is set (llama.cpp prefixes the
//!   text at the start and after every special token).
//! * `bert` (WordPiece): NFD, accent stripping, lower-casing, punctuation/CJK splitting, greedy
//!   longest match; the GGUF spelling (`▁word`, `piece`) is mapped back to the
//!   usual (`word`, `##piece`).
//!
//! Token types: 2 (unknown) and 3 (control) become *special* added tokens,
//! matched atomically only when special parsing is asked for; 4 (user-defined)
//! become non-special added tokens, always matched atomically (as llama.cpp
//! does); 1 (normal), 5 (unused) and 6 (byte) are ordinary vocabulary entries.

use std::collections::HashMap;

use kiln_format::gguf::{Array, Gguf, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::{
    BertNormalizer, NormalizerWrapper, Prepend, Replace, Sequence as NormSequence,
};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::{Built, ModelKind};

/// GGUF token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}

const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM_RE: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// The pre-tokenizer of a `gpt2` vocabulary: the regexes llama.cpp applies
/// for `tokenizer.ggml.pre` (in order) and whether whole-word tokens bypass
/// the merges. `None` for names kiln does not know.
pub fn pre_tokenizer_regexes(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    let r = match pre {
        "default" | "" => (
            vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => (vec![LLAMA3_RE], true),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" => (vec![LLAMA3_RE], false),
        "deepseek-coder" => (
            vec![
                "[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            false,
        ),
        "deepseek-v3" => (
            vec![
                r"\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
            ],
            false,
        ),
        "falcon" => (
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]"],
            false,
        ),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            (vec![r"\p{N}", GPT2_RE], false)
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v1-en" | "jina-v2-es"
        | "jina-v2-de" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" => {
            (vec![GPT2_RE], false)
        }
        "qwen2" | "stablelm2" | "megrez" => (vec![QWEN2_RE], false),
        "gpt-4o" | "llama4" => (vec![GPT4O_RE], false),
        "tekken" => (vec![TEKKEN_RE], true),
        "poro-chat" | "bloom" | "gpt3-finnish" => (vec![BLOOM_RE], false),
        "viking" => (vec![BLOOM_RE, r"\p{N}"], false),
        _ => return None,
    };
    Some(r)
}

/// Whether llama.cpp adds a BOS for this pre-tokenizer when the file does not say.
fn pre_default_add_bos(pre: &str) -> bool {
    matches!(
        pre,
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "tekken" | "chameleon"
    )
}

struct Meta<'a> {
    g: &'a Gguf,
    origin: String,
}

impl<'a> Meta<'a> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> Error {
        Error::invalid(&self.origin, format!("{key}: {msg}"))
    }

    fn strings(&self, key: &str) -> Result<Option<&'a [String]>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => match a.as_strings() {
                Some(s) => Ok(Some(s)),
                None => Err(self.err(
                    key,
                    format!(
                        "expected an array of strings, found an array of {}",
                        a.element_type().name()
                    ),
                )),
            },
            Some(v) => Err(self.err(
                key,
                format!(
                    "expected an array of strings, found {}",
                    v.value_type().name()
                ),
            )),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a Array>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.err(
                key,
                format!("expected an array, found {}", v.value_type().name()),
            )),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => match v.as_str() {
                Some(s) => Ok(Some(s)),
                None => Err(self.err(
                    key,
                    format!("expected a string, found {}", v.value_type().name()),
                )),
            },
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => match (v.as_bool(), v.as_int()) {
                (Some(b), _) => Ok(Some(b)),
                (None, Some(i)) => Ok(Some(i != 0)),
                _ => Err(self.err(
                    key,
                    format!("expected a bool, found {}", v.value_type().name()),
                )),
            },
        }
    }

    /// A token id; ids outside the vocabulary are an error.
    fn id(&self, key: &str, n_vocab: usize) -> Result<Option<u32>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int() {
                Some(i) if i >= 0 && (i as u128) < n_vocab as u128 => Ok(Some(i as u32)),
                // llama.cpp writes -1 (as i32) for "none" in a few converters.
                Some(-1) => Ok(None),
                Some(i) => Err(self.err(
                    key,
                    format!("token id {i} is outside the vocabulary (size {n_vocab})"),
                )),
                None => Err(self.err(
                    key,
                    format!("expected an integer, found {}", v.value_type().name()),
                )),
            },
        }
    }
}

/// Read `tokenizer.ggml.*` and build the tokenizer pipeline.
pub(crate) fn build(g: &Gguf) -> Result<Built> {
    let m = Meta {
        g,
        origin: g.path().display().to_string(),
    };
    let model = m
        .str("tokenizer.ggml.model")?
        .ok_or_else(|| Error::invalid(&m.origin, "missing key tokenizer.ggml.model"))?;
    let raw_tokens = m.strings("tokenizer.ggml.tokens")?.ok_or_else(|| {
        Error::invalid(
            &m.origin,
            "missing key tokenizer.ggml.tokens (the vocabulary)",
        )
    })?;
    if raw_tokens.is_empty() {
        return Err(m.err("tokenizer.ggml.tokens", "the vocabulary is empty"));
    }
    if raw_tokens.len() > u32::MAX as usize / 2 {
        return Err(m.err("tokenizer.ggml.tokens", "absurd vocabulary size"));
    }
    let n = raw_tokens.len();
    // llama.cpp renames empty tokens so every id has a distinct text.
    let tokens: Vec<String> = raw_tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            }
        })
        .collect();
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        if let Some(prev) = index.insert(t.as_str(), i as u32) {
            return Err(m.err(
                "tokenizer.ggml.tokens",
                format!("token {t:?} appears twice (ids {prev} and {i})"),
            ));
        }
    }

    let scores: Option<Vec<f32>> = match m.array("tokenizer.ggml.scores")? {
        None => None,
        Some(a) => {
            let v = a.to_f32_vec().ok_or_else(|| {
                m.err(
                    "tokenizer.ggml.scores",
                    format!("expected numbers, found {}", a.element_type().name()),
                )
            })?;
            if v.len() != n {
                return Err(m.err(
                    "tokenizer.ggml.scores",
                    format!("has {} entries but the vocabulary has {n} tokens", v.len()),
                ));
            }
            Some(v)
        }
    };
    let types: Vec<i64> = match m.array("tokenizer.ggml.token_type")? {
        None => vec![token_type::NORMAL; n],
        Some(a) => {
            let v = a.to_i64_vec().ok_or_else(|| {
                m.err(
                    "tokenizer.ggml.token_type",
                    format!("expected integers, found {}", a.element_type().name()),
                )
            })?;
            if v.len() != n {
                return Err(m.err(
                    "tokenizer.ggml.token_type",
                    format!("has {} entries but the vocabulary has {n} tokens", v.len()),
                ));
            }
            v
        }
    };

    let mut b = Built::new(m.origin.clone());
    b.n_vocab = n;
    b.gguf_model = Some(model.to_string());
    let pre = m
        .str("tokenizer.ggml.pre")?
        .unwrap_or("default")
        .to_string();

    // llama.cpp's defaults per vocabulary kind; keys override them below.
    let (def_bos, def_eos, def_unk, def_add_bos, add_space_default): (
        Option<u32>,
        Option<u32>,
        Option<u32>,
        bool,
        bool,
    ) = match model {
        "llama" => (Some(1), Some(2), Some(0), true, true),
        "gpt2" => (Some(11), Some(11), None, pre_default_add_bos(&pre), false),
        "bert" => (Some(101), None, Some(100), true, false),
        "t5" => {
            return Err(Error::unsupported(
                &m.origin,
                "tokenizer.ggml.model 't5' (SentencePiece unigram with a precompiled charsmap) is not implemented",
            ))
        }
        other => {
            return Err(Error::unsupported(
                &m.origin,
                format!("tokenizer.ggml.model '{other}' is not implemented (supported: gpt2, llama, bert)"),
            ))
        }
    };
    let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    b.bos = match m.id("tokenizer.ggml.bos_token_id", n)? {
        Some(i) => Some(i),
        None => in_vocab(def_bos),
    };
    b.eos = match m.id("tokenizer.ggml.eos_token_id", n)? {
        Some(i) => Some(i),
        None => in_vocab(def_eos),
    };
    b.unk = match m.id("tokenizer.ggml.unknown_token_id", n)? {
        Some(i) => Some(i),
        None => in_vocab(def_unk),
    };
    b.pad = m.id("tokenizer.ggml.padding_token_id", n)?;
    let sep = match m.id("tokenizer.ggml.seperator_token_id", n)? {
        Some(i) => Some(i),
        None if model == "bert" => in_vocab(Some(102)),
        None => None,
    };
    if let Some(cls) = m.id("tokenizer.ggml.cls_token_id", n)? {
        if model == "bert" {
            b.bos = Some(cls);
        }
    }
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(i) = m.id(key, n)? {
            b.extra_stop.push(i);
        }
    }
    b.add_bos = m
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(def_add_bos);
    b.add_eos = m.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let add_space_prefix = m
        .bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(add_space_default);
    b.chat_template = m.str("tokenizer.chat_template")?.map(|t| t.to_string());
    // Named variants (tokenizer.chat_template.<name>), e.g. "tool_use".
    for (k, v) in g.metadata() {
        if let Some(name) = k.strip_prefix("tokenizer.chat_template.") {
            if let Some(s) = v.as_str() {
                b.named_templates.push((name.to_string(), s.to_string()));
            }
        }
    }

    // Specials: control and unknown tokens are special (parsed only on request),
    // user-defined tokens are always matched atomically.
    let mut added = Vec::new();
    for (i, t) in types.iter().enumerate() {
        match *t {
            token_type::CONTROL | token_type::UNKNOWN => {
                added.push(AddedToken::from(tokens[i].clone(), true).normalized(false));
                b.special_ids.push(i as u32);
            }
            token_type::USER_DEFINED => {
                added.push(AddedToken::from(tokens[i].clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    // Without token types, at least the declared specials must be atomic.
    if m.g.get("tokenizer.ggml.token_type").is_none() {
        for id in [b.bos, b.eos, b.unk, b.pad, sep].into_iter().flatten() {
            if !b.special_ids.contains(&id) {
                added.push(AddedToken::from(tokens[id as usize].clone(), true).normalized(false));
                b.special_ids.push(id);
            }
        }
    }

    let mut tk: tokenizers::Tokenizer;
    match model {
        "gpt2" => {
            let merges_raw = m.strings("tokenizer.ggml.merges")?.ok_or_else(|| {
                Error::invalid(
                    &m.origin,
                    "missing key tokenizer.ggml.merges (a gpt2 BPE vocabulary needs merges)",
                )
            })?;
            let mut merges = Vec::with_capacity(merges_raw.len());
            for (i, mg) in merges_raw.iter().enumerate() {
                // llama.cpp splits at the first space after the first byte.
                let pos = mg
                    .bytes()
                    .skip(1)
                    .position(|c| c == b' ')
                    .map(|p| p + 1)
                    .ok_or_else(|| {
                        m.err(
                            "tokenizer.ggml.merges",
                            format!("merge #{i} {mg:?} is not two tokens separated by a space"),
                        )
                    })?;
                let (l, r) = (&mg[..pos], &mg[pos + 1..]);
                for part in [l, r] {
                    if !index.contains_key(part) {
                        return Err(m.err(
                            "tokenizer.ggml.merges",
                            format!("merge #{i} {mg:?} refers to {part:?}, which is not in the vocabulary"),
                        ));
                    }
                }
                let joined = format!("{l}{r}");
                if !index.contains_key(joined.as_str()) {
                    return Err(m.err(
                        "tokenizer.ggml.merges",
                        format!(
                            "merge #{i} {mg:?} produces {joined:?}, which is not in the vocabulary"
                        ),
                    ));
                }
                merges.push((l.to_string(), r.to_string()));
            }
            let (regexes, ignore_merges) = pre_tokenizer_regexes(&pre).ok_or_else(|| {
                Error::unsupported(
                    &m.origin,
                    format!("tokenizer.ggml.pre '{pre}' (pre-tokenizer) is not known to kiln"),
                )
            })?;
            let vocab: ahash::AHashMap<String, u32> = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i as u32))
                .collect();
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .ignore_merges(ignore_merges)
                .build()
                .map_err(|e| m.err("tokenizer.ggml.merges", e))?;
            tk = tokenizers::Tokenizer::new(bpe);
            let mut pres: Vec<PreTokenizerWrapper> = Vec::new();
            for re in regexes {
                let split = Split::new(
                    SplitPattern::Regex(re.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| {
                    Error::invalid(&m.origin, format!("pre-tokenizer regex for '{pre}': {e}"))
                })?;
                pres.push(split.into());
            }
            pres.push(ByteLevel::new(false, false, false).into());
            tk.with_pre_tokenizer(Some(PreSequence::new(pres)));
            tk.with_decoder(Some(ByteLevelDecoder::default()));
            b.kind = ModelKind::ByteLevelBpe;
            b.pre = Some(pre);
        }
        "llama" => {
            let scores = scores.ok_or_else(|| {
                Error::invalid(
                    &m.origin,
                    "missing key tokenizer.ggml.scores (a SentencePiece vocabulary needs scores)",
                )
            })?;
            let merges = spm_merges(&tokens, &scores, &index);
            let vocab: ahash::AHashMap<String, u32> = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i as u32))
                .collect();
            let mut builder = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .byte_fallback(true)
                .fuse_unk(true);
            if let Some(u) = b.unk {
                builder = builder.unk_token(tokens[u as usize].clone());
            }
            let bpe = builder
                .build()
                .map_err(|e| Error::invalid(&m.origin, format!("SentencePiece vocabulary: {e}")))?;
            tk = tokenizers::Tokenizer::new(bpe);
            let replace =
                Replace::new(" ", "▁").map_err(|e| Error::invalid(&m.origin, e.to_string()))?;
            let norm: NormalizerWrapper = if add_space_prefix {
                NormSequence::new(vec![Prepend::new("▁".to_string()).into(), replace.into()]).into()
            } else {
                replace.into()
            };
            tk.with_normalizer(Some(norm));
            let unescape = tokenizers::decoders::DecoderWrapper::Replace(
                Replace::new("▁", " ").map_err(|e| Error::invalid(&m.origin, e.to_string()))?,
            );
            let mut decs: Vec<DecoderWrapper> =
                vec![unescape, ByteFallback::new().into(), Fuse::new().into()];
            if add_space_prefix {
                decs.push(Strip::new(' ', 1, 0).into());
            }
            tk.with_decoder(Some(DecoderSequence::new(decs)));
            b.kind = ModelKind::SentencePieceBpe;
            b.add_space_prefix = add_space_prefix;
        }
        "bert" => {
            // GGUF stores word-initial pieces as "▁word" and continuations bare.
            let mut vocab: ahash::AHashMap<String, u32> = ahash::AHashMap::with_capacity(n);
            for (i, t) in tokens.iter().enumerate() {
                let hf = if types[i] == token_type::CONTROL || types[i] == token_type::UNKNOWN {
                    t.clone()
                } else if let Some(w) = t.strip_prefix('▁') {
                    w.to_string()
                } else if t.starts_with('[') && t.ends_with(']') {
                    t.clone()
                } else {
                    format!("##{t}")
                };
                vocab.entry(hf).or_insert(i as u32);
            }
            let unk = b.unk.map(|u| tokens[u as usize].clone()).ok_or_else(|| {
                Error::invalid(&m.origin, "a bert vocabulary needs an unknown token")
            })?;
            let wp = WordPiece::builder()
                .vocab(vocab)
                .unk_token(unk)
                .continuing_subword_prefix("##".to_string())
                .max_input_chars_per_word(usize::MAX)
                .build()
                .map_err(|e| Error::invalid(&m.origin, format!("WordPiece vocabulary: {e}")))?;
            tk = tokenizers::Tokenizer::new(wp);
            // llama.cpp: NFD, drop accents (nonspacing marks), lower-case.
            tk.with_normalizer(Some(BertNormalizer::new(true, true, Some(true), true)));
            tk.with_pre_tokenizer(Some(BertPreTokenizer));
            tk.with_decoder(Some(WordPieceDecoder::new("##".to_string(), true)));
            b.kind = ModelKind::WordPiece;
            // llama.cpp: [CLS] text [SEP]
            b.add_eos = false;
            b.suffix = sep.into_iter().collect();
        }
        other => {
            return Err(Error::unsupported(
                &m.origin,
                format!("tokenizer.ggml.model '{other}'"),
            ))
        }
    }
    tk.add_tokens(&added);
    if b.add_bos {
        let bos = b.bos.ok_or_else(|| {
            Error::invalid(
                &m.origin,
                "tokenizer.ggml.add_bos_token is set but there is no BOS token",
            )
        })?;
        b.prefix.push(bos);
    }
    if b.add_eos {
        let eos = b.eos.ok_or_else(|| {
            Error::invalid(
                &m.origin,
                "tokenizer.ggml.add_eos_token is set but there is no EOS token",
            )
        })?;
        b.suffix.push(eos);
    }
    b.pieces = tokens;
    b.hf = Some(tk);
    Ok(b)
}

/// Merges of a SentencePiece BPE vocabulary, derived from the scores the way
/// transformers' GGUF converter does it (and equivalent to llama.cpp's
/// score-driven merging): every split of a token into two tokens is a merge,
/// ranked by the merged token's score (descending; stable), ties within a
/// token by the pieces' scores.
fn spm_merges(
    tokens: &[String],
    scores: &[f32],
    index: &HashMap<&str, u32>,
) -> Vec<(String, String)> {
    let mut merges: Vec<(u32, u32, f32)> = Vec::new();
    let mut local: Vec<(u32, u32, f32)> = Vec::new();
    for (i, tok) in tokens.iter().enumerate() {
        local.clear();
        for (pos, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(pos);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                local.push((li, ri, scores[i]));
            }
        }
        local.sort_by(|a, b| {
            scores[b.0 as usize]
                .total_cmp(&scores[a.0 as usize])
                .then(scores[b.1 as usize].total_cmp(&scores[a.1 as usize]))
        });
        merges.extend_from_slice(&local);
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(l, r, _)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect()
}
