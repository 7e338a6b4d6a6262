//! `kiln quantize` against llama.cpp's own llama-quantize: for every K-quant
//! mix (q4_k_m, q4_k_s, q5_k_m, q5_k_s, q3_k_m, q3_k_l) and every single K
//! type (= `llama-quantize --pure`), every quantized tensor's type and bytes
//! (sha256) equal llama-quantize's on the same input, as listed in
//! `tests/data/quant/llama_quantize_mixes.txt` (made by
//! `tools/gen_kquant_vectors.py --mix-hashes`; inputs: the tiny llama_kq
//! model's Q6_K file decoded to F32 — 256-wide rows, so K types are kept —
//! and the tiny gemma3/qwen3 F32 files, 64-wide rows: the fallbacks).
//! The outputs are also read back and dequantized.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_format::{Model, TensorType};
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (input, target) -> [(tensor, type, hash)] in file order.
type Expected = BTreeMap<(String, String), Vec<(String, String, String)>>;

fn expected() -> Expected {
    let p = root().join("tests/data/quant/llama_quantize_mixes.txt");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut m = Expected::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 5, "bad line {line:?}");
        m.entry((f[0].to_string(), f[1].to_string()))
            .or_default()
            .push((f[2].to_string(), f[3].to_string(), f[4].to_string()));
    }
    m
}

fn input(label: &str) -> PathBuf {
    let fx = root().join("tests/data/fixtures/tiny");
    match label {
        "llama_kq" => fx.join("llama_kq/gguf/llama_kq-q6_k.gguf"),
        a => fx.join(format!("{a}/gguf/{a}-f32.gguf")),
    }
}

#[test]
fn mixes_and_k_types_equal_llama_quantize() {
    let exp = expected();
    assert!(exp.len() >= 20, "only {} files listed", exp.len());
    let dir = std::env::temp_dir().join(format!("kiln-quant-mixes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut n_tensors = 0;
    let mut n_bytes = 0;
    for ((label, target), tensors) in &exp {
        let out = dir.join(format!("{label}-{target}.gguf"));
        let run = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["quantize", "--threads", "2"])
            .arg(input(label))
            .arg(&out)
            .arg(target)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{label} {target}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let m = Model::open(&out).unwrap();
        let quantized: Vec<_> = m
            .tensors()
            .iter()
            .filter(|t| t.ty != TensorType::Ggml(kiln_format::GgmlType::F32))
            .collect();
        assert_eq!(quantized.len(), tensors.len(), "{label} {target}");
        for (name, ty, hash) in tensors {
            let t = m.require(name).unwrap();
            let TensorType::Ggml(got_ty) = t.ty else {
                panic!("{name}: {}", t.ty)
            };
            assert_eq!(got_ty.name(), ty, "{label} {target} {name}: type");
            let h = Sha256::digest(m.data(t));
            let h: String = h[..8].iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(&h, hash, "{label} {target} {name} ({ty}): bytes differ");
            kiln_format::dequant::dequantize_to_vec(got_ty, m.data(t)).unwrap();
            n_tensors += 1;
            n_bytes += m.data(t).len();
        }
    }
    println!(
        "{} files, {n_tensors} tensors, {n_bytes} bytes equal to llama-quantize",
        exp.len()
    );
    std::fs::remove_dir_all(&dir).ok();
}
