//! `ArchDescriptor`: the differences between architectures as data.
//!
//! Built once at load from the [`ModelConfig`] and the tensors present in the
//! model; the forward pass reads its fields and never an architecture name.
//! Adding an architecture means teaching the loader its names and config
//! keys — no new forward pass.

use kiln_format::{Activation, Model, ModelConfig, NormKind, RopeConfig};

use crate::error::{EngineError, Result};

/// Per-layer attention settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerDesc {
    /// Keys visible to a query: the `window` most recent positions including
    /// its own (`None`: all earlier positions).
    pub window: Option<usize>,
    /// Which RoPE table the layer uses (index into the backend's tables:
    /// 0 = global, 1 = local / sliding).
    pub rope_table: usize,
}

#[derive(Debug, Clone)]
pub struct ArchDescriptor {
    /// For messages and stats only; never branched on.
    pub name: &'static str,
    pub vocab_size: usize,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub context_length: usize,

    pub norm: NormKind,
    pub norm_eps: f32,
    /// Added to every stored norm weight at load (Gemma HF `(1 + w)`).
    pub norm_weight_offset: f32,
    pub activation: Activation,
    /// `down(act(gate(x)) * up(x))` when true, `down(act(up(x)))` otherwise.
    pub gated_ffn: bool,
    /// One `attn_qkv` projection instead of three.
    pub fused_qkv: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norm of the attention output before the residual add (Gemma 3).
    pub post_attn_norm: bool,
    /// Norm of the FFN output before the residual add (Gemma 3).
    pub post_ffn_norm: bool,
    /// Embedding rows are multiplied by this (Gemma: sqrt(hidden)).
    pub embedding_scale: f32,
    /// Learned absolute positions (`position_embd`) are added to the embeddings.
    pub learned_positions: bool,
    /// Queries see only earlier positions (false: encoder).
    pub causal: bool,
    /// Attention scores are multiplied by this.
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// The output projection is `token_embd`.
    pub tied_embeddings: bool,
    /// Global RoPE settings (`None`: learned positions).
    pub rope: Option<RopeConfig>,
    pub layers: Vec<LayerDesc>,
}

impl ArchDescriptor {
    /// From the model's config and the tensors of its first block.
    pub fn from_model(m: &Model) -> Result<Self> {
        let c: &ModelConfig = &m.config;
        if c.arch.is_encoder() {
            return Err(EngineError::Unsupported(format!(
                "{} is an encoder (embeddings); the decoder engine runs causal language models",
                c.arch.name()
            )));
        }
        let has = |n: &str| m.tensor(&format!("blk.0.{n}.weight")).is_some();
        let fused_qkv = has("attn_qkv");
        let separate_qkv = has("attn_q") && has("attn_k") && has("attn_v");
        if !(fused_qkv || separate_qkv) {
            return Err(m.require("blk.0.attn_q.weight").err().map_or_else(
                || EngineError::Unsupported("attention projections".into()),
                EngineError::from,
            ));
        }
        let layers = (0..c.n_layers)
            .map(|i| {
                let sliding = c.layer_sliding.get(i).copied().unwrap_or(false);
                let window = if sliding { c.sliding_window } else { None };
                let local =
                    window.is_some() && c.rope.as_ref().is_some_and(|r| r.theta_local.is_some());
                LayerDesc {
                    window,
                    rope_table: usize::from(local),
                }
            })
            .collect();
        Ok(ArchDescriptor {
            name: c.arch.name(),
            vocab_size: c.vocab_size,
            hidden: c.hidden_size,
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate_size,
            context_length: c.context_length,
            norm: c.norm,
            norm_eps: c.norm_eps as f32,
            norm_weight_offset: c.norm_weight_offset,
            activation: c.activation,
            gated_ffn: has("ffn_gate"),
            fused_qkv,
            qk_norm: has("attn_q_norm") && has("attn_k_norm"),
            post_attn_norm: has("post_attention_norm"),
            post_ffn_norm: has("post_ffw_norm"),
            embedding_scale: c.embedding_scale,
            learned_positions: m.tensor("position_embd.weight").is_some(),
            causal: !c.arch.is_encoder(),
            attn_scale: c.attn_scale as f32,
            attn_softcap: c.attn_logit_softcap.map(|v| v as f32),
            final_softcap: c.final_logit_softcap.map(|v| v as f32),
            tied_embeddings: m.tensor("output.weight").is_none(),
            rope: c.rope.clone(),
            layers,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Largest window of any sliding layer.
    pub fn max_window(&self) -> Option<usize> {
        self.layers.iter().filter_map(|l| l.window).max()
    }
}

#[cfg(test)]
impl ArchDescriptor {
    /// A tiny llama-like descriptor for unit tests: one layer per entry of
    /// `windows` (its sliding window), no RoPE.
    pub(crate) fn test_tiny(windows: &[Option<usize>], context_length: usize) -> ArchDescriptor {
        ArchDescriptor {
            name: "test",
            vocab_size: 10,
            hidden: 8,
            n_layers: windows.len(),
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            intermediate: 16,
            context_length,
            norm: kiln_format::NormKind::Rms,
            norm_eps: 1e-6,
            norm_weight_offset: 0.0,
            activation: kiln_format::Activation::Silu,
            gated_ffn: true,
            fused_qkv: false,
            qk_norm: false,
            post_attn_norm: false,
            post_ffn_norm: false,
            embedding_scale: 1.0,
            learned_positions: false,
            causal: true,
            attn_scale: 0.5,
            attn_softcap: None,
            final_softcap: None,
            tied_embeddings: true,
            rope: None,
            layers: windows
                .iter()
                .map(|&window| LayerDesc {
                    window,
                    rope_table: 0,
                })
                .collect(),
        }
    }
}
