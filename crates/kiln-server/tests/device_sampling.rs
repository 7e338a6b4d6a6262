//! A backend that samples on its device (as the CUDA backend does): steps
//! whose sequences are all greedy come back as ids only, and every output —
//! greedy, seeded sampling, logprobs, mixed in one batch — is the one the
//! plain CPU backend gives.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use kiln_core::{sampler::argmax, ArchDescriptor, Backend, Batch, DeviceSampling, KvTables};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_server::{BackendSpec, ServerConfig};
use serde_json::{json, Value};

/// The CPU backend, with greedy "device" sampling (argmax of its own
/// logits); sampling at a temperature is refused, so the scheduler must keep
/// those steps on the host.
struct DeviceGreedy {
    inner: CpuBackend,
    logits: Vec<f32>,
    sampled_steps: Arc<AtomicUsize>,
}

impl Backend for DeviceGreedy {
    fn desc(&self) -> &ArchDescriptor {
        self.inner.desc()
    }
    fn max_batch_tokens(&self) -> usize {
        self.inner.max_batch_tokens()
    }
    fn forward(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        logits: &mut [f32],
    ) -> kiln_core::Result<()> {
        self.inner.forward(batch, kv, logits)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn forward_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[DeviceSampling],
        ids: &mut [u32],
    ) -> kiln_core::Result<()> {
        let rows = batch.n_logits();
        if params[..rows].iter().any(|p| p.temperature > 0.0) {
            return Err(kiln_core::EngineError::Input(
                "test backend: greedy only".into(),
            ));
        }
        let vocab = self.inner.desc().vocab_size;
        self.inner.forward(batch, kv, &mut self.logits)?;
        for (id, row) in ids.iter_mut().zip(self.logits.chunks(vocab).take(rows)) {
            *id = argmax(row);
        }
        self.sampled_steps.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn device_server(cfg: &ServerConfig) -> (kiln_server::RunningServer, Arc<AtomicUsize>) {
    let steps = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&steps);
    let state = kiln_server::load_with(
        cfg,
        Box::new(move |s: BackendSpec| {
            let vocab = s.desc.vocab_size;
            let rows = s.max_batch;
            let inner = CpuBackend::new(
                s.model,
                s.desc,
                s.layout,
                s.max_batch,
                CpuOptions { threads: 1 },
            )
            .map_err(|e| e.to_string())?;
            let b = DeviceGreedy {
                inner,
                logits: vec![0.0; vocab * rows],
                sampled_steps: counter,
            };
            Ok((
                Box::new(b) as Box<dyn Backend>,
                "device-greedy test".to_string(),
            ))
        }),
    )
    .unwrap_or_else(|e| panic!("server: {e}"));
    let s = kiln_server::start_with(cfg, state).unwrap_or_else(|e| panic!("server: {e}"));
    (s, steps)
}

/// Token ids and logprobs of each request, sent all at once.
fn run_all(addr: std::net::SocketAddr, bodies: &[Value]) -> Vec<(Vec<u64>, Value)> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| {
                sc.spawn(move || {
                    let mut b = b.clone();
                    b["return_token_ids"] = json!(true);
                    let r = post(addr, "/v1/completions", &b);
                    assert_eq!(r.status, 200, "{}", r.body);
                    let v = r.json();
                    let c = &v["choices"][0];
                    let ids = c["token_ids"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_u64).collect())
                        .unwrap_or_default();
                    (ids, c["logprobs"].clone())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("client")).collect()
    })
}

#[test]
fn device_greedy_steps_match_the_host() {
    let mut cfg = config(tiny_llama());
    cfg.parallel = 4;
    let greedy: Vec<Value> = (0..4)
        .map(|i| json!({"prompt": format!("greedy {i}"), "max_tokens": 12 + i, "temperature": 0, "ignore_eos": true}))
        .collect();
    let mut mixed = greedy.clone();
    mixed.push(json!({"prompt": "sampled", "max_tokens": 12, "temperature": 0.9, "seed": 7, "ignore_eos": true}));
    mixed.push(json!({"prompt": "with logprobs", "max_tokens": 8, "temperature": 0, "logprobs": 2, "ignore_eos": true}));
    mixed.push(json!({"prompt": "penalized", "max_tokens": 8, "temperature": 0, "frequency_penalty": 1.5, "ignore_eos": true}));

    let host = start(cfg.clone());
    let want_greedy = run_all(host.addr, &greedy);
    let want_mixed = run_all(host.addr, &mixed);
    drop(host);

    let (dev, steps) = device_server(&cfg);
    let r = get(dev.addr, "/health").json();
    assert_eq!(r["backend"], "device-greedy test");
    assert_eq!(run_all(dev.addr, &greedy), want_greedy);
    let after_greedy = steps.load(Ordering::SeqCst);
    assert!(after_greedy > 0, "no step was sampled on the device");
    assert_eq!(run_all(dev.addr, &mixed), want_mixed);
    // With only greedy requests every step ran on the device: at least one
    // per token of the longest request.
    assert!(after_greedy >= 15, "{after_greedy} device steps");
}
