//! HTTP API tests on the tiny llama fixture (random weights, byte-level BPE,
//! 256 positions): protocol, errors, streaming, scheduler behaviour.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn server() -> kiln_server::RunningServer {
    start(config(tiny_llama()))
}

#[test]
fn health_models_metrics() {
    let s = server();
    let r = get(s.addr, "/health");
    assert_eq!((r.status, r.json()["status"].clone()), (200, json!("ok")));
    let m = get(s.addr, "/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "llama-f32");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(m["data"][0]["max_model_len"], 256);
    assert_eq!(get(s.addr, "/v1/models/llama-f32").status, 200);
    let r = get(s.addr, "/v1/models/gpt-4");
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "model_not_found");
    let r = get(s.addr, "/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    for name in [
        "kiln_requests_total",
        "kiln_prompt_tokens_total",
        "kiln_generation_tokens_total",
        "kiln_time_to_first_token_seconds_bucket",
        "kiln_inter_token_latency_seconds_bucket",
        "kiln_queue_depth",
        "kiln_running_sequences",
        "kiln_kv_blocks_used",
        "kiln_kv_blocks_free",
    ] {
        assert!(r.body.contains(name), "{name} missing");
    }
    assert_eq!(metric(s.addr, "kiln_kv_blocks_used"), 0.0);
    let r = get(s.addr, "/nope");
    assert_eq!(r.status, 404);
    r.error();
}

#[test]
fn bad_requests_are_openai_errors() {
    let mut cfg = config(tiny_llama());
    cfg.max_body_bytes = 64 << 10;
    let s = start(cfg);
    let a = s.addr;
    // Malformed JSON.
    let r = request(a, "POST", "/v1/chat/completions", b"{\"messages\": [");
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["type"], "invalid_request_error");
    // Not an object, wrong types, bad values: 400 naming the parameter.
    for (path, body, param) in [
        ("/v1/chat/completions", json!([1, 2]), Value::Null),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            json!("messages"),
        ),
        ("/v1/chat/completions", json!({}), json!("messages")),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}),
            json!("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
            json!("temperature"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            json!("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 5}]}),
            json!("messages[0].content"),
        ),
        ("/v1/completions", json!({"prompt": 12}), json!("prompt")),
        (
            "/v1/completions",
            json!({"prompt": [1, 100000]}),
            json!("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "n": 0}),
            json!("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stop": [1]}),
            json!("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logit_bias": {"1": 500}}),
            json!("logit_bias"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stream": false, "stream_options": {"include_usage": true}}),
            json!("stream_options"),
        ),
    ] {
        let r = post(a, path, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = r.error();
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    // Unknown model: 404 model_not_found.
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 404);
    let e = r.error();
    assert_eq!(e["code"], "model_not_found");
    assert!(e["message"].as_str().unwrap().contains("llama-f32"));
    // Prompt past the context: 400 with the numbers.
    let long: Vec<u32> = (0..300).map(|i| 3 + i % 300).collect();
    let r = post(a, "/v1/completions", &json!({"prompt": long}));
    assert_eq!(r.status, 400);
    let e = r.error();
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("256") && msg.contains("300"), "{msg}");
    // Oversized body: 413.
    let big = json!({"prompt": "x".repeat(100 << 10)});
    let r = post(a, "/v1/completions", &big);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.error()["code"], "request_too_large");
    // Invalid UTF-8 and an empty body.
    let r = request(a, "POST", "/v1/completions", b"\xff\xfe{");
    assert_eq!(r.status, 400);
    let r = request(a, "POST", "/v1/completions", b"");
    assert_eq!(r.status, 400);
    // Wrong method.
    assert_eq!(get(a, "/v1/completions").status, 405);
    // The server is still fine, and counted the errors.
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let m = get(a, "/metrics").body;
    assert!(
        m.contains("kiln_request_errors_total{class=\"4xx\"} 1"),
        "{m}"
    );
}

#[test]
fn completion_usage_and_length() {
    let s = server();
    let body =
        json!({"prompt": "hello world", "max_tokens": 7, "temperature": 0, "ignore_eos": true});
    let r = post(s.addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 7);
    let p = u["prompt_tokens"].as_u64().unwrap();
    assert!(p > 0);
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + 7);
    // max_tokens past the context is capped by it.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 100000, "temperature": 0, "ignore_eos": true}),
    );
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 253, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Several prompts and n: choices prompt-major.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ["a", "b c"], "n": 2, "max_tokens": 3, "seed": 1, "ignore_eos": true}),
    );
    let v = r.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 4);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert_eq!(v["usage"]["completion_tokens"], 12);
}

#[test]
fn chat_stream_format_matches_whole_response() {
    let s = server();
    let msgs =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]);
    let whole = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 20, "temperature": 0, "ignore_eos": true}),
    )
    .json();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 20, "temperature": 0, "ignore_eos": true,
                "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].clone();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut streamed = String::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], id);
        assert!(
            c.get("usage").is_some(),
            "include_usage: every chunk has usage"
        );
        if let Some(ch) = c["choices"].as_array().and_then(|a| a.first()) {
            if let Some(t) = ch["delta"]["content"].as_str() {
                streamed.push_str(t);
            }
            if !ch["finish_reason"].is_null() {
                finish = Some(ch["finish_reason"].clone());
            }
        }
    }
    assert_eq!(streamed, text);
    assert_eq!(finish, Some(json!("length")));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 20);
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(last["usage"][k], whole["usage"][k]);
    }

    // Completions stream, no usage requested: no usage key.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 5, "stream": true, "ignore_eos": true}),
    );
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let c: Value = serde_json::from_str(&ev[0]).unwrap();
    assert_eq!(c["object"], "text_completion");
    assert!(c.get("usage").is_none());
}

#[test]
fn stop_strings_seeds_logprobs() {
    let s = server();
    let a = s.addr;
    let base = json!({"prompt": "the quick brown fox", "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let full = post(a, "/v1/completions", &base).json();
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the greedy text: output is cut before it.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    let stop: String = chars[8..11].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut b = base.clone();
    b["stop"] = json!([stop, "\u{1F600}never"]);
    let v = post(a, "/v1/completions", &b).json();
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 40);
    // Same through the stream.
    b["stream"] = json!(true);
    let r = post(a, "/v1/completions", &b);
    let mut streamed = String::new();
    let mut finish = Value::Null;
    for e in r.events() {
        if e == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&e).unwrap();
        streamed.push_str(c["choices"][0]["text"].as_str().unwrap_or(""));
        if !c["choices"][0]["finish_reason"].is_null() {
            finish = c["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!(streamed, cut);
    assert_eq!(finish, "stop");

    // Seeds: same seed, same sample; n choices differ from each other.
    let sampled = json!({"prompt": "x", "max_tokens": 16, "temperature": 1.0, "seed": 42,
                         "n": 3, "ignore_eos": true, "return_token_ids": true});
    let one = post(a, "/v1/completions", &sampled).json();
    let two = post(a, "/v1/completions", &sampled).json();
    assert_eq!(one["choices"], two["choices"]);
    let ids = |v: &Value, i: usize| v["choices"][i]["token_ids"].clone();
    assert_ne!(ids(&one, 0), ids(&one, 1));
    let mut other = sampled.clone();
    other["seed"] = json!(43);
    let three = post(a, "/v1/completions", &other).json();
    assert_ne!(ids(&one, 0), ids(&three, 0));

    // Logprobs: chat shape, greedy token is the top alternative.
    let v = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "q"}], "max_tokens": 4,
                "temperature": 0, "logprobs": true, "top_logprobs": 3, "ignore_eos": true}),
    )
    .json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(t["logprob"], top[0]["logprob"]);
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
        assert!(t["bytes"].is_array());
    }
    // Completions shape; logit_bias forces a token.
    let v = post(
        a,
        "/v1/completions",
        &json!({"prompt": "q", "max_tokens": 3, "logprobs": 2, "temperature": 0,
                "logit_bias": {"65": 100}, "ignore_eos": true, "return_token_ids": true}),
    )
    .json();
    assert_eq!(v["choices"][0]["token_ids"], json!([65, 65, 65]));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
}

/// Greedy output of a request alone vs. the same request in a batch with
/// others (different prompts and lengths, chunked prefill interleaved with
/// decode steps): identical token ids.
#[test]
fn batch_invariance_tiny() {
    let mut cfg = config(tiny_llama());
    cfg.parallel = 4;
    cfg.batch_size = 8; // prompts are prefilled in chunks between decode steps
    cfg.prefix_cache = false;
    let s = start(cfg);
    let a = s.addr;
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let prompt: Vec<u32> = (0..(5 + 13 * i)).map(|j| 3 + ((j * 7 + i * 11) % 380) as u32).collect();
            json!({"prompt": prompt, "max_tokens": 24 + 5 * i, "temperature": 0, "ignore_eos": true})
        })
        .collect();
    let alone: Vec<Vec<u32>> = bodies.iter().map(|b| completion_ids(a, b).0).collect();
    let together: Vec<Vec<u32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| sc.spawn(move || completion_ids(a, b).0))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
    // The batch did hold several sequences at once.
    let m = get(a, "/metrics").body;
    let mixed = m
        .lines()
        .find(|l| l.starts_with("kiln_step_batch_tokens_bucket{le=\"1\"}"))
        .unwrap();
    let total = metric(a, "kiln_step_batch_tokens_count");
    let ones: f64 = mixed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(ones < total, "no step had more than one token");
}

/// Clients that disconnect mid-stream: their sequences stop and the KV
/// blocks return to the pool.
#[test]
fn disconnect_frees_kv() {
    let mut cfg = config(tiny_llama());
    cfg.prefix_cache = false;
    cfg.parallel = 2;
    let s = start(cfg);
    let a = s.addr;
    for _ in 0..3 {
        let body =
            json!({"prompt": "a b c d", "max_tokens": 250, "ignore_eos": true, "stream": true})
                .to_string();
        let mut c = connect(a);
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        // Read until a couple of chunks arrived, then hang up.
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while got.windows(5).filter(|w| w == b"data:").count() < 2 {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        drop(c);
    }
    wait_for(30, "sequences to stop", || {
        metric(a, "kiln_running_sequences") == 0.0 && metric(a, "kiln_kv_blocks_used") == 0.0
    });
    let m = get(a, "/metrics").body;
    let total = metric(a, "kiln_kv_blocks_total");
    assert_eq!(metric(a, "kiln_kv_blocks_free"), total);
    // At least some were cut short (not run to max_tokens).
    let gen = metric(a, "kiln_generation_tokens_total");
    assert!(
        gen < 750.0,
        "{gen} tokens generated: disconnects not noticed\n{m}"
    );
    assert!(
        m.contains("kiln_sequences_finished_total{reason=\"cancelled\"} 3"),
        "{m}"
    );
}

/// A non-streaming client that hangs up before its answer: the request's
/// sequences (running and queued) are cancelled and every KV block returns
/// to the pool.
#[test]
fn non_streaming_disconnect_frees_kv() {
    let mut cfg = config(tiny_llama());
    cfg.prefix_cache = false;
    cfg.parallel = 2;
    let s = start(cfg);
    let a = s.addr;
    // 8 choices × 240 tokens on 2 slots: far more steps than the test needs
    // to see it start and hang up.
    let body =
        json!({"prompt": "a b c d", "max_tokens": 240, "ignore_eos": true, "n": 8}).to_string();
    let mut c = connect(a);
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_for(30, "generation to start", || {
        metric(a, "kiln_running_sequences") == 2.0
            && metric(a, "kiln_generation_tokens_total") > 0.0
    });
    assert!(metric(a, "kiln_kv_blocks_used") > 0.0);
    drop(c);
    wait_for(30, "the sequences to be cancelled", || {
        metric(a, "kiln_running_sequences") == 0.0
            && metric(a, "kiln_queue_depth") == 0.0
            && metric(a, "kiln_kv_blocks_used") == 0.0
    });
    let total = metric(a, "kiln_kv_blocks_total");
    assert_eq!(metric(a, "kiln_kv_blocks_free"), total);
    let m = get(a, "/metrics").body;
    let gen = metric(a, "kiln_generation_tokens_total");
    assert!(
        gen < 8.0 * 240.0,
        "{gen} tokens generated: the disconnect was not noticed\n{m}"
    );
    assert!(
        m.contains("kiln_sequences_finished_total{reason=\"cancelled\"} 8"),
        "{m}"
    );
    // The server still serves.
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}

#[test]
fn queue_full_is_429_and_shutdown_is_503() {
    let mut cfg = config(tiny_llama());
    cfg.max_queue = 0;
    let s = start(cfg);
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "a"}));
    assert_eq!(r.status, 429);
    assert_eq!(r.error()["code"], "queue_full");
    assert!(metric(s.addr, "kiln_requests_rejected_total") >= 1.0);
    s.state.sched.close();
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "a"}));
    assert_eq!(r.status, 503);
    assert_eq!(get(s.addr, "/health").status, 503);
}

/// Graceful shutdown: an in-flight stream completes, then the port closes.
#[test]
fn graceful_shutdown_finishes_in_flight() {
    let s = server();
    let a = s.addr;
    let body = json!({"prompt": "x", "max_tokens": 200, "ignore_eos": true, "stream": true,
                      "temperature": 0});
    let h = std::thread::spawn(move || post(a, "/v1/completions", &body));
    wait_for(30, "the request to start", || {
        metric(a, "kiln_generation_tokens_total") > 0.0
    });
    s.shutdown().unwrap();
    let r = h.join().unwrap();
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let finish: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![json!("length")]);
    assert!(std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_err());
}

/// Past the grace period, in-flight and queued requests are cancelled with
/// a 503, and the server still stops.
#[test]
fn shutdown_cancels_after_grace() {
    let mut cfg = config(tiny_llama());
    cfg.shutdown_grace = Duration::from_millis(0);
    cfg.parallel = 1;
    let s = start(cfg);
    let a = s.addr;
    let body = json!({"prompt": "x", "max_tokens": 250, "ignore_eos": true});
    let hs: Vec<_> = (0..6)
        .map(|_| {
            let b = body.clone();
            std::thread::spawn(move || post(a, "/v1/completions", &b))
        })
        .collect();
    // Every request must have reached the scheduler first: a client that
    // connects after shutdown began is (rightly) refused, not cancelled. On a
    // loaded machine the first may finish before the last arrives, so
    // finished sequences count too.
    wait_for(30, "all requests queued, running or finished", || {
        metric(a, "kiln_queue_depth")
            + metric(a, "kiln_running_sequences")
            + metric_sum(a, "kiln_sequences_finished_total")
            >= 6.0
    });
    wait_for(30, "generation to start", || {
        metric(a, "kiln_generation_tokens_total") > 0.0
    });
    s.shutdown().unwrap();
    let statuses: Vec<u16> = hs
        .into_iter()
        .map(|h| {
            let r = h.join().unwrap();
            if r.status == 503 {
                assert_eq!(r.error()["code"], "shutting_down");
            }
            r.status
        })
        .collect();
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );
    assert!(statuses.contains(&503), "{statuses:?}");
}

/// Prefix cache: a second request sharing the prompt prefix reuses its KV
/// and gives the same output as without the cache.
#[test]
fn prefix_cache_reuses_and_matches() {
    let s = start(config(tiny_llama()));
    let mut cfg = config(tiny_llama());
    cfg.prefix_cache = false;
    let plain = start(cfg);
    let sys: Vec<u32> = (0..100).map(|i| 3 + (i * 5) % 300).collect();
    let mut p2 = sys.clone();
    p2.extend([7, 8, 9, 10]);
    let b1 = json!({"prompt": sys, "max_tokens": 10, "temperature": 0, "ignore_eos": true});
    let b2 = json!({"prompt": p2, "max_tokens": 10, "temperature": 0, "ignore_eos": true});
    let r1 = post(s.addr, "/v1/completions", &b1).json();
    assert_eq!(r1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let r2 = post(s.addr, "/v1/completions", &b2).json();
    let cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, 100, "{r2}");
    assert!(metric(s.addr, "kiln_kv_blocks_cached") > 0.0);
    let fresh = post(plain.addr, "/v1/completions", &b2).json();
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(r2["choices"][0]["text"], fresh["choices"][0]["text"]);
    // Multi-turn: the continuation of a generated answer reuses it too.
    let mut turn: Vec<u32> = serde_json::from_value(b2["prompt"].clone()).unwrap();
    let (ids, _) = completion_ids(s.addr, &b2);
    turn.extend(&ids);
    turn.extend([11, 12]);
    let b3 = json!({"prompt": turn, "max_tokens": 5, "temperature": 0, "ignore_eos": true, "return_token_ids": true});
    let r3 = post(s.addr, "/v1/completions", &b3).json();
    let c3 = r3["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(c3 >= 104 + 9, "{r3}");
    let f3 = post(plain.addr, "/v1/completions", &b3).json();
    assert_eq!(r3["choices"][0]["token_ids"], f3["choices"][0]["token_ids"]);
}

/// A KV pool smaller than the slots need: sequences are preempted and
/// recomputed, and their greedy outputs do not change.
#[test]
fn preemption_keeps_outputs() {
    let mut cfg = config(tiny_llama());
    cfg.parallel = 4;
    cfg.kv_tokens = Some(320); // 20 blocks; 4 sequences of ~140 positions need 36
    cfg.prefix_cache = false;
    let s = start(cfg);
    let a = s.addr;
    let bodies: Vec<Value> = (0..4)
        .map(|i| {
            let prompt: Vec<u32> = (0..20)
                .map(|j| 3 + ((j * 3 + i * 17) % 380) as u32)
                .collect();
            json!({"prompt": prompt, "max_tokens": 120, "temperature": 0, "ignore_eos": true})
        })
        .collect();
    let alone: Vec<Vec<u32>> = bodies.iter().map(|b| completion_ids(a, b).0).collect();
    let together: Vec<Vec<u32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| sc.spawn(move || completion_ids(a, b).0))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (x, y) in alone.iter().zip(&together) {
        assert_eq!(x.len(), 120);
        assert_eq!(x, y);
    }
    assert!(metric(a, "kiln_preemptions_total") > 0.0);
    assert_eq!(metric(a, "kiln_kv_blocks_used"), 0.0);
}

/// Many concurrent clients on few slots: every request completes with the
/// right counts.
#[test]
fn many_clients_queue_and_complete() {
    let mut cfg = config(tiny_llama());
    cfg.parallel = 3;
    let s = start(cfg);
    let a = s.addr;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|sc| {
        for i in 0..16 {
            let done = Arc::clone(&done);
            sc.spawn(move || {
                let stream = i % 2 == 0;
                let body = json!({"prompt": format!("client {i}"), "max_tokens": 8 + i,
                                  "ignore_eos": true, "stream": stream,
                                  "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }});
                let r = post(a, "/v1/completions", &body);
                assert_eq!(r.status, 200, "{}", r.body);
                let usage = if stream {
                    let ev = r.events();
                    assert_eq!(ev.last().unwrap(), "[DONE]");
                    serde_json::from_str::<Value>(&ev[ev.len() - 2]).unwrap()["usage"].clone()
                } else {
                    r.json()["usage"].clone()
                };
                assert_eq!(usage["completion_tokens"], 8 + i);
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 16);
    let m = get(a, "/metrics").body;
    assert!(
        m.contains("kiln_requests_total{endpoint=\"completions\"} 16"),
        "{m}"
    );
    let total: u64 = (0..16).map(|i| 8 + i).sum();
    assert_eq!(metric(a, "kiln_generation_tokens_total"), total as f64);
    wait_for(10, "the gauges to settle", || {
        metric(a, "kiln_running_sequences") == 0.0 && metric(a, "kiln_queue_depth") == 0.0
    });
}
