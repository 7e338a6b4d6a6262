//! Byte-exact check of kiln's quantizers against gguf-py's
//! `gguf.quants.quantize` on the vectors in `tests/data/quant/` (made by
//! `tools/gen_quant_vectors.py`; see that directory's README.md), and of the
//! K-quants against ggml's own `ggml_quantize_chunk` without importance
//! matrix (`tools/gen_kquant_vectors.py`).
//!
//! `KILN_KQUANT_DIR=DIR` also checks a larger set made with
//! `tools/gen_kquant_vectors.py --big N DIR` (not committed).
//!
//! A missing vector file fails the test, so it cannot pass vacuously.

use std::path::{Path, PathBuf};

use kiln_format::quantize::{quantize_par, quantize_to_vec};
use kiln_format::GgmlType;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/quant")
}

fn read(name: &str) -> Vec<u8> {
    read_in(&data_dir(), name)
}

fn read_in(dir: &Path, name: &str) -> Vec<u8> {
    let p = dir.join(name);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "missing quant vector file {}: {e} (regenerate with `python3 tools/gen_quant_vectors.py`)",
            p.display()
        )
    })
}

fn read_f32(name: &str) -> Vec<f32> {
    to_f32(&read(name))
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn check(ty: GgmlType, input: &[f32], expected_file: &str) -> usize {
    check_bytes(ty, input, &read(expected_file), expected_file)
}

fn check_bytes(ty: GgmlType, input: &[f32], want: &[u8], expected_file: &str) -> usize {
    let got = quantize_to_vec(ty, input).unwrap();
    assert_eq!(got.len(), want.len(), "{ty}: size");
    let bs = ty.block_size();
    let ts = ty.type_size();
    let bad: Vec<String> = got
        .chunks(ts)
        .zip(want.chunks(ts))
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| {
            format!(
                "  block {i}: input {:?}\n    got  {g:02x?}\n    want {w:02x?}",
                &input[i * bs..(i + 1) * bs]
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{ty}: {} of {} blocks differ from the reference ({expected_file}):\n{}",
        bad.len(),
        got.len() / ts,
        bad.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(quantize_par(ty, input, 4).unwrap(), got, "{ty}: parallel");
    got.len() / ts
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    let input = read_f32("input.f32");
    let floats = read_f32("floats.f32");
    assert!(input.len() >= 4096, "only {} input values", input.len());
    for name in ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"] {
        let ty = GgmlType::from_name(name).unwrap();
        let n = check(ty, &input, &format!("{name}.bin"));
        println!("{name:5} {n:5} blocks byte-exact");
        if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
            let n = check(ty, &floats, &format!("{name}.floats.bin"));
            println!("{name:5} {n:5} special floats byte-exact");
        }
    }
}

const KQUANTS: [&str; 5] = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"];

#[test]
fn kquants_match_ggml_byte_for_byte() {
    let input = read_f32("kquant_input.f32");
    assert!(
        input.len() >= 256 * 150,
        "only {} input values",
        input.len()
    );
    for name in KQUANTS {
        let ty = GgmlType::from_name(name).unwrap();
        let n = check(ty, &input, &format!("{name}.kquant.bin"));
        println!("{name:5} {n:5} blocks byte-exact with ggml");
    }
}

/// The large uncommitted set, when `KILN_KQUANT_DIR` names one.
#[test]
fn kquants_match_ggml_on_large_set() {
    let Some(dir) = std::env::var_os("KILN_KQUANT_DIR") else {
        println!("KILN_KQUANT_DIR not set: skipped");
        return;
    };
    let dir = PathBuf::from(dir);
    let input = to_f32(&read_in(&dir, "kquant_input.f32"));
    for name in KQUANTS {
        let ty = GgmlType::from_name(name).unwrap();
        let file = format!("{name}.kquant.bin");
        let n = check_bytes(ty, &input, &read_in(&dir, &file), &file);
        println!("{name:5} {n:8} blocks byte-exact with ggml");
    }
}
