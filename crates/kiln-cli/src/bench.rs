//! `kiln bench MODEL -p 128 -n 64 -t 2 -r 5`: llama-bench style throughput.
//!
//! Each test runs once to warm up, then `-r` times, each on an empty KV
//! cache: `ppN` feeds N prompt tokens in one forward call, `tgN` decodes N
//! tokens one at a time. The markdown table and the `-o json` records use
//! llama-bench's columns and field names, so tooling that reads llama-bench
//! reads kiln.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kiln_core::{ArchDescriptor, Engine, KvLayout};
use kiln_cpu::{CpuBackend, CpuOptions, Kernels};
use kiln_format::{Model, TensorType};

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
    /// A GGUF file or Hugging Face model folder.
    pub model: PathBuf,
    /// Prompt lengths to time (comma-separated; 0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value = "128", value_parser = parse_list)]
    pub n_prompt: Vec<Vec<usize>>,
    /// Generation lengths to time (comma-separated; 0 skips).
    #[arg(short = 'n', long = "n-gen", default_value = "64", value_parser = parse_list)]
    pub n_gen: Vec<Vec<usize>>,
    /// Thread counts (comma-separated; default: all cores).
    #[arg(short = 't', long = "threads", value_parser = parse_list)]
    pub threads: Vec<Vec<usize>>,
    /// Repetitions per test (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Md)]
    pub output: Output,
    /// CPU kernels (default: fast; the scalar reference for comparison).
    #[arg(long, value_enum, default_value_t = KernelArg::Fast)]
    pub kernels: KernelArg,
    /// Also measure read bandwidth (MiB of buffer, per thread count) and
    /// report each generation test's fraction of the bandwidth floor.
    #[arg(long = "floor", num_args = 0..=1, default_missing_value = "512")]
    pub floor: Option<usize>,
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

struct Record {
    /// Read bandwidth measured for this thread count (bytes/s), with --floor.
    bandwidth: Option<f64>,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    samples: Vec<f64>,
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

pub fn run(a: Args) -> CliResult {
    let model = Arc::new(Model::open(&a.model)?);
    let desc = ArchDescriptor::from_model(&model)?;
    let (model_type, params, size) = describe(&model);
    let prompts: Vec<usize> = a.n_prompt.concat().into_iter().filter(|&p| p > 0).collect();
    let gens: Vec<usize> = a.n_gen.concat().into_iter().filter(|&n| n > 0).collect();
    let threads: Vec<usize> = match a.threads.concat() {
        t if t.is_empty() => vec![CpuOptions::default().threads],
        t => t,
    };
    let max_p = prompts.iter().copied().max().unwrap_or(1);
    let max_n = gens.iter().copied().max().unwrap_or(0);
    let ctx = max_p + max_n + 8;
    let kernels = match a.kernels {
        KernelArg::Fast => Kernels::Fast,
        KernelArg::Reference => Kernels::Reference,
    };
    let vocab = desc.vocab_size;
    // The same pseudo-random prompt as bench/llamacpp_bench.py.
    let tokens: Vec<u32> = (0..max_p.max(2) as u64)
        .map(|i| ((i * 7919 + 13) % vocab as u64) as u32)
        .collect();
    let per_token = bytes_per_token(&model);
    let mut records = Vec::new();
    for &nt in &threads {
        let bandwidth = a.floor.map(|mib| read_bandwidth(nt, mib));
        let layout = KvLayout::plan(&desc, ctx, 1, 16, max_p);
        let mut backend = CpuBackend::new(
            Arc::clone(&model),
            desc.clone(),
            layout.clone(),
            max_p,
            CpuOptions { threads: nt },
        )?;
        backend.set_kernels(kernels);
        let mut e = Engine::new(backend, layout);
        for &p in &prompts {
            let samples = rates(a.reps, p, &mut e, |e| {
                e.prefill(0, &tokens[..p]).map(|_| ())
            })?;
            records.push(Record {
                bandwidth,
                threads: nt,
                n_prompt: p,
                n_gen: 0,
                samples,
            });
        }
        for &n in &gens {
            let samples = rates(a.reps, n, &mut e, |e| {
                let mut tok = tokens[0];
                for _ in 0..n {
                    tok = kiln_core::sampler::argmax(e.decode(0, tok)?);
                }
                Ok(())
            })?;
            records.push(Record {
                bandwidth,
                threads: nt,
                n_prompt: 0,
                n_gen: n,
                samples,
            });
        }
    }
    let backend = match kernels {
        Kernels::Fast => "CPU",
        Kernels::Reference => "CPU (reference)",
    };
    let filename = a.model.display().to_string();
    match a.output {
        Output::Json => {
            let v: Vec<_> = records
                .iter()
                .map(|r| {
                    let (avg, sd) = mean_sd(&r.samples);
                    let mut v = serde_json::json!({
                        "model_filename": filename,
                        "model_type": model_type,
                        "model_size": size,
                        "model_n_params": params,
                        "n_threads": r.threads,
                        "n_prompt": r.n_prompt,
                        "n_gen": r.n_gen,
                        "avg_ts": avg,
                        "stddev_ts": sd,
                        "samples_ts": r.samples,
                        "backend": backend,
                        "bytes_per_token": per_token,
                    });
                    if let (Some(bw), true) = (r.bandwidth, r.n_gen > 0) {
                        v["read_bandwidth_gbs"] = serde_json::json!(bw / 1e9);
                        v["floor_ts"] = serde_json::json!(bw / per_token as f64);
                        v["floor_fraction"] = serde_json::json!(avg * per_token as f64 / bw);
                    }
                    v
                })
                .collect();
            crate::write_stdout(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
        }
        Output::Md => {
            let mut out = String::new();
            out.push_str("| model                          |       size |     params | backend         | threads |          test |                  t/s |\n");
            out.push_str("| ------------------------------ | ---------: | ---------: | --------------- | ------: | ------------: | -------------------: |\n");
            for r in &records {
                let (avg, sd) = mean_sd(&r.samples);
                let test = if r.n_prompt > 0 {
                    format!("pp{}", r.n_prompt)
                } else {
                    format!("tg{}", r.n_gen)
                };
                out.push_str(&format!(
                    "| {:<30} | {:>6.2} MiB | {:>8.2} M | {:<15} | {:>7} | {:>13} | {:>20} |\n",
                    model_type,
                    size as f64 / (1 << 20) as f64,
                    params as f64 / 1e6,
                    backend,
                    r.threads,
                    test,
                    format!("{avg:.2} ± {sd:.2}"),
                ));
            }
            for r in records.iter().filter(|r| r.n_gen > 0) {
                if let Some(bw) = r.bandwidth {
                    let (avg, _) = mean_sd(&r.samples);
                    let floor = bw / per_token as f64;
                    out.push_str(&format!(
                        "\nfloor, {} threads: {:.1} MiB read per token at {:.1} GB/s = {floor:.1} tok/s; tg{} is {:.0}% of it\n",
                        r.threads,
                        per_token as f64 / (1 << 20) as f64,
                        bw / 1e9,
                        r.n_gen,
                        100.0 * avg / floor,
                    ));
                }
            }
            crate::write_stdout(&out)?;
        }
    }
    Ok(())
}

/// Runs `f` on a freshly reset sequence `reps + 1` times, the first as a
/// warm-up, and returns the tokens per second (`count` tokens per run) of
/// the timed runs.
fn rates<B: kiln_core::Backend>(
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
