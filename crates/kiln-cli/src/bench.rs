//! `kiln bench MODEL -p 128 -n 64 -t 2 -r 5`: llama-bench style throughput.
//!
//! Each test runs once to warm up, then `-r` times, each on an empty KV
//! cache: `ppN` feeds N prompt tokens in one forward call, `tgN` decodes N
//! tokens one at a time. The markdown table and the `-o json` records use
//! llama-bench's columns and field names, so tooling that reads llama-bench
//! reads kiln.
//!
//! `kiln bench MODEL --batch 1,8,32,64,128 [-p 128] [-n 128]`: like
//! llama-batched-bench. For each batch size B, B sequences each get a P-token
//! prompt (whole prompts packed into forwards of up to 1024 tokens, like
//! batched-bench's n_batch), then G decode steps each feed one
//! token of every sequence as one batch. Reported: prompt time and tok/s,
//! generation time and aggregate tok/s, total; the table and the `-o json`
//! records use llama-batched-bench's columns and field names.
//!
//! The backend is built as `kiln run` builds it (`--device`, `--gpu-mem`);
//! the records' `backend` field says `cpu` or `cuda`. Generated tokens are
//! greedy; a backend that samples on its device (CUDA) returns only the ids
//! (`sampling`: `device`), others return logits rows argmaxed on the host
//! (`host`). Where the backend can queue steps (CUDA), `tgN` decodes as
//! `kiln run` does: each step is queued before the host reads the id of the
//! one before, its token taken on the device (`decode_loop`: `pipelined`);
//! `--sync-steps` waits for each id before queuing the next step, as
//! llama-bench's loop does (`sync`).
//!
//! Each `tgN` also gets its decode floor: the bytes one step reads (the
//! weights, an untied embedding table one row, plus the K/V at the test's
//! mean depth) over a measured bandwidth — on CUDA the device's copy rate,
//! measured at start; on the CPU the threads' read rate, with `--floor`.

use std::path::PathBuf;
use std::time::Instant;

use kiln_core::engine::{Feed, Logits};
use kiln_core::kv::KvTypes;
use kiln_core::{ArchDescriptor, Backend, DeviceSampling, Engine, KvLayout};
use kiln_cpu::Kernels;
use kiln_format::{Model, TensorType};

use crate::engine_args::{self, BackendKind, Built, CpuChoice, DeviceArgs, Opened};
use crate::CliResult;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Md,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelArg {
    Fast,
    Reference,
}

fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse()
                .map_err(|_| format!("'{p}' is not a count"))
        })
        .collect()
}

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file or Hugging Face model folder (default: SmolLM2-135M-Instruct, downloaded once).
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// Prompt lengths to time (comma-separated; 0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value = "128", value_parser = parse_list)]
    pub n_prompt: Vec<Vec<usize>>,
    /// Generation lengths to time (comma-separated; 0 skips; default 64,
    /// with --batch 128).
    #[arg(short = 'n', long = "n-gen", value_parser = parse_list)]
    pub n_gen: Vec<Vec<usize>>,
    /// Batched mode: numbers of sequences decoded together (comma-separated),
    /// each with a -p prompt and -n generated tokens, like llama-batched-bench.
    #[arg(long = "batch", value_parser = parse_list)]
    pub batch: Vec<Vec<usize>>,
    /// Thread counts (comma-separated; default: all cores; CPU only).
    #[arg(short = 't', long = "threads", value_parser = parse_list)]
    pub threads: Vec<Vec<usize>>,
    /// Repetitions per test after one warm-up run (default 5; with --batch 1).
    #[arg(short = 'r', long = "repetitions")]
    pub reps: Option<usize>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Md)]
    pub output: Output,
    /// CPU kernels (default: fast; the scalar reference for comparison).
    #[arg(long, value_enum, default_value_t = KernelArg::Fast)]
    pub kernels: KernelArg,
    /// Also measure read bandwidth (MiB of buffer, per thread count) and
    /// report each generation test's fraction of the bandwidth floor (CPU).
    #[arg(long = "floor", num_args = 0..=1, default_missing_value = "512")]
    pub floor: Option<usize>,
    /// Decode tests wait for each token's id before queuing the next step
    /// (llama-bench's loop) instead of pipelining as `kiln run` does.
    #[arg(long = "sync-steps")]
    pub sync_steps: bool,
}

/// Bytes one decode step reads: every matrix, except that the embedding
/// is read one row per token unless it doubles as the output matrix.
fn bytes_per_token(m: &Model) -> u64 {
    let tied = m.tensor("output.weight").is_none();
    let mut total = 0u64;
    for t in m.tensors() {
        if t.name == "token_embd.weight" && !tied {
            let rows = t.logical_shape().first().copied().unwrap_or(1).max(1);
            total += t.n_bytes / rows;
        } else {
            total += t.n_bytes;
        }
    }
    total
}

/// Mean K/V bytes one decode step reads over `n` steps from an empty
/// cache: step i attends to i + 1 positions (a sliding layer to at most its
/// window), each K and V row of `n_kv_heads * head_dim` values.
fn kv_bytes_per_token(desc: &ArchDescriptor, kv: KvTypes, n: usize) -> f64 {
    let row = (desc.n_kv_heads * desc.head_dim * (kv.k.size() + kv.v.size())) as f64;
    let positions: usize = desc
        .layers
        .iter()
        .map(|l| {
            (1..=n)
                .map(|d| l.window.map_or(d, |w| d.min(w)))
                .sum::<usize>()
        })
        .sum();
    row * positions as f64 / n.max(1) as f64
}

#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Best read bandwidth (bytes/s) of `threads` threads summing their share
/// of a `mib` MiB buffer, over five passes.
fn read_bandwidth(threads: usize, mib: usize) -> f64 {
    let n = (mib.max(64) << 20) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    let per = n.div_ceil(threads.max(1));
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let s: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = buf
                .chunks(per)
                .map(|c| {
                    sc.spawn(move || {
                        let mut acc = [0u64; 8];
                        for (i, v) in c.chunks_exact(8).enumerate() {
                            // Prefetch 4 KiB ahead, as the kernels do.
                            prefetch(c.as_ptr().wrapping_add(i * 8 + 512));
                            for j in 0..8 {
                                acc[j] = acc[j].wrapping_add(v[j]);
                            }
                        }
                        acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(s);
        best = best.max((n * 8) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn mean_sd(s: &[f64]) -> (f64, f64) {
    let n = s.len().max(1) as f64;
    let mean = s.iter().sum::<f64>() / n;
    let var = if s.len() > 1 {
        s.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// llama.cpp's names of GGUF `general.file_type` values.
fn ftype_name(t: i64) -> Option<&'static str> {
    Some(match t {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

/// llama-bench's "model type": architecture, parameter count, and the
/// type holding most of the matrix bytes.
fn describe(m: &Model) -> (String, u64, u64) {
    let mut by_type: Vec<(String, u64)> = Vec::new();
    let (mut params, mut bytes) = (0u64, 0u64);
    for t in m.tensors() {
        params += t.n_elements();
        bytes += t.n_bytes;
        if t.shape.len() >= 2 {
            let name = match t.ty {
                TensorType::Ggml(g) => g.to_string(),
                other => other.to_string(),
            };
            match by_type.iter_mut().find(|(n, _)| *n == name) {
                Some((_, b)) => *b += t.n_bytes,
                None => by_type.push((name, t.n_bytes)),
            }
        }
    }
    by_type.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let ftype = m
        .gguf
        .as_ref()
        .and_then(|g| g.get("general.file_type"))
        .and_then(|v| v.as_int())
        .and_then(|t| ftype_name(t as i64));
    // The largest is often the (Q8_0/Q6_K) embedding; name the layers' type.
    let ty = ftype
        .map(str::to_string)
        .or_else(|| {
            by_type
                .iter()
                .find(|(n, _)| n != "Q8_0" && n != "Q6_K" && n != "F32")
                .or(by_type.first())
                .map(|(n, _)| n.clone())
        })
        .unwrap_or_else(|| "?".to_string());
    let p = params as f64;
    let size = if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else {
        format!("{:.0}M", p / 1e6)
    };
    (
        format!("{} {size} {ty}", m.config.arch.name()),
        params,
        bytes,
    )
}

/// What every record says about the model and the backend it ran on.
struct Setup {
    filename: String,
    model_type: String,
    params: u64,
    size: u64,
    bytes_per_token: u64,
    desc: ArchDescriptor,
    kv: KvTypes,
}

/// The backend one group of records ran on.
#[derive(Clone, Copy)]
struct On {
    kind: BackendKind,
    kernels: Kernels,
    threads: usize,
    /// Greedy tokens are picked on the device (only ids come back).
    device_sampling: bool,
    /// Decode steps are queued ahead of the host reading their ids.
    pipelined: bool,
}

impl On {
    /// The `backend` column of the markdown tables.
    fn label(&self) -> &'static str {
        match (self.kind, self.kernels) {
            (BackendKind::Cuda, _) => "cuda",
            (BackendKind::Cpu, Kernels::Fast) => "cpu",
            (BackendKind::Cpu, Kernels::Reference) => "cpu (reference)",
        }
    }
}

/// A `tgN` record's decode floor.
struct Floor {
    /// Mean K/V bytes a step reads.
    kv: f64,
    /// The bandwidth it is taken at (bytes/s).
    bandwidth: f64,
    /// Steps a second at that bandwidth.
    ts: f64,
}

impl Setup {
    /// The floor of a `tgN` record with a measured bandwidth: the weights
    /// and the mean K/V a step reads, over that bandwidth.
    fn floor(&self, r: &Record) -> Option<Floor> {
        let bandwidth = r.bandwidth.filter(|_| r.n_gen > 0)?;
        let kv = kv_bytes_per_token(&self.desc, self.kv, r.n_gen);
        let ts = bandwidth / (self.bytes_per_token as f64 + kv);
        Some(Floor { kv, bandwidth, ts })
    }

    /// The fields every JSON record starts with; each mode adds its own.
    fn json(&self, on: On) -> serde_json::Value {
        let mut v = serde_json::json!({
            "model_filename": self.filename,
            "model_type": self.model_type,
            "model_size": self.size,
            "model_n_params": self.params,
            "n_threads": on.threads,
            "backend": on.kind.as_str(),
            "sampling": if on.device_sampling { "device" } else { "host" },
            "decode_loop": if on.pipelined { "pipelined" } else { "sync" },
        });
        if on.kind == BackendKind::Cpu {
            v["kernels"] = serde_json::json!(match on.kernels {
                Kernels::Fast => "fast",
                Kernels::Reference => "reference",
            });
        }
        v
    }
}

/// One `ppN` or `tgN` test.
struct Record {
    on: On,
    /// The floor's bandwidth (bytes/s): the device's copy rate (CUDA), or
    /// the read rate of this thread count with --floor (CPU).
    bandwidth: Option<f64>,
    n_prompt: usize,
    n_gen: usize,
    samples: Vec<f64>,
}

/// One batched run: `pl` sequences × (`pp` prompt + `tg` generated tokens).
struct BatchRecord {
    on: On,
    n_kv_max: usize,
    pp: usize,
    tg: usize,
    pl: usize,
    /// Mean seconds over the repetitions.
    t_pp: f64,
    t_tg: f64,
}

impl BatchRecord {
    fn n_kv(&self) -> usize {
        self.pl * (self.pp + self.tg)
    }
    fn speed_pp(&self) -> f64 {
        per_sec(self.pl * self.pp, self.t_pp)
    }
    fn speed_tg(&self) -> f64 {
        per_sec(self.pl * self.tg, self.t_tg)
    }
    fn t(&self) -> f64 {
        self.t_pp + self.t_tg
    }
    fn speed(&self) -> f64 {
        per_sec(self.n_kv(), self.t())
    }
}

fn per_sec(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// The same pseudo-random prompt as bench/llamacpp_bench.py (sequence 0);
/// sequence `s` continues the series where sequence `s - 1` stopped.
fn prompt_tokens(seq: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| (((seq * len + i) as u64 * 7919 + 13) % vocab.max(1) as u64) as u32)
        .collect()
}

pub fn run(a: Args) -> CliResult {
    let Opened { path, model, desc } = engine_args::open(a.model.clone())?;
    let (model_type, params, size) = describe(&model);
    let setup = Setup {
        filename: path.display().to_string(),
        model_type,
        params,
        size,
        bytes_per_token: bytes_per_token(&model),
        desc: desc.clone(),
        kv: a.dev.kv_types(),
    };
    let prompts: Vec<usize> = a.n_prompt.concat().into_iter().filter(|&p| p > 0).collect();
    let batches: Vec<usize> = a.batch.concat();
    let batched = !batches.is_empty();
    let gens: Vec<usize> = match a.n_gen.concat() {
        g if g.is_empty() => vec![if batched { 128 } else { 64 }],
        g => g,
    };
    let gens: Vec<usize> = gens.into_iter().filter(|&n| n > 0).collect();
    if let Some(&b) = batches.iter().find(|&&b| b == 0) {
        return Err(format!("--batch {b}: a batch holds at least one sequence").into());
    }
    let threads: Vec<usize> = match a.threads.concat() {
        t if t.is_empty() => vec![CpuChoice::threads(None).threads],
        t => t,
    };
    if let Some(&t) = threads.iter().find(|&&t| t == 0) {
        return Err(format!("-t {t}: at least one thread").into());
    }
    let kernels = match a.kernels {
        KernelArg::Fast => Kernels::Fast,
        KernelArg::Reference => Kernels::Reference,
    };
    let reps = a.reps.unwrap_or(if batched { 1 } else { 5 }).max(1);
    let vocab = desc.vocab_size;

    // Plan: (ctx, sequences, tokens per forward step).
    let max_p = prompts.iter().copied().max().unwrap_or(0);
    let max_n = gens.iter().copied().max().unwrap_or(0);
    let (ctx, max_seqs, max_chunk) = if batched {
        let max_b = batches.iter().copied().max().unwrap_or(1);
        // Steps of up to 1024 tokens (whole prompts packed) or one token of
        // every sequence, whichever is more.
        let step = max_p.max((max_b * max_p).min(1024)).max(max_b).max(1);
        ((max_p + max_n).max(1), max_b, step)
    } else {
        (max_p + max_n + 8, 1, max_p.max(1))
    };
    if ctx > desc.context_length.max(1) {
        eprintln!(
            "kiln: warning: {ctx} positions per sequence exceed the model's context of {}",
            desc.context_length
        );
    }
    let layout = KvLayout::plan(&desc, ctx, max_seqs, 16, max_chunk);

    let mut records = Vec::new();
    let mut batch_records = Vec::new();
    for &nt in &threads {
        let Built {
            mut backend, kind, ..
        } = engine_args::make_backend(
            &model,
            &desc,
            &layout,
            max_chunk,
            a.dev,
            CpuChoice {
                threads: nt,
                kernels: Some(kernels),
            },
        )
        .map_err(|e| e as Box<dyn std::error::Error>)?;
        let device_sampling = backend.samples_on_device();
        let on = On {
            kind,
            kernels,
            threads: nt,
            device_sampling,
            pipelined: device_sampling && backend.pipelines_sampling() && !a.sync_steps,
        };
        // The floor's bandwidth: the CPU's read rate, the GPU's copy rate.
        let bandwidth = match kind {
            BackendKind::Cpu => a.floor.map(|mib| read_bandwidth(nt, mib)),
            BackendKind::Cuda => backend.copy_bandwidth(),
        };
        let mut e = Engine::new(backend, layout.clone());
        if batched {
            for &p in &prompts_or_zero(&prompts) {
                for &g in &gens {
                    for &b in &batches {
                        let (t_pp, t_tg) = time_batched(&mut e, reps, b, p, g, vocab)?;
                        batch_records.push(BatchRecord {
                            on,
                            n_kv_max: ctx * max_seqs,
                            pp: p,
                            tg: g,
                            pl: b,
                            t_pp,
                            t_tg,
                        });
                    }
                }
            }
        } else {
            let tokens = prompt_tokens(0, max_p.max(2), vocab);
            for &p in &prompts {
                let samples = rates(reps, p, &mut e, |e| e.prefill(0, &tokens[..p]).map(|_| ()))?;
                records.push(Record {
                    on,
                    bandwidth,
                    n_prompt: p,
                    n_gen: 0,
                    samples,
                });
            }
            for &n in &gens {
                let samples = rates(reps, n, &mut e, |e| {
                    if on.pipelined {
                        return e.decode_chain(0, tokens[0], n, GREEDY).map(|_| ());
                    }
                    let mut tok = tokens[0];
                    for _ in 0..n {
                        tok = if on.device_sampling {
                            e.decode_sampled(0, tok, GREEDY)?
                        } else {
                            kiln_core::sampler::argmax(e.decode(0, tok)?)
                        };
                    }
                    Ok(())
                })?;
                records.push(Record {
                    on,
                    bandwidth,
                    n_prompt: 0,
                    n_gen: n,
                    samples,
                });
            }
        }
        if kind == BackendKind::Cuda {
            // Thread counts only matter on the CPU.
            break;
        }
    }
    let out = match (batched, a.output) {
        (false, Output::Json) => tests_json(&setup, &records)?,
        (false, Output::Md) => tests_md(&setup, &records),
        (true, Output::Json) => batched_json(&setup, &batch_records)?,
        (true, Output::Md) => batched_md(&setup, &batch_records),
    };
    crate::write_stdout(&out)?;
    Ok(())
}

/// Greedy sampling on the device.
const GREEDY: DeviceSampling = DeviceSampling {
    temperature: 0.0,
    top_k: 0,
    seed: 0,
};

/// The prompt lengths of batched runs; `-p 0` alone runs generation only.
fn prompts_or_zero(prompts: &[usize]) -> Vec<usize> {
    if prompts.is_empty() {
        vec![0]
    } else {
        prompts.to_vec()
    }
}

/// One warm-up (the same prompts, two decode steps of `b` sequences), then
/// `reps` timed runs of `b` sequences × (`p` prompt, `g` generated tokens).
/// Returns the mean prompt and generation seconds. (Short warm-up prompts
/// left the prompt step's own kernels cold: on CUDA the first 2-sequence
/// prefill of 128-token prompts was the process's first cuBLAS GEMM, 0.115
/// s for 256 tokens against 0.045 s for 512.)
fn time_batched<B: Backend>(
    e: &mut Engine<B>,
    reps: usize,
    b: usize,
    p: usize,
    g: usize,
    vocab: usize,
) -> kiln_core::Result<(f64, f64)> {
    let (mut t_pp, mut t_tg) = (0.0, 0.0);
    batched_once(e, b, p, g.min(2), vocab)?;
    for _ in 0..reps {
        let (pp, tg) = batched_once(e, b, p, g, vocab)?;
        t_pp += pp;
        t_tg += tg;
    }
    Ok((t_pp / reps as f64, t_tg / reps as f64))
}

/// `b` sequences on empty slots: each prompt prefilled, then `g` steps that
/// decode one (greedy) token of every sequence in one batch. Returns the
/// seconds of both phases.
fn batched_once<B: Backend>(
    e: &mut Engine<B>,
    b: usize,
    p: usize,
    g: usize,
    vocab: usize,
) -> kiln_core::Result<(f64, f64)> {
    let prompts: Vec<Vec<u32>> = (0..b).map(|s| prompt_tokens(s, p, vocab)).collect();
    for s in 0..b {
        e.reset(s);
    }
    let mut items: Vec<(usize, u32)> = (0..b).map(|s| (s, 0)).collect();
    let on_device = e.backend.samples_on_device();
    let greedy = vec![GREEDY; b];
    let mut ids = vec![0u32; b];
    let t = Instant::now();
    // Whole prompts packed into forwards of up to the step size, as
    // llama-batched-bench fills its n_batch; a prompt longer than a step
    // (e.g. `--batch-invariant` on a GPU: 64 tokens) is prefilled in chunks.
    let step = e.backend.max_batch_tokens().max(1);
    if p > step {
        for (s, prompt) in prompts.iter().enumerate() {
            items[s].1 = kiln_core::sampler::argmax(e.prefill(s, prompt)?);
        }
    } else if let Some(per_step) = step.checked_div(p) {
        let per_step = per_step.max(1);
        for (g0, group) in prompts.chunks(per_step).enumerate() {
            let s0 = g0 * per_step;
            let feeds: Vec<Feed<'_>> = group
                .iter()
                .enumerate()
                .map(|(i, prompt)| Feed {
                    slot: s0 + i,
                    tokens: prompt,
                    logits: Logits::Last,
                })
                .collect();
            if on_device {
                e.step_sampled(&feeds, &greedy[..group.len()], &mut ids[..group.len()])?;
                for (i, &id) in ids[..group.len()].iter().enumerate() {
                    items[s0 + i].1 = id;
                }
            } else {
                let logits = e.step(&feeds)?;
                for (i, row) in logits.chunks_exact(vocab).enumerate() {
                    items[s0 + i].1 = kiln_core::sampler::argmax(row);
                }
            }
        }
    }
    let t_pp = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..g {
        // One step per `step` sequences (all of them unless the backend
        // takes fewer tokens per step).
        for group in items.chunks_mut(step) {
            if on_device {
                let feeds: Vec<Feed<'_>> = group
                    .iter()
                    .map(|(slot, token)| Feed {
                        slot: *slot,
                        tokens: std::slice::from_ref(token),
                        logits: Logits::Last,
                    })
                    .collect();
                let n = group.len();
                e.step_sampled(&feeds, &greedy[..n], &mut ids[..n])?;
                for (item, &id) in group.iter_mut().zip(&ids) {
                    item.1 = id;
                }
            } else {
                let logits = e.decode_batch(group)?;
                for (item, row) in group.iter_mut().zip(logits.chunks_exact(vocab)) {
                    item.1 = kiln_core::sampler::argmax(row);
                }
            }
        }
    }
    let t_tg = t.elapsed().as_secs_f64();
    for s in 0..b {
        e.reset(s);
    }
    Ok((t_pp, t_tg))
}

fn tests_json(setup: &Setup, records: &[Record]) -> serde_json::Result<String> {
    let per_token = setup.bytes_per_token;
    let v: Vec<_> = records
        .iter()
        .map(|r| {
            let (avg, sd) = mean_sd(&r.samples);
            let mut v = setup.json(r.on);
            v["n_prompt"] = r.n_prompt.into();
            v["n_gen"] = r.n_gen.into();
            v["avg_ts"] = avg.into();
            v["stddev_ts"] = sd.into();
            v["samples_ts"] = serde_json::json!(r.samples);
            v["bytes_per_token"] = per_token.into();
            if let Some(f) = setup.floor(r) {
                v["kv_bytes_per_token"] = f.kv.round().into();
                v["read_bandwidth_gbs"] = (f.bandwidth / 1e9).into();
                v["floor_ts"] = f.ts.into();
                v["floor_fraction"] = (avg / f.ts).into();
            }
            v
        })
        .collect();
    Ok(format!("{}\n", serde_json::to_string_pretty(&v)?))
}

fn tests_md(setup: &Setup, records: &[Record]) -> String {
    let per_token = setup.bytes_per_token;
    let mut out = String::new();
    out.push_str("| model                          |       size |     params | backend         | threads |          test |                  t/s |\n");
    out.push_str("| ------------------------------ | ---------: | ---------: | --------------- | ------: | ------------: | -------------------: |\n");
    for r in records {
        let (avg, sd) = mean_sd(&r.samples);
        let test = if r.n_prompt > 0 {
            format!("pp{}", r.n_prompt)
        } else {
            format!("tg{}", r.n_gen)
        };
        out.push_str(&format!(
            "| {:<30} | {:>6.2} MiB | {:>8.2} M | {:<15} | {:>7} | {:>13} | {:>20} |\n",
            setup.model_type,
            setup.size as f64 / (1 << 20) as f64,
            setup.params as f64 / 1e6,
            r.on.label(),
            r.on.threads,
            test,
            format!("{avg:.2} ± {sd:.2}"),
        ));
    }
    if records.iter().any(|r| r.n_gen > 0 && r.on.pipelined) {
        out.push_str(
            "\ntg: each step queued before the host reads the last id, as `kiln run` decodes (--sync-steps: llama-bench's loop)\n",
        );
    }
    for r in records {
        if let Some(f) = setup.floor(r) {
            let (avg, _) = mean_sd(&r.samples);
            let rate = match r.on.kind {
                BackendKind::Cpu => format!("{} threads' read", r.on.threads),
                BackendKind::Cuda => "device copy, bytes read + written".to_string(),
            };
            let mib = |b: f64| b / (1 << 20) as f64;
            out.push_str(&format!(
                "\nfloor, tg{}: {:.1} MiB weights + {:.1} MiB K/V read per token at {:.1} GB/s ({rate}) = {:.1} tok/s; tg{} is {:.0}% of it\n",
                r.n_gen,
                mib(per_token as f64),
                mib(f.kv),
                f.bandwidth / 1e9,
                f.ts,
                r.n_gen,
                100.0 * avg / f.ts,
            ));
        }
    }
    out
}

fn batched_json(setup: &Setup, records: &[BatchRecord]) -> serde_json::Result<String> {
    let v: Vec<_> = records
        .iter()
        .map(|r| {
            let mut v = setup.json(r.on);
            v["n_kv_max"] = r.n_kv_max.into();
            v["pp"] = r.pp.into();
            v["tg"] = r.tg.into();
            v["pl"] = r.pl.into();
            v["n_kv"] = r.n_kv().into();
            v["t_pp"] = r.t_pp.into();
            v["speed_pp"] = r.speed_pp().into();
            v["t_tg"] = r.t_tg.into();
            v["speed_tg"] = r.speed_tg().into();
            v["t"] = r.t().into();
            v["speed"] = r.speed().into();
            v
        })
        .collect();
    Ok(format!("{}\n", serde_json::to_string_pretty(&v)?))
}

fn batched_md(setup: &Setup, records: &[BatchRecord]) -> String {
    let mut out = String::new();
    let mut last: Option<(BackendKind, usize)> = None;
    for r in records {
        if last != Some((r.on.kind, r.on.threads)) {
            last = Some((r.on.kind, r.on.threads));
            let threads = match r.on.kind {
                BackendKind::Cpu => format!(", {} threads", r.on.threads),
                BackendKind::Cuda => String::new(),
            };
            out.push_str(&format!(
                "{}{}\n{}, {}{threads}, n_kv_max {}\n\n",
                if out.is_empty() { "" } else { "\n" },
                setup.filename,
                setup.model_type,
                r.on.label(),
                r.n_kv_max,
            ));
            out.push_str("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n");
            out.push_str("|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n");
        }
        out.push_str(&format!(
            "| {:>5} | {:>6} | {:>4} | {:>6} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} |\n",
            r.pp,
            r.tg,
            r.pl,
            r.n_kv(),
            r.t_pp,
            r.speed_pp(),
            r.t_tg,
            r.speed_tg(),
            r.t(),
            r.speed(),
        ));
    }
    out
}

/// Runs `f` on a freshly reset sequence `reps + 1` times, the first as a
/// warm-up, and returns the tokens per second (`count` tokens per run) of
/// the timed runs.
fn rates<B: Backend>(
    reps: usize,
    count: usize,
    e: &mut Engine<B>,
    mut f: impl FnMut(&mut Engine<B>) -> kiln_core::Result<()>,
) -> kiln_core::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        e.reset(0);
        let t = Instant::now();
        f(e)?;
        let dt = t.elapsed().as_secs_f64();
        if rep > 0 {
            samples.push(count as f64 / dt);
        }
    }
    Ok(samples)
}
