//! Real quantized models against transformers' rows (same dequantized
//! weights, f32 compute). Skipped, with a message, when the models are absent.

mod common;

use std::path::PathBuf;

use common::{argmax, engine, fixtures, max_abs, Arrays};
use kiln_core::EngineOptions;

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln-test-models"))
        })?;
    dir.is_dir().then_some(dir)
}

const CASES: [&str; 5] = ["plain_en", "chat_en", "code_py", "zh_emoji", "long_en"];

/// Top-1/top-2 gap below which a greedy disagreement counts as a near-tie.
const NEAR_TIE: f32 = 2e-2;

fn check(tag: &str, file: &str) {
    let Some(path) = models_dir().map(|d| d.join(file)).filter(|p| p.is_file()) else {
        eprintln!("SKIPPED {tag}: {file} not found (set KILN_MODELS or run tools/fixtures/obtain_models.sh)");
        return;
    };
    let opts = EngineOptions {
        ctx: 320,
        max_seqs: 2,
        block_size: 16,
        max_chunk: 128,
    };
    let mut e = engine(&path, opts, 2);
    let v = e.vocab_size();
    for case in CASES {
        let r = Arrays::open(
            &fixtures()
                .join("real")
                .join(tag)
                .join(format!("{case}.safetensors")),
        );
        let prompt = r.ids("llamacpp_prompt_ids");
        let lgen = r.ids("llamacpp_generated_ids");
        let hgen = r.ids("hf_generated_ids");
        let (_, hv) = r.f32("hf_top64_values");
        let hi = r.ids("hf_top64_indices");
        e.reset(0);
        e.reset(1);
        let row0 = e.prefill(0, &prompt).unwrap().to_vec();
        e.prefill(1, &prompt).unwrap();
        // Slot 0 follows llama.cpp's tokens (the reference rows' path), slot 1
        // runs greedy; both in the same batch.
        let mut rows = vec![row0.clone()];
        let mut ours = vec![argmax(&row0)];
        for step in 0..31 {
            if step < 4 {
                let l = e.decode_batch(&[(0, lgen[step]), (1, ours[step])]).unwrap();
                rows.push(l[..v].to_vec());
                ours.push(argmax(&l[v..2 * v]));
            } else {
                let l = e.decode(1, ours[step]).unwrap();
                ours.push(argmax(l));
            }
        }
        let mut worst = 0.0f32;
        for (ri, row) in rows.iter().enumerate() {
            for k in 0..64 {
                let id = hi[ri * 64 + k] as usize;
                worst = worst.max((row[id] - hv[ri * 64 + k]).abs());
            }
        }
        let mut full = String::new();
        if r.has("hf_logits") {
            let (_, hl) = r.f32("hf_logits");
            let d = max_abs(&row0, &hl);
            full = format!(", full row 0 {d:.2e}");
            assert!(d <= 1e-2, "{tag} {case}: full row 0 differs by {d}");
        }
        let lead = ours.iter().zip(&hgen).take_while(|(a, b)| a == b).count();
        let mut note = String::new();
        if lead < hgen.len() {
            // Re-run our own path to the divergence point to measure its gap.
            e.reset(0);
            let mut l = e.prefill(0, &prompt).unwrap().to_vec();
            for &t in &ours[..lead] {
                l = e.decode(0, t).unwrap().to_vec();
            }
            let gap = (l[ours[lead] as usize] - l[hgen[lead] as usize]).abs();
            note = format!(
                " (diverges at {lead}: gap between ours and transformers' token {gap:.2e})"
            );
            assert!(
                gap < NEAR_TIE,
                "{tag} {case}: greedy differs at {lead} with gap {gap}"
            );
        }
        eprintln!(
            "{tag} {case}: {} prompt tokens, top-64 rows 0..4 max abs {worst:.2e}{full}, greedy = transformers for {lead}/32{note}, top-1 = llama.cpp {}",
            prompt.len(),
            ours[0] == lgen[0]
        );
        assert!(worst <= 1e-2, "{tag} {case}: top-64 differs by {worst}");
    }
}

#[test]
fn smollm2_135m_q4_1() {
    check(
        "smollm2-135m-instruct-q4_1",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    );
}

#[test]
fn gemma3_270m_q4_k_m() {
    check("gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf");
}

#[test]
fn qwen25_coder_05b_q4_k_m() {
    check(
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    );
}
