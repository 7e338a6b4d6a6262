//! One view of a model whatever its format: config, canonical tensors, bytes.
//!
//! [`Model::open`] takes a GGUF file or a Hugging Face folder (`config.json`
//! plus one `.safetensors` file or shards listed in
//! `model.safetensors.index.json`). After it returns, nothing downstream needs to know which it was: names are
//! canonical, shapes row-major, and the format quirks are fields of
//! [`ModelConfig`] or flags on [`ModelTensor`].

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::config::ModelConfig;
use crate::error::{FormatError, Result};
use crate::ggml_type::GgmlType;
use crate::gguf::{Gguf, Storage};
use crate::names;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Gguf,
    Safetensors,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Gguf => "gguf",
            Format::Safetensors => "safetensors",
        }
    }
}

/// How a tensor's bytes encode its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    /// A ggml type (safetensors F32/F16/BF16/F64/I8–I64 map here too).
    Ggml(GgmlType),
    /// MLX affine quantization: `bits`-bit values packed little-endian into
    /// u32 words, one f16/bf16 scale and bias per `group_size` values
    /// (companion tensors `<name>.scales` / `<name>.biases`).
    Mlx { bits: u32, group_size: u32 },
    /// A safetensors dtype with no ggml equivalent (U8, BOOL, F8 …).
    Other(&'static str),
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorType::Ggml(t) => write!(f, "{t}"),
            TensorType::Mlx { bits, group_size } => write!(f, "MLX_Q{bits}_G{group_size}"),
            TensorType::Other(s) => write!(f, "{s}"),
        }
    }
}

/// Where a tensor's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Gguf,
    File(usize),
}

#[derive(Debug, Clone)]
pub struct ModelTensor {
    /// Canonical (GGUF-style) name.
    pub name: String,
    /// Name in the file it came from.
    pub source_name: String,
    pub ty: TensorType,
    /// Row-major, outermost first, as stored. For MLX weights: the logical
    /// (unpacked) shape.
    pub shape: Vec<u64>,
    /// Stored as `[in, out]` (HF GPT-2 `Conv1D`); every other 2-D weight is
    /// `[out, in]`.
    pub transposed: bool,
    pub n_bytes: u64,
    source: Source,
    offset: usize,
}

impl ModelTensor {
    /// Shape with the transposition undone: `[out, in]` for weights.
    pub fn logical_shape(&self) -> Vec<u64> {
        let mut s = self.shape.clone();
        if self.transposed {
            s.reverse();
        }
        s
    }
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The tensor's values (as stored, e.g. just dequantized) in the logical
    /// `[out, in]` order: HF GPT-2's `[in, out]` weights are transposed,
    /// every other tensor is returned as it is.
    pub fn to_logical(&self, stored: Vec<f32>) -> Vec<f32> {
        let &[r, c] = self.shape.as_slice() else {
            return stored;
        };
        if !self.transposed {
            return stored;
        }
        let (r, c) = (r as usize, c as usize);
        let mut out = vec![0.0f32; stored.len()];
        for (i, row) in stored.chunks_exact(c).enumerate().take(r) {
            for (j, &v) in row.iter().enumerate() {
                out[j * r + i] = v;
            }
        }
        out
    }
}

/// MLX quantization as declared in config.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlxQuantization {
    pub bits: u32,
    pub group_size: u32,
}

pub struct Model {
    pub path: PathBuf,
    pub format: Format,
    pub config: ModelConfig,
    /// The GGUF itself (metadata, tokenizer) when the model is one.
    pub gguf: Option<Gguf>,
    /// `config.json` when the model is an HF folder.
    pub hf_config: Option<Json>,
    pub mlx_quantization: Option<MlxQuantization>,
    /// Tensors in the file(s) that have no canonical name (vision towers,
    /// poolers …); kept for `kiln inspect`.
    pub unmapped: Vec<String>,
    tensors: Vec<ModelTensor>,
    index: HashMap<String, usize>,
    files: Vec<(PathBuf, Storage)>,
}

impl Model {
    /// Opens a GGUF file or an HF model folder.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
        if meta.is_dir() {
            return open_hf_dir(path);
        }
        let mut magic = [0u8; 4];
        {
            use std::io::Read;
            let mut f = File::open(path).map_err(|e| FormatError::io(path, e))?;
            let n = f.read(&mut magic).map_err(|e| FormatError::io(path, e))?;
            if n < 4 {
                return Err(FormatError::malformed(
                    path,
                    format!("file is only {n} bytes long"),
                ));
            }
        }
        if &magic == crate::gguf::GGUF_MAGIC {
            return Self::from_gguf(Gguf::open(path)?);
        }
        if path.extension().is_some_and(|e| e == "safetensors") {
            if let Some(dir) = path.parent().filter(|d| d.join("config.json").is_file()) {
                return open_hf_dir(dir);
            }
            return Err(FormatError::missing(
                path,
                "config.json beside this .safetensors file (pass the model folder)",
            ));
        }
        Err(FormatError::malformed(
            path,
            format!("not a GGUF file (magic {magic:02x?}) and not a model folder"),
        ))
    }

    pub fn from_gguf(g: Gguf) -> Result<Self> {
        let config = ModelConfig::from_gguf(&g)?;
        let tensors: Vec<ModelTensor> = g
            .tensors()
            .iter()
            .map(|t| ModelTensor {
                name: t.name.clone(),
                source_name: t.name.clone(),
                ty: TensorType::Ggml(t.ty),
                shape: t.shape(),
                transposed: false,
                n_bytes: t.n_bytes,
                source: Source::Gguf,
                offset: (g.data_start + t.offset) as usize,
            })
            .collect();
        let model = Self::assemble(g.path().to_path_buf(), Format::Gguf, config, tensors)?;
        Ok(Model {
            gguf: Some(g),
            ..model
        })
    }

    fn assemble(
        path: PathBuf,
        format: Format,
        config: ModelConfig,
        tensors: Vec<ModelTensor>,
    ) -> Result<Self> {
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(FormatError::malformed(
                    &path,
                    format!("two tensors map to the canonical name '{}'", t.name),
                ));
            }
        }
        let m = Model {
            path,
            format,
            config,
            gguf: None,
            hf_config: None,
            mlx_quantization: None,
            unmapped: Vec::new(),
            tensors,
            index,
            files: Vec::new(),
        };
        crate::shapes::check(&m)?;
        Ok(m)
    }

    pub fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&ModelTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor that must exist, as an error naming it otherwise.
    pub fn require(&self, name: &str) -> Result<&ModelTensor> {
        self.tensor(name)
            .ok_or_else(|| FormatError::missing(&self.path, format!("tensor '{name}'")))
    }

    /// The tensor's bytes, borrowed from the mapped file (never copied).
    pub fn data(&self, t: &ModelTensor) -> &[u8] {
        let buf: &[u8] = match t.source {
            Source::Gguf => match &self.gguf {
                Some(g) => g.bytes(),
                None => &[],
            },
            Source::File(i) => &self.files[i].1,
        };
        &buf[t.offset..t.offset + t.n_bytes as usize]
    }

    /// Total bytes of all tensors.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }

    /// The model's mapped (or owned) file images.
    fn images(&self) -> Vec<&[u8]> {
        match &self.gguf {
            Some(g) => vec![g.bytes()],
            None => self.files.iter().map(|(_, s)| &**s).collect(),
        }
    }

    /// Reads every page of the model's file images (`--warm`), split over
    /// `threads` threads, so the first forward pass does not wait on page
    /// faults and disk reads. Returns the bytes covered.
    pub fn warm(&self, threads: usize) -> u64 {
        const PAGE: usize = 4096;
        let mut total = 0u64;
        for img in self.images() {
            total += img.len() as u64;
            let per = img
                .len()
                .div_ceil(threads.max(1))
                .next_multiple_of(PAGE)
                .max(PAGE);
            std::thread::scope(|s| {
                for part in img.chunks(per) {
                    s.spawn(move || {
                        let mut acc = 0u8;
                        for p in part.iter().step_by(PAGE) {
                            // SAFETY: `p` is a valid reference; a volatile
                            // read so the touch is not optimized away.
                            acc ^= unsafe { std::ptr::read_volatile(p) };
                        }
                        std::hint::black_box(acc);
                    });
                }
            });
        }
        total
    }

    /// Locks the model's file images in memory (`--mlock`, `mlock(2)` as
    /// memmap2's `Mmap::lock` does), so they are never paged out. Fails as
    /// `mlock` does, typically with `RLIMIT_MEMLOCK` too low (`ulimit -l`)
    /// — the error says so.
    pub fn lock(&self) -> std::result::Result<u64, String> {
        let mut total = 0u64;
        for img in self.images() {
            lock_bytes(img).map_err(|e| {
                let limit = memlock_limit()
                    .map(|l| format!("RLIMIT_MEMLOCK is {l} bytes (ulimit -l)"))
                    .unwrap_or_else(|| "see RLIMIT_MEMLOCK (ulimit -l)".into());
                format!("mlock of {} MiB failed: {e}; {limit}", img.len() >> 20)
            })?;
            total += img.len() as u64;
        }
        Ok(total)
    }

    /// Files the tensors live in.
    pub fn files(&self) -> Vec<&Path> {
        match &self.gguf {
            Some(g) => vec![g.path()],
            None => self.files.iter().map(|(p, _)| p.as_path()).collect(),
        }
    }
}

// ---------------------------------------------------------------- HF folders

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| FormatError::malformed(path, format!("invalid JSON: {e}")))
}

fn map_file(path: &Path) -> Result<Storage> {
    let f = File::open(path).map_err(|e| FormatError::io(path, e))?;
    // SAFETY: read-only map; see `Gguf::open`.
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| FormatError::io(path, e))?;
    Ok(Storage::Mmap(m))
}

fn safetensors_type(d: safetensors::Dtype) -> TensorType {
    use safetensors::Dtype as D;
    match d {
        D::F32 => TensorType::Ggml(GgmlType::F32),
        D::F16 => TensorType::Ggml(GgmlType::F16),
        D::BF16 => TensorType::Ggml(GgmlType::BF16),
        D::F64 => TensorType::Ggml(GgmlType::F64),
        D::I8 => TensorType::Ggml(GgmlType::I8),
        D::I16 => TensorType::Ggml(GgmlType::I16),
        D::I32 => TensorType::Ggml(GgmlType::I32),
        D::I64 => TensorType::Ggml(GgmlType::I64),
        D::U8 => TensorType::Other("U8"),
        D::U16 => TensorType::Other("U16"),
        D::U32 => TensorType::Other("U32"),
        D::U64 => TensorType::Other("U64"),
        D::BOOL => TensorType::Other("BOOL"),
        D::F8_E4M3 => TensorType::Other("F8_E4M3"),
        D::F8_E5M2 => TensorType::Other("F8_E5M2"),
        _ => TensorType::Other("unknown"),
    }
}

/// The safetensors files of a folder: the shards named by the index, or the
/// single `model.safetensors` (or the only `*.safetensors`).
/// Tensor name → shard file name, from `model.safetensors.index.json`.
type WeightMap = HashMap<String, String>;

fn shard_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<WeightMap>)> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.is_file() {
        let idx = read_json(&index_path)?;
        let map = idx
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| FormatError::missing(&index_path, "object 'weight_map'"))?;
        let mut weight_map = HashMap::with_capacity(map.len());
        let mut files = BTreeSet::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                FormatError::invalid(
                    &index_path,
                    format!("weight_map['{name}'] is not a file name"),
                )
            })?;
            if file.contains('/') || file.contains('\\') || file.starts_with("..") {
                return Err(FormatError::invalid(
                    &index_path,
                    format!("weight_map['{name}'] = '{file}' points outside the folder"),
                ));
            }
            files.insert(file.to_string());
            weight_map.insert(name.clone(), file.to_string());
        }
        let mut paths = Vec::new();
        for f in files {
            let p = dir.join(&f);
            if !p.is_file() {
                return Err(FormatError::missing(
                    &index_path,
                    format!("shard '{f}' (named in weight_map) in {}", dir.display()),
                ));
            }
            paths.push(p);
        }
        return Ok((paths, Some(weight_map)));
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single], None));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| FormatError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    found.sort();
    match found.len() {
        0 => Err(FormatError::missing(
            dir,
            "model.safetensors (no .safetensors file in the folder)",
        )),
        1 => Ok((found, None)),
        n => Err(FormatError::missing(
            dir,
            format!("model.safetensors.index.json ({n} .safetensors files and no index)"),
        )),
    }
}

struct RawTensor {
    name: String,
    ty: TensorType,
    shape: Vec<u64>,
    file: usize,
    offset: usize,
    n_bytes: u64,
}

fn open_hf_dir(dir: &Path) -> Result<Model> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(FormatError::missing(
            dir,
            "config.json (not a Hugging Face model folder)",
        ));
    }
    let hf_config = read_json(&config_path)?;
    let (paths, weight_map) = shard_files(dir)?;

    let mut files = Vec::with_capacity(paths.len());
    let mut raw: Vec<RawTensor> = Vec::new();
    for (fi, p) in paths.iter().enumerate() {
        let storage = map_file(p)?;
        let st = safetensors::SafeTensors::deserialize(&storage)
            .map_err(|e| FormatError::malformed(p, format!("safetensors: {e}")))?;
        let base = storage.as_ptr() as usize;
        for (name, view) in st.tensors() {
            let data = view.data();
            let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            let ty = safetensors_type(view.dtype());
            let n: u64 = shape.iter().product();
            let want = n.checked_mul(view.dtype().bitsize() as u64 / 8);
            if want != Some(data.len() as u64) {
                return Err(FormatError::malformed(
                    p,
                    format!(
                        "tensor '{name}': {:?} {shape:?} needs {want:?} bytes, has {}",
                        view.dtype(),
                        data.len()
                    ),
                ));
            }
            if let Some(wm) = &weight_map {
                let expected = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
                if wm.get(&name).is_some_and(|f| f != expected) {
                    return Err(FormatError::invalid(
                        p,
                        format!(
                            "tensor '{name}' is in this shard but the index names '{}'",
                            wm[&name]
                        ),
                    ));
                }
            }
            raw.push(RawTensor {
                name,
                ty,
                shape,
                file: fi,
                offset: data.as_ptr() as usize - base,
                n_bytes: data.len() as u64,
            });
        }
        files.push((p.clone(), storage));
    }
    if let Some(wm) = &weight_map {
        let present: BTreeSet<&str> = raw.iter().map(|t| t.name.as_str()).collect();
        if let Some((name, file)) = wm.iter().find(|(n, _)| !present.contains(n.as_str())) {
            return Err(FormatError::missing(
                dir.join(file),
                format!("tensor '{name}' (listed in model.safetensors.index.json)"),
            ));
        }
    }
    raw.sort_by(|a, b| a.name.cmp(&b.name));

    let mlx = mlx_quantization(&config_path, &hf_config)?;
    // The query projection's row count stands in for a missing head_dim.
    let q_out = raw
        .iter()
        .find(|t| t.name.ends_with("layers.0.self_attn.q_proj.weight"))
        .and_then(|t| t.shape.first().copied())
        .map(|n| n as usize);
    let config = ModelConfig::from_hf_json(&config_path, &hf_config, q_out)?;
    let arch = config.arch;

    let by_name: HashMap<&str, &RawTensor> = raw.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut tensors = Vec::new();
    let mut unmapped = Vec::new();
    for t in &raw {
        // MLX companions map like their weight, with their own suffix.
        let (lookup, aux) = match t.name.rsplit_once('.') {
            Some((stem, s @ ("scales" | "biases"))) if mlx.is_some() => {
                (format!("{stem}.weight"), Some(s))
            }
            _ => (t.name.clone(), None),
        };
        let Some(mut canon) = names::hf_to_canonical(arch, &lookup) else {
            unmapped.push(t.name.clone());
            continue;
        };
        let mut ty = t.ty;
        let mut shape = t.shape.clone();
        if let Some(aux) = aux {
            canon = format!("{}.{aux}", canon.trim_end_matches(".weight"));
        } else if let (Some(q), Some(stem)) = (mlx, t.name.strip_suffix(".weight")) {
            if by_name.contains_key(format!("{stem}.scales").as_str()) {
                if t.ty != TensorType::Other("U32") || shape.len() != 2 {
                    return Err(FormatError::invalid(
                        &files[t.file].0,
                        format!(
                            "MLX-quantized '{}' must be a 2-D U32 tensor, is {} {shape:?}",
                            t.name, t.ty
                        ),
                    ));
                }
                shape[1] = shape[1] * 32 / q.bits as u64;
                ty = TensorType::Mlx {
                    bits: q.bits,
                    group_size: q.group_size,
                };
            }
        }
        let transposed = names::hf_is_transposed(arch, &canon);
        tensors.push(ModelTensor {
            name: canon,
            source_name: t.name.clone(),
            ty,
            shape,
            transposed,
            n_bytes: t.n_bytes,
            source: Source::File(t.file),
            offset: t.offset,
        });
    }
    let mut config = config;
    config.tied_embeddings = !tensors.iter().any(|t| t.name == "output.weight");
    let mut m = Model::assemble(dir.to_path_buf(), Format::Safetensors, config, tensors)?;
    m.files = files;
    m.hf_config = Some(hf_config);
    m.mlx_quantization = mlx;
    m.unmapped = unmapped;
    Ok(m)
}

fn mlx_quantization(path: &Path, cfg: &Json) -> Result<Option<MlxQuantization>> {
    let Some(q) = cfg
        .get("quantization")
        .or_else(|| cfg.get("quantization_config"))
    else {
        return Ok(None);
    };
    // Only MLX's shape ({group_size, bits}) is this kind; others (GPTQ, AWQ…) say quant_method.
    if q.get("quant_method").is_some() {
        let method = q.get("quant_method").and_then(Json::as_str).unwrap_or("?");
        return Err(FormatError::unsupported(
            path,
            format!("quantization method '{method}'"),
        ));
    }
    let get = |k: &str| q.get(k).and_then(Json::as_u64);
    match (get("bits"), get("group_size")) {
        (Some(bits @ (2 | 3 | 4 | 5 | 6 | 8)), Some(gs @ 1..=4096)) => Ok(Some(MlxQuantization {
            bits: bits as u32,
            group_size: gs as u32,
        })),
        (b, g) => Err(FormatError::invalid(
            path,
            format!("quantization: bits {b:?} / group_size {g:?} (bits 2–8, group_size 1–4096)"),
        )),
    }
}

#[cfg(unix)]
extern "C" {
    fn mlock(addr: *const std::ffi::c_void, len: usize) -> i32;
}

/// `mlock(2)` over `b` (the kernel rounds to whole pages).
#[cfg(unix)]
fn lock_bytes(b: &[u8]) -> std::io::Result<()> {
    if b.is_empty() {
        return Ok(());
    }
    // SAFETY: `b` is a valid mapped or owned range; mlock changes no
    // contents. The lock lasts until the mapping is dropped.
    if unsafe { mlock(b.as_ptr().cast(), b.len()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(unix))]
fn lock_bytes(_: &[u8]) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "mlock is not available on this platform",
    ))
}

/// The soft `RLIMIT_MEMLOCK` (Linux: from `/proc/self/limits`).
fn memlock_limit() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    line.split_whitespace().nth(3).map(str::to_string)
}
