//! `kiln run [MODEL] -p PROMPT`: generate text, streamed to stdout, with
//! llama.cpp-style statistics on stderr (or one JSON object with `--json`).

use std::io::Write;

use kiln_core::engine::Control;
use kiln_core::{Backend, Sampler, StopStrings};

use crate::engine_args::{load, CtxArg, EngineArgs, Loaded, SamplingArgs};
use crate::CliResult;

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
    #[command(flatten)]
    pub engine: EngineArgs,
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
    #[command(flatten)]
    pub sampling: SamplingArgs,
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
    let Loaded {
        path,
        tok,
        mut engine,
        backend_name,
        ctx,
        kv_bytes,
        load_secs,
    } = load(&a.engine)?;
    let chat = a.chat || matches!(a.engine.ctx_size, Some(CtxArg::Cnv));

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

    let params = a.sampling.params();
    let seed = params.seed;
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
            "kiln: model {} ({}, {backend_name}, ctx {ctx}, KV {:.1} MiB, seed {seed})",
            path.display(),
            engine.backend.desc().name,
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
