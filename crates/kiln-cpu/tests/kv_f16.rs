//! The f16 KV cache (`KvTypes { k: F16, v: F16 }`, and K/V alone) against
//! transformers' float64 logits on the tiny float models, through prefill
//! (all positions) and step-by-step greedy decode, with both kernel sets;
//! and the f16 result's distance from the f32 cache's.
//!
//! Tolerance: f16 keeps 11 significant bits (relative rounding ≤ 2^-11 ≈
//! 4.9e-4 per stored K/V value); the tiny models' logits move by 0.8e-3–
//! 3.4e-3 (f16 K and V: llama 1.6e-3, qwen2 2.3e-3, qwen3 3.4e-3, gemma3
//! 2.0e-3, gpt2 1.4e-3; f32 KV: ≤ 3e-6), so f16 KV is held to 5e-3 where
//! f32 KV is held to 1e-4, and greedy tokens must not change.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{argmax, fixtures, max_abs, Arrays};
use kiln_core::{ArchDescriptor, Engine, EngineOptions, KvLayout};
use kiln_cpu::{CpuBackend, CpuOptions, Kernels, KvType, KvTypes};
use kiln_format::Model;

const TOL: f32 = 5e-3;

/// Awkward sizes: blocks of 3 positions, chunks of 5 tokens.
fn opts() -> EngineOptions {
    EngineOptions {
        ctx: 64,
        max_seqs: 1,
        block_size: 3,
        max_chunk: 5,
    }
}

fn engine(path: &Path, kv: KvTypes, k: Kernels, threads: usize) -> Engine<CpuBackend> {
    let o = opts();
    let model = Arc::new(Model::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    let desc = ArchDescriptor::from_model(&model).expect("descriptor");
    let layout = KvLayout::plan(&desc, o.ctx, o.max_seqs, o.block_size, o.max_chunk);
    let mut b = CpuBackend::with_kv(
        model,
        desc,
        layout.clone(),
        o.max_chunk,
        CpuOptions { threads },
        kv,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.set_kernels(k);
    assert_eq!(b.kv_types(), kv);
    Engine::new(b, layout)
}

/// (all-position logits, greedy step logits) max abs vs the f64 reference,
/// and the all-position logits.
fn run(path: &Path, r: &Arrays, kv: KvTypes, k: Kernels, threads: usize) -> (f32, f32, Vec<f32>) {
    let ids = r.ids("input_ids");
    let (_, want) = r.f32("logits");
    let mut e = engine(path, kv, k, threads);
    let mut out = Vec::new();
    e.prefill_into(0, &ids, true, &mut out).expect("prefill");
    let d = max_abs(&out, &want);

    let prompt = r.ids("prompt_ids");
    let gen = r.ids("generated_ids");
    let (shape, seq) = r.f32("gen_seq_logits");
    let v = shape[1];
    let mut e = engine(path, kv, k, threads);
    let mut logits = e.prefill(0, &prompt).expect("prefill").to_vec();
    let mut worst = 0.0f32;
    for (i, &tok) in gen.iter().enumerate() {
        let row = &seq[(prompt.len() - 1 + i) * v..(prompt.len() + i) * v];
        worst = worst.max(max_abs(&logits, row));
        assert_eq!(
            argmax(&logits),
            tok,
            "{} {kv:?} {k:?}: step {i}",
            path.display()
        );
        logits = e.decode(0, tok).expect("decode").to_vec();
    }
    (d, worst, out)
}

#[test]
fn f16_kv_matches_the_reference_on_tiny_models() {
    let f32kv = KvTypes::default();
    let kinds = [
        KvTypes {
            k: KvType::F16,
            v: KvType::F16,
        },
        KvTypes {
            k: KvType::F16,
            v: KvType::F32,
        },
        KvTypes {
            k: KvType::F32,
            v: KvType::F16,
        },
    ];
    for name in ["llama", "qwen2", "qwen3", "gemma3", "gpt2"] {
        let dir = fixtures().join("tiny").join(name);
        let r = Arrays::open(&dir.join("ref_hf.safetensors"));
        let path = dir.join(format!("gguf/{name}-f32.gguf"));
        for k in [Kernels::Reference, Kernels::Fast] {
            let (d32, g32, base) = run(&path, &r, f32kv, k, 2);
            assert!(
                d32 <= 1e-4 && g32 <= 1e-4,
                "{name} f32 KV {k:?}: {d32} {g32}"
            );
            for kv in kinds {
                for threads in [1, 3] {
                    let (d, g, out) = run(&path, &r, kv, k, threads);
                    let vs32 = max_abs(&out, &base);
                    eprintln!(
                        "{name} {:?}/{:?} {k:?} {threads}t: logits vs f64 {d:.2e} (f32 KV {d32:.2e}), greedy steps {g:.2e}, vs f32 KV {vs32:.2e}",
                        kv.k, kv.v
                    );
                    assert!(d <= TOL && g <= TOL, "{name} {kv:?} {k:?}: {d} {g}");
                }
            }
        }
    }
}

/// The fast and reference kernels round to f16 alike (tested bit for bit
/// in the crate), but their K/V differ by f32 rounding before the store, so
/// a value near a rounding boundary may land one f16 step apart: measured
/// 1.5e-4 (qwen3) and 4.9e-4 (gemma3); held to 1e-3.
#[test]
fn f16_kv_fast_and_reference_agree() {
    let kv = KvTypes {
        k: KvType::F16,
        v: KvType::F16,
    };
    for name in ["qwen3", "gemma3"] {
        let dir = fixtures().join("tiny").join(name);
        let r = Arrays::open(&dir.join("ref_hf.safetensors"));
        let path = dir.join(format!("gguf/{name}-f32.gguf"));
        let (_, _, a) = run(&path, &r, kv, Kernels::Reference, 2);
        let (_, _, b) = run(&path, &r, kv, Kernels::Fast, 2);
        let d = max_abs(&a, &b);
        assert!(d <= 1e-3, "{name}: {d}");
    }
}
