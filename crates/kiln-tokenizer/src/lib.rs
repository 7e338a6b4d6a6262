//! kiln-tokenizer: text in and out, exactly as the model was trained.
//!
//! # What it does
//!
//! * **Tokenizers** from a Hugging Face `tokenizer.json` (any model the
//!   [`tokenizers`] crate reads: byte-level BPE, SentencePiece-style BPE with
//!   byte fallback, WordPiece, Unigram, WordLevel) or from GGUF metadata
//!   (`tokenizer.ggml.model` = `gpt2`, `llama`, `bert`; see [`gguf`] for how
//!   each is rebuilt to match llama.cpp). Added/special tokens are matched
//!   atomically.
//! * **Special and stop tokens**: BOS/EOS/UNK/PAD ids, `add_bos`/`add_eos`,
//!   and one stop set ([`Tokenizer::is_eos`]) holding the EOS id, the model's
//!   other declared EOS ids (GGUF `eot`/`eom` ids, HF `generation_config.json`
//!   `eos_token_id` lists) and every implicit stop token found among the
//!   special tokens of the vocabulary ([`IMPLICIT_STOP_TOKENS`]).
//! * **Streaming detokenization** ([`StreamDecoder`]): never emits a partial
//!   UTF-8 character or half a byte-fallback sequence; the concatenated
//!   output equals [`Tokenizer::decode`].
//! * **Chat templates** ([`ChatTemplate`]): HF Jinja templates rendered with
//!   minijinja plus the Python-compatible pieces HF templates use. Sources: GGUF
//!   `tokenizer.chat_template`; for HF folders `tokenizer_config.json`, then
//!   `chat_template.jinja`, then `chat_template.json`. A model without any
//!   template renders with the documented ChatML fallback
//!   ([`chat::CHATML_TEMPLATE`]); a template that fails to render is an error,
//!   never a silent fallback.
//!
//! # Public API
//!
//! ```no_run
//! # fn main() -> Result<(), kiln_tokenizer::Error> {
//! use kiln_tokenizer::Tokenizer;
//! let tok = Tokenizer::load("model.gguf")?;           // or a HF folder / tokenizer.json
//! let ids = tok.encode("Hello", tok.add_bos(), true)?; // add_special, parse_special
//! let text = tok.decode(&ids, false)?;                  // skip_special = false
//! let mut stream = tok.stream_decoder(true);
//! for &id in &ids {
//!     if tok.is_eos(id) { break; }
//!     if let Some(piece) = stream.step(id)? { print!("{piece}"); }
//! }
//! if let Some(rest) = stream.finish()? { print!("{rest}"); }
//! let msgs = serde_json::json!([{"role": "user", "content": "Hi"}]);
//! let prompt = tok.render_chat(&msgs, true)?;
//! println!("{}", tok.summary());
//! # Ok(()) }
//! ```
//!
//! # Encoding and decoding semantics
//!
//! * `encode(text, add_special, parse_special)`: `add_special` adds what the
//!   model adds around a sequence (HF: the `post_processor`; GGUF: BOS if
//!   `add_bos_token`, EOS if `add_eos_token`, `[CLS] … [SEP]` for bert).
//!   `parse_special` makes special (control) tokens written in the text match
//!   as single tokens; without it they are tokenized as plain text. Non-special
//!   added tokens (GGUF user-defined) always match, as in HF and llama.cpp.
//! * `decode(ids, skip_special)`: the HF decoder pipeline (byte-level mapping,
//!   or `▁`→space + byte fallback + leading-space strip, or WordPiece joining).
//!   No extra clean-up of spaces before punctuation is applied. Ids outside the
//!   vocabulary are skipped.
//!
//! # Not supported (and why)
//!
//! * GGUF `tokenizer.ggml.model` = `t5` (UGM: SentencePiece unigram with a
//!   precompiled normalization charsmap), `rwkv`, `plamo2` and `none`: no model
//!   kiln targets uses them yet; loading one returns an `Unsupported` error.
//!   (No llama.cpp test vocabulary of these kinds is in the fixtures either.)
//! * GGUF `tokenizer.ggml.pre` = `deepseek-llm` and `chameleon`, and names newer
//!   than this list (see [`gguf::pre_tokenizer_regexes`]): unknown names are an
//!   `Unsupported` error rather than a silently different split.
//! * Per-model token attributes llama.cpp hard-codes by model name (phi-3's
//!   right-stripping of spaces after special tokens) are not applied.
//! * The `{% generation %}` block of some HF training templates.
//!
//! All six llama.cpp vocab test files (`llama-spm`, `llama-bpe`, `qwen2`,
//! `gpt-2`, `bert-bge`, `phi-3`) are checked by `tests/llamacpp_vocab.rs`.

pub mod chat;
mod error;
pub mod gguf;
mod hf;
mod stream;

use std::path::Path;
use std::sync::OnceLock;

use serde::Serialize;

pub use chat::{ChatRequest, ChatTemplate, TemplateOrigin};
pub use error::{Error, Result};
pub use stream::StreamDecoder;

/// Token texts that end generation when present as special tokens of the
/// vocabulary (in addition to the declared EOS id(s)). The llama.cpp list
/// plus `</s>`, `<|return|>`, `<|call|>` and `<end_of_utterance>`.
pub const IMPLICIT_STOP_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
    "<EOT>",
    "<|return|>",
    "<|call|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// The tokenization algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ModelKind {
    /// GPT-2 style BPE over byte-level symbols.
    ByteLevelBpe,
    /// SentencePiece-style BPE over characters with `<0xNN>` byte fallback.
    SentencePieceBpe,
    WordPiece,
    Unigram,
    WordLevel,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::ByteLevelBpe => "BPE (byte-level)",
            ModelKind::SentencePieceBpe => "SentencePiece BPE (byte fallback)",
            ModelKind::WordPiece => "WordPiece",
            ModelKind::Unigram => "Unigram",
            ModelKind::WordLevel => "WordLevel",
        })
    }
}

/// Everything a loader found, before it becomes a [`Tokenizer`].
pub(crate) struct Built {
    pub origin: String,
    pub hf: Option<tokenizers::Tokenizer>,
    pub kind: ModelKind,
    pub gguf_model: Option<String>,
    pub pre: Option<String>,
    pub n_vocab: usize,
    pub pieces: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub extra_stop: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub prefix: Vec<u32>,
    pub suffix: Vec<u32>,
    pub use_post_processor: bool,
    pub special_ids: Vec<u32>,
    pub chat_template: Option<String>,
    pub template_origin: TemplateOrigin,
    pub template_location: String,
    pub named_templates: Vec<(String, String)>,
}

impl Built {
    pub fn new(origin: String) -> Self {
        Self {
            template_location: origin.clone(),
            origin,
            hf: None,
            kind: ModelKind::ByteLevelBpe,
            gguf_model: None,
            pre: None,
            n_vocab: 0,
            pieces: Vec::new(),
            bos: None,
            eos: None,
            unk: None,
            pad: None,
            extra_stop: Vec::new(),
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
            prefix: Vec::new(),
            suffix: Vec::new(),
            use_post_processor: false,
            special_ids: Vec::new(),
            chat_template: None,
            template_origin: TemplateOrigin::Gguf,
            named_templates: Vec::new(),
        }
    }
}

/// A token id with its vocabulary text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenRef {
    pub id: u32,
    pub text: String,
}

/// What `kiln inspect` prints about a tokenizer.
#[derive(Clone, Debug, Serialize)]
pub struct TokenizerSummary {
    /// "gguf" or "tokenizer.json".
    pub source: String,
    pub model: ModelKind,
    /// GGUF `tokenizer.ggml.model` / `tokenizer.ggml.pre`.
    pub gguf_model: Option<String>,
    pub pre_tokenizer: Option<String>,
    pub vocab_size: usize,
    pub bos: Option<TokenRef>,
    pub eos: Option<TokenRef>,
    pub unk: Option<TokenRef>,
    pub pad: Option<TokenRef>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Every id that ends generation.
    pub stop_tokens: Vec<TokenRef>,
    /// Number of special (control) tokens.
    pub n_special: usize,
    pub has_chat_template: bool,
    /// Where the template comes from (ChatML fallback when the model has none).
    pub chat_template: TemplateOrigin,
    /// Set when the model's template does not compile.
    pub chat_template_error: Option<String>,
}

impl std::fmt::Display for TokenizerSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tr = |t: &Option<TokenRef>| match t {
            Some(t) => format!("{} {:?}", t.id, t.text),
            None => "none".to_string(),
        };
        write!(f, "tokenizer: {} from {}", self.model, self.source)?;
        if let Some(m) = &self.gguf_model {
            write!(f, " (model {m:?}")?;
            if let Some(p) = &self.pre_tokenizer {
                write!(f, ", pre {p:?}")?;
            }
            write!(f, ")")?;
        }
        writeln!(f)?;
        writeln!(f, "  vocab size: {}", self.vocab_size)?;
        writeln!(f, "  bos: {}  (added: {})", tr(&self.bos), self.add_bos)?;
        writeln!(f, "  eos: {}  (added: {})", tr(&self.eos), self.add_eos)?;
        writeln!(f, "  unk: {}  pad: {}", tr(&self.unk), tr(&self.pad))?;
        let stops: Vec<String> = self
            .stop_tokens
            .iter()
            .map(|t| format!("{} {:?}", t.id, t.text))
            .collect();
        writeln!(f, "  stop tokens: {}", stops.join(", "))?;
        writeln!(f, "  special tokens: {}", self.n_special)?;
        match &self.chat_template_error {
            Some(e) => write!(f, "  chat template: INVALID: {e}"),
            None => write!(f, "  chat template: {}", self.chat_template),
        }
    }
}

/// A loaded tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    /// Same pipeline with special-token parsing switched off (built on first use).
    hf_plain: OnceLock<tokenizers::Tokenizer>,
    origin: String,
    source: &'static str,
    kind: ModelKind,
    gguf_model: Option<String>,
    pre: Option<String>,
    pieces: Vec<String>,
    special: Vec<bool>,
    n_special: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    stop: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    use_post_processor: bool,
    chat_template: Option<ChatTemplate>,
    named_templates: Vec<(String, ChatTemplate)>,
    /// Why the model's template could not be compiled, if it could not.
    template_error: Option<String>,
    fallback_template: OnceLock<ChatTemplate>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("origin", &self.origin)
            .field("kind", &self.kind)
            .field("vocab_size", &self.pieces.len())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Load from a GGUF file, a Hugging Face model folder, or a `tokenizer.json`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::from_hf_dir(path);
        }
        if !path.exists() {
            return Err(Error::io(
                path.display(),
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
            ));
        }
        let is_json = path.extension().and_then(|e| e.to_str()) == Some("json");
        if is_json {
            let dir = path.parent().unwrap_or(Path::new("."));
            let b = hf::build_from_dir(dir, path)?;
            return Self::from_built(b, "tokenizer.json");
        }
        let g = kiln_format::gguf::Gguf::open(path)?;
        Self::from_gguf(&g)
    }

    /// Build from the `tokenizer.ggml.*` metadata of an open GGUF file.
    pub fn from_gguf(g: &kiln_format::gguf::Gguf) -> Result<Self> {
        let b = gguf::build(g)?;
        Self::from_built(b, "gguf")
    }

    /// The tokenizer of an opened model: its GGUF metadata, or the files of
    /// its Hugging Face folder.
    pub fn from_model(m: &kiln_format::Model) -> Result<Self> {
        match &m.gguf {
            Some(g) => Self::from_gguf(g),
            None => Self::from_hf_dir(&m.path),
        }
    }

    /// Load a Hugging Face folder: `tokenizer.json` plus `tokenizer_config.json`,
    /// `generation_config.json`, `config.json` and the chat template files.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let b = hf::build_from_dir(dir, &dir.join("tokenizer.json"))?;
        Self::from_built(b, "tokenizer.json")
    }

    /// Build from the bytes of a `tokenizer.json` alone (no config files: BOS
    /// and EOS are guessed from common special-token names). `origin` names it
    /// in errors.
    pub fn from_tokenizer_json_bytes(bytes: &[u8], origin: &str) -> Result<Self> {
        let b = hf::build_from_json(bytes, origin)?;
        Self::from_built(b, "tokenizer.json")
    }

    fn from_built(b: Built, source: &'static str) -> Result<Self> {
        let hf =
            b.hf.ok_or_else(|| Error::invalid(&b.origin, "no tokenizer was built"))?;
        let n = b.pieces.len();
        let mut special = vec![false; n];
        for &i in &b.special_ids {
            if let Some(s) = special.get_mut(i as usize) {
                *s = true;
            }
        }
        let n_special = special.iter().filter(|&&s| s).count();
        let is_special = |id: u32| special.get(id as usize).copied().unwrap_or(false);
        let mut stop: Vec<u32> = b
            .eos
            .into_iter()
            .chain(b.extra_stop.iter().copied())
            .collect();
        for name in IMPLICIT_STOP_TOKENS {
            if let Some(id) = hf.token_to_id(name) {
                if is_special(id) {
                    stop.push(id);
                }
            }
        }
        stop.sort_unstable();
        stop.dedup();

        let text_of = |id: Option<u32>| -> String {
            id.and_then(|i| b.pieces.get(i as usize).cloned())
                .unwrap_or_default()
        };
        let (bos_t, eos_t) = (text_of(b.bos), text_of(b.eos));
        let (unk_t, pad_t) = (text_of(b.unk), text_of(b.pad));
        let mk = |src: &str, origin: TemplateOrigin, loc: String| -> Result<ChatTemplate> {
            let mut t = ChatTemplate::new(src, origin, loc, &bos_t, &eos_t)?;
            t.set_unk_pad(&unk_t, &pad_t);
            Ok(t)
        };
        // A template that does not compile does not stop the tokenizer from
        // loading (plain completion still works); rendering reports the error.
        let mut template_error = None;
        let chat_template = match &b.chat_template {
            Some(src) => match mk(src, b.template_origin.clone(), b.template_location.clone()) {
                Ok(t) => Some(t),
                Err(e) => {
                    template_error = Some(e.to_string());
                    None
                }
            },
            None => None,
        };
        let mut named_templates = Vec::new();
        for (name, src) in &b.named_templates {
            let loc = format!("{} [{name}]", b.template_location);
            match mk(src, b.template_origin.clone(), loc) {
                Ok(t) => named_templates.push((name.clone(), t)),
                Err(e) => {
                    template_error.get_or_insert(e.to_string());
                }
            }
        }

        let mut add_bos = b.add_bos;
        let mut add_eos = b.add_eos;
        if b.use_post_processor {
            // What the post-processor adds, found by encoding an empty text.
            let enc = hf
                .encode_fast("", true)
                .map_err(|e| Error::tokenize(&b.origin, e.to_string()))?;
            let ids = enc.get_ids();
            add_bos = b.bos.is_some() && ids.first().copied() == b.bos;
            add_eos = b.eos.is_some() && ids.last().copied() == b.eos;
        }
        Ok(Self {
            hf,
            hf_plain: OnceLock::new(),
            origin: b.origin,
            source,
            kind: b.kind,
            gguf_model: b.gguf_model,
            pre: b.pre,
            pieces: b.pieces,
            special,
            n_special,
            bos: b.bos,
            eos: b.eos,
            unk: b.unk,
            pad: b.pad,
            stop,
            add_bos,
            add_eos,
            prefix: b.prefix,
            suffix: b.suffix,
            use_post_processor: b.use_post_processor,
            chat_template,
            named_templates,
            template_error,
            fallback_template: OnceLock::new(),
        })
    }

    /// Encode `text`. `add_special`: add the model's BOS/EOS (or CLS/SEP)
    /// around it as the model is configured to; `parse_special`: let special
    /// tokens written in the text match as single tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let tk = if parse_special {
            &self.hf
        } else {
            self.hf_plain.get_or_init(|| {
                let mut t = self.hf.clone();
                t.set_encode_special_tokens(true);
                t
            })
        };
        let enc = tk
            .encode_fast(text, add_special && self.use_post_processor)
            .map_err(|e| Error::tokenize(&self.origin, e.to_string()))?;
        let ids = enc.get_ids();
        if add_special && !self.use_post_processor {
            let mut out = Vec::with_capacity(ids.len() + self.prefix.len() + self.suffix.len());
            out.extend_from_slice(&self.prefix);
            out.extend_from_slice(ids);
            out.extend_from_slice(&self.suffix);
            Ok(out)
        } else {
            Ok(ids.to_vec())
        }
    }

    /// Encode a rendered chat prompt: special tokens are parsed, and the BOS
    /// is added when the model adds one, unless the template already wrote it
    /// (no double BOS). No EOS is added.
    pub fn encode_chat_prompt(&self, rendered: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(rendered, false, true)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Decode ids to text; `skip_special` drops special (control) tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.hf
            .decode(ids, skip_special)
            .map_err(|e| Error::tokenize(&self.origin, e.to_string()))
    }

    /// An incremental decoder (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// Number of token ids (the largest id + 1).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The vocabulary string of a token (e.g. `Ġworld`, `▁world`, `<0x0A>`).
    pub fn token_piece(&self, id: u32) -> Option<&str> {
        self.pieces
            .get(id as usize)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// The id of a vocabulary string (including added tokens).
    pub fn token_to_id(&self, piece: &str) -> Option<u32> {
        self.hf.token_to_id(piece)
    }

    /// Whether the id is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The model's primary EOS id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every id that ends generation (sorted).
    pub fn eos_ids(&self) -> &[u32] {
        &self.stop
    }

    /// Does this id end generation?
    pub fn is_eos(&self, id: u32) -> bool {
        self.stop.binary_search(&id).is_ok()
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Does `encode(.., add_special = true, ..)` put a BOS first?
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Does `encode(.., add_special = true, ..)` put an EOS last?
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// The model's own chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// A named template variant (GGUF `tokenizer.chat_template.<name>`, or an
    /// entry of a `tokenizer_config.json` template list), e.g. `tool_use`.
    pub fn named_chat_template(&self, name: &str) -> Option<&ChatTemplate> {
        self.named_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The template `render_chat` uses: the model's, or ChatML when it has
    /// none. An error when the model has a template that does not compile
    /// (never a silent fallback).
    pub fn effective_chat_template(&self) -> Result<&ChatTemplate> {
        if let Some(e) = &self.template_error {
            return Err(Error::template(&self.origin, e.clone()));
        }
        if let Some(t) = &self.chat_template {
            return Ok(t);
        }
        if let Some(t) = self.fallback_template.get() {
            return Ok(t);
        }
        let text_of = |id: Option<u32>| id.and_then(|i| self.token_piece(i)).unwrap_or("");
        let t = ChatTemplate::chatml(text_of(self.bos), text_of(self.eos))?;
        Ok(self.fallback_template.get_or_init(|| t))
    }

    /// Why the model's chat template failed to compile, if it did.
    pub fn chat_template_error(&self) -> Option<&str> {
        self.template_error.as_deref()
    }

    /// Render OpenAI-style `messages` with the model's chat template (ChatML if
    /// the model has none).
    pub fn render_chat(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat_request(&ChatRequest::new(messages, add_generation_prompt))
    }

    /// Render a full request (tools, extra variables). Uses the `tool_use`
    /// variant when tools are given and the model has one.
    pub fn render_chat_request(&self, req: &ChatRequest<'_>) -> Result<String> {
        let t = match (req.tools, self.named_chat_template("tool_use")) {
            (Some(_), Some(t)) => t,
            _ => self.effective_chat_template()?,
        };
        t.render(req)
    }

    /// A short description for `kiln inspect`.
    pub fn summary(&self) -> TokenizerSummary {
        let tr = |id: Option<u32>| {
            id.map(|i| TokenRef {
                id: i,
                text: self.token_piece(i).unwrap_or("").to_string(),
            })
        };
        TokenizerSummary {
            source: self.source.to_string(),
            model: self.kind,
            gguf_model: self.gguf_model.clone(),
            pre_tokenizer: self.pre.clone(),
            vocab_size: self.vocab_size(),
            bos: tr(self.bos),
            eos: tr(self.eos),
            unk: tr(self.unk),
            pad: tr(self.pad),
            add_bos: self.add_bos,
            add_eos: self.add_eos,
            stop_tokens: self.stop.iter().filter_map(|&i| tr(Some(i))).collect(),
            n_special: self.n_special,
            has_chat_template: self.chat_template.is_some(),
            chat_template: match &self.chat_template {
                Some(t) => t.origin().clone(),
                None => TemplateOrigin::ChatMlFallback,
            },
            chat_template_error: self.template_error.clone(),
        }
    }
}
