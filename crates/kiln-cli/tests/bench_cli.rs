//! `kiln bench` on the tiny llama fixture: llama-bench records, batched
//! (`--batch`) records, and the device errors.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/fixtures/tiny/llama/gguf/llama-f32.gguf")
}

/// (success, stdout, stderr) of `kiln bench MODEL ARGS…`.
fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("bench")
        .arg(model())
        .args(args)
        .output()
        .expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn records(stdout: &str) -> Vec<Value> {
    match serde_json::from_str(stdout) {
        Ok(Value::Array(v)) => v,
        other => panic!("not a JSON array ({other:?}): {stdout}"),
    }
}

#[test]
fn batched_records() {
    let (ok, out, err) = bench(&[
        "--device", "cpu", "--batch", "1,2,5", "-p", "8", "-n", "4", "-t", "1", "-o", "json",
    ]);
    assert!(ok, "{err}");
    let r = records(&out);
    assert_eq!(r.len(), 3, "{out}");
    for (rec, b) in r.iter().zip([1u64, 2, 5]) {
        assert_eq!(rec["backend"], "cpu", "{rec}");
        assert_eq!(rec["sampling"], "host", "{rec}");
        assert_eq!(rec["n_threads"], 1);
        assert_eq!(rec["pp"], 8);
        assert_eq!(rec["tg"], 4);
        assert_eq!(rec["pl"], b);
        assert_eq!(rec["n_kv"], b * 12);
        // KV planned for the largest batch: 5 × (8 + 4).
        assert_eq!(rec["n_kv_max"], 60);
        for f in ["t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"] {
            let v = rec[f].as_f64().unwrap_or_else(|| panic!("no {f}: {rec}"));
            assert!(v > 0.0, "{f} = {v}: {rec}");
        }
        let t = rec["t"].as_f64().unwrap_or(0.0);
        let parts = rec["t_pp"].as_f64().unwrap_or(0.0) + rec["t_tg"].as_f64().unwrap_or(0.0);
        assert!((t - parts).abs() < 1e-9, "{rec}");
        for f in [
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
        ] {
            assert!(rec.get(f).is_some(), "no {f}: {rec}");
        }
    }

    // The text table: one row per batch size.
    let (ok, out, err) = bench(&["--batch", "1,3", "-p", "4", "-n", "2", "-t", "1"]);
    assert!(ok, "{err}");
    assert!(out.contains("S_TG t/s"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("|") && l.split('|').nth(1).is_some_and(|c| c.trim() == "4"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
}

#[test]
fn llama_bench_records_keep_their_fields() {
    let (ok, out, err) = bench(&[
        "--device", "cpu", "-p", "8", "-n", "4", "-r", "2", "-t", "1", "-o", "json",
    ]);
    assert!(ok, "{err}");
    let r = records(&out);
    assert_eq!(r.len(), 2, "{out}");
    assert_eq!(
        (r[0]["n_prompt"].as_u64(), r[0]["n_gen"].as_u64()),
        (Some(8), Some(0))
    );
    assert_eq!(
        (r[1]["n_prompt"].as_u64(), r[1]["n_gen"].as_u64()),
        (Some(0), Some(4))
    );
    for rec in &r {
        assert_eq!(rec["backend"], "cpu");
        assert_eq!(rec["kernels"], "fast");
        assert_eq!(rec["sampling"], "host");
        // The CPU backend cannot queue steps: its loop waits for each token.
        assert_eq!(rec["decode_loop"], "sync");
        assert_eq!(rec["samples_ts"].as_array().map(Vec::len), Some(2));
        for f in [
            "avg_ts",
            "stddev_ts",
            "bytes_per_token",
            "n_threads",
            "model_type",
        ] {
            assert!(rec.get(f).is_some(), "no {f}: {rec}");
        }
    }
}

#[test]
fn floor_counts_weights_and_kv_reads() {
    // The fixture: 3 layers, 2 KV heads of 16 dims, f32 K and V unless told.
    // tg4 from an empty cache reads 1, 2, 3, 4 positions: a mean of 2.5.
    for (kv_args, row_bytes) in [(&[][..], 4 + 4), (&["--cache-type-k", "f16"][..], 2 + 4)] {
        let mut args = vec![
            "--device", "cpu", "-p", "0", "-n", "4", "-r", "1", "-t", "1", "--floor", "64", "-o",
            "json",
        ];
        args.extend_from_slice(kv_args);
        let (ok, out, err) = bench(&args);
        assert!(ok, "{err}");
        let r = records(&out);
        assert_eq!(r.len(), 1, "{out}");
        let rec = &r[0];
        let kv = rec["kv_bytes_per_token"].as_f64().unwrap_or(-1.0);
        assert_eq!(kv, (3 * 2 * 16 * row_bytes) as f64 * 2.5, "{rec}");
        let num = |f: &str| rec[f].as_f64().unwrap_or_else(|| panic!("no {f}: {rec}"));
        let read = num("bytes_per_token") + kv;
        let bw = num("read_bandwidth_gbs") * 1e9;
        assert!(bw > 0.0, "{rec}");
        assert!(
            (num("floor_ts") - bw / read).abs() <= 1e-9 * num("floor_ts"),
            "{rec}"
        );
        let frac = num("avg_ts") / num("floor_ts");
        assert!((num("floor_fraction") - frac).abs() <= 1e-9 * frac, "{rec}");
    }
}

#[test]
fn bad_arguments_are_errors() {
    let (ok, _, err) = bench(&["--batch", "2,0"]);
    assert!(!ok);
    assert!(err.contains("--batch 0"), "{err}");
    let (ok, _, err) = bench(&["--batch", "two"]);
    assert!(!ok);
    assert!(err.contains("not a count"), "{err}");
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_error() {
    if kiln_cuda::driver_present() {
        eprintln!("SKIPPED: a CUDA driver is present");
        return;
    }
    let (ok, out, err) = bench(&["--device", "cuda", "-p", "4", "-n", "2", "-r", "1"]);
    assert!(!ok, "{out}");
    assert!(err.starts_with("kiln: error: --device cuda:"), "{err}");
    assert!(err.contains("--device cpu"), "{err}");
    // auto falls back to the CPU.
    let (ok, out, err) = bench(&[
        "--device", "auto", "-p", "4", "-n", "2", "-r", "1", "-o", "json",
    ]);
    assert!(ok, "{err}");
    assert!(records(&out).iter().all(|r| r["backend"] == "cpu"), "{out}");
}
