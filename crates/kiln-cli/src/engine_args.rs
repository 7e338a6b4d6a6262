//! What `run`, `chat`, `bench` and `serve` share: the device and model/engine
//! flags, the sampling flags, and building a backend (CPU or CUDA, chosen by
//! `--device`) and an engine plus tokenizer from them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kiln_core::{ArchDescriptor, Backend, Engine, EngineOptions, KvLayout, SamplerParams};
use kiln_cpu::{CpuBackend, CpuOptions, Kernels, KvType, KvTypes};
use kiln_cuda::{CudaBackend, CudaOptions};
use kiln_format::Model;
use kiln_tokenizer::Tokenizer;

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

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The GPU when a CUDA driver is found, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

fn parse_gpu_mem(s: &str) -> Result<usize, String> {
    kiln_cuda::parse_bytes(s).ok_or_else(|| format!("'{s}' is not a size (e.g. 512M, 8G)"))
}

/// `--device`, `--gpu-mem`, the KV cache types and `--mlock`/`--warm`:
/// which backend runs the model and how it is loaded (`run`, `chat`,
/// `bench`, `serve`).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DeviceArgs {
    /// Where to run: auto (CUDA if a driver is found), cpu or cuda.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Most GPU memory kiln may plan for (weights + KV + scratch), e.g. 8G
    /// (default: the device's free memory less a margin).
    #[arg(long = "gpu-mem", value_parser = parse_gpu_mem)]
    pub gpu_mem: Option<usize>,
    /// KV cache type for K: f32 or f16 (`-ctk` as llama.cpp; CUDA: the same for K and V).
    #[arg(long = "cache-type-k", default_value = "f32")]
    pub cache_type_k: KvType,
    /// KV cache type for V: f32 or f16 (`-ctv` as llama.cpp).
    #[arg(long = "cache-type-v", default_value = "f32")]
    pub cache_type_v: KvType,
    /// Lock the model's mapped file in memory (mlock); a failure (e.g.
    /// RLIMIT_MEMLOCK, `ulimit -l`) is a warning, as in llama.cpp.
    #[arg(long)]
    pub mlock: bool,
    /// Read every page of the model's mapped file at load (in parallel), so
    /// the first tokens do not wait on page faults.
    #[arg(long)]
    pub warm: bool,
    /// GPU: batch-invariant numerics (a sequence's logits do not depend on
    /// what shares its steps; no cuBLAS, steps of at most 64 tokens, slower
    /// prefill). The CPU backend is always invariant.
    #[arg(long = "batch-invariant")]
    pub batch_invariant: bool,
}

impl DeviceArgs {
    pub(crate) fn kv_types(&self) -> KvTypes {
        KvTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }

    /// KV cache bytes for `layout` with the requested types.
    pub fn kv_bytes(&self, layout: &KvLayout) -> usize {
        self.kv_types().total_bytes(layout)
    }
}

/// llama.cpp's multi-letter short flags that clap cannot declare
/// (`-ctk`, `-ctv`), rewritten to the long ones; arguments after `--` are
/// left alone.
pub fn llama_aliases(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut rest = false;
    args.into_iter()
        .map(|a| {
            if rest {
                return a;
            }
            match a.to_str() {
                Some("--") => {
                    rest = true;
                    a
                }
                Some("-ctk") => "--cache-type-k".into(),
                Some("-ctv") => "--cache-type-v".into(),
                _ => a,
            }
        })
        .collect()
}

/// `--warm` and `--mlock` on an opened model (before a backend reads it).
fn prepare_model(model: &Model, dev: &DeviceArgs, threads: usize) {
    if dev.warm {
        let t = Instant::now();
        let bytes = model.warm(threads);
        eprintln!(
            "kiln: warmed {} MiB of model pages in {:.2} s",
            bytes >> 20,
            t.elapsed().as_secs_f64()
        );
    }
    if dev.mlock {
        if let Err(e) = model.lock() {
            eprintln!("kiln: warning: --mlock: {e}; continuing without it");
        }
    }
}

#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// GGUF file or Hugging Face model folder (default: SmolLM2-135M-Instruct, downloaded once).
    pub model: Option<PathBuf>,
    /// Context size in tokens (0: the model's; default min(4096, model's)). `-cnv` is read as --chat.
    #[arg(short = 'c', long = "ctx-size", value_parser = parse_ctx)]
    pub ctx_size: Option<CtxArg>,
    /// Threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Tokens per prefill step.
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    pub batch_size: usize,
}

#[derive(clap::Args, Clone)]
pub struct SamplingArgs {
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
}

impl SamplingArgs {
    /// The sampler parameters, with the seed resolved (clock if not given).
    pub fn params(&self) -> SamplerParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: Vec::new(),
            seed,
        }
    }
}

/// The backend kind that was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// CPU backend settings (used when the model runs on the CPU).
#[derive(Clone, Copy, Debug)]
pub struct CpuChoice {
    pub threads: usize,
    /// `None`: the backend's default ([`Kernels::from_env`]).
    pub kernels: Option<Kernels>,
}

impl CpuChoice {
    /// `threads` or all cores; the default kernels.
    pub fn threads(threads: Option<usize>) -> Self {
        CpuChoice {
            threads: threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            kernels: None,
        }
    }
}

/// A backend built by [`make_backend`].
pub struct Built {
    pub backend: Box<dyn Backend>,
    pub kind: BackendKind,
    /// "cpu, 2 threads" or "cuda".
    pub name: String,
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A model file opened and described: what every backend is built from.
pub struct Opened {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub desc: ArchDescriptor,
}

/// Opens `model` (default: the downloaded default model).
pub fn open(model: Option<PathBuf>) -> Result<Opened, Box<dyn std::error::Error>> {
    let path = crate::default_model::resolve(model)?;
    let model = Arc::new(Model::open(&path)?);
    let desc = ArchDescriptor::from_model(&model)?;
    Ok(Opened { path, model, desc })
}

/// What the CLI shows while a cold start compiles the CUDA kernels: a
/// spinner with the elapsed time on a terminal, else one line.
fn compile_spinner() -> impl Fn(Option<&str>) + Send + Sync + 'static {
    use std::io::IsTerminal;
    let bar = std::sync::Mutex::new(None::<indicatif::ProgressBar>);
    move |what| {
        let Ok(mut bar) = bar.lock() else {
            return;
        };
        match what {
            Some(what) if std::io::stderr().is_terminal() => {
                let b = indicatif::ProgressBar::new_spinner();
                b.set_style(
                    indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
                );
                b.set_message(format!("kiln: {what}"));
                b.enable_steady_tick(std::time::Duration::from_millis(120));
                *bar = Some(b);
            }
            Some(what) => eprintln!("kiln: {what}"),
            None => {
                if let Some(b) = bar.take() {
                    b.finish_and_clear();
                }
            }
        }
    }
}

/// The one place a backend is chosen and built: CUDA for `--device cuda`
/// (an error if it cannot start) or `auto` with a driver present (falling
/// back to the CPU with a note on stderr if it cannot start), else the CPU.
/// `layout` is the KV pool the backend stores; `max_chunk` the most tokens
/// one forward step takes.
pub fn make_backend(
    model: &Arc<Model>,
    desc: &ArchDescriptor,
    layout: &KvLayout,
    max_chunk: usize,
    dev: DeviceArgs,
    cpu: CpuChoice,
) -> Result<Built, BoxError> {
    prepare_model(model, &dev, cpu.threads);
    let cuda = match dev.device {
        Device::Cpu => None,
        Device::Auto if !kiln_cuda::driver_present() => None,
        Device::Auto | Device::Cuda => {
            kiln_cuda::gpu::on_kernel_compile(compile_spinner());
            let b = CudaBackend::new(
                Arc::clone(model),
                desc.clone(),
                layout.clone(),
                max_chunk,
                CudaOptions {
                    gpu_mem: dev.gpu_mem.or(CudaOptions::default().gpu_mem),
                    invariant: dev.batch_invariant || CudaOptions::default().invariant,
                    kv: dev.kv_types(),
                    ..CudaOptions::default()
                },
            );
            match (b, dev.device) {
                (Ok(b), _) => Some(b),
                (Err(e), Device::Cuda) => return Err(format!("--device cuda: {e}").into()),
                (Err(e), _) => {
                    eprintln!("kiln: CUDA unavailable ({e}); running on the CPU");
                    None
                }
            }
        }
    };
    if let Some(b) = cuda {
        return Ok(Built {
            name: format!("cuda{}", kv_note(b.kv_types())),
            backend: Box::new(b),
            kind: BackendKind::Cuda,
        });
    }
    let mut b = CpuBackend::with_kv(
        Arc::clone(model),
        desc.clone(),
        layout.clone(),
        max_chunk,
        CpuOptions {
            threads: cpu.threads,
        },
        dev.kv_types(),
    )?;
    if let Some(k) = cpu.kernels {
        b.set_kernels(k);
    }
    let kernels = match b.kernels() {
        Kernels::Reference => ", reference kernels",
        Kernels::Fast => "",
    };
    Ok(Built {
        name: format!(
            "cpu, {} threads{kernels}{}",
            cpu.threads,
            kv_note(b.kv_types())
        ),
        backend: Box::new(b),
        kind: BackendKind::Cpu,
    })
}

/// ", KV f16/f16" for a cache other than the default f32 one.
fn kv_note(kv: KvTypes) -> String {
    if kv == KvTypes::default() {
        String::new()
    } else {
        format!(", KV {}/{}", kv.k.as_str(), kv.v.as_str())
    }
}

/// A model ready to generate with: one sequence slot on the chosen backend.
pub struct Loaded {
    pub path: PathBuf,
    pub tok: Result<Tokenizer, kiln_tokenizer::Error>,
    pub engine: Engine<Box<dyn Backend>>,
    /// "cpu, 2 threads" or "cuda".
    pub backend_name: String,
    pub ctx: usize,
    pub kv_bytes: usize,
    pub load_secs: f64,
}

pub fn load(a: &EngineArgs) -> Result<Loaded, Box<dyn std::error::Error>> {
    let t_load = Instant::now();
    let Opened { path, model, desc } = open(a.model.clone())?;
    let tok = Tokenizer::from_model(&model);
    let requested = match a.ctx_size {
        Some(CtxArg::Size(n)) => Some(n),
        _ => None,
    };
    let ctx = EngineOptions::resolve_ctx(requested, desc.context_length);
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
    let built = make_backend(
        &model,
        &desc,
        &layout,
        opts.max_chunk,
        a.dev,
        CpuChoice::threads(a.threads),
    )
    .map_err(|e| e as Box<dyn std::error::Error>)?;
    let kv_bytes = a.dev.kv_bytes(&layout);
    Ok(Loaded {
        path,
        tok,
        engine: Engine::new(built.backend, layout),
        backend_name: built.name,
        ctx,
        kv_bytes,
        load_secs: t_load.elapsed().as_secs_f64(),
    })
}
