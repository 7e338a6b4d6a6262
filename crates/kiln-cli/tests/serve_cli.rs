//! `kiln serve --device …`: the CPU (and auto without a GPU) serves and stops
//! on SIGTERM with status 0; `--device cuda` without a GPU is a clear error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/fixtures/tiny/llama/gguf/llama-f32.gguf")
}

fn kiln_serve(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.arg("serve")
        .arg(model())
        .args(["--port", "0", "-t", "1"])
        .args(args);
    c
}

/// One HTTP/1.1 exchange; the response body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    match raw.split_once("\r\n\r\n") {
        Some((_, b)) => b.to_string(),
        None => panic!("no HTTP response: {raw:?}"),
    }
}

/// Starts `kiln serve` with `device`, checks /health names `expect_backend`
/// and a completion works, then stops it with SIGTERM (exit status 0).
fn serves_and_stops(device: &str, expect_backend: &str) {
    let mut child = kiln_serve(&["--device", device])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start kiln serve");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut log = String::new();
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            panic!("kiln serve exited before serving:\n{log}");
        }
        log.push_str(&line);
        if let Some(rest) = line.split("on http://").nth(1) {
            break rest.split_whitespace().next().unwrap_or("").to_string();
        }
    };
    assert!(log.contains(&format!("({expect_backend}")), "{log}");
    let health: Value = serde_json::from_str(&http(&addr, "GET", "/health", "")).expect("JSON");
    assert_eq!(health["status"], "ok");
    assert!(
        health["backend"]
            .as_str()
            .is_some_and(|b| b.starts_with(expect_backend)),
        "{health}"
    );
    let r: Value = serde_json::from_str(&http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "a b", "max_tokens": 4, "ignore_eos": true}"#,
    ))
    .expect("JSON");
    assert_eq!(r["usage"]["completion_tokens"], 4, "{r}");
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let status = child.wait().expect("wait");
    let mut rest = String::new();
    let _ = err.read_to_string(&mut rest);
    assert!(status.success(), "{status}: {log}{rest}");
    assert!(rest.contains("server stopped"), "{log}{rest}");
}

#[test]
fn device_cpu_serves() {
    serves_and_stops("cpu", "cpu, 1 threads");
}

#[test]
fn device_auto_without_a_gpu_serves_on_the_cpu() {
    if kiln_cuda::driver_present() {
        eprintln!("SKIPPED: a CUDA driver is present");
        return;
    }
    serves_and_stops("auto", "cpu, 1 threads");
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_error() {
    if kiln_cuda::driver_present() {
        eprintln!("SKIPPED: a CUDA driver is present");
        return;
    }
    let out = kiln_serve(&["--device", "cuda"])
        .stdin(Stdio::null())
        .output()
        .expect("run kiln serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("kiln: error: --device cuda:"), "{err}");
    assert!(err.contains("--device cpu"), "{err}");
    assert!(!err.contains("serving"), "{err}");
}

#[test]
fn bad_gpu_mem_is_a_usage_error() {
    let out = kiln_serve(&["--gpu-mem", "lots"])
        .output()
        .expect("run kiln serve");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
}
