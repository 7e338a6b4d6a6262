//! `kiln run [MODEL] -p PROMPT`: generate text, streamed to stdout, with
//! llama.cpp-style statistics on stderr (or one JSON object with `--json`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kiln_core::engine::Control;
use kiln_core::{
    ArchDescriptor, Backend, Engine, EngineOptions, KvLayout, Sampler, SamplerParams, StopStrings,
};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_format::Model;
use kiln_tokenizer::Tokenizer;

use crate::CliResult;

/// `-c` value; `-cnv` (llama.cpp's conversation flag) parses as `-c nv`.
#[derive(Clone, Copy, Debug)]
pub enum CtxArg {
    Size(usize),
    Cnv,
}

fn parse_ctx(s: &str) -> Result<CtxArg, String> {
    if s == "nv" {
        return Ok(CtxArg::Cnv);
    }
    s.parse()
        .map(CtxArg::Size)
        .map_err(|_| format!("'{s}' is not a context size"))
}

/// `--prompt-ids` value: comma- or space-separated token ids.
#[derive(Clone, Debug)]
pub struct Ids(pub Vec<u32>);

fn parse_ids(s: &str) -> Result<Ids, String> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().map_err(|_| format!("'{p}' is not a token id")))
        .collect::<Result<Vec<u32>, String>>()
        .map(Ids)
}

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model folder (default: SmolLM2-135M-Instruct, downloaded once).
    pub model: Option<PathBuf>,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Token ids to feed instead of a text prompt (e.g. 1,2,3).
    #[arg(long, value_parser = parse_ids, conflicts_with = "prompt")]
    pub prompt_ids: Option<Ids>,
    /// Apply the model's chat template to the prompt (as one user message).
    #[arg(long = "chat", visible_alias = "cnv", alias = "conversation")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Tokens to generate (-1: until end of sequence or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Context size in tokens (0: the model's; default min(4096, model's)). `-cnv` is read as --chat.
    #[arg(short = 'c', long = "ctx-size", value_parser = parse_ctx)]
    pub ctx_size: Option<CtxArg>,
    /// Threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Tokens per prefill step.
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    pub batch_size: usize,
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1.0: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0.0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1.0: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock; printed in the stats).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Stop when this text is generated (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Print one JSON object (ids, text, finish reason, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> CliResult {
    let t_load = Instant::now();
    let path = crate::default_model::resolve(a.model.clone())?;
    let model = Arc::new(Model::open(&path)?);
    let tok = match &model.gguf {
        Some(g) => Tokenizer::from_gguf(g),
        None => Tokenizer::from_hf_dir(&path),
    };
    let desc = ArchDescriptor::from_model(&model)?;
    let chat = a.chat || matches!(a.ctx_size, Some(CtxArg::Cnv));
    let model_ctx = desc.context_length;
    let ctx = match a.ctx_size {
        Some(CtxArg::Size(0)) => model_ctx,
        Some(CtxArg::Size(n)) => n.min(model_ctx),
        _ => model_ctx.min(4096),
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = EngineOptions {
        ctx,
        max_seqs: 1,
        block_size: 16,
        max_chunk: a.batch_size.clamp(1, ctx),
    };
    let layout = KvLayout::plan(
        &desc,
        opts.ctx,
        opts.max_seqs,
        opts.block_size,
        opts.max_chunk,
    );
    let kv_bytes = layout.total_bytes();
    let backend = CpuBackend::new(
        Arc::clone(&model),
        desc,
        layout.clone(),
        opts.max_chunk,
        CpuOptions { threads },
    )?;
    let mut engine = Engine::new(backend, layout);

    let prompt: Vec<u32> = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.0.clone(),
        (None, Some(text)) => {
            let tok = tok.as_ref().map_err(|e| format!("tokenizer: {e}"))?;
            if chat {
                let mut msgs = Vec::new();
                if let Some(s) = &a.system {
                    msgs.push(serde_json::json!({"role": "system", "content": s}));
                }
                msgs.push(serde_json::json!({"role": "user", "content": text}));
                let rendered = tok.render_chat(&serde_json::Value::Array(msgs), true)?;
                tok.encode_chat_prompt(&rendered)?
            } else {
                tok.encode(text, true, true)?
            }
        }
        (None, None) => return Err("no prompt: pass -p PROMPT or --prompt-ids 1,2,3".into()),
    };
    let load_secs = t_load.elapsed().as_secs_f64();

    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let params = SamplerParams {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        logit_bias: Vec::new(),
        seed,
    };
    let mut sampler = Sampler::new(params, engine.vocab_size());
    let room = ctx.saturating_sub(prompt.len());
    let max_tokens = if a.n_predict < 0 {
        room
    } else {
        (a.n_predict as usize).min(room)
    };

    let tok_ok = tok.as_ref().ok();
    let mut stream = tok_ok.map(|t| t.stream_decoder(false));
    let mut stops = StopStrings::new(a.stop.iter().cloned());
    let mut text = String::new();
    let mut stopped_by_string = false;
    let mut io_err: Option<std::io::Error> = None;
    let stdout = std::io::stdout();
    let json = a.json;
    let is_stop = |id: u32| tok_ok.is_some_and(|t| t.is_eos(id));
    let mut emit = |piece: &str, text: &mut String| {
        text.push_str(piece);
        if !json && !piece.is_empty() {
            let mut out = stdout.lock();
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                io_err.get_or_insert(e);
            }
        }
    };
    let mut on_token = |id: u32| -> Control {
        let Some(sd) = stream.as_mut() else {
            return Control::Continue;
        };
        let piece = match sd.step(id) {
            Ok(Some(p)) => p,
            _ => return Control::Continue,
        };
        let mut out = String::new();
        let hit = stops.push(&piece, &mut out);
        emit(&out, &mut text);
        if hit {
            stopped_by_string = true;
            return Control::Stop;
        }
        Control::Continue
    };
    let gen = engine.generate(
        0,
        &prompt,
        &mut sampler,
        max_tokens.max(1),
        a.ignore_eos,
        &is_stop,
        &mut on_token,
    )?;
    if !stopped_by_string {
        let mut rest = String::new();
        if let Some(Ok(Some(p))) = stream.as_mut().map(|s| s.finish()) {
            let _ = stops.push(&p, &mut rest);
        }
        stops.flush(&mut rest);
        emit(&rest, &mut text);
    }
    if let Some(e) = io_err {
        return Err(e.into());
    }
    let finish = if stopped_by_string {
        "stop"
    } else {
        gen.finish.as_str()
    };
    let t = gen.timings;
    if json {
        let v = serde_json::json!({
            "model": path.display().to_string(),
            "prompt_ids": prompt,
            "generated_ids": gen.tokens,
            "text": text,
            "finish_reason": finish,
            "seed": seed,
            "timings": {
                "load_ms": load_secs * 1e3,
                "prompt_tokens": t.prompt_tokens,
                "prompt_ms": t.prompt_secs * 1e3,
                "prompt_tokens_per_second": t.prompt_tps(),
                "generated_tokens": t.gen_tokens,
                "generation_ms": t.gen_secs * 1e3,
                "generation_tokens_per_second": t.gen_tps(),
            },
        });
        println!("{v}");
    } else {
        if tok_ok.is_none() {
            println!("{:?}", gen.tokens);
        } else {
            println!();
        }
        let ms = |s: f64, n: usize| if n > 0 { s * 1e3 / n as f64 } else { 0.0 };
        eprintln!();
        eprintln!(
            "kiln: model {} ({}, {} threads, ctx {ctx}, KV {:.1} MiB, seed {seed})",
            path.display(),
            engine.backend.desc().name,
            engine.backend.n_threads(),
            kv_bytes as f64 / (1 << 20) as f64
        );
        eprintln!("kiln:        load time = {:10.2} ms", load_secs * 1e3);
        eprintln!(
            "kiln: prompt eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
            t.prompt_secs * 1e3,
            t.prompt_tokens,
            ms(t.prompt_secs, t.prompt_tokens),
            t.prompt_tps()
        );
        eprintln!(
            "kiln:        eval time = {:10.2} ms / {:5} runs   ({:8.2} ms per token, {:8.2} tokens per second)",
            t.gen_secs * 1e3,
            t.gen_tokens,
            ms(t.gen_secs, t.gen_tokens),
            t.gen_tps()
        );
        eprintln!(
            "kiln:       total time = {:10.2} ms / {:5} tokens (finish: {finish})",
            (load_secs + t.prompt_secs + t.gen_secs) * 1e3,
            t.prompt_tokens + t.gen_tokens
        );
    }
    Ok(())
}
