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
}

struct Record {
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
    // The largest is often the (Q8_0/Q6_K) embedding; name the layers' type.
    let ty = by_type
        .iter()
        .find(|(n, _)| n != "Q8_0" && n != "Q6_K" && n != "F32")
        .or(by_type.first())
        .map_or("?".to_string(), |(n, _)| n.clone());
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
    let mut records = Vec::new();
    for &nt in &threads {
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
            let mut samples = Vec::new();
            for rep in 0..=a.reps {
                e.reset(0);
                let t = Instant::now();
                e.prefill(0, &tokens[..p])?;
                let dt = t.elapsed().as_secs_f64();
                if rep > 0 {
                    samples.push(p as f64 / dt);
                }
            }
            records.push(Record {
                threads: nt,
                n_prompt: p,
                n_gen: 0,
                samples,
            });
        }
        for &n in &gens {
            let mut samples = Vec::new();
            for rep in 0..=a.reps {
                e.reset(0);
                let t = Instant::now();
                let mut tok = tokens[0];
                for _ in 0..n {
                    let l = e.decode(0, tok)?;
                    tok = kiln_core::sampler::argmax(l);
                }
                let dt = t.elapsed().as_secs_f64();
                if rep > 0 {
                    samples.push(n as f64 / dt);
                }
            }
            records.push(Record {
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
                    serde_json::json!({
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
                    })
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
            crate::write_stdout(&out)?;
        }
    }
    Ok(())
}
