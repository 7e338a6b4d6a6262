//! `kiln serve [MODEL]`: an OpenAI-compatible HTTP server (kiln-server) with
//! continuous batching. Stops gracefully on SIGTERM / Ctrl-C. The backend is
//! built by [`engine_args::make_backend`] (`--device`, `--gpu-mem`), as for
//! `kiln run`.

use std::path::PathBuf;
use std::time::Duration;

use kiln_server::{BackendFactory, BackendSpec, ServerConfig};

use crate::engine_args::{self, CpuChoice, DeviceArgs};
use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model folder (default: SmolLM2-135M-Instruct, downloaded once).
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Model name served at /v1/models (default: the file name).
    #[arg(long = "model-id")]
    pub model_id: Option<String>,
    /// Another name requests may use for the model (repeatable).
    #[arg(long = "alias")]
    pub alias: Vec<String>,
    /// Context size per sequence (0: the model's; default min(4096, model's)).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Sequences decoded together (slots).
    #[arg(short = 'n', long = "parallel", default_value_t = 4)]
    pub parallel: usize,
    /// Tokens per forward step (decode tokens plus prefill chunks).
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    pub batch_size: usize,
    /// Threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Sequences that may wait for a slot; more are refused with 429.
    #[arg(long = "max-queue", default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body in bytes.
    #[arg(long = "max-body-bytes", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// KV pool size in tokens over all sequences (default: parallel × ctx-size;
    /// smaller pools preempt and recompute sequences when full).
    #[arg(long = "kv-tokens")]
    pub kv_tokens: Option<usize>,
    /// Do not keep finished sequences' KV for prompt-prefix reuse.
    #[arg(long = "no-prefix-cache")]
    pub no_prefix_cache: bool,
    /// Seconds in-flight requests may run after SIGTERM before they are cancelled.
    #[arg(long = "shutdown-grace", default_value_t = 30)]
    pub shutdown_grace: u64,
}

pub fn run(a: Args) -> CliResult {
    let path = crate::default_model::resolve(a.model.clone())?;
    let cfg = ServerConfig {
        model_path: path.clone(),
        model_id: a.model_id,
        aliases: a.alias,
        host: a.host,
        port: a.port,
        ctx: a.ctx_size,
        parallel: a.parallel,
        batch_size: a.batch_size,
        threads: a.threads,
        max_queue: a.max_queue,
        max_body_bytes: a.max_body_bytes,
        kv_tokens: a.kv_tokens,
        prefix_cache: !a.no_prefix_cache,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
    };
    let (dev, cpu) = (a.dev, CpuChoice::threads(a.threads));
    let make: BackendFactory = Box::new(move |s: BackendSpec| {
        let b = engine_args::make_backend(&s.model, &s.desc, &s.layout, s.max_batch, dev, cpu)
            .map_err(|e| e.to_string())?;
        Ok((b.backend, b.name))
    });
    kiln_server::run_blocking(&cfg, make, |st, addr| {
        let info = &st.sched.info;
        eprintln!(
            "kiln: serving {} as \"{}\" on http://{addr} ({}; ctx {}, {} slots, {} tokens per step, {} KV blocks)",
            path.display(),
            st.model_id,
            info.backend,
            info.ctx,
            st.metrics.slots_total.get(),
            info.step_tokens,
            info.kv_blocks,
        );
    })?;
    eprintln!("kiln: server stopped");
    Ok(())
}
