//! `kiln inspect` end to end: every fixture and every real model (when
//! fetched) prints its report and valid JSON; bad paths exit 1 with a message
//! that names the file.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures")
}

fn models_dir() -> PathBuf {
    std::env::var_os("KILN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/kiln-test-models")
        })
}

fn inspect_ok(path: &Path) -> serde_json::Value {
    let out = kiln().arg("inspect").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("format:") && text.contains("totals:"),
        "{}",
        path.display()
    );
    let out = kiln()
        .args(["inspect", "--json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", path.display());
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: bad JSON: {e}", path.display()))
}

#[test]
fn inspects_every_fixture() {
    let mut n = 0;
    for arch in [
        "llama", "qwen2", "qwen3", "gemma3", "gpt2", "llama_kq", "bert",
    ] {
        let dir = fixtures().join("tiny").join(arch);
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.join("gguf"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        if dir.join("hf").is_dir() {
            paths.push(dir.join("hf"));
        }
        for p in paths {
            let j = inspect_ok(&p);
            let expect = if arch == "llama_kq" { "llama" } else { arch };
            assert_eq!(j["architecture"], expect, "{}", p.display());
            assert!(j["totals"]["bytes"].as_u64().unwrap() > 0);
            n += 1;
        }
    }
    assert!(n >= 36, "{n}");
}

/// Valid files that are not runnable models (vocab-only GGUFs, reference
/// arrays) are still described, with the reason they cannot run.
#[test]
fn inspects_non_model_fixtures() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures().join("tokenizer/llamacpp"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    paths.push(fixtures().join("tiny/llama/ref_hf.safetensors"));
    paths.push(fixtures().join("real/minilm/embeddings.safetensors"));
    assert!(paths.len() >= 6);
    for p in paths {
        let j = inspect_ok(&p);
        assert!(j["tensors"].is_array(), "{}", p.display());
        if p.extension().is_some_and(|e| e == "gguf") {
            assert!(
                j["metadata"]["tokenizer.ggml.model"].is_string(),
                "{}",
                p.display()
            );
        }
    }
}

#[test]
fn inspects_the_real_models() {
    let dir = models_dir();
    let cases = [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "llama", 272, 49152),
        ("gemma-3-270m-q4_k_m.gguf", "gemma3", 236, 262144),
        (
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "qwen2",
            291,
            151936,
        ),
        ("all-minilm-l6-v2", "bert", 101, 30522),
    ];
    if !dir.join(cases[0].0).exists() {
        assert!(
            std::env::var("KILN_REQUIRE_REFS").map_or(true, |v| v != "1"),
            "real models missing in {} (run scripts/fetch-models.sh)",
            dir.display()
        );
        eprintln!(
            "SKIPPED inspects_the_real_models: no models in {}",
            dir.display()
        );
        return;
    }
    for (file, arch, n_tensors, vocab) in cases {
        let j = inspect_ok(&dir.join(file));
        assert_eq!(j["architecture"], arch, "{file}");
        assert_eq!(j["tensors"].as_array().unwrap().len(), n_tensors, "{file}");
        assert_eq!(j["config"]["vocab_size"], vocab, "{file}");
        assert_eq!(j["tokenizer"]["vocab_size"], vocab, "{file}");
    }
}

#[test]
fn bad_input_exits_1_naming_the_file() {
    let tmp = std::env::temp_dir().join(format!("kiln-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let trunc = tmp.join("truncated.gguf");
    let orig = std::fs::read(fixtures().join("tiny/llama/gguf/llama-q4_0.gguf")).unwrap();
    std::fs::write(&trunc, &orig[..orig.len() / 2]).unwrap();
    let magic = tmp.join("magic.gguf");
    std::fs::write(&magic, b"GGUX\x03\0\0\0________________").unwrap();
    let empty_dir = tmp.join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    for (p, want) in [
        (trunc.clone(), "truncated"),
        (magic.clone(), "not a GGUF file"),
        (empty_dir.clone(), "config.json"),
        (tmp.join("missing.gguf"), "No such file"),
    ] {
        let out = kiln().arg("inspect").arg(&p).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", p.display());
        assert!(
            err.contains(&*p.to_string_lossy()) && err.contains(want),
            "{}: {err}",
            p.display()
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
