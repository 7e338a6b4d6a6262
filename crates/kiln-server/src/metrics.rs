//! Server metrics, rendered in the Prometheus text format at `GET /metrics`.
//!
//! Counters and gauges are atomics; histograms sit behind a mutex (they are
//! written once per token by the engine thread and read by scrapes).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
}

/// Every number `/metrics` shows.
#[derive(Debug)]
pub struct Metrics {
    pub requests_chat: Counter,
    pub requests_completions: Counter,
    /// Requests answered with an error status, by class.
    pub errors_4xx: Counter,
    pub errors_5xx: Counter,
    pub rejected_queue_full: Counter,
    pub finished_stop: Counter,
    pub finished_length: Counter,
    pub finished_cancelled: Counter,
    pub finished_error: Counter,
    pub prompt_tokens: Counter,
    pub prompt_tokens_cached: Counter,
    pub generation_tokens: Counter,
    pub engine_steps: Counter,
    pub preemptions: Counter,
    /// Gauges (set by the engine thread after each step).
    pub queue_depth: Counter,
    pub running: Counter,
    pub kv_blocks_used: Counter,
    pub kv_blocks_free: Counter,
    pub kv_blocks_cached: Counter,
    pub kv_blocks_total: Counter,
    pub slots_total: Counter,
    pub ttft: Mutex<Histogram>,
    pub itl: Mutex<Histogram>,
    pub batch_tokens: Mutex<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests_chat: Counter::default(),
            requests_completions: Counter::default(),
            errors_4xx: Counter::default(),
            errors_5xx: Counter::default(),
            rejected_queue_full: Counter::default(),
            finished_stop: Counter::default(),
            finished_length: Counter::default(),
            finished_cancelled: Counter::default(),
            finished_error: Counter::default(),
            prompt_tokens: Counter::default(),
            prompt_tokens_cached: Counter::default(),
            generation_tokens: Counter::default(),
            engine_steps: Counter::default(),
            preemptions: Counter::default(),
            queue_depth: Counter::default(),
            running: Counter::default(),
            kv_blocks_used: Counter::default(),
            kv_blocks_free: Counter::default(),
            kv_blocks_cached: Counter::default(),
            kv_blocks_total: Counter::default(),
            slots_total: Counter::default(),
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(ITL_BUCKETS)),
            batch_tokens: Mutex::new(Histogram::new(BATCH_BUCKETS)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn observe_ttft(&self, secs: f64) {
        lock(&self.ttft).observe(secs);
    }
    pub fn observe_itl(&self, secs: f64) {
        lock(&self.itl).observe(secs);
    }
    pub fn observe_batch(&self, tokens: usize) {
        lock(&self.batch_tokens).observe(tokens as f64);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(4096);
        let mut one = |name: &str, kind: &str, help: &str, rows: &[(&str, u64)]| {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} {kind}");
            for (labels, v) in rows {
                if labels.is_empty() {
                    let _ = writeln!(o, "{name} {v}");
                } else {
                    let _ = writeln!(o, "{name}{{{labels}}} {v}");
                }
            }
        };
        one(
            "kiln_requests_total",
            "counter",
            "Generation requests received, by endpoint.",
            &[
                ("endpoint=\"chat_completions\"", self.requests_chat.get()),
                ("endpoint=\"completions\"", self.requests_completions.get()),
            ],
        );
        one(
            "kiln_request_errors_total",
            "counter",
            "Requests answered with an error status, by class.",
            &[
                ("class=\"4xx\"", self.errors_4xx.get()),
                ("class=\"5xx\"", self.errors_5xx.get()),
            ],
        );
        one(
            "kiln_requests_rejected_total",
            "counter",
            "Requests refused because the queue was full.",
            &[("", self.rejected_queue_full.get())],
        );
        one(
            "kiln_sequences_finished_total",
            "counter",
            "Sequences (choices) finished, by reason.",
            &[
                ("reason=\"stop\"", self.finished_stop.get()),
                ("reason=\"length\"", self.finished_length.get()),
                ("reason=\"cancelled\"", self.finished_cancelled.get()),
                ("reason=\"error\"", self.finished_error.get()),
            ],
        );
        one(
            "kiln_prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted sequences.",
            &[("", self.prompt_tokens.get())],
        );
        one(
            "kiln_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens whose KV was reused from the prefix cache.",
            &[("", self.prompt_tokens_cached.get())],
        );
        one(
            "kiln_generation_tokens_total",
            "counter",
            "Tokens generated.",
            &[("", self.generation_tokens.get())],
        );
        one(
            "kiln_engine_steps_total",
            "counter",
            "Forward steps run by the scheduler.",
            &[("", self.engine_steps.get())],
        );
        one(
            "kiln_preemptions_total",
            "counter",
            "Sequences preempted (KV recomputed later) because the block pool ran out.",
            &[("", self.preemptions.get())],
        );
        one(
            "kiln_queue_depth",
            "gauge",
            "Sequences waiting for a slot.",
            &[("", self.queue_depth.get())],
        );
        one(
            "kiln_running_sequences",
            "gauge",
            "Sequences in the running batch.",
            &[("", self.running.get())],
        );
        one(
            "kiln_slots_total",
            "gauge",
            "Sequence slots (--parallel).",
            &[("", self.slots_total.get())],
        );
        one(
            "kiln_kv_blocks_used",
            "gauge",
            "KV blocks in use (running sequences plus the prefix cache).",
            &[("", self.kv_blocks_used.get())],
        );
        one(
            "kiln_kv_blocks_cached",
            "gauge",
            "KV blocks held by idle slots for prefix reuse (freed on demand).",
            &[("", self.kv_blocks_cached.get())],
        );
        one(
            "kiln_kv_blocks_free",
            "gauge",
            "KV blocks free in the pool.",
            &[("", self.kv_blocks_free.get())],
        );
        one(
            "kiln_kv_blocks_total",
            "gauge",
            "KV blocks in the pool.",
            &[("", self.kv_blocks_total.get())],
        );
        lock(&self.ttft).render(
            &mut o,
            "kiln_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
        );
        lock(&self.itl).render(
            &mut o,
            "kiln_inter_token_latency_seconds",
            "Time between consecutive tokens of one sequence.",
        );
        lock(&self.batch_tokens).render(
            &mut o,
            "kiln_step_batch_tokens",
            "Tokens per forward step (decode tokens plus prefill chunks).",
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(0.5);
        h.observe(1.5);
        h.observe(9.0);
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"1\"} 1\n"));
        assert!(s.contains("x_bucket{le=\"2\"} 2\n"));
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("x_count 3\n"));
    }
}
