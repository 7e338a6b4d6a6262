//! `-ctk/-ctv` (KV cache types), `--warm`, `--mlock` and `--batch-invariant`
//! on the tiny llama fixture: greedy output with an f16 KV cache equals
//! f32's, `--batch-invariant` (a GPU mode; the CPU is always invariant)
//! changes nothing on the CPU, the flags parse on `run` and `bench`, and f16
//! on `--device cuda` is refused.

use std::path::PathBuf;
use std::process::Command;

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/fixtures/tiny/llama/gguf/llama-f32.gguf")
}

/// (success, stdout, stderr) of `kiln ARGS…`.
fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run_greedy(extra: &[&str]) -> (String, String) {
    let m = model();
    let m = m.to_str().expect("utf-8 path");
    let mut args = vec![
        "run",
        m,
        "--device",
        "cpu",
        "-t",
        "2",
        "--temp",
        "0",
        "-n",
        "16",
        "-p",
        "hello world",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = kiln(&args);
    assert!(ok, "kiln {args:?}: {err}");
    (out, err)
}

#[test]
fn f16_kv_greedy_matches_f32() {
    let (f32_out, f32_err) = run_greedy(&[]);
    assert!(!f32_err.contains("KV f16"), "{f32_err}");
    let (f16_out, f16_err) = run_greedy(&["-ctk", "f16", "-ctv", "f16"]);
    assert!(f16_err.contains("KV f16/f16"), "{f16_err}");
    assert_eq!(f32_out, f16_out);
    let (long_out, long_err) = run_greedy(&["--cache-type-k", "f16", "--warm", "--mlock"]);
    assert!(long_err.contains("KV f16/f32"), "{long_err}");
    assert!(long_err.contains("warmed"), "{long_err}");
    assert_eq!(f32_out, long_out);
    let (inv_out, _) = run_greedy(&["--batch-invariant"]);
    assert_eq!(f32_out, inv_out);
}

#[test]
fn kv_flags_on_bench_and_errors() {
    let m = model();
    let m = m.to_str().expect("utf-8 path");
    let (ok, out, err) = kiln(&[
        "bench", m, "--device", "cpu", "-p", "8", "-n", "4", "-t", "1", "-r", "1", "-ctk", "f16",
        "-ctv", "f16", "--warm",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("tg4"), "{out}");
    let (ok, _, err) = kiln(&["run", m, "--device", "cpu", "-ctk", "q8_0", "-n", "1"]);
    assert!(!ok && err.contains("f32 or f16"), "{err}");
    // CUDA takes f16 for both or neither (checked before the device opens).
    let (ok, _, err) = kiln(&["run", m, "--device", "cuda", "-ctv", "f16", "-n", "1"]);
    assert!(
        !ok && err.contains("K f32 / V f16") && err.contains("both as f32 or both as f16"),
        "{err}"
    );
}
