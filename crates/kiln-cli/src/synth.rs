//! `kiln synth SHAPE OUT_DIR`: a random-weight model of a named shape, as an
//! HF folder (`config.json`, bf16 `model.safetensors` — sharded with an index
//! past 4 GiB — and a byte-level `tokenizer.json`) and as GGUF files in the
//! requested types (made from that folder by `kiln quantize`'s converter).
//!
//! Weights are seeded per tensor (the same seed and shape give the same
//! bytes) and streamed to disk chunk by chunk over all cores; the GGUFs are
//! streamed too (one tensor in memory at a time). Measured on a 16-core
//! machine (release build): `kiln synth Llama-3.1-8B DIR --types q8_0,q4_0`
//! took 60 s wall (HF folder, 4 shards of 16 GB in all: 22 s; Q8_0: 24 s;
//! Q4_0: 14 s), peak RSS 18 GB (mostly the mapped shards).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use kiln_format::quantize::f32_to_bf16_bits;
use kiln_format::Model;
use serde_json::json;

use crate::quantize::{default_threads, parse_target, plan};
use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// Shape: tiny (llama), tiny-qwen3, tiny-gemma3, Llama-3.2-1B, Llama-3.1-8B, Qwen3-0.6B, Qwen3-14B, SmolLM2-135M, SmolLM2-360M, Gemma-3-1B.
    pub shape: String,
    /// Output folder: `hf/` and `model-<type>.gguf` are written inside.
    pub out_dir: PathBuf,
    /// GGUF types to write (comma-separated; empty for none): any `kiln quantize`
    /// target, e.g. f16, q8_0, q4_0, q4_k, q6_k, q4_k_m.
    #[arg(long, default_value = "f16,q8_0,q4_0")]
    pub types: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Clone, Copy)]
enum Kind {
    Llama,
    Qwen3,
    Gemma3,
}

struct Shape {
    kind: Kind,
    vocab: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    tied: bool,
    max_pos: usize,
    /// Llama 3 rope scaling factor (None: no scaling).
    llama3_factor: Option<f64>,
    theta: f64,
    eps: f64,
}

fn shape(name: &str) -> Option<Shape> {
    let s = |kind, vocab, hidden, layers, heads, kv_heads, head_dim, ffn, tied| Shape {
        kind,
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        ffn,
        tied,
        max_pos: 131072,
        llama3_factor: None,
        theta: 500000.0,
        eps: 1e-5,
    };
    Some(match name.to_ascii_lowercase().as_str() {
        "tiny" => Shape {
            max_pos: 256,
            ..s(Kind::Llama, 512, 64, 2, 4, 2, 16, 128, false)
        },
        "tiny-qwen3" => Shape {
            max_pos: 256,
            theta: 1e6,
            eps: 1e-6,
            ..s(Kind::Qwen3, 512, 64, 2, 4, 2, 32, 128, true)
        },
        "tiny-gemma3" => Shape {
            max_pos: 256,
            theta: 1e6,
            eps: 1e-6,
            ..s(Kind::Gemma3, 512, 64, 7, 2, 1, 32, 128, true)
        },
        "llama-3.2-1b" => Shape {
            llama3_factor: Some(32.0),
            ..s(Kind::Llama, 128256, 2048, 16, 32, 8, 64, 8192, true)
        },
        "llama-3.1-8b" => Shape {
            llama3_factor: Some(8.0),
            ..s(Kind::Llama, 128256, 4096, 32, 32, 8, 128, 14336, false)
        },
        "qwen3-0.6b" => Shape {
            max_pos: 40960,
            theta: 1e6,
            eps: 1e-6,
            ..s(Kind::Qwen3, 151936, 1024, 28, 16, 8, 128, 3072, true)
        },
        // Groups of 5 query heads a KV head: two grouped attention blocks
        // a group.
        "qwen3-14b" => Shape {
            max_pos: 40960,
            theta: 1e6,
            eps: 1e-6,
            ..s(Kind::Qwen3, 151936, 5120, 40, 40, 8, 128, 17408, false)
        },
        // Rows of 576 / 960 values: not whole runs of 8 quantized blocks.
        "smollm2-135m" => Shape {
            max_pos: 8192,
            theta: 100000.0,
            ..s(Kind::Llama, 49152, 576, 30, 9, 3, 64, 1536, true)
        },
        "smollm2-360m" => Shape {
            max_pos: 8192,
            theta: 100000.0,
            ..s(Kind::Llama, 49152, 960, 32, 15, 5, 64, 2560, true)
        },
        "gemma-3-1b" => Shape {
            max_pos: 32768,
            theta: 1e6,
            eps: 1e-6,
            ..s(Kind::Gemma3, 262144, 1152, 26, 4, 1, 256, 6912, true)
        },
        _ => return None,
    })
}

fn config_json(s: &Shape) -> serde_json::Value {
    let c = json!({
        "hidden_size": s.hidden,
        "intermediate_size": s.ffn,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "vocab_size": s.vocab,
        "max_position_embeddings": s.max_pos,
        "rms_norm_eps": s.eps,
        "rope_theta": s.theta,
        "tie_word_embeddings": s.tied,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": true,
    });
    // `json!({..})` is always an object; the arms add the family's keys.
    let serde_json::Value::Object(mut o) = c else {
        return c;
    };
    match s.kind {
        Kind::Llama => {
            o.insert("architectures".into(), json!(["LlamaForCausalLM"]));
            o.insert("model_type".into(), json!("llama"));
            o.insert("hidden_act".into(), json!("silu"));
            o.insert("mlp_bias".into(), json!(false));
            o.insert("pretraining_tp".into(), json!(1));
            if let Some(f) = s.llama3_factor {
                o.insert(
                    "rope_scaling".into(),
                    json!({"factor": f, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
                );
            }
        }
        Kind::Qwen3 => {
            o.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
            o.insert("model_type".into(), json!("qwen3"));
            o.insert("hidden_act".into(), json!("silu"));
            o.insert("use_sliding_window".into(), json!(false));
        }
        Kind::Gemma3 => {
            o.insert("architectures".into(), json!(["Gemma3ForCausalLM"]));
            o.insert("model_type".into(), json!("gemma3_text"));
            o.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            o.insert("rope_local_base_freq".into(), json!(10000.0));
            o.insert("sliding_window".into(), json!(512));
            o.insert("sliding_window_pattern".into(), json!(6));
            let types: Vec<&str> = (0..s.layers)
                .map(|i| {
                    if (i + 1) % 6 == 0 {
                        "full_attention"
                    } else {
                        "sliding_attention"
                    }
                })
                .collect();
            o.insert("layer_types".into(), json!(types));
            o.insert("query_pre_attn_scalar".into(), json!(s.head_dim));
            o.insert("final_logit_softcapping".into(), json!(null));
            o.insert("attn_logit_softcapping".into(), json!(null));
        }
    }
    serde_json::Value::Object(o)
}

/// (HF name, shape, is a norm weight).
fn tensors(s: &Shape) -> Vec<(String, Vec<usize>, bool)> {
    let (h, q, kv, f) = (
        s.hidden,
        s.heads * s.head_dim,
        s.kv_heads * s.head_dim,
        s.ffn,
    );
    let mut t = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![s.vocab, h],
        false,
    )];
    for i in 0..s.layers {
        let p = format!("model.layers.{i}.");
        let mut add = |n: &str, sh: Vec<usize>, norm: bool| t.push((format!("{p}{n}"), sh, norm));
        add("input_layernorm.weight", vec![h], true);
        add("self_attn.q_proj.weight", vec![q, h], false);
        add("self_attn.k_proj.weight", vec![kv, h], false);
        add("self_attn.v_proj.weight", vec![kv, h], false);
        add("self_attn.o_proj.weight", vec![h, q], false);
        if !matches!(s.kind, Kind::Llama) {
            add("self_attn.q_norm.weight", vec![s.head_dim], true);
            add("self_attn.k_norm.weight", vec![s.head_dim], true);
        }
        add("post_attention_layernorm.weight", vec![h], true);
        if matches!(s.kind, Kind::Gemma3) {
            add("pre_feedforward_layernorm.weight", vec![h], true);
            add("post_feedforward_layernorm.weight", vec![h], true);
        }
        add("mlp.gate_proj.weight", vec![f, h], false);
        add("mlp.up_proj.weight", vec![f, h], false);
        add("mlp.down_proj.weight", vec![h, f], false);
    }
    t.push(("model.norm.weight".into(), vec![h], true));
    if !s.tied {
        t.push(("lm_head.weight".into(), vec![s.vocab, h], false));
    }
    t
}

/// splitmix64: one independent stream per (seed, tensor, chunk).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

const CHUNK: usize = 1 << 20;

/// Fills `out` (bf16 little-endian) with chunk `ci` of a tensor: roughly
/// normal values (sum of 4 uniforms) with std 0.02 for weights, 1 + small
/// noise for norms (Gemma's `(1 + w)` norms: small noise around 0).
fn fill_chunk(seed: u64, ci: usize, n: usize, norm: bool, gemma: bool, out: &mut [u8]) {
    let mut st = mix(seed ^ (ci as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut u = || {
        st = mix(st);
        (st >> 40) as f32 / (1u64 << 24) as f32
    };
    for j in 0..n {
        let g = (u() + u() + u() + u() - 2.0) * 1.732_050_8; // unit variance
        let v = if norm {
            (if gemma { 0.0 } else { 1.0 }) + 0.05 * g
        } else {
            0.02 * g
        };
        out[2 * j..2 * j + 2].copy_from_slice(&f32_to_bf16_bits(v).to_le_bytes());
    }
}

fn write_tensor(
    w: &mut impl Write,
    seed: u64,
    n: usize,
    norm: bool,
    gemma: bool,
    threads: usize,
) -> std::io::Result<()> {
    let n_chunks = n.div_ceil(CHUNK);
    let batch = threads.max(1) * 4;
    let mut buf = vec![0u8; batch * CHUNK * 2];
    for c0 in (0..n_chunks).step_by(batch) {
        let c1 = (c0 + batch).min(n_chunks);
        let len = |ci: usize| CHUNK.min(n - ci * CHUNK);
        let total: usize = (c0..c1).map(len).sum();
        std::thread::scope(|s| {
            let mut rest = &mut buf[..total * 2];
            let per = (c1 - c0).div_ceil(threads.max(1));
            let mut ci = c0;
            while ci < c1 {
                let end = (ci + per).min(c1);
                let bytes: usize = (ci..end).map(len).sum::<usize>() * 2;
                let (mine, r) = rest.split_at_mut(bytes);
                rest = r;
                let start = ci;
                s.spawn(move || {
                    let mut off = 0;
                    for c in start..end {
                        let l = len(c);
                        fill_chunk(seed, c, l, norm, gemma, &mut mine[off..off + 2 * l]);
                        off += 2 * l;
                    }
                });
                ci = end;
            }
        });
        w.write_all(&buf[..total * 2])?;
    }
    Ok(())
}

const SHARD_BYTES: u64 = 4 << 30;

fn write_safetensors(dir: &Path, s: &Shape, seed: u64, threads: usize) -> CliResult {
    let ts = tensors(s);
    let gemma = matches!(s.kind, Kind::Gemma3);
    // Shards of at most 4 GiB of data (a tensor never splits).
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut size = 0u64;
    for (i, (_, sh, _)) in ts.iter().enumerate() {
        let b = sh.iter().product::<usize>() as u64 * 2;
        if size > 0 && size + b > SHARD_BYTES {
            shards.push(std::mem::take(&mut current));
            size = 0;
        }
        current.push(i);
        size += b;
    }
    shards.push(current);
    let n_sh = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    for (k, shard) in shards.iter().enumerate() {
        let fname = if n_sh == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n_sh:05}.safetensors", k + 1)
        };
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut off = 0u64;
        for &i in shard {
            let (name, sh, _) = &ts[i];
            let b = sh.iter().product::<usize>() as u64 * 2;
            header.insert(
                name.clone(),
                json!({"dtype": "BF16", "shape": sh, "data_offsets": [off, off + b]}),
            );
            weight_map.insert(name.clone(), json!(fname));
            off += b;
        }
        total += off;
        let mut h = serde_json::to_vec(&header)?;
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let path = dir.join(&fname);
        let mut w = BufWriter::with_capacity(8 << 20, File::create(&path)?);
        w.write_all(&(h.len() as u64).to_le_bytes())?;
        w.write_all(&h)?;
        for &i in shard {
            let (name, sh, norm) = &ts[i];
            let tseed = mix(seed ^ name_hash(name));
            write_tensor(&mut w, tseed, sh.iter().product(), *norm, gemma, threads)?;
        }
        w.flush()?;
    }
    if n_sh > 1 {
        let idx = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&idx)?,
        )?;
    }
    Ok(())
}

/// GPT-2's byte-to-unicode table: printable bytes map to themselves.
fn byte_token(b: u8) -> char {
    let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable {
        return char::from(b);
    }
    let n = (0..b)
        .filter(|&x| !((b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || x >= 0xAE))
        .count() as u32;
    // 256 + n < 512 is always a Unicode scalar value.
    char::from_u32(256 + n).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// A byte-level BPE tokenizer with the 256 byte tokens and no merges, plus
/// `<unk>`-free specials `<s>` / `</s>` at the end.
fn tokenizer_json() -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_token(b).to_string(), json!(b as u32));
    }
    vocab.insert("<s>".into(), json!(256));
    vocab.insert("</s>".into(), json!(257));
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 256, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 257, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

pub fn run(a: Args) -> CliResult {
    let s = shape(&a.shape).ok_or_else(|| {
        format!(
            "unknown shape '{}' (known: tiny, tiny-qwen3, tiny-gemma3, Llama-3.2-1B, Llama-3.1-8B, Qwen3-0.6B, SmolLM2-135M, SmolLM2-360M, Gemma-3-1B)",
            a.shape
        )
    })?;
    let types = a
        .types
        .split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| parse_target(t.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let threads = a.threads.unwrap_or_else(default_threads);
    let hf = a.out_dir.join("hf");
    std::fs::create_dir_all(&hf)?;
    let t0 = std::time::Instant::now();
    std::fs::write(
        hf.join("config.json"),
        serde_json::to_vec_pretty(&config_json(&s))?,
    )?;
    std::fs::write(
        hf.join("tokenizer.json"),
        serde_json::to_vec(&tokenizer_json())?,
    )?;
    std::fs::write(
        hf.join("tokenizer_config.json"),
        serde_json::to_vec_pretty(&json!({"bos_token": "<s>", "eos_token": "</s>",
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": s.max_pos}))?,
    )?;
    write_safetensors(&hf, &s, a.seed, threads)?;
    eprintln!(
        "wrote {} ({:.1}s)",
        hf.display(),
        t0.elapsed().as_secs_f64()
    );
    if types.is_empty() {
        return Ok(());
    }
    let model = Model::open(&hf)?;
    for ty in types {
        let t0 = std::time::Instant::now();
        let conv = plan(&model, ty)?;
        for n in &conv.notes {
            eprintln!("{n}");
        }
        let out = a
            .out_dir
            .join(format!("model-{}.gguf", ty.name().to_ascii_lowercase()));
        conv.write(&out, threads)?;
        eprintln!(
            "wrote {} ({:.1}s)",
            out.display(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_format::{GgmlType, ModelConfig, RopeStyle, TensorType};

    /// The HF and GGUF views of one model: the same except for what the
    /// format itself changes (llama's Q/K permutation turns HF's NEOX-style
    /// RoPE into llama.cpp's interleaved one; GGUF stores floats as f32).
    fn same_model(hf: &ModelConfig, gguf: &ModelConfig) {
        let mut h = hf.clone();
        h.norm_eps = h.norm_eps as f32 as f64;
        if let (Some(r), Some(g)) = (h.rope.as_mut(), gguf.rope.as_ref()) {
            assert_eq!(r.style, RopeStyle::Neox);
            assert_eq!(g.style, RopeStyle::Interleaved);
            r.style = g.style;
        }
        assert_eq!(&h, gguf);
    }

    #[test]
    fn tiny_synth_opens_as_hf_and_gguf_with_one_config() {
        let dir = std::env::temp_dir().join(format!("kiln-synth-{}", std::process::id()));
        let args = |seed| Args {
            shape: "tiny".into(),
            out_dir: dir.clone(),
            types: "f16,q8_0,q4_0".into(),
            seed,
            threads: Some(2),
        };
        run(args(7)).unwrap();
        let hf = Model::open(dir.join("hf")).unwrap();
        assert_eq!(hf.config.hidden_size, 64);
        assert_eq!(hf.config.n_layers, 2);
        assert!(hf
            .tensors()
            .iter()
            .all(|t| t.ty == TensorType::Ggml(GgmlType::BF16)));
        let st = std::fs::read(dir.join("hf/model.safetensors")).unwrap();
        for (name, ty) in [
            ("f16", GgmlType::F16),
            ("q8_0", GgmlType::Q8_0),
            ("q4_0", GgmlType::Q4_0),
        ] {
            let g = Model::open(dir.join(format!("model-{name}.gguf"))).unwrap();
            same_model(&hf.config, &g.config);
            let t = g.require("blk.0.ffn_up.weight").unwrap();
            assert_eq!(t.ty, TensorType::Ggml(ty));
            assert_eq!(t.shape, vec![128, 64]);
            let n = g.require("output_norm.weight").unwrap();
            assert_eq!(n.ty, TensorType::Ggml(GgmlType::F32));
        }
        // Seeded: the same seed writes the same bytes, another seed does not.
        run(args(7)).unwrap();
        assert_eq!(std::fs::read(dir.join("hf/model.safetensors")).unwrap(), st);
        run(Args {
            types: String::new(),
            ..args(8)
        })
        .unwrap();
        assert_ne!(std::fs::read(dir.join("hf/model.safetensors")).unwrap(), st);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn tiny_qwen3_and_gemma3_agree_between_hf_and_gguf() {
        for shape in ["tiny-qwen3", "tiny-gemma3"] {
            let dir =
                std::env::temp_dir().join(format!("kiln-synth-{shape}-{}", std::process::id()));
            run(Args {
                shape: shape.into(),
                out_dir: dir.clone(),
                types: "q8_0".into(),
                seed: 1,
                threads: Some(2),
            })
            .unwrap();
            let hf = Model::open(dir.join("hf")).unwrap();
            let g = Model::open(dir.join("model-q8_0.gguf")).unwrap();
            let mut h = hf.config.clone();
            h.norm_eps = h.norm_eps as f32 as f64;
            // GGUF Gemma norms carry the +1 (checked below on the bytes).
            h.norm_weight_offset = g.config.norm_weight_offset;
            assert_eq!(h, g.config, "{shape}");
            if shape == "tiny-gemma3" {
                assert_eq!(hf.config.norm_weight_offset, 1.0);
                assert!(hf.config.layer_sliding.iter().any(|s| !s));
                let t = g.require("output_norm.weight").unwrap();
                let v = kiln_format::dequant::dequantize_to_vec(GgmlType::F32, g.data(t)).unwrap();
                let mean = v.iter().sum::<f32>() / v.len() as f32;
                assert!((mean - 1.0).abs() < 0.05, "gemma norm mean {mean}");
            }
            std::fs::remove_dir_all(&dir).ok();
        }
    }

    #[test]
    fn named_shapes_have_consistent_tensor_lists() {
        for name in [
            "Llama-3.2-1B",
            "Llama-3.1-8B",
            "Qwen3-0.6B",
            "Qwen3-14B",
            "SmolLM2-135M",
            "SmolLM2-360M",
            "Gemma-3-1B",
        ] {
            let s = shape(name).unwrap();
            let n: usize = tensors(&s)
                .iter()
                .map(|(_, sh, _)| sh.iter().product::<usize>())
                .sum();
            let (lo, hi) = match name {
                "Llama-3.2-1B" => (1.2e9, 1.3e9),
                "Llama-3.1-8B" => (7.9e9, 8.1e9),
                "Qwen3-0.6B" => (0.58e9, 0.62e9),
                "Qwen3-14B" => (14.5e9, 15.0e9),
                "SmolLM2-135M" => (0.13e9, 0.14e9),
                "SmolLM2-360M" => (0.35e9, 0.37e9),
                _ => (0.98e9, 1.01e9),
            };
            assert!((lo..hi).contains(&(n as f64)), "{name}: {n} parameters");
        }
        assert!(shape("nope").is_none());
    }
}
