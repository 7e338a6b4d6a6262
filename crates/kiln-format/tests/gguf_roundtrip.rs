//! The GGUF writer against the reader, against llama.cpp's files, and against
//! llama.cpp's gguf-py reader.

use std::path::{Path, PathBuf};

use kiln_format::gguf::{Array, Gguf, GgufWriter, Value};
use kiln_format::GgmlType;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures")
}

/// One value of every metadata type, nested arrays included.
fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-7)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo ✓ 世界".into())),
        ("t.u64", Value::U64(u64::MAX - 1)),
        ("t.i64", Value::I64(i64::MIN + 1)),
        ("t.f64", Value::F64(-2.5e300)),
        ("t.arr.u8", Value::Array(Array::U8(vec![1, 2, 255]))),
        ("t.arr.i32", Value::Array(Array::I32(vec![-1, 0, 7]))),
        ("t.arr.f32", Value::Array(Array::F32(vec![0.5, -1.25]))),
        ("t.arr.bool", Value::Array(Array::Bool(vec![true, false]))),
        (
            "t.arr.str",
            Value::Array(Array::String(vec!["a".into(), "".into(), "ü".into()])),
        ),
        ("t.arr.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("t.arr.f64", Value::Array(Array::F64(vec![1e-300]))),
        ("t.arr.empty", Value::Array(Array::I16(vec![]))),
        (
            "t.arr.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::String(vec!["x".into()]),
            ])),
        ),
    ]
}

fn sample_writer(alignment: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    if let Some(a) = alignment {
        w.set("general.alignment", Value::U32(a));
    }
    for (k, v) in every_value() {
        w.set(k, v);
    }
    let mut seed = 7u8;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(31).wrapping_add(11);
                seed
            })
            .collect()
    };
    for (name, ty, ne) in [
        ("a.f32", GgmlType::F32, vec![3u64, 5]),
        ("b.q4_0", GgmlType::Q4_0, vec![64, 3]),
        ("c.q6_k", GgmlType::Q6K, vec![256, 2]),
        ("d.f16", GgmlType::F16, vec![7]),
        ("e.q8_0", GgmlType::Q8_0, vec![32, 2, 2, 2]),
    ] {
        let n: u64 = ne.iter().product();
        let data = bytes(ty.bytes_for(n).unwrap() as usize);
        w.add_tensor(name, ty, &ne, data).unwrap();
    }
    w
}

#[test]
fn writer_output_reads_back_identically() {
    for alignment in [None, Some(64), Some(1)] {
        let w = sample_writer(alignment);
        let bytes = w.to_bytes();
        let g = Gguf::from_bytes("mem", bytes.clone()).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment, alignment.unwrap_or(32) as u64);
        for (k, v) in every_value() {
            assert_eq!(g.get(k), Some(&v), "{k}");
        }
        assert_eq!(g.tensors().len(), 5);
        for t in g.tensors() {
            assert_eq!(t.offset % g.alignment, 0);
        }
        // Writing what was read gives the same bytes.
        let mut w2 = GgufWriter::new();
        for (k, v) in g.metadata() {
            w2.set(k.clone(), v.clone());
        }
        for t in g.tensors() {
            w2.add_tensor(t.name.clone(), t.ty, &t.ne, g.tensor_data(t).to_vec())
                .unwrap();
        }
        assert_eq!(w2.to_bytes(), bytes);
    }
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let mut w = GgufWriter::new();
    assert!(
        w.add_tensor("x", GgmlType::Q4_0, &[30], vec![0; 18])
            .is_err(),
        "row not whole blocks"
    );
    assert!(
        w.add_tensor("x", GgmlType::F32, &[4], vec![0; 15]).is_err(),
        "wrong byte count"
    );
    assert!(
        w.add_tensor("x", GgmlType::F32, &[], vec![]).is_err(),
        "no dims"
    );
    assert!(
        w.add_tensor("x", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4])
            .is_err(),
        "5 dims"
    );
    w.add_tensor("x", GgmlType::F32, &[1], vec![0; 4]).unwrap();
    assert!(
        w.add_tensor("x", GgmlType::F32, &[1], vec![0; 4]).is_err(),
        "duplicate"
    );
}

/// llama.cpp's files (written by gguf-py's writer) come out byte-identical
/// when kiln reads and re-writes them.
#[test]
fn llamacpp_files_rewrite_byte_identically() {
    let root = fixtures();
    let mut n = 0;
    for f in [
        "tiny/llama/gguf/llama-q4_0.gguf",
        "tiny/gemma3/gguf/gemma3-f16.gguf",
        "tiny/llama_kq/gguf/llama_kq-q4_k_m.gguf",
        "tokenizer/llamacpp/ggml-vocab-llama-spm.gguf",
    ] {
        let orig = std::fs::read(root.join(f)).unwrap();
        let g = Gguf::from_bytes(f, orig.clone()).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            w.set(k.clone(), v.clone());
        }
        for t in g.tensors() {
            w.add_tensor(t.name.clone(), t.ty, &t.ne, g.tensor_data(t).to_vec())
                .unwrap();
        }
        let out = w.to_bytes();
        // gguf-py pads the file end to the alignment; compare what both hold.
        let common = orig.len().min(out.len());
        assert_eq!(out[..common], orig[..common], "{f}");
        n += 1;
    }
    assert_eq!(n, 4);
}

/// gguf-py (llama.cpp's own reader) reads the writer's output as intended.
/// Needs python with `gguf` (KILN_PYTHON, default python3); the test suite
/// script installs it. Without it the test says so, and fails when
/// KILN_REQUIRE_REFS=1 (as in CI).
#[test]
fn gguf_py_reads_writer_output() {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/gguf_py_dump.py");
    let path = std::env::temp_dir().join(format!("kiln-writer-{}.gguf", std::process::id()));
    sample_writer(Some(64)).write_file(&path).unwrap();
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    let out = match out {
        Ok(o) if o.status.success() => o,
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            if std::env::var("KILN_REQUIRE_REFS").is_ok_and(|v| v == "1") {
                panic!("gguf-py is required (KILN_REQUIRE_REFS=1) but could not run: {why}");
            }
            eprintln!("SKIPPED gguf_py_reads_writer_output: gguf-py not available ({why})");
            return;
        }
    };
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let fields = &j["fields"];
    assert_eq!(fields["t.u32"]["value"], 4_000_000_000u64);
    assert_eq!(fields["t.i64"]["value"], i64::MIN + 1);
    assert_eq!(fields["t.string"]["value"], "héllo ✓ 世界");
    assert_eq!(fields["t.bool"]["value"], true);
    assert_eq!(
        fields["t.arr.str"]["value"],
        serde_json::json!(["a", "", "ü"])
    );
    assert_eq!(fields["t.arr.i32"]["value"], serde_json::json!([-1, 0, 7]));
    // gguf-py flattens a nested array into its leaves: [1, 2] + ["x"].
    assert_eq!(fields["t.arr.nested"]["value"]["len"], 3);
    assert_eq!(fields["general.alignment"]["value"], 64);
    assert_eq!(fields.as_object().unwrap().len(), every_value().len() + 2);
    let g = Gguf::from_bytes("mem", sample_writer(Some(64)).to_bytes()).unwrap();
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), g.tensors().len());
    for (py, t) in tensors.iter().zip(g.tensors()) {
        assert_eq!(py["name"], t.name);
        assert_eq!(py["type"], t.ty.id());
        assert_eq!(py["offset"], g.data_start + t.offset);
        let sha = sha256_hex(g.tensor_data(t));
        assert_eq!(py["sha"], sha, "{} data", t.name);
    }
}

/// Minimal SHA-256 so the comparison needs no dependency.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes(chunk[4 * i..4 * i + 4].try_into().unwrap());
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for i in 0..8 {
            h[i] = h[i].wrapping_add(v[i]);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}
