//! `kiln quantize IN OUT TYPE`: a GGUF file or HF folder in, a GGUF file out
//! (like llama-quantize).
//!
//! TYPE is either one ggml type for every 2-D weight (f32 … q6_k: what
//! `llama-quantize --pure` writes) or one of llama.cpp's K-quant mixes
//! (`q3_k_s`, `q3_k_m`, `q3_k_l`, `q4_k_s`, `q4_k_m`, `q5_k_s`, `q5_k_m`),
//! which pick a type per tensor as llama.cpp's `llama_tensor_get_type` does
//! for a dense model without importance matrix (see [`Mix`]).
//!
//! 1-D tensors (norms, biases, `rope_freqs`), `position_embd` and
//! `token_types` stay F32 (as llama-quantize leaves them). A weight whose rows
//! are not a whole number of its type's blocks falls back as llama.cpp's
//! `tensor_type_fallback` does (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
//! Q6_K -> Q8_0, then F16; said on stderr). GGUF input keeps its metadata
//! (tokenizer included); HF input gets llama.cpp-style metadata from its
//! `ModelConfig`, and for `llama` the Q/K row permutation and the Llama 3
//! `rope_freqs` tensor llama.cpp's converter writes.
//!
//! The output is streamed: one tensor is in memory at a time.

use std::path::{Path, PathBuf};

use kiln_format::dequant::{dequantize, dequantize_to_vec};
use kiln_format::gguf::Value;
use kiln_format::quantize::{
    is_supported, quantize_par, GgufStreamWriter, PlannedTensor, SUPPORTED,
};
use kiln_format::{Arch, Format, GgmlType, Model, ModelConfig, NormKind, RopeScaling, TensorType};

use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// Input: a GGUF file or a Hugging Face model folder.
    pub input: PathBuf,
    /// Output GGUF file.
    pub output: PathBuf,
    /// Target: one type for every 2-D weight (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
    /// q2_k, q3_k, q4_k, q5_k, q6_k) or a llama.cpp mix (q3_k_s, q3_k_m, q3_k_l, q4_k_s,
    /// q4_k_m, q5_k_s, q5_k_m).
    pub ty: String,
    /// Threads for quantization (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(a: Args) -> CliResult {
    let target = parse_target(&a.ty)?;
    let model = Model::open(&a.input)?;
    let threads = a.threads.unwrap_or_else(default_threads);
    let t0 = std::time::Instant::now();
    let conv = plan(&model, target)?;
    for n in &conv.notes {
        eprintln!("{n}");
    }
    conv.write(&a.output, threads)?;
    eprintln!(
        "wrote {} ({} {}, {} tensors, {:.1}s)",
        a.output.display(),
        model.config.arch.name(),
        target.name(),
        model.tensors().len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One of llama.cpp's K-quant mixes (`enum llama_ftype` `MOSTLY_Q*_K_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    Q3KS,
    Q3KM,
    Q3KL,
    Q4KS,
    Q4KM,
    Q5KS,
    Q5KM,
}

impl Mix {
    pub const ALL: [Mix; 7] = [
        Mix::Q3KS,
        Mix::Q3KM,
        Mix::Q3KL,
        Mix::Q4KS,
        Mix::Q4KM,
        Mix::Q5KS,
        Mix::Q5KM,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mix::Q3KS => "Q3_K_S",
            Mix::Q3KM => "Q3_K_M",
            Mix::Q3KL => "Q3_K_L",
            Mix::Q4KS => "Q4_K_S",
            Mix::Q4KM => "Q4_K_M",
            Mix::Q5KS => "Q5_K_S",
            Mix::Q5KM => "Q5_K_M",
        }
    }

    /// `general.file_type` (`enum llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Mix::Q3KS => 11,
            Mix::Q3KM => 12,
            Mix::Q3KL => 13,
            Mix::Q4KS => 14,
            Mix::Q4KM => 15,
            Mix::Q5KS => 16,
            Mix::Q5KM => 17,
        }
    }

    /// The type of every tensor no rule picks otherwise.
    pub fn default_type(self) -> GgmlType {
        match self {
            Mix::Q3KS | Mix::Q3KM | Mix::Q3KL => GgmlType::Q3K,
            Mix::Q4KS | Mix::Q4KM => GgmlType::Q4K,
            Mix::Q5KS | Mix::Q5KM => GgmlType::Q5K,
        }
    }
}

/// What `kiln quantize` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One type for every 2-D weight (`llama-quantize --pure`).
    Pure(GgmlType),
    /// A llama.cpp mix.
    Mix(Mix),
}

impl Target {
    /// Upper-case name (`Q8_0`, `Q4_K_M`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Pure(t) => t.name(),
            Target::Mix(m) => m.name(),
        }
    }

    pub fn file_type(self) -> u32 {
        match self {
            Target::Pure(t) => file_type(t),
            Target::Mix(m) => m.file_type(),
        }
    }
}

pub fn parse_target(s: &str) -> Result<Target, String> {
    let up = s.to_ascii_uppercase();
    if let Some(m) = Mix::ALL.iter().find(|m| m.name() == up) {
        return Ok(Target::Mix(*m));
    }
    GgmlType::from_name(&up)
        .filter(|t| is_supported(*t))
        .map(Target::Pure)
        .ok_or_else(|| {
            let names: Vec<String> = SUPPORTED
                .iter()
                .map(|t| t.name())
                .chain(Mix::ALL.iter().map(|m| m.name()))
                .map(|n| n.to_ascii_lowercase())
                .collect();
            format!(
                "unknown or unsupported type '{s}' (supported: {})",
                names.join(", ")
            )
        })
}

/// llama.cpp's `general.file_type` (`enum llama_ftype`) for a target type.
pub fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q2K => 10,
        // llama.cpp has no "all Q3_K/Q4_K/Q5_K" ftype; the _S variants are
        // the closest (mostly that type).
        GgmlType::Q3K => 11,
        GgmlType::Q4K => 14,
        GgmlType::Q5K => 16,
        GgmlType::Q6K => 18,
        GgmlType::BF16 => 32,
        _ => 0,
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and
/// every third one between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// llama.cpp's tensor order in llama-quantize (`weight_name_comparer`):
/// by layer number (non-layer tensors first), then by name.
fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |s: &str| -> i64 {
        s.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(-1)
    };
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

fn is_attn_v_like(name: &str) -> bool {
    ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
        .iter()
        .any(|s| name.contains(s))
}

/// What llama.cpp's `quantize_state_impl` counts: the position of each
/// attn_v-like and ffn_down tensor in llama-quantize's tensor order (its
/// `i_attention_wv` / `i_ffn_down` when it reaches that tensor), so the
/// result does not depend on the order of the input file.
struct MixState {
    attn_v: Vec<String>,
    ffn_down: Vec<String>,
    n_layers: usize,
    has_output: bool,
}

impl MixState {
    fn new(model: &Model) -> Self {
        let quantizable = |t: &&kiln_format::ModelTensor| {
            t.logical_shape().len() >= 2 && t.name.ends_with("weight")
        };
        let mut attn_v: Vec<String> = model
            .tensors()
            .iter()
            .filter(quantizable)
            .filter(|t| is_attn_v_like(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let mut ffn_down: Vec<String> = model
            .tensors()
            .iter()
            .filter(quantizable)
            .filter(|t| t.name.contains("ffn_down"))
            .map(|t| t.name.clone())
            .collect();
        attn_v.sort_by(|a, b| llama_order(a, b));
        ffn_down.sort_by(|a, b| llama_order(a, b));
        MixState {
            attn_v,
            ffn_down,
            n_layers: model.config.n_layers,
            has_output: model.tensors().iter().any(|t| t.name == "output.weight"),
        }
    }
}

/// llama.cpp's `llama_tensor_get_type_impl` for the K-quant mixes, as it
/// runs for a dense (non-MoE) model without importance matrix or overrides.
/// Left out: the Falcon, 70B-model (`attn_v` Q3_K/Q4_K -> Q5_K) and
/// 8-expert branches, and the IQ/Q2_K mixes (kiln makes none of those).
fn mix_type(m: Mix, st: &MixState, name: &str, ncols: u64) -> GgmlType {
    let mut ty = m.default_type();
    let is_output = name == "output.weight";
    let is_embd = name == "token_embd.weight" || name == "per_layer_token_embd.weight";
    let rank = |v: &[String]| v.iter().position(|n| n == name).unwrap_or(0);
    if is_output || (!st.has_output && is_embd) {
        // Output (and tied embeddings): Q6_K, or Q8_0 where rows do not fit.
        ty = if !ncols.is_multiple_of(ty.block_size() as u64) {
            GgmlType::Q8_0
        } else {
            GgmlType::Q6K
        };
    } else if is_embd {
        // Untied token embeddings keep the default type.
    } else if is_attn_v_like(name) {
        let (i, n) = (rank(&st.attn_v), st.attn_v.len());
        match m {
            Mix::Q3KM => ty = if i < 2 { GgmlType::Q5K } else { GgmlType::Q4K },
            Mix::Q3KL => ty = GgmlType::Q5K,
            Mix::Q4KM | Mix::Q5KM if use_more_bits(i, n) => ty = GgmlType::Q6K,
            Mix::Q4KS if i < 4 => ty = GgmlType::Q5K,
            _ => {}
        }
    } else if name.contains("attn_k.weight") || name.contains("attn_q.weight") {
        // (rules for IQ3 mixes and 8-expert models only)
    } else if name.contains("ffn_down") {
        let (i, n) = (rank(&st.ffn_down), st.n_layers);
        match m {
            Mix::Q3KM => {
                ty = if i < n / 16 {
                    GgmlType::Q5K
                } else {
                    GgmlType::Q4K
                }
            }
            Mix::Q3KL => ty = GgmlType::Q5K,
            Mix::Q4KM | Mix::Q5KM if use_more_bits(i, n) => ty = GgmlType::Q6K,
            Mix::Q4KS if i < n / 8 => ty = GgmlType::Q5K,
            _ => {}
        }
    } else if name.contains("attn_output.weight") {
        match m {
            Mix::Q3KM => ty = GgmlType::Q4K,
            Mix::Q3KL => ty = GgmlType::Q5K,
            _ => {}
        }
    }
    ty
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks fit rows of
/// `ncols` values.
fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    if ncols.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let f = match ty {
        GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    };
    if ncols.is_multiple_of(f.block_size() as u64) {
        f
    } else {
        GgmlType::F16
    }
}

/// Metadata in insertion order; setting a key again replaces its value.
#[derive(Default)]
pub struct Meta(pub Vec<(String, Value)>);

impl Meta {
    pub fn set(&mut self, k: impl Into<String>, v: Value) {
        let k = k.into();
        match self.0.iter_mut().find(|(key, _)| *key == k) {
            Some(slot) => slot.1 = v,
            None => self.0.push((k, v)),
        }
    }
}

enum Src {
    Values(Vec<f32>),
    Tensor(usize),
}

struct Item {
    plan: PlannedTensor,
    src: Src,
    /// Q/K rows to permute (number of heads), llama from HF only.
    permute_heads: Option<usize>,
    /// Added to every value (Gemma norms from HF).
    add: f32,
}

/// What [`plan`] decided: metadata, every output tensor, notes for the user.
pub struct Conversion<'a> {
    model: &'a Model,
    pub meta: Meta,
    items: Vec<Item>,
    pub notes: Vec<String>,
}

/// Plans the conversion of `model` to `target` (no tensor data is touched).
pub fn plan(model: &Model, target: Target) -> Result<Conversion<'_>, Box<dyn std::error::Error>> {
    let mut meta = Meta::default();
    let mut notes = Vec::new();
    let cfg = &model.config;
    match (&model.format, &model.gguf) {
        (Format::Gguf, Some(g)) => {
            for (k, v) in g.metadata() {
                if k != "general.file_type" && k != "general.quantization_version" {
                    meta.set(k.clone(), v.clone());
                }
            }
        }
        _ => hf_metadata(&mut meta, cfg),
    }
    meta.set("general.quantization_version", Value::U32(2));
    meta.set("general.file_type", Value::U32(target.file_type()));
    let mix = MixState::new(model);

    let from_hf = model.format != Format::Gguf;
    let mut items = Vec::new();
    if from_hf && cfg.arch == Arch::Llama {
        if let Some(f) = llama3_rope_freqs(cfg) {
            items.push(Item {
                plan: PlannedTensor {
                    name: "rope_freqs.weight".into(),
                    ty: GgmlType::F32,
                    ne: vec![f.len() as u64],
                },
                src: Src::Values(f),
                permute_heads: None,
                add: 0.0,
            });
        }
    }
    for (i, t) in model.tensors().iter().enumerate() {
        let TensorType::Ggml(_) = t.ty else {
            return Err(format!("{}: tensor type {} cannot be converted", t.name, t.ty).into());
        };
        let shape = t.logical_shape();
        let mut permute_heads = None;
        if from_hf && cfg.arch == Arch::Llama && shape.len() == 2 {
            if t.name.ends_with("attn_q.weight") {
                permute_heads = Some(cfg.n_heads);
            } else if t.name.ends_with("attn_k.weight") {
                permute_heads = Some(cfg.n_kv_heads);
            }
        }
        // llama.cpp's converter stores Gemma's `(1 + w)` norms with the 1 added.
        let add = if from_hf && t.name.ends_with("norm.weight") {
            cfg.norm_weight_offset
        } else {
            0.0
        };
        let ne: Vec<u64> = shape.iter().rev().copied().collect();
        // llama-quantize keeps learned positions and token types as they are.
        let keep = t.name.starts_with("position_embd.") || t.name.starts_with("token_types.");
        let out_ty = if shape.len() >= 2 && !keep {
            let want = match target {
                Target::Pure(ty) => ty,
                Target::Mix(m) => mix_type(m, &mix, &t.name, ne[0]),
            };
            let got = fallback(want, ne[0]);
            if got != want {
                notes.push(format!(
                    "{}: row length {} is not a multiple of the {want} block size ({}); written as {got}",
                    t.name,
                    ne[0],
                    want.block_size()
                ));
            }
            got
        } else {
            GgmlType::F32
        };
        items.push(Item {
            plan: PlannedTensor {
                name: t.name.clone(),
                ty: out_ty,
                ne,
            },
            src: Src::Tensor(i),
            permute_heads,
            add,
        });
    }
    Ok(Conversion {
        model,
        meta,
        items,
        notes,
    })
}

impl Conversion<'_> {
    /// The f32 values of item `i`, in output layout.
    fn values(&self, i: usize, threads: usize) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        let it = &self.items[i];
        let t = match &it.src {
            Src::Values(v) => return Ok(v.clone()),
            Src::Tensor(k) => &self.model.tensors()[*k],
        };
        let TensorType::Ggml(src_ty) = t.ty else {
            unreachable!("checked by plan")
        };
        let mut x = t.to_logical(
            dequantize_par(src_ty, self.model.data(t), threads)
                .map_err(|e| format!("{}: {e}", t.name))?,
        );
        if let Some(h) = it.permute_heads {
            x = permute_qk(&x, h, it.plan.ne[0] as usize);
        }
        if it.add != 0.0 {
            x.iter_mut().for_each(|v| *v += it.add);
        }
        Ok(x)
    }

    /// Writes the GGUF, one tensor in memory at a time.
    pub fn write(&self, path: &Path, threads: usize) -> Result<(), Box<dyn std::error::Error>> {
        let plan = self.items.iter().map(|i| i.plan.clone()).collect();
        let mut w = GgufStreamWriter::create(path, &self.meta.0, plan)?;
        for (i, it) in self.items.iter().enumerate() {
            let x = self.values(i, threads)?;
            let data = quantize_par(it.plan.ty, &x, threads)
                .map_err(|e| format!("{}: {e}", it.plan.name))?;
            drop(x);
            w.write_tensor(&data)?;
        }
        w.finish()?;
        Ok(())
    }
}

/// [`dequantize_to_vec`] over `threads` threads in whole-block chunks.
fn dequantize_par(
    ty: GgmlType,
    data: &[u8],
    threads: usize,
) -> Result<Vec<f32>, kiln_format::dequant::DequantError> {
    let ts = ty.type_size();
    let n_blocks = data.len() / ts;
    if threads <= 1 || n_blocks < 4096 || !data.len().is_multiple_of(ts) {
        return dequantize_to_vec(ty, data);
    }
    let mut out = vec![0.0f32; n_blocks * ty.block_size()];
    let per = n_blocks.div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = data
            .chunks(per * ts)
            .zip(out.chunks_mut(per * ty.block_size()))
            .map(|(d, o)| s.spawn(move || dequantize(ty, d, o)))
            .collect();
        // A worker only fails by returning an error; a panic there is a bug,
        // reported as the length error it would have been caught as.
        hs.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or(Err(kiln_format::dequant::DequantError::Length {
                    ty,
                    bytes: data.len(),
                    elements: n_blocks * ty.block_size(),
                }))
        })
    })?;
    Ok(out)
}

/// llama.cpp's `LlamaModel.permute`: within each head, rows
/// `[2, half]` become `[half, 2]` (HF rotate-half order to interleaved pairs).
pub fn permute_qk(x: &[f32], n_heads: usize, cols: usize) -> Vec<f32> {
    let rows = x.len() / cols;
    let hd = rows / n_heads;
    let half = hd / 2;
    let mut out = vec![0.0f32; x.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let dst = h * hd + i * 2 + j;
                let src = h * hd + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&x[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The Llama 3 rope factors as convert_hf_to_gguf.py computes them.
fn llama3_rope_freqs(cfg: &ModelConfig) -> Option<Vec<f32>> {
    let rope = cfg.rope.as_ref()?;
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_context,
    } = rope.scaling
    else {
        return None;
    };
    let dim = rope.dim;
    let old = original_context as f64;
    let low_wl = old / low_freq_factor;
    let high_wl = old / high_freq_factor;
    Some(
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0f32 / (rope.theta as f32).powf((2 * i) as f32 / dim as f32);
                let wl = 2.0 * std::f64::consts::PI / freq as f64;
                if wl < high_wl {
                    1.0
                } else if wl > low_wl {
                    factor as f32
                } else {
                    let smooth =
                        (old / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect(),
    )
}

/// llama.cpp-style metadata for a model that came from an HF folder.
pub fn hf_metadata(w: &mut Meta, cfg: &ModelConfig) {
    let a = cfg.arch.name();
    let k = |s: &str| format!("{a}.{s}");
    w.set("general.architecture", Value::String(a.into()));
    w.set("general.type", Value::String("model".into()));
    w.set(k("block_count"), Value::U32(cfg.n_layers as u32));
    w.set(k("context_length"), Value::U32(cfg.context_length as u32));
    w.set(k("embedding_length"), Value::U32(cfg.hidden_size as u32));
    w.set(
        k("feed_forward_length"),
        Value::U32(cfg.intermediate_size as u32),
    );
    w.set(k("attention.head_count"), Value::U32(cfg.n_heads as u32));
    w.set(
        k("attention.head_count_kv"),
        Value::U32(cfg.n_kv_heads as u32),
    );
    let eps_key = match cfg.norm {
        NormKind::Rms => "attention.layer_norm_rms_epsilon",
        NormKind::Layer => "attention.layer_norm_epsilon",
    };
    w.set(k(eps_key), Value::F32(cfg.norm_eps as f32));
    w.set(k("attention.key_length"), Value::U32(cfg.head_dim as u32));
    w.set(k("attention.value_length"), Value::U32(cfg.head_dim as u32));
    w.set(k("vocab_size"), Value::U32(cfg.vocab_size as u32));
    if let Some(r) = &cfg.rope {
        w.set(k("rope.freq_base"), Value::F32(r.theta as f32));
        w.set(k("rope.dimension_count"), Value::U32(r.dim as u32));
        match r.scaling {
            RopeScaling::Linear { factor } => {
                w.set(k("rope.scaling.type"), Value::String("linear".into()));
                w.set(k("rope.scaling.factor"), Value::F32(factor as f32));
            }
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
            } => {
                w.set(k("rope.scaling.type"), Value::String("yarn".into()));
                w.set(k("rope.scaling.factor"), Value::F32(factor as f32));
                w.set(
                    k("rope.scaling.original_context_length"),
                    Value::U32(original_context as u32),
                );
                w.set(
                    k("rope.scaling.yarn_beta_fast"),
                    Value::F32(beta_fast as f32),
                );
                w.set(
                    k("rope.scaling.yarn_beta_slow"),
                    Value::F32(beta_slow as f32),
                );
            }
            _ => {}
        }
        if let Some(t) = r.theta_local {
            w.set(k("rope.freq_base_swa"), Value::F32(t as f32));
        }
    }
    if let Some(sw) = cfg.sliding_window {
        w.set(k("attention.sliding_window"), Value::U32(sw as u32));
        if cfg.arch == Arch::Gemma3 {
            // An every-p-th-layer-is-global pattern as llama.cpp's integer
            // key, anything else as one bool per layer.
            let ls = &cfg.layer_sliding;
            let p = ls.iter().position(|s| !s).map_or(0, |i| i + 1);
            let regular = p > 0 && ls.iter().enumerate().all(|(i, &s)| s == ((i + 1) % p != 0));
            let v = if regular {
                Value::U32(p as u32)
            } else {
                Value::Array(kiln_format::gguf::Array::Bool(ls.clone()))
            };
            w.set(k("attention.sliding_window_pattern"), v);
        }
    }
    if let Some(c) = cfg.attn_logit_softcap {
        w.set(k("attn_logit_softcapping"), Value::F32(c as f32));
    }
    if let Some(c) = cfg.final_logit_softcap {
        w.set(k("final_logit_softcapping"), Value::F32(c as f32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(p: &str) -> PathBuf {
        fixture_of("llama", p)
    }

    fn fixture_of(arch: &str, p: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/fixtures/tiny")
            .join(arch)
            .join(p)
    }

    /// Converts `input` to Q8_0 and checks it against llama.cpp's own
    /// `llama-q8_0.gguf`: same tensors, types and bytes (`rope_freqs`
    /// within f32 rounding), same config, tokenizer metadata when given.
    fn check_against_llamacpp_q8_0(input: &Path, tag: &str) {
        check_against(input, &fixture("gguf/llama-q8_0.gguf"), tag)
    }

    fn check_against(input: &Path, reference: &Path, tag: &str) {
        check_type_against(input, GgmlType::Q8_0, reference, tag)
    }

    fn check_type_against(input: &Path, ty: GgmlType, reference: &Path, tag: &str) {
        let model = Model::open(input).unwrap();
        let conv = plan(&model, Target::Pure(ty)).unwrap();
        assert!(conv.notes.is_empty(), "{:?}", conv.notes);
        let dir = std::env::temp_dir().join(format!("kiln-quant-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join(format!("{ty}.gguf"));
        conv.write(&out, 2).unwrap();
        let got = Model::open(&out).unwrap();
        let want = Model::open(reference).unwrap();
        assert_eq!(got.config, want.config, "{tag}: config");
        assert_eq!(got.tensors().len(), want.tensors().len(), "{tag}");
        for t in want.tensors() {
            let g = got
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{tag}: {} missing", t.name));
            assert_eq!((g.ty, &g.shape), (t.ty, &t.shape), "{tag}: {}", t.name);
            if t.name == "rope_freqs.weight" {
                let a = dequantize_to_vec(GgmlType::F32, got.data(g)).unwrap();
                let b = dequantize_to_vec(GgmlType::F32, want.data(t)).unwrap();
                for (x, y) in a.iter().zip(&b) {
                    assert!(
                        (x - y).abs() <= 1e-5 * y.abs(),
                        "{tag}: rope_freqs {a:?} vs {b:?}"
                    );
                }
            } else {
                assert!(
                    got.data(g) == want.data(t),
                    "{tag}: {} bytes differ",
                    t.name
                );
            }
        }
        let gg = got.gguf.as_ref().unwrap();
        assert_eq!(
            gg.get_str("general.architecture"),
            Some(want.config.arch.name())
        );
        assert_eq!(
            gg.get("general.file_type").and_then(|v| v.as_int()),
            Some(file_type(ty) as i128)
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn gguf_f32_to_q8_0_equals_llamacpp() {
        check_against_llamacpp_q8_0(&fixture("gguf/llama-f32.gguf"), "gguf");
        // GGUF input keeps the tokenizer.
        let model = Model::open(fixture("gguf/llama-f32.gguf")).unwrap();
        let conv = plan(&model, Target::Pure(GgmlType::Q4_0)).unwrap();
        assert!(conv
            .meta
            .0
            .iter()
            .any(|(k, _)| k == "tokenizer.ggml.tokens"));
    }

    #[test]
    fn hf_to_q8_0_equals_llamacpp() {
        check_against_llamacpp_q8_0(&fixture("hf"), "hf");
    }

    /// The other tiny fixtures: GGUF f32 and HF folder in, Q8_0 out, equal
    /// to llama.cpp's Q8_0 file.
    #[test]
    fn other_architectures_equal_llamacpp_q8_0() {
        for arch in ["qwen2", "qwen3", "gemma3", "gpt2"] {
            let reference = fixture_of(arch, &format!("gguf/{arch}-q8_0.gguf"));
            let f32_in = fixture_of(arch, &format!("gguf/{arch}-f32.gguf"));
            check_against(&f32_in, &reference, &format!("{arch}-gguf"));
            check_against(&fixture_of(arch, "hf"), &reference, &format!("{arch}-hf"));
        }
    }

    /// llama.cpp's Q4_0/Q4_1/Q5_0 files of the llama fixture, from the f32
    /// GGUF and from the HF folder.
    #[test]
    fn llama_q4_0_q4_1_q5_0_equal_llamacpp() {
        for (name, ty) in [
            ("q4_0", GgmlType::Q4_0),
            ("q4_1", GgmlType::Q4_1),
            ("q5_0", GgmlType::Q5_0),
        ] {
            let reference = fixture(&format!("gguf/llama-{name}.gguf"));
            let f32_in = fixture("gguf/llama-f32.gguf");
            check_type_against(&f32_in, ty, &reference, &format!("{name}-gguf"));
            check_type_against(&fixture("hf"), ty, &reference, &format!("{name}-hf"));
        }
    }

    /// Q6_K has no gguf-py reference: re-quantizing llama.cpp's Q6_K file
    /// must give back exactly the values it decodes to.
    #[test]
    fn q6_k_requantizes_llamacpp_values_exactly() {
        let input = fixture_of("llama_kq", "gguf/llama_kq-q6_k.gguf");
        let model = Model::open(&input).unwrap();
        let dir = std::env::temp_dir().join(format!("kiln-quant-q6k-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("q6_k.gguf");
        plan(&model, Target::Pure(GgmlType::Q6K))
            .unwrap()
            .write(&out, 2)
            .unwrap();
        let got = Model::open(&out).unwrap();
        assert_eq!(got.config, model.config);
        let mut n = 0;
        for t in model.tensors() {
            if t.ty != TensorType::Ggml(GgmlType::Q6K) {
                continue;
            }
            let g = got.require(&t.name).unwrap();
            assert_eq!(g.ty, t.ty, "{}", t.name);
            let a = dequantize_to_vec(GgmlType::Q6K, model.data(t)).unwrap();
            let b = dequantize_to_vec(GgmlType::Q6K, got.data(g)).unwrap();
            assert!(a == b, "{}: values differ", t.name);
            n += 1;
        }
        assert!(n >= 10, "only {n} Q6_K tensors");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn permute_qk_matches_llamacpp_layout() {
        // 1 head of dim 4, 1 column: rows [0,1,2,3] -> [0,2,1,3].
        assert_eq!(permute_qk(&[0., 1., 2., 3.], 1, 1), vec![0., 2., 1., 3.]);
    }

    #[test]
    fn parse_type_names() {
        assert_eq!(parse_target("Q8_0"), Ok(Target::Pure(GgmlType::Q8_0)));
        assert_eq!(parse_target("q4_k"), Ok(Target::Pure(GgmlType::Q4K)));
        assert_eq!(parse_target("q4_k_m"), Ok(Target::Mix(Mix::Q4KM)));
        assert!(parse_target("iq4_xs").is_err());
        assert!(parse_target("q2_k_s").is_err());
    }
}
