//! kiln-server: an OpenAI-compatible HTTP server over one kiln engine.
//!
//! * [`http`]: axum routes — `POST /v1/chat/completions`, `POST /v1/completions`
//!   (streaming as SSE chunks or whole), `GET /v1/models`, `GET /health`,
//!   `GET /metrics` (Prometheus text).
//! * [`scheduler`]: the continuous-batching engine thread (mixed
//!   prefill/decode steps under a token budget, slot pool, prefix cache,
//!   preemption when the KV pool runs out, cancellation on disconnect).
//! * [`openai`]: request parsing with OpenAI-style 400s naming the parameter.
//! * [`metrics`]: counters, gauges and histograms.
//!
//! [`start`] runs a server on a background thread (tests, embedding);
//! [`run_blocking`] runs one until SIGTERM / Ctrl-C (the `kiln serve` CLI).
//!
//! The backend comes from a [`BackendFactory`] run on the engine thread:
//! `kiln serve` passes the CLI's (`--device cpu|cuda|auto`, the same code
//! `kiln run` loads with); [`cpu_backend`] is the default.

pub mod error;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod scheduler;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use kiln_core::{ArchDescriptor, Backend, EngineOptions, KvLayout};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_format::Model;
use kiln_tokenizer::Tokenizer;

pub use error::ApiError;
pub use http::{router, AppState};
pub use metrics::Metrics;
pub use scheduler::{Scheduler, SchedulerConfig};

/// Everything `kiln serve` can set.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub model_path: PathBuf,
    /// Name served at `/v1/models` (default: the file or folder name).
    pub model_id: Option<String>,
    /// Other names requests may use for the model.
    pub aliases: Vec<String>,
    pub host: String,
    /// 0: an ephemeral port.
    pub port: u16,
    /// Context per sequence (None: min(4096, the model's); 0: the model's).
    pub ctx: Option<usize>,
    /// Sequences decoded together at most (slots).
    pub parallel: usize,
    /// Tokens per forward step (decode tokens + prefill chunks).
    pub batch_size: usize,
    /// CPU threads of [`load`]'s backend (None: all cores).
    pub threads: Option<usize>,
    /// Sequences that may wait for a slot; more get 429.
    pub max_queue: usize,
    pub max_body_bytes: usize,
    /// KV pool size in positions over all sequences (None: parallel × ctx,
    /// so every slot can fill its context; smaller pools preempt).
    pub kv_tokens: Option<usize>,
    pub prefix_cache: bool,
    /// After SIGTERM: how long in-flight requests may finish before they
    /// are cancelled.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_path: PathBuf::new(),
            model_id: None,
            aliases: Vec::new(),
            host: "127.0.0.1".into(),
            port: 8080,
            ctx: None,
            parallel: 4,
            batch_size: 256,
            threads: None,
            max_queue: 256,
            max_body_bytes: 4 << 20,
            kv_tokens: None,
            prefix_cache: true,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// What the engine's backend is built for: the model, its architecture, the
/// KV pool the backend stores and the most tokens one forward step takes.
pub struct BackendSpec {
    pub model: Arc<Model>,
    pub desc: ArchDescriptor,
    pub layout: KvLayout,
    pub max_batch: usize,
}

/// Builds the backend (on the engine thread, so it need not be `Send`) and
/// names it for logs and `/health` ("cpu, 2 threads", "cuda").
pub type BackendFactory =
    Box<dyn FnOnce(BackendSpec) -> Result<(Box<dyn Backend>, String), String> + Send>;

/// The CPU backend with `threads` threads (default: all cores).
pub fn cpu_backend(threads: Option<usize>) -> BackendFactory {
    Box::new(move |s: BackendSpec| {
        let threads =
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let b = CpuBackend::new(
            s.model,
            s.desc,
            s.layout,
            s.max_batch,
            CpuOptions { threads },
        )
        .map_err(|e| e.to_string())?;
        Ok((
            Box::new(b) as Box<dyn Backend>,
            format!("cpu, {threads} threads"),
        ))
    })
}

/// Loads the model and tokenizer and starts the engine thread on the CPU
/// backend ([`cpu_backend`] with `cfg.threads`).
pub fn load(cfg: &ServerConfig) -> Result<Arc<AppState>, String> {
    load_with(cfg, cpu_backend(cfg.threads))
}

/// Loads the model and tokenizer and starts the engine thread on the
/// backend `make` builds.
pub fn load_with(cfg: &ServerConfig, make: BackendFactory) -> Result<Arc<AppState>, String> {
    let path = &cfg.model_path;
    let model = Arc::new(Model::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let tok = Tokenizer::from_model(&model)
        .map_err(|e| format!("tokenizer of {}: {e}", path.display()))?;
    let desc = ArchDescriptor::from_model(&model).map_err(|e| e.to_string())?;
    let ctx = EngineOptions::resolve_ctx(cfg.ctx, desc.context_length);
    let parallel = cfg.parallel.max(1);
    let step = cfg.batch_size.max(parallel).max(1);
    let mut layout = KvLayout::plan(&desc, ctx, parallel, 16, step);
    if let Some(t) = cfg.kv_tokens {
        let blocks = t.div_ceil(layout.block_size).max(1);
        for g in &mut layout.groups {
            g.n_blocks = g.n_blocks.min(blocks);
        }
    }
    let metrics = Arc::new(Metrics::default());
    let eos = tok.eos_ids().to_vec();
    let sched_cfg = SchedulerConfig {
        parallel,
        step_tokens: step,
        max_queue: cfg.max_queue,
        prefix_cache: cfg.prefix_cache,
        eos,
    };
    let spec = BackendSpec {
        model: Arc::clone(&model),
        desc,
        layout: layout.clone(),
        max_batch: step,
    };
    let sched = Scheduler::spawn(sched_cfg, Arc::clone(&metrics), move || {
        let (backend, name) = make(spec)?;
        Ok((backend, layout, name))
    })?;
    let model_id = cfg.model_id.clone().unwrap_or_else(|| {
        let name = path
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    });
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Arc::new(AppState {
        sched,
        tok: Arc::new(tok),
        metrics,
        model_id,
        aliases: cfg.aliases.clone(),
        created,
        max_body_bytes: cfg.max_body_bytes,
        next_id: AtomicU64::new(0),
    }))
}

/// Serves `state` on `listener` until `shutdown` resolves, then stops
/// accepting, lets in-flight requests finish for `grace`, cancels what is
/// left and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let app = router(Arc::clone(&state));
    let st = Arc::clone(&state);
    let signal = async move {
        shutdown.await;
        st.sched.close();
        let st2 = Arc::clone(&st);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            st2.sched.cancel_all();
        });
    };
    let r = axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await;
    state.sched.cancel_all();
    r
}

/// A server running on its own thread (and tokio runtime).
pub struct RunningServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl RunningServer {
    /// Graceful shutdown (as on SIGTERM); waits for the server to finish.
    pub fn shutdown(mut self) -> std::io::Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> std::io::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let r = match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("server thread panicked"))),
            None => Ok(()),
        };
        self.state.sched.shutdown();
        r
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("kiln-http")
        .enable_all()
        .build()
}

/// Loads the model and serves on `cfg.host:cfg.port` from a background thread.
pub fn start(cfg: &ServerConfig) -> Result<RunningServer, String> {
    let state = load(cfg)?;
    start_with(cfg, state)
}

/// Serves an already loaded state from a background thread.
pub fn start_with(cfg: &ServerConfig, state: Arc<AppState>) -> Result<RunningServer, String> {
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let std_listener =
        std::net::TcpListener::bind(&addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    let local = std_listener.local_addr().map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let st = Arc::clone(&state);
    let grace = cfg.shutdown_grace;
    let thread = std::thread::Builder::new()
        .name("kiln-server".into())
        .spawn(move || {
            let rt = runtime()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener)?;
                serve(
                    listener,
                    st,
                    async move {
                        let _ = stop_rx.await;
                    },
                    grace,
                )
                .await
            })
        })
        .map_err(|e| e.to_string())?;
    Ok(RunningServer {
        addr: local,
        state,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// Serves until SIGTERM or Ctrl-C, then shuts down gracefully, on the
/// backend `make` builds. `on_ready` sees the bound address once the model
/// is loaded and the port is open.
pub fn run_blocking(
    cfg: &ServerConfig,
    make: BackendFactory,
    on_ready: impl FnOnce(&AppState, SocketAddr),
) -> Result<(), String> {
    let state = load_with(cfg, make)?;
    let rt = runtime().map_err(|e| e.to_string())?;
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let st = Arc::clone(&state);
    let grace = cfg.shutdown_grace;
    let r = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        on_ready(&st, local);
        serve(listener, st, shutdown_signal(), grace)
            .await
            .map_err(|e| e.to_string())
    });
    state.sched.shutdown();
    r
}

/// Resolves on Ctrl-C or (Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
