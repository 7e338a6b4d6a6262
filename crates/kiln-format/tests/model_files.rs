//! Model-level checks of the loaders: every fixture opens; a model's GGUF
//! conversion and its HF folder agree on the config and, with the format
//! quirks undone, on every weight; errors name the field.

use std::path::{Path, PathBuf};

use kiln_format::gguf::{Gguf, GgufWriter, Value};
use kiln_format::{dequant, Arch, GgmlType, Model, RopeStyle, TensorType};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures")
}

const TINY: [&str; 5] = ["llama", "qwen2", "qwen3", "gemma3", "gpt2"];

fn f32s(m: &Model, name: &str) -> Vec<f32> {
    let t = m.require(name).unwrap();
    let TensorType::Ggml(ty) = t.ty else {
        panic!("{name}: {}", t.ty)
    };
    dequant::dequantize_to_vec(ty, m.data(t)).unwrap()
}

#[test]
fn every_fixture_model_opens() {
    let mut n = 0;
    for entry in walk(&fixtures().join("tiny")) {
        let is_gguf = entry.extension().is_some_and(|e| e == "gguf");
        let is_hf = entry.ends_with("hf");
        if is_gguf || is_hf {
            let m = Model::open(&entry).unwrap_or_else(|e| panic!("{e}"));
            assert!(!m.tensors().is_empty());
            n += 1;
        }
    }
    assert!(n >= 35, "only {n} fixture models found");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.clone());
        if p.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn gguf_and_hf_configs_agree() {
    for name in TINY {
        let dir = fixtures().join("tiny").join(name);
        let g = Model::open(dir.join(format!("gguf/{name}-f32.gguf"))).unwrap();
        let h = Model::open(dir.join("hf")).unwrap();
        let (a, b) = (&g.config, &h.config);
        assert_eq!(a.arch, b.arch, "{name}");
        assert_eq!(
            (
                a.vocab_size,
                a.hidden_size,
                a.n_layers,
                a.n_heads,
                a.n_kv_heads,
                a.head_dim,
                a.intermediate_size
            ),
            (
                b.vocab_size,
                b.hidden_size,
                b.n_layers,
                b.n_heads,
                b.n_kv_heads,
                b.head_dim,
                b.intermediate_size
            ),
            "{name}"
        );
        assert_eq!(a.norm, b.norm, "{name}");
        assert!(
            (a.norm_eps - b.norm_eps).abs() < 1e-9 * b.norm_eps.max(1e-3) * 1e3,
            "{name} eps"
        );
        assert_eq!(a.activation, b.activation, "{name}");
        assert_eq!(a.sliding_window, b.sliding_window, "{name}");
        assert_eq!(a.layer_sliding, b.layer_sliding, "{name}");
        assert!((a.attn_scale - b.attn_scale).abs() < 1e-12, "{name}");
        assert_eq!(a.tied_embeddings, b.tied_embeddings, "{name}");
        assert_eq!(a.embedding_scale, b.embedding_scale, "{name}");
        match (&a.rope, &b.rope) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                assert_eq!(x.theta, y.theta, "{name}");
                assert_eq!(x.theta_local, y.theta_local, "{name}");
                assert_eq!(x.dim, y.dim, "{name}");
                // The one intended difference: GGUF llama Q/K are permuted.
                let want = if a.arch == Arch::Llama {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::Neox
                };
                assert_eq!(x.style, want, "{name}");
                assert_eq!(y.style, RopeStyle::Neox, "{name}");
            }
            _ => panic!("{name}: rope present in one format only"),
        }
        if name == "gemma3" {
            assert_eq!((a.norm_weight_offset, b.norm_weight_offset), (0.0, 1.0));
        }
    }
}

/// With the quirks undone, the GGUF conversion holds exactly the HF weights.
#[test]
fn gguf_and_hf_weights_agree_with_quirks_undone() {
    for name in TINY {
        let dir = fixtures().join("tiny").join(name);
        let g = Model::open(dir.join(format!("gguf/{name}-f32.gguf"))).unwrap();
        let h = Model::open(dir.join("hf")).unwrap();
        let mut compared = 0;
        for t in h.tensors() {
            let hv = f32s(&h, &t.name);
            let gv = f32s(&g, &t.name);
            assert_eq!(
                g.require(&t.name).unwrap().logical_shape(),
                t.logical_shape(),
                "{name} {}",
                t.name
            );
            let shape = t.logical_shape();
            let expected: Vec<f32> = if t.transposed {
                // HF GPT-2 Conv1D [in, out] → [out, in].
                let (rows, cols) = (shape[0] as usize, shape[1] as usize);
                (0..rows * cols)
                    .map(|i| hv[(i % cols) * rows + i / cols])
                    .collect()
            } else if g
                .config
                .rope
                .as_ref()
                .is_some_and(|r| r.style == RopeStyle::Interleaved)
                && (t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_k.weight"))
            {
                // llama.cpp's converter: per head, row (j·hd/2 + i) moves to (2i + j).
                let hd = g.config.head_dim;
                let cols = shape[1] as usize;
                let mut out = vec![0.0; hv.len()];
                for head in 0..shape[0] as usize / hd {
                    for i in 0..hd / 2 {
                        for j in 0..2 {
                            let src = head * hd + j * (hd / 2) + i;
                            let dst = head * hd + 2 * i + j;
                            out[dst * cols..(dst + 1) * cols]
                                .copy_from_slice(&hv[src * cols..(src + 1) * cols]);
                        }
                    }
                }
                out
            } else if name == "gemma3" && t.name.ends_with("norm.weight") {
                hv.iter().map(|w| w + h.config.norm_weight_offset).collect()
            } else {
                hv
            };
            let max = expected
                .iter()
                .zip(&gv)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(max <= 1e-6, "{name} {}: max diff {max}", t.name);
            compared += 1;
        }
        assert_eq!(compared, h.tensors().len());
        assert!(compared >= 20, "{name}");
    }
}

#[test]
fn head_dim_is_inferred_from_q_proj() {
    let src = fixtures().join("tiny/qwen3/hf");
    let tmp = std::env::temp_dir().join(format!("kiln-headdim-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("head_dim");
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), tmp.join("model.safetensors")).unwrap();
    let m = Model::open(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    // hidden 64 / 4 heads would be 16; q_proj has 128 rows → 32.
    assert_eq!(m.unwrap().config.head_dim, 32);
}

#[test]
fn mlx_quantized_folder_is_recognised() {
    let tmp = std::env::temp_dir().join(format!("kiln-mlx-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let cfg = serde_json::json!({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128,
        "vocab_size": 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
        "quantization": {"group_size": 32, "bits": 4}
    });
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    // Every linear layer quantized: [out, in*4/32] u32 + [out, in/32] f16 scales and biases.
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>)> = Vec::new();
    let mut lin = |n: &str, out: usize, inp: usize| {
        tensors.push((
            format!("{n}.weight"),
            safetensors::Dtype::U32,
            vec![out, inp / 8],
        ));
        tensors.push((
            format!("{n}.scales"),
            safetensors::Dtype::F16,
            vec![out, inp / 32],
        ));
        tensors.push((
            format!("{n}.biases"),
            safetensors::Dtype::F16,
            vec![out, inp / 32],
        ));
    };
    lin("model.embed_tokens", 32, 64);
    for (p, o, i) in [
        ("self_attn.q_proj", 64, 64),
        ("self_attn.k_proj", 32, 64),
        ("self_attn.v_proj", 32, 64),
        ("self_attn.o_proj", 64, 64),
        ("mlp.gate_proj", 128, 64),
        ("mlp.up_proj", 128, 64),
        ("mlp.down_proj", 64, 128),
    ] {
        lin(&format!("model.layers.0.{p}"), o, i);
    }
    tensors.push((
        "model.layers.0.input_layernorm.weight".into(),
        safetensors::Dtype::F32,
        vec![64],
    ));
    tensors.push((
        "model.layers.0.post_attention_layernorm.weight".into(),
        safetensors::Dtype::F32,
        vec![64],
    ));
    tensors.push((
        "model.norm.weight".into(),
        safetensors::Dtype::F32,
        vec![64],
    ));
    let bufs: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, d, s)| {
            let bytes = s.iter().product::<usize>() * d.bitsize() / 8;
            (n, d, s, vec![0u8; bytes])
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bufs
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &tmp.join("model.safetensors")).unwrap();
    let m = Model::open(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    let m = m.unwrap_or_else(|e| panic!("{e}"));
    let q = m.mlx_quantization.unwrap();
    assert_eq!((q.bits, q.group_size), (4, 32));
    let w = m.require("blk.0.ffn_down.weight").unwrap();
    assert_eq!(
        w.ty,
        TensorType::Mlx {
            bits: 4,
            group_size: 32
        }
    );
    assert_eq!(w.shape, vec![64, 128], "logical (unpacked) shape");
    assert_eq!(
        m.require("blk.0.ffn_down.scales").unwrap().shape,
        vec![64, 4]
    );
    assert!(m.tensor("blk.0.ffn_down.biases").is_some());
    assert_eq!(m.require("token_embd.weight").unwrap().shape, vec![32, 64]);
}

#[test]
fn gguf_v2_reads_like_v3() {
    let mut b = std::fs::read(fixtures().join("tiny/qwen2/gguf/qwen2-q8_0.gguf")).unwrap();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    let g = Gguf::from_bytes("v2", b).unwrap();
    assert_eq!(g.version, 2);
    assert!(Model::from_gguf(g).is_ok());
}

/// A GGUF whose config is broken in one field must say which field.
#[test]
fn config_errors_name_the_field() {
    let base = Gguf::open(fixtures().join("tiny/qwen2/gguf/qwen2-f32.gguf")).unwrap();
    let rewrite = |key: &str, v: Option<Value>| -> String {
        let mut w = GgufWriter::new();
        for (k, val) in base.metadata() {
            if k != key {
                w.set(k.clone(), val.clone());
            }
        }
        if let Some(v) = v {
            w.set(key, v);
        }
        for t in base.tensors() {
            w.add_tensor(t.name.clone(), t.ty, &t.ne, base.tensor_data(t).to_vec())
                .unwrap();
        }
        match Model::from_gguf(Gguf::from_bytes("bad.gguf", w.to_bytes()).unwrap()) {
            Ok(_) => String::from("OK"),
            Err(e) => e.to_string(),
        }
    };
    let cases: [(&str, Option<Value>, &str); 7] = [
        (
            "qwen2.embedding_length",
            Some(Value::U32(0)),
            "qwen2.embedding_length",
        ),
        ("qwen2.embedding_length", None, "qwen2.embedding_length"),
        (
            "qwen2.embedding_length",
            Some(Value::U32(48)),
            "token_embd.weight",
        ),
        (
            "qwen2.attention.head_count_kv",
            Some(Value::U32(3)),
            "num_key_value_heads",
        ),
        (
            "qwen2.block_count",
            Some(Value::String("three".into())),
            "qwen2.block_count",
        ),
        ("qwen2.block_count", Some(Value::U32(4)), "blk.3"),
        (
            "general.architecture",
            Some(Value::String("mamba".into())),
            "mamba",
        ),
    ];
    for (key, v, want) in cases {
        let msg = rewrite(key, v.clone());
        assert!(
            msg.contains(want) && msg.contains("bad.gguf"),
            "{key}={v:?}: {msg}"
        );
    }
    let _ = GgmlType::F32;
}
