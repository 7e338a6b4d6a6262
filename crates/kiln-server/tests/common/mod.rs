//! Test helpers: servers on 127.0.0.1 with ephemeral ports, and a raw
//! HTTP/1.1 client (no client library between the test and the wire).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_server::{RunningServer, ServerConfig};
use serde_json::Value;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures")
}

pub fn tiny_llama() -> PathBuf {
    fixtures().join("tiny/llama/gguf/llama-f32.gguf")
}

/// SmolLM2-135M-Instruct from `$KILN_MODELS` or `~/.cache/kiln-test-models`.
pub fn smollm2() -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln-test-models"))
        })?;
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        if std::env::var("KILN_REQUIRE_REFS").as_deref() == Ok("1") {
            panic!("{} is missing and KILN_REQUIRE_REFS=1", p.display());
        }
        eprintln!(
            "SKIPPED: {} not found (set KILN_MODELS or run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

pub fn config(model: PathBuf) -> ServerConfig {
    ServerConfig {
        model_path: model,
        port: 0,
        threads: Some(1),
        ..Default::default()
    }
}

pub fn start(cfg: ServerConfig) -> RunningServer {
    kiln_server::start(&cfg).unwrap_or_else(|e| panic!("server: {e}"))
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// `data:` payloads of an SSE body.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| {
                e.lines()
                    .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            })
            .map(str::to_string)
            .collect()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    /// The OpenAI error object, checking its shape.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string(), "no error.message: {v}");
        assert!(e["type"].is_string(), "no error.type: {v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_str = String::from_utf8_lossy(&b[..nl]);
        let size =
            usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        b = &b[nl + 2..];
        if size == 0 || b.len() < size {
            out.extend_from_slice(&b[..size.min(b.len())]);
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[(size + 2).min(b.len())..];
    }
}

fn parse(raw: &[u8]) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = &raw[split + 4..];
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Resp {
        status,
        headers: head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).ok();
    s
}

pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> Resp {
    let mut s = connect(addr);
    let _ = s.write_all(raw);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse(&buf)
}

pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Resp {
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    send_raw(addr, &raw)
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, b"")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, body.to_string().as_bytes())
}

/// One gauge or counter (without labels) from /metrics.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let m = get(addr, "/metrics").body;
    m.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.parse().ok())?
        })
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{m}"))
}

/// A metric's samples summed over their labels (0 when it has none yet).
pub fn metric_sum(addr: SocketAddr, name: &str) -> f64 {
    let m = get(addr, "/metrics").body;
    m.lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            let base = k.split('{').next()?;
            (base == name).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

/// Polls until `f` holds (at most `secs`).
pub fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Token ids of a non-streaming completion (`return_token_ids`).
pub fn completion_ids(addr: SocketAddr, body: &Value) -> (Vec<u32>, String) {
    let mut b = body.clone();
    b["return_token_ids"] = Value::Bool(true);
    let r = post(addr, "/v1/completions", &b);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let c = &v["choices"][0];
    let ids = c["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (ids, c["text"].as_str().unwrap().to_string())
}
