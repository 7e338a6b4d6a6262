//! Checks that a model's tensors are the ones its config promises, with the
//! shapes it promises, so that no later stage indexes out of bounds on a
//! file that lies. Errors name the tensor and both shapes.

use crate::config::Arch;
use crate::error::{FormatError, Result};
use crate::model::Model;

pub(crate) fn check(m: &Model) -> Result<()> {
    let c = &m.config;
    let (h, v, f) = (
        c.hidden_size as u64,
        c.vocab_size as u64,
        c.intermediate_size as u64,
    );
    let (q, kv, hd) = (c.q_dim() as u64, c.kv_dim() as u64, c.head_dim as u64);
    let expect = |name: &str, want: &[u64], required: bool| -> Result<()> {
        match m.tensor(name) {
            None if required => Err(FormatError::missing(&m.path, format!("tensor '{name}'"))),
            None => Ok(()),
            Some(t) if t.logical_shape() == want => Ok(()),
            Some(t) => Err(FormatError::invalid(
                &m.path,
                format!(
                    "tensor '{name}' has shape {:?}, the config implies {want:?}",
                    t.logical_shape()
                ),
            )),
        }
    };
    expect("token_embd.weight", &[v, h], true)?;
    if !c.arch.is_encoder() {
        expect("output_norm.weight", &[h], true)?;
    }
    expect("output.weight", &[v, h], !c.tied_embeddings)?;
    if matches!(c.arch, Arch::Gpt2 | Arch::Bert) {
        let t = m.require("position_embd.weight")?;
        let s = t.logical_shape();
        if s.len() != 2 || s[1] != h || s[0] < c.context_length as u64 {
            return Err(FormatError::invalid(
                &m.path,
                format!(
                    "tensor 'position_embd.weight' has shape {s:?}, expected [≥{}, {h}]",
                    c.context_length
                ),
            ));
        }
    }
    for l in 0..c.n_layers {
        let b = |s: &str| format!("blk.{l}.{s}");
        match c.arch {
            Arch::Gpt2 => {
                expect(&b("attn_norm.weight"), &[h], true)?;
                expect(&b("attn_qkv.weight"), &[3 * h, h], true)?;
                expect(&b("attn_qkv.bias"), &[3 * h], false)?;
                expect(&b("attn_output.weight"), &[h, h], true)?;
                expect(&b("ffn_norm.weight"), &[h], true)?;
                expect(&b("ffn_up.weight"), &[f, h], true)?;
                expect(&b("ffn_down.weight"), &[h, f], true)?;
            }
            Arch::Bert => {
                for p in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                    expect(&b(&format!("{p}.weight")), &[h, h], true)?;
                }
                expect(&b("attn_output_norm.weight"), &[h], true)?;
                expect(&b("ffn_up.weight"), &[f, h], true)?;
                expect(&b("ffn_down.weight"), &[h, f], true)?;
                expect(&b("layer_output_norm.weight"), &[h], true)?;
            }
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => {
                expect(&b("attn_norm.weight"), &[h], true)?;
                expect(&b("attn_q.weight"), &[q, h], true)?;
                expect(&b("attn_k.weight"), &[kv, h], true)?;
                expect(&b("attn_v.weight"), &[kv, h], true)?;
                expect(&b("attn_q.bias"), &[q], false)?;
                expect(&b("attn_k.bias"), &[kv], false)?;
                expect(&b("attn_v.bias"), &[kv], false)?;
                expect(&b("attn_output.weight"), &[h, q], true)?;
                expect(&b("ffn_norm.weight"), &[h], true)?;
                expect(&b("ffn_gate.weight"), &[f, h], true)?;
                expect(&b("ffn_up.weight"), &[f, h], true)?;
                expect(&b("ffn_down.weight"), &[h, f], true)?;
                let qk_norm = matches!(c.arch, Arch::Qwen3 | Arch::Gemma3);
                expect(&b("attn_q_norm.weight"), &[hd], qk_norm)?;
                expect(&b("attn_k_norm.weight"), &[hd], qk_norm)?;
                if c.arch == Arch::Gemma3 {
                    expect(&b("post_attention_norm.weight"), &[h], true)?;
                    expect(&b("post_ffw_norm.weight"), &[h], true)?;
                }
            }
        }
    }
    Ok(())
}
