//! Canonical tensor names. kiln names every tensor the way GGUF does
//! (`token_embd.weight`, `blk.N.attn_q.weight` …); Hugging Face names are
//! mapped onto that canon per architecture here, and nowhere else.

use crate::config::Arch;

/// Per-layer HF suffix → canonical suffix, for the llama-family decoders.
const DECODER_LAYER: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// Gemma 3 has four norms per layer; llama-style models call their
/// pre-FFN norm `post_attention_layernorm`.
const GEMMA3_NORMS: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];
const LLAMA_NORMS: &[(&str, &str)] = &[("post_attention_layernorm", "ffn_norm")];

const GPT2_LAYER: &[(&str, &str)] = &[
    ("ln_1", "attn_norm"),
    ("attn.c_attn", "attn_qkv"),
    ("attn.c_proj", "attn_output"),
    ("ln_2", "ffn_norm"),
    ("mlp.c_fc", "ffn_up"),
    ("mlp.c_proj", "ffn_down"),
];

const BERT_LAYER: &[(&str, &str)] = &[
    ("attention.self.query", "attn_q"),
    ("attention.self.key", "attn_k"),
    ("attention.self.value", "attn_v"),
    ("attention.output.dense", "attn_output"),
    ("attention.output.LayerNorm", "attn_output_norm"),
    ("intermediate.dense", "ffn_up"),
    ("output.dense", "ffn_down"),
    ("output.LayerNorm", "layer_output_norm"),
];

/// Strips the wrappers multimodal and task-head checkpoints put around the
/// language model (`language_model.`, `model.language_model.`, `transformer.`, `bert.`).
fn strip_prefix(arch: Arch, name: &str) -> &str {
    let name = name.strip_prefix("language_model.").unwrap_or(name);
    match arch {
        Arch::Gpt2 => name.strip_prefix("transformer.").unwrap_or(name),
        Arch::Bert => name.strip_prefix("bert.").unwrap_or(name),
        _ => name,
    }
}

/// `weight`/`bias` (old BERT checkpoints say `gamma`/`beta`).
fn param_suffix(p: &str) -> Option<&'static str> {
    match p {
        "weight" | "gamma" => Some("weight"),
        "bias" | "beta" => Some("bias"),
        _ => None,
    }
}

/// Splits `prefix.N.rest` (layer index N) off a name.
fn layer_split<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (n, rest) = rest.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

/// Canonical name for an HF tensor name, or `None` for tensors kiln does not
/// use (vision towers, rotary caches, poolers …).
pub fn hf_to_canonical(arch: Arch, hf: &str) -> Option<String> {
    let name = strip_prefix(arch, hf);
    let (stem, param) = name.rsplit_once('.')?;
    let param = param_suffix(param)?;
    let global = |s: &str| Some(format!("{s}.{param}"));
    match arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => {
            let stem = stem
                .strip_prefix("model.language_model.")
                .map(|s| format!("model.{s}"))
                .unwrap_or_else(|| stem.to_string());
            match stem.as_str() {
                "model.embed_tokens" => return global("token_embd"),
                "model.norm" => return global("output_norm"),
                "lm_head" => return global("output"),
                _ => {}
            }
            let (n, rest) = layer_split(&stem, "model.layers.")?;
            let norms = if arch == Arch::Gemma3 {
                GEMMA3_NORMS
            } else {
                LLAMA_NORMS
            };
            let canon = DECODER_LAYER
                .iter()
                .chain(norms)
                .find(|(h, _)| *h == rest)?
                .1;
            Some(format!("blk.{n}.{canon}.{param}"))
        }
        Arch::Gpt2 => match stem {
            "wte" => global("token_embd"),
            "wpe" => global("position_embd"),
            "ln_f" => global("output_norm"),
            "lm_head" => global("output"),
            _ => {
                let (n, rest) = layer_split(stem, "h.")?;
                let canon = GPT2_LAYER.iter().find(|(h, _)| *h == rest)?.1;
                Some(format!("blk.{n}.{canon}.{param}"))
            }
        },
        Arch::Bert => match stem {
            "embeddings.word_embeddings" => global("token_embd"),
            "embeddings.position_embeddings" => global("position_embd"),
            "embeddings.token_type_embeddings" => global("token_types"),
            "embeddings.LayerNorm" => global("token_embd_norm"),
            _ => {
                let (n, rest) = layer_split(stem, "encoder.layer.")?;
                let canon = BERT_LAYER.iter().find(|(h, _)| *h == rest)?.1;
                Some(format!("blk.{n}.{canon}.{param}"))
            }
        },
    }
}

/// HF GPT-2 stores its linear layers as `Conv1D`, `[in, out]`: transposed
/// relative to every other checkpoint's `[out, in]`.
pub fn hf_is_transposed(arch: Arch, canonical: &str) -> bool {
    arch == Arch::Gpt2
        && canonical.ends_with(".weight")
        && ["attn_qkv", "attn_output", "ffn_up", "ffn_down"]
            .iter()
            .any(|k| canonical.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps() {
        let c = |a, n| hf_to_canonical(a, n);
        assert_eq!(
            c(Arch::Llama, "model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            c(Arch::Llama, "lm_head.weight").as_deref(),
            Some("output.weight")
        );
        assert_eq!(
            c(Arch::Qwen2, "model.layers.3.self_attn.k_proj.bias").as_deref(),
            Some("blk.3.attn_k.bias")
        );
        assert_eq!(
            c(
                Arch::Llama,
                "model.layers.0.post_attention_layernorm.weight"
            )
            .as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(
            c(
                Arch::Gemma3,
                "model.layers.0.post_attention_layernorm.weight"
            )
            .as_deref(),
            Some("blk.0.post_attention_norm.weight")
        );
        assert_eq!(
            c(
                Arch::Gemma3,
                "language_model.model.layers.2.pre_feedforward_layernorm.weight"
            )
            .as_deref(),
            Some("blk.2.ffn_norm.weight")
        );
        assert_eq!(
            c(
                Arch::Gemma3,
                "model.language_model.layers.2.mlp.up_proj.weight"
            )
            .as_deref(),
            Some("blk.2.ffn_up.weight")
        );
        assert_eq!(c(Arch::Gemma3, "vision_tower.encoder.x.weight"), None);
        assert_eq!(
            c(Arch::Gpt2, "transformer.h.1.attn.c_attn.bias").as_deref(),
            Some("blk.1.attn_qkv.bias")
        );
        assert_eq!(
            c(Arch::Gpt2, "h.0.mlp.c_fc.weight").as_deref(),
            Some("blk.0.ffn_up.weight")
        );
        assert_eq!(
            c(
                Arch::Bert,
                "encoder.layer.5.attention.output.LayerNorm.gamma"
            )
            .as_deref(),
            Some("blk.5.attn_output_norm.weight")
        );
        assert_eq!(c(Arch::Bert, "pooler.dense.weight"), None);
        assert!(hf_is_transposed(Arch::Gpt2, "blk.0.attn_qkv.weight"));
        assert!(!hf_is_transposed(Arch::Gpt2, "blk.0.attn_qkv.bias"));
        assert!(!hf_is_transposed(Arch::Llama, "blk.0.attn_q.weight"));
    }
}
