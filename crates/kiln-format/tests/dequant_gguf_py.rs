//! Bit-exact check of kiln's reference dequantization against the vectors in
//! `tests/data/dequant/` (made by `tools/gen_dequant_vectors.py` from gguf-py;
//! see that directory's README.md for provenance).
//!
//! Every type listed here must have its vector files: a missing file fails
//! the test, so it cannot pass vacuously.

use std::path::{Path, PathBuf};

use kiln_format::dequant::{dequantize, dequantize_to_vec, is_supported};
use kiln_format::GgmlType;

/// (type, source of the expected values, minimum number of values).
const VECTORS: &[(&str, &str, usize)] = &[
    ("F32", "gguf-py", 1024),
    ("F16", "gguf-py", 3000),
    ("BF16", "gguf-py", 2048),
    ("Q4_0", "gguf-py", 512),
    ("Q4_1", "gguf-py", 512),
    ("Q5_0", "gguf-py", 512),
    ("Q5_1", "gguf-py", 512),
    ("Q8_0", "gguf-py", 512),
    ("Q2_K", "gguf-py", 1536),
    ("Q3_K", "gguf-py", 1536),
    ("Q4_K", "gguf-py", 1536),
    ("Q5_K", "gguf-py", 1536),
    ("Q6_K", "gguf-py", 1536),
    ("IQ4_NL", "gguf-py", 512),
    ("IQ4_XS", "gguf-py", 1536),
    ("TQ1_0", "gguf-py", 1536),
    ("TQ2_0", "gguf-py", 1536),
    ("MXFP4", "gguf-py", 512),
    ("IQ2_XXS", "gguf-py", 1536),
    ("IQ2_XS", "gguf-py", 1536),
    ("IQ2_S", "gguf-py", 1536),
    ("IQ3_XXS", "gguf-py", 1536),
    ("IQ3_S", "gguf-py", 1536),
    ("IQ1_S", "gguf-py", 1536),
    ("IQ1_M", "gguf-py", 1536),
    ("Q8_K", "ggml transcription", 1536),
    ("I8", "numpy astype", 256),
    ("I16", "numpy astype", 512),
    ("I32", "numpy astype", 512),
    ("I64", "numpy astype", 512),
    ("F64", "numpy astype", 512),
];

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/dequant")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "missing dequant vector file {}: {e} (regenerate with `python3 tools/gen_dequant_vectors.py`)",
            path.display()
        )
    })
}

/// Compares one type; returns the number of values compared.
fn check(name: &str, min_values: usize) -> usize {
    let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
    assert!(is_supported(ty), "{name} has vectors but is not supported");
    let dir = data_dir();
    let raw = read(&dir.join(format!("{name}.bin")));
    let expected_bytes = read(&dir.join(format!("{name}.f32")));
    assert_eq!(expected_bytes.len() % 4, 0, "{name}.f32 is not whole f32s");
    let expected: Vec<u32> = expected_bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(
        expected.len() >= min_values,
        "{name}: only {} expected values, want at least {min_values}",
        expected.len()
    );
    assert_eq!(
        raw.len() % ty.type_size(),
        0,
        "{name}.bin is not whole blocks"
    );
    assert_eq!(
        raw.len() / ty.type_size() * ty.block_size(),
        expected.len(),
        "{name}: input and expected sizes disagree"
    );

    let got = dequantize_to_vec(ty, &raw).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(got.len(), expected.len());
    // The in-place entry point must agree with the allocating one.
    let mut got2 = vec![0.0f32; expected.len()];
    dequantize(ty, &raw, &mut got2).unwrap();

    let mut mismatches = Vec::new();
    for (i, (&g, &want)) in got.iter().zip(&expected).enumerate() {
        // Bitwise: distinguishes -0.0 from 0.0 and NaN payloads (NaN == NaN
        // when the bits agree).
        if g.to_bits() != want || got2[i].to_bits() != want {
            mismatches.push(format!(
                "  [{i}] (block {}) got {g:e} ({:#010x}), want {:e} ({want:#010x})",
                i / ty.block_size(),
                g.to_bits(),
                f32::from_bits(want)
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} values differ:\n{}",
        mismatches.len(),
        expected.len(),
        mismatches
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    expected.len()
}

#[test]
fn dequant_matches_gguf_py_bit_for_bit() {
    let mut total = 0;
    for &(name, source, min_values) in VECTORS {
        let n = check(name, min_values);
        println!("{name:8} {n:5} values bit-exact ({source})");
        total += n;
    }
    println!("total: {total} values in {} types", VECTORS.len());
    let floor: usize = VECTORS.iter().map(|v| v.2).sum();
    assert!(total >= floor, "only {total} values compared, want {floor}");
}

/// Every supported type has vectors, so a new decoder cannot ship unchecked.
#[test]
fn every_supported_type_has_vectors() {
    for ty in GgmlType::ALL {
        let listed = VECTORS.iter().any(|(n, _, _)| *n == ty.name());
        assert_eq!(
            listed,
            is_supported(ty),
            "{ty}: supported={} but vectors listed={listed}",
            is_supported(ty)
        );
        if listed {
            assert!(
                data_dir().join(format!("{}.bin", ty.name())).is_file(),
                "{ty}"
            );
        }
    }
}
