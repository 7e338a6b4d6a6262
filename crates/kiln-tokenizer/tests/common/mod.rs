//! Shared helpers for the kiln-tokenizer integration tests.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};

use kiln_tokenizer::Tokenizer;

/// `tests/data` at the repository root.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

pub fn tok_fixtures() -> PathBuf {
    data_dir().join("fixtures/tokenizer")
}

/// Read a file, gunzipping it when its name ends in `.gz`.
pub fn read_maybe_gz(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().and_then(|e| e.to_str()) == Some("gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out
    } else {
        raw
    }
}

/// Where the real test models live: `$KILN_MODELS` or `~/.cache/kiln-test-models`.
pub fn models_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("KILN_MODELS") {
        return Some(PathBuf::from(d));
    }
    std::env::var("HOME")
        .ok()
        .map(|h| PathBuf::from(h).join(".cache/kiln-test-models"))
}

/// A real model file, or `None` with a visible skip message.
pub fn real_model(file: &str, test: &str) -> Option<PathBuf> {
    let p = models_dir().map(|d| d.join(file));
    match p {
        Some(p) if p.is_file() => Some(p),
        _ => {
            eprintln!(
                "SKIPPED {test}: model {file} not found (set KILN_MODELS or put it in ~/.cache/kiln-test-models)"
            );
            None
        }
    }
}

pub fn hf_cases(name: &str) -> serde_json::Value {
    let p = tok_fixtures().join("hf").join(name).join("cases.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn hf_tokenizer(name: &str) -> Tokenizer {
    let p = tok_fixtures()
        .join("hf")
        .join(name)
        .join("tokenizer.json.gz");
    let bytes = read_maybe_gz(&p);
    Tokenizer::from_tokenizer_json_bytes(&bytes, &p.display().to_string())
        .unwrap_or_else(|e| panic!("{e}"))
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Feed ids one at a time; check no piece holds U+FFFD unless the full
/// decode does, and the pieces add up to the full decode. Returns a
/// description of the first problem.
pub fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Result<(), String> {
    let full = tok.decode(ids, skip_special).map_err(|e| e.to_string())?;
    let mut st = tok.stream_decoder(skip_special);
    let mut out = String::new();
    for &id in ids {
        if let Some(p) = st.step(id).map_err(|e| e.to_string())? {
            if p.contains('\u{FFFD}') && !full.contains('\u{FFFD}') {
                return Err(format!("piece {p:?} holds U+FFFD"));
            }
            out.push_str(&p);
        }
    }
    if let Some(p) = st.finish().map_err(|e| e.to_string())? {
        out.push_str(&p);
    }
    if out != full {
        return Err(format!("stream {out:?} != full decode {full:?}"));
    }
    Ok(())
}
