//! `ModelConfig`: the hyper-parameters of a model, read from GGUF metadata or
//! a Hugging Face `config.json`, validated, and with every format difference
//! already resolved (RoPE style, norm weight offset, per-layer sliding window).

use std::path::Path;

use serde::Serialize;
use serde_json::Value as Json;

use crate::error::{FormatError, Result};
use crate::gguf::{Gguf, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Gpt2,
    Bert,
}

impl Arch {
    /// The GGUF `general.architecture` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Gpt2 => "gpt2",
            Arch::Bert => "bert",
        }
    }

    pub fn from_gguf_name(name: &str) -> Option<Self> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "gpt2" => Arch::Gpt2,
            "bert" => Arch::Bert,
            _ => return None,
        })
    }

    /// HF `model_type` (config.json), including the aliases that share a
    /// decoder with a supported architecture.
    pub fn from_hf_model_type(t: &str) -> Option<Self> {
        Some(match t {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" | "gemma3_text" => Arch::Gemma3,
            "gpt2" => Arch::Gpt2,
            "bert" => Arch::Bert,
            _ => return None,
        })
    }

    /// The activation when the file does not name one.
    pub fn default_activation(self) -> Activation {
        match self {
            Arch::Gemma3 | Arch::Gpt2 => Activation::GeluTanh,
            Arch::Bert => Activation::Gelu,
            _ => Activation::Silu,
        }
    }

    /// Gemma multiplies embeddings by sqrt(hidden); no other family scales.
    pub fn embedding_scale(self, hidden_size: usize) -> f32 {
        if self == Arch::Gemma3 {
            (hidden_size as f32).sqrt()
        } else {
            1.0
        }
    }

    /// Encoder-only models attend both ways and produce embeddings, not text.
    pub fn is_encoder(self) -> bool {
        matches!(self, Arch::Bert)
    }
}

/// Which pairs of a head's dimensions RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama.cpp's "normal" mode, which the
    /// GGUF llama converter's Q/K row permutation is made for.
    Interleaved,
    /// Halves (x[i], x[i + d/2]): HF `rotate_half`, llama.cpp's NEOX mode.
    Neox,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1 wavelength-dependent scaling (HF `rope_type: llama3`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: usize,
    },
    /// YaRN (HF `rope_type: yarn`, GGUF `rope.scaling.type = yarn`).
    Yarn {
        factor: f64,
        original_context: usize,
        beta_fast: f64,
        beta_slow: f64,
    },
    /// Per-frequency divisors stored as the tensor `rope_freqs.weight`
    /// (how llama.cpp's converter writes Llama 3.1 scaling into GGUF).
    FreqFactors,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RopeConfig {
    /// Base of the global (or only) layers.
    pub theta: f64,
    /// Base of sliding-window layers where it differs (Gemma 3: 10000).
    pub theta_local: Option<f64>,
    /// Leading dimensions of each head that are rotated (even, ≤ head_dim).
    pub dim: usize,
    pub style: RopeStyle,
    /// Scaling of the global layers; sliding-window layers are never scaled.
    pub scaling: RopeScaling,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Silu,
    /// tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
    /// exact erf GELU.
    Gelu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    Rms,
    /// LayerNorm with weight and bias.
    Layer,
}

/// Validated hyper-parameters. Everything a later stage needs to know about
/// the format is here as plain data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// Longest context the model was trained for.
    pub context_length: usize,
    pub norm: NormKind,
    pub norm_eps: f64,
    /// Added to every stored norm weight before use: Gemma's `(1 + w)`
    /// RMSNorm is 1.0 for HF checkpoints and 0.0 for GGUF (the converter
    /// already added it).
    pub norm_weight_offset: f32,
    pub activation: Activation,
    /// `None` for learned absolute positions (GPT-2, BERT).
    pub rope: Option<RopeConfig>,
    /// Window size (tokens, including the current one) of sliding layers.
    pub sliding_window: Option<usize>,
    /// Per layer: does it use the sliding window?
    pub layer_sliding: Vec<bool>,
    /// Attention scores are multiplied by `query_pre_attn_scalar^-0.5`
    /// (defaults to head_dim).
    pub attn_scale: f64,
    pub attn_logit_softcap: Option<f64>,
    pub final_logit_softcap: Option<f64>,
    /// Embedding rows are multiplied by this (Gemma: sqrt(hidden)).
    pub embedding_scale: f32,
    /// The output projection is `token_embd` (no `output.weight`).
    pub tied_embeddings: bool,
    /// BERT token-type vocabulary.
    pub type_vocab_size: usize,
}

/// Reads a field and says which one is wrong when it is.
struct Fields<'a> {
    path: &'a Path,
}

impl Fields<'_> {
    fn missing(&self, key: &str) -> FormatError {
        FormatError::missing(self.path, format!("config field '{key}'"))
    }
    fn invalid(&self, key: &str, msg: impl std::fmt::Display) -> FormatError {
        FormatError::invalid(self.path, format!("config field '{key}': {msg}"))
    }
    /// A positive integer that fits comfortably in memory arithmetic.
    fn positive(&self, key: &str, v: Option<i128>) -> Result<usize> {
        match v {
            None => Err(self.missing(key)),
            Some(n) if n > 0 && n <= (1 << 40) => Ok(n as usize),
            Some(n) => Err(self.invalid(key, format!("{n} is not a positive size"))),
        }
    }
    fn positive_f(&self, key: &str, v: f64) -> Result<f64> {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(self.invalid(key, format!("{v} must be a positive number")))
        }
    }
}

// ---------------------------------------------------------------- GGUF

impl ModelConfig {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let path = g.path();
        let f = Fields { path };
        let arch_name = g.architecture()?;
        let arch = Arch::from_gguf_name(arch_name).ok_or_else(|| {
            FormatError::unsupported(
                path,
                format!(
                    "architecture '{arch_name}' (kiln runs llama, qwen2, qwen3, gemma3, gpt2, bert)"
                ),
            )
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let int = |k: &str| -> Result<Option<i128>> {
            let full = key(k);
            match g.get(&full) {
                None => Ok(None),
                Some(v) => match v.as_int() {
                    Some(n) => Ok(Some(n)),
                    None => per_layer_int(v).map(Some).ok_or_else(|| {
                        f.invalid(
                            &full,
                            format!("expected an integer, found {}", v.value_type().name()),
                        )
                    }),
                },
            }
        };
        let float = |k: &str| -> Result<Option<f64>> {
            let full = key(k);
            match g.get(&full) {
                None => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    f.invalid(
                        &full,
                        format!("expected a number, found {}", v.value_type().name()),
                    )
                }),
            }
        };

        let hidden_size = f.positive(&key("embedding_length"), int("embedding_length")?)?;
        let n_layers = f.positive(&key("block_count"), int("block_count")?)?;
        let n_heads = f.positive(&key("attention.head_count"), int("attention.head_count")?)?;
        let n_kv_heads = match int("attention.head_count_kv")? {
            None => n_heads,
            v => f.positive(&key("attention.head_count_kv"), v)?,
        };
        let head_dim = match int("attention.key_length")? {
            Some(v) => f.positive(&key("attention.key_length"), Some(v))?,
            None => infer_head_dim(g, n_heads).unwrap_or(hidden_size / n_heads),
        };
        let intermediate_size =
            f.positive(&key("feed_forward_length"), int("feed_forward_length")?)?;
        let context_length = f.positive(&key("context_length"), int("context_length")?)?;
        let vocab_size = match int("vocab_size")? {
            Some(v) => f.positive(&key("vocab_size"), Some(v))?,
            None => g
                .tensor("token_embd.weight")
                .and_then(|t| t.ne.get(1).copied())
                .or_else(|| {
                    g.get("tokenizer.ggml.tokens")
                        .and_then(Value::as_array)
                        .map(|a| a.len() as u64)
                })
                .map(|n| n as usize)
                .ok_or_else(|| f.missing(&key("vocab_size")))?,
        };
        let (norm, norm_eps) = match arch {
            Arch::Gpt2 | Arch::Bert => (
                NormKind::Layer,
                float("attention.layer_norm_epsilon")?.unwrap_or(1e-5),
            ),
            _ => (
                NormKind::Rms,
                float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
            ),
        };
        let norm_eps = f.positive_f(&key("attention.layer_norm_rms_epsilon"), norm_eps)?;

        let rope = match arch {
            Arch::Gpt2 | Arch::Bert => None,
            _ => {
                let theta = f.positive_f(
                    &key("rope.freq_base"),
                    float("rope.freq_base")?.unwrap_or(10000.0),
                )?;
                let dim = match int("rope.dimension_count")? {
                    Some(v) => f.positive(&key("rope.dimension_count"), Some(v))?,
                    None => head_dim,
                };
                let scaling = match g.get_str(&key("rope.scaling.type")) {
                    None | Some("none") => {
                        if g.tensor("rope_freqs.weight").is_some() {
                            RopeScaling::FreqFactors
                        } else {
                            RopeScaling::None
                        }
                    }
                    Some("linear") => RopeScaling::Linear {
                        factor: f.positive_f(
                            &key("rope.scaling.factor"),
                            float("rope.scaling.factor")?.unwrap_or(1.0),
                        )?,
                    },
                    Some("yarn") => RopeScaling::Yarn {
                        factor: f.positive_f(
                            &key("rope.scaling.factor"),
                            float("rope.scaling.factor")?.unwrap_or(1.0),
                        )?,
                        original_context: f.positive(
                            &key("rope.scaling.original_context_length"),
                            int("rope.scaling.original_context_length")?,
                        )?,
                        beta_fast: float("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                        beta_slow: float("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                    },
                    Some(other) => {
                        return Err(FormatError::unsupported(
                            path,
                            format!("{} = '{other}'", key("rope.scaling.type")),
                        ))
                    }
                };
                let theta_local = match arch {
                    Arch::Gemma3 => Some(float("rope.freq_base_swa")?.unwrap_or(10000.0)),
                    _ => None,
                };
                Some(RopeConfig {
                    theta,
                    theta_local,
                    dim,
                    // llama.cpp's converter permutes llama Q/K rows for
                    // interleaved RoPE; the other families keep HF order.
                    style: if arch == Arch::Llama {
                        RopeStyle::Interleaved
                    } else {
                        RopeStyle::Neox
                    },
                    scaling,
                })
            }
        };

        let sliding_window = match int("attention.sliding_window")? {
            None => None,
            v => Some(f.positive(&key("attention.sliding_window"), v)?),
        };
        let layer_sliding = match (arch, sliding_window) {
            (_, None) => vec![false; n_layers],
            (Arch::Gemma3, Some(_)) => match g.get(&key("attention.sliding_window_pattern")) {
                Some(Value::Array(crate::gguf::Array::Bool(v))) if v.len() == n_layers => v.clone(),
                Some(v) => match v.as_int() {
                    Some(p) if p > 0 => pattern_layers(n_layers, p as usize),
                    _ => {
                        return Err(f.invalid(
                            &key("attention.sliding_window_pattern"),
                            "expected a positive integer or one bool per layer",
                        ))
                    }
                },
                None => pattern_layers(n_layers, 6),
            },
            (_, Some(_)) => vec![true; n_layers],
        };

        let cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            intermediate_size,
            context_length,
            norm,
            norm_eps,
            norm_weight_offset: 0.0,
            activation: arch.default_activation(),
            rope,
            sliding_window,
            layer_sliding,
            // llama.cpp always scales Gemma 3 (but 27B) by 1/sqrt(head_dim);
            // GGUF has no query_pre_attn_scalar key.
            attn_scale: 1.0 / (head_dim as f64).sqrt(),
            attn_logit_softcap: float("attn_logit_softcapping")?,
            final_logit_softcap: float("final_logit_softcapping")?,
            embedding_scale: arch.embedding_scale(hidden_size),
            tied_embeddings: g.tensor("output.weight").is_none(),
            type_vocab_size: match arch {
                Arch::Bert => g
                    .tensor("token_types.weight")
                    .and_then(|t| t.ne.get(1).copied())
                    .unwrap_or(2) as usize,
                _ => 0,
            },
        };
        cfg.validate(path)?;
        Ok(cfg)
    }
}

/// llama.cpp allows some counts as one value per layer; kiln accepts such an
/// array when every layer has the same value.
fn per_layer_int(v: &Value) -> Option<i128> {
    let vals = v.as_array()?.to_i64_vec()?;
    let first = *vals.first()?;
    vals.iter().all(|&x| x == first).then_some(first as i128)
}

fn infer_head_dim(g: &Gguf, n_heads: usize) -> Option<usize> {
    let t = g.tensor("blk.0.attn_q.weight")?;
    let out = *t.ne.get(1)? as usize;
    out.is_multiple_of(n_heads).then_some(out / n_heads)
}

/// Gemma's pattern n: every n-th layer (1-based) is global, the rest slide.
fn pattern_layers(n_layers: usize, n: usize) -> Vec<bool> {
    (0..n_layers).map(|i| (i + 1) % n != 0).collect()
}

// ---------------------------------------------------------------- HF config.json

impl ModelConfig {
    /// From a parsed `config.json`. `q_proj_out` is the row count of layer
    /// 0's query projection, used when the config has no `head_dim`.
    pub fn from_hf_json(path: &Path, root: &Json, q_proj_out: Option<usize>) -> Result<Self> {
        let f = Fields { path };
        // Multimodal checkpoints nest the language model's config.
        let c = match root.get("text_config") {
            Some(t) if t.is_object() => t,
            _ => root,
        };
        let model_type = c
            .get("model_type")
            .or_else(|| root.get("model_type"))
            .and_then(Json::as_str)
            .ok_or_else(|| f.missing("model_type"))?;
        let arch = Arch::from_hf_model_type(model_type).ok_or_else(|| {
            FormatError::unsupported(
                path,
                format!("model_type '{model_type}' (kiln runs llama, mistral, qwen2, qwen3, gemma3, gpt2, bert)"),
            )
        })?;
        // First of several spellings that is present.
        let get = |keys: &[&str]| -> Option<(String, &Json)> {
            keys.iter().find_map(|k| {
                c.get(*k)
                    .filter(|v| !v.is_null())
                    .map(|v| (k.to_string(), v))
            })
        };
        let int = |keys: &[&str]| -> Result<Option<i128>> {
            match get(keys) {
                None => Ok(None),
                Some((k, v)) => v
                    .as_i64()
                    .map(|n| Some(n as i128))
                    .ok_or_else(|| f.invalid(&k, format!("expected an integer, found {v}"))),
            }
        };
        let req = |keys: &[&str]| -> Result<usize> { f.positive(keys[0], int(keys)?) };
        let float = |keys: &[&str]| -> Result<Option<f64>> {
            match get(keys) {
                None => Ok(None),
                Some((k, v)) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| f.invalid(&k, format!("expected a number, found {v}"))),
            }
        };

        let hidden_size = req(&["hidden_size", "n_embd"])?;
        let n_layers = req(&["num_hidden_layers", "n_layer"])?;
        let n_heads = req(&["num_attention_heads", "n_head"])?;
        let n_kv_heads = match int(&["num_key_value_heads"])? {
            None => n_heads,
            v => f.positive("num_key_value_heads", v)?,
        };
        let head_dim = match int(&["head_dim"])? {
            Some(v) => f.positive("head_dim", Some(v))?,
            None => match q_proj_out {
                Some(out) if out % n_heads == 0 && out > 0 => out / n_heads,
                _ => hidden_size / n_heads,
            },
        };
        let intermediate_size = match int(&["intermediate_size", "n_inner"])? {
            Some(v) => f.positive("intermediate_size", Some(v))?,
            None if arch == Arch::Gpt2 => 4 * hidden_size,
            None => return Err(f.missing("intermediate_size")),
        };
        let context_length = req(&["max_position_embeddings", "n_positions", "n_ctx"])?;
        let vocab_size = req(&["vocab_size"])?;
        let (norm, eps_keys): (NormKind, &[&str]) = match arch {
            Arch::Gpt2 | Arch::Bert => (NormKind::Layer, &["layer_norm_epsilon", "layer_norm_eps"]),
            _ => (NormKind::Rms, &["rms_norm_eps"]),
        };
        let norm_eps = f.positive_f(eps_keys[0], float(eps_keys)?.unwrap_or(1e-6))?;

        let act_name = get(&["hidden_activation", "hidden_act", "activation_function"])
            .and_then(|(_, v)| v.as_str().map(str::to_owned));
        let activation = match act_name.as_deref() {
            None => arch.default_activation(),
            Some("silu" | "swish") => Activation::Silu,
            Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" | "gelu_tanh") => {
                Activation::GeluTanh
            }
            Some("gelu") => Activation::Gelu,
            Some(other) => {
                return Err(FormatError::unsupported(
                    path,
                    format!("activation '{other}'"),
                ))
            }
        };

        let rope = match arch {
            Arch::Gpt2 | Arch::Bert => None,
            _ => Some(hf_rope(&f, c, head_dim, arch)?),
        };

        let sliding_window = match arch {
            // Qwen2 configs carry a window that is off unless use_sliding_window.
            Arch::Qwen2 | Arch::Qwen3
                if !c
                    .get("use_sliding_window")
                    .and_then(Json::as_bool)
                    .unwrap_or(false) =>
            {
                None
            }
            _ => match int(&["sliding_window"])? {
                None => None,
                v => Some(f.positive("sliding_window", v)?),
            },
        };
        let layer_sliding = match (
            sliding_window,
            c.get("layer_types").and_then(Json::as_array),
        ) {
            (None, _) => vec![false; n_layers],
            (Some(_), Some(types)) => {
                if types.len() != n_layers {
                    return Err(f.invalid(
                        "layer_types",
                        format!("{} entries for {n_layers} layers", types.len()),
                    ));
                }
                types
                    .iter()
                    .map(|t| t.as_str() == Some("sliding_attention"))
                    .collect()
            }
            (Some(_), None) if arch == Arch::Gemma3 => {
                let p = int(&["sliding_window_pattern", "_sliding_window_pattern"])?.unwrap_or(6);
                pattern_layers(n_layers, f.positive("sliding_window_pattern", Some(p))?)
            }
            (Some(_), None) => vec![true; n_layers],
        };

        let attn_scale = match float(&["query_pre_attn_scalar"])? {
            Some(s) => 1.0 / f.positive_f("query_pre_attn_scalar", s)?.sqrt(),
            None => 1.0 / (head_dim as f64).sqrt(),
        };
        let tied_default = !matches!(arch, Arch::Llama | Arch::Qwen3);
        let tied_embeddings = root
            .get("tie_word_embeddings")
            .or_else(|| c.get("tie_word_embeddings"))
            .and_then(Json::as_bool)
            .unwrap_or(tied_default);

        let cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            intermediate_size,
            context_length,
            norm,
            norm_eps,
            norm_weight_offset: if arch == Arch::Gemma3 { 1.0 } else { 0.0 },
            activation,
            rope,
            sliding_window,
            layer_sliding,
            attn_scale,
            attn_logit_softcap: float(&["attn_logit_softcapping"])?,
            final_logit_softcap: float(&["final_logit_softcapping"])?,
            embedding_scale: arch.embedding_scale(hidden_size),
            tied_embeddings,
            type_vocab_size: match arch {
                Arch::Bert => int(&["type_vocab_size"])?.unwrap_or(2).max(0) as usize,
                _ => 0,
            },
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Cross-field checks; each error names the field.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let f = Fields { path };
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(f.invalid(
                "num_key_value_heads",
                format!(
                    "{} query heads are not a multiple of {} key/value heads",
                    self.n_heads, self.n_kv_heads
                ),
            ));
        }
        if self.head_dim == 0 || self.head_dim > 4096 {
            return Err(f.invalid("head_dim", format!("{} is out of range", self.head_dim)));
        }
        if (self.arch == Arch::Gpt2 || self.arch == Arch::Bert)
            && !self.hidden_size.is_multiple_of(self.n_heads)
        {
            return Err(f.invalid(
                "num_attention_heads",
                format!(
                    "hidden size {} is not divisible by {} heads",
                    self.hidden_size, self.n_heads
                ),
            ));
        }
        if let Some(r) = &self.rope {
            if r.dim == 0 || r.dim % 2 != 0 || r.dim > self.head_dim {
                return Err(f.invalid(
                    "rope dimension",
                    format!(
                        "{} must be even and at most head_dim {}",
                        r.dim, self.head_dim
                    ),
                ));
            }
        }
        if self.layer_sliding.len() != self.n_layers {
            return Err(f.invalid("layer_types", "one entry per layer expected"));
        }
        Ok(())
    }

    /// Size of one K (or V) row across KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

fn hf_rope(f: &Fields<'_>, c: &Json, head_dim: usize, arch: Arch) -> Result<RopeConfig> {
    // transformers 5 writes `rope_parameters` (per layer type for Gemma 3);
    // older configs write `rope_theta` + `rope_scaling` (+ `rope_local_base_freq`).
    let params = c.get("rope_parameters").filter(|v| v.is_object());
    let (global, local) = match params {
        Some(p) if p.get("full_attention").is_some() => {
            (p.get("full_attention"), p.get("sliding_attention"))
        }
        Some(p) => (Some(p), None),
        None => (c.get("rope_scaling").filter(|v| v.is_object()), None),
    };
    let num = |o: Option<&Json>, k: &str| o.and_then(|o| o.get(k)).and_then(Json::as_f64);
    let theta = num(global, "rope_theta")
        .or_else(|| c.get("rope_theta").and_then(Json::as_f64))
        .unwrap_or(10000.0);
    let theta = f.positive_f("rope_theta", theta)?;
    let theta_local = match arch {
        Arch::Gemma3 => Some(
            num(local, "rope_theta")
                .or_else(|| c.get("rope_local_base_freq").and_then(Json::as_f64))
                .unwrap_or(10000.0),
        ),
        _ => None,
    };
    let rope_type = global
        .and_then(|g| g.get("rope_type").or_else(|| g.get("type")))
        .and_then(Json::as_str)
        .unwrap_or("default");
    let factor = || -> Result<f64> {
        f.positive_f("rope_scaling.factor", num(global, "factor").unwrap_or(1.0))
    };
    let orig_ctx = || -> Result<usize> {
        f.positive(
            "rope_scaling.original_max_position_embeddings",
            num(global, "original_max_position_embeddings")
                .or_else(|| c.get("max_position_embeddings").and_then(Json::as_f64))
                .map(|v| v as i128),
        )
    };
    let scaling = match rope_type {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: num(global, "low_freq_factor").unwrap_or(1.0),
            high_freq_factor: num(global, "high_freq_factor").unwrap_or(4.0),
            original_context: orig_ctx()?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_context: orig_ctx()?,
            beta_fast: num(global, "beta_fast").unwrap_or(32.0),
            beta_slow: num(global, "beta_slow").unwrap_or(1.0),
        },
        other => {
            return Err(FormatError::unsupported(
                f.path,
                format!("rope_type '{other}'"),
            ))
        }
    };
    let partial = c
        .get("partial_rotary_factor")
        .and_then(Json::as_f64)
        .unwrap_or(1.0);
    Ok(RopeConfig {
        theta,
        theta_local,
        dim: ((head_dim as f64 * partial) as usize) & !1,
        // HF checkpoints are unpermuted: rotate-half for every family.
        style: RopeStyle::Neox,
        scaling,
    })
}
