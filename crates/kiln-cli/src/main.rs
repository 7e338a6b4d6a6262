//! The `kiln` command line. Each subcommand lives in its own module; this file
//! only parses arguments and turns errors into a message and exit code 1.

mod bench;
mod chat;
mod default_model;
mod engine_args;
mod inspect;
mod quantize;
mod run;
mod serve;
mod synth;
mod tokenize;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Local LLM inference: GGUF and Hugging Face models on CPU and GPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Quantize a GGUF file or HF folder to a GGUF file (like llama-quantize).
    Quantize(quantize::Args),
    /// Write a random-weight model of a named shape (HF folder and GGUFs).
    Synth(synth::Args),
    /// Measure prompt and generation throughput, llama-bench style.
    Bench(bench::Args),
    /// Describe a model file or folder: format, architecture, config, tokenizer, tensors.
    Inspect(inspect::Args),
    /// Tokenize text (or render a chat) with a model's tokenizer.
    Tokenize(tokenize::Args),
    /// Generate text from a prompt (streams to stdout, stats to stderr).
    Run(run::Args),
    /// Chat interactively; earlier turns stay in the KV cache.
    Chat(chat::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(serve::Args),
}

/// Errors reaching `main` are printed as one line each (with their causes) and
/// exit with status 1; clap's own usage errors exit with 2.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Writes to stdout; a reader that went away (`kiln inspect … | head`) ends
/// the program quietly instead of panicking.
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => r,
    }
}

fn main() {
    let cli = Cli::parse_from(engine_args::llama_aliases(std::env::args_os()));
    let result = match cli.command {
        Command::Quantize(a) => quantize::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
    };
    if let Err(e) = result {
        let mut shown = e.to_string();
        eprintln!("kiln: error: {shown}");
        let mut src = e.source();
        while let Some(s) = src {
            // Our errors often quote their cause already; say it once.
            let text = s.to_string();
            if !shown.contains(&text) {
                eprintln!("  caused by: {text}");
                shown.push_str(&text);
            }
            src = s.source();
        }
        std::process::exit(1);
    }
}
