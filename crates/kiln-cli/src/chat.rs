//! `kiln chat [MODEL]`: an interactive multi-turn conversation. The KV cache
//! of earlier turns is kept: each turn renders the whole conversation with
//! the model's template and prefills only what is not already cached.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_core::engine::Control;
use kiln_core::{FinishReason, Sampler};
use serde_json::{json, Value as Json};

use crate::engine_args::{load, EngineArgs, Loaded, SamplingArgs};
use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message for the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply (-1: until the end of the turn or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
}

/// Set while a reply is being generated: Ctrl-C then stops the reply
/// instead of leaving the program.
static GENERATING: AtomicBool = AtomicBool::new(false);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

pub fn run(a: Args) -> CliResult {
    let Loaded {
        path,
        tok,
        mut engine,
        ctx,
        ..
    } = load(&a.engine)?;
    let tok = tok.map_err(|e| format!("tokenizer: {e}"))?;
    ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            INTERRUPTED.store(true, Ordering::SeqCst);
        } else {
            eprintln!();
            std::process::exit(0);
        }
    })?;
    let system: Vec<Json> = a
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    let mut messages = system.clone();
    // Tokens whose K/V are in the cache of slot 0, in order.
    let mut cached: Vec<u32> = Vec::new();
    let mut sampler = Sampler::new(a.sampling.params(), engine.vocab_size());
    eprintln!(
        "kiln chat: {} (ctx {ctx}). /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a reply.",
        path.display()
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            println!();
            break;
        }
        let text = line.trim_end_matches(['\n', '\r']);
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                engine.reset(0);
                cached.clear();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": text}));
        let rendered = tok.render_chat(&Json::Array(messages.clone()), true);
        let ids = match rendered.and_then(|r| tok.encode_chat_prompt(&r)) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("kiln: error: {e}");
                messages.pop();
                continue;
            }
        };
        if ids.len() >= ctx {
            eprintln!(
                "kiln: error: the conversation is {} tokens and the context holds {ctx}; /reset to start over (or a larger -c)",
                ids.len()
            );
            messages.pop();
            continue;
        }
        // Reuse the longest cached prefix. Where the re-rendered history
        // differs (a reply that re-tokenizes differently), the cache is cut
        // back to the common part. At least one token must be fed for logits.
        let mut reuse = common_prefix(&cached, &ids).min(ids.len() - 1);
        if reuse < cached.len() {
            if engine.truncate(0, reuse) {
                cached.truncate(reuse);
            } else {
                engine.reset(0);
                cached.clear();
                reuse = 0;
            }
        }
        let room = ctx - ids.len();
        let max_tokens = if a.n_predict < 0 {
            room
        } else {
            (a.n_predict as usize).min(room)
        };
        let mut stream = tok.stream_decoder(true);
        let mut reply = String::new();
        let mut on_token = |id: u32| -> Control {
            if let Ok(Some(piece)) = stream.step(id) {
                print!("{piece}");
                let _ = std::io::stdout().flush();
                reply.push_str(&piece);
            }
            if INTERRUPTED.load(Ordering::SeqCst) {
                Control::Stop
            } else {
                Control::Continue
            }
        };
        INTERRUPTED.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let result = engine.generate(
            0,
            &ids[reuse..],
            &mut sampler,
            max_tokens.max(1),
            false,
            &|id| tok.is_eos(id),
            &mut on_token,
        );
        GENERATING.store(false, Ordering::SeqCst);
        if let Ok(Some(rest)) = stream.finish() {
            print!("{rest}");
            reply.push_str(&rest);
        }
        println!();
        let gen = match result {
            Ok(g) => g,
            Err(e) => {
                eprintln!("kiln: error: {e}; the conversation was reset");
                messages = system.clone();
                engine.reset(0);
                cached.clear();
                continue;
            }
        };
        cached = ids;
        cached.extend_from_slice(&gen.tokens);
        cached.truncate(engine.seq_len(0));
        messages.push(json!({"role": "assistant", "content": reply}));
        let t = gen.timings;
        eprintln!(
            "[{} new prompt tokens ({reuse} reused from cache), {} generated at {:.1} tok/s{}]",
            t.prompt_tokens,
            t.gen_tokens,
            t.gen_tps(),
            match gen.finish {
                FinishReason::Cancelled => ", stopped",
                FinishReason::Length => ", length limit",
                FinishReason::Context => ", context full",
                _ => "",
            }
        );
    }
    Ok(())
}
