//! The device: driver checks, context and stream, the kernel module (NVRTC
//! compiled, cached on disk), raw device buffers and kernel launches.
//!
//! Everything goes through cudarc's thin `result`/`sys` layers with the
//! libraries loaded at run time: a machine without CUDA builds and runs the
//! rest of kiln, and asking for the GPU there is an error, never a crash.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::driver::{result as dr, sys};

/// A device-side failure, with what was being done.
#[derive(Debug, Clone)]
pub struct CudaError(pub String);

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CudaError {}

impl From<CudaError> for kiln_core::EngineError {
    fn from(e: CudaError) -> Self {
        kiln_core::EngineError::Unsupported(e.0)
    }
}

pub type CuResult<T> = std::result::Result<T, CudaError>;

const HINT: &str = "run with --device cpu to use the CPU backend";

fn drv<T>(what: &str, r: std::result::Result<T, dr::DriverError>) -> CuResult<T> {
    r.map_err(|e| {
        let name = e
            .error_name()
            .ok()
            .and_then(|s| s.to_str().ok())
            .unwrap_or("?");
        CudaError(format!("CUDA {what}: {name} ({})", e.0 as i32))
    })
}

/// cudarc panics when a library or symbol is missing; turn that into an error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> CuResult<T>) -> CuResult<T> {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(prev);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(CudaError(format!("{what} failed: {msg}; {HINT}")))
        }
    }
}

/// Whether a CUDA driver library can be loaded at all (cheap; no device work).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version as (major, minor), if the library is present.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    // SAFETY: dlopen only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return None;
    }
    guarded("NVRTC", || {
        let (mut a, mut b) = (0i32, 0i32);
        // SAFETY: plain out-pointers.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
        r.result()
            .map_err(|e| CudaError(format!("nvrtcVersion: {e:?}")))?;
        Ok((a, b))
    })
    .ok()
}

/// A device allocation (freed on drop; the owner keeps the context current).
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub fn alloc(bytes: usize) -> CuResult<DevBuf> {
        let b = bytes.max(16);
        // SAFETY: plain allocation in the current context.
        let ptr = drv(&format!("allocating {b} bytes"), unsafe {
            dr::malloc_sync(b)
        })?;
        Ok(DevBuf { ptr, bytes: b })
    }

    pub fn from_bytes(data: &[u8]) -> CuResult<DevBuf> {
        let b = DevBuf::alloc(data.len())?;
        // SAFETY: b holds at least data.len() bytes.
        unsafe { upload_landed(b.ptr, data)? };
        Ok(b)
    }

    pub fn from_f32(data: &[f32]) -> CuResult<DevBuf> {
        let b = DevBuf::alloc(std::mem::size_of_val(data))?;
        // SAFETY: as above.
        unsafe { upload_landed(b.ptr, data)? };
        Ok(b)
    }

    pub fn zeroed(bytes: usize) -> CuResult<DevBuf> {
        let b = DevBuf::alloc(bytes)?;
        // SAFETY: within the allocation.
        drv("memset", unsafe { dr::memset_d8_sync(b.ptr, 0, b.bytes) })?;
        // As in upload_landed: the memset runs on the legacy stream.
        drv("memset", dr::ctx::synchronize())?;
        Ok(b)
    }
}

/// Copies `src` to device address `dst` and returns once the bytes are
/// there. cuMemcpyHtoD from pageable memory may return while its DMA is
/// still running, on the legacy stream, which the backend's non-blocking
/// stream does not wait for: a kernel queued next (the load-time repacking)
/// read part of a 37 x 16640 matrix before it had landed (cuda_check).
///
/// # Safety
/// `dst` must hold `size_of_val(src)` bytes.
pub unsafe fn upload_landed<T>(dst: u64, src: &[T]) -> CuResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    drv("upload", unsafe { dr::memcpy_htod_sync(dst, src) })?;
    drv("upload", dr::ctx::synchronize())
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync, freed once.
        let _ = unsafe { dr::free_sync(self.ptr) };
    }
}

/// One kernel argument (passed by value).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// Device pointer or u64.
    P(u64),
    I(i32),
    F(f32),
}

/// Device facts for messages and for choosing the kernels' target.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub cc: (i32, i32),
    pub sms: i32,
    pub driver_version: i32,
    pub nvrtc: Option<(i32, i32)>,
    pub total_mem: usize,
    /// The memory's peak rate by its datasheet (bytes/s: clock × 2 × bus
    /// width, as the driver reports them); 0 where the driver does not.
    pub peak_bandwidth: f64,
    /// How the kernels were obtained: "compiled M of N modules (T ms)" or
    /// "cache".
    pub kernels: String,
    /// Where compiled kernel modules are kept ([`cache_dir`]).
    pub kernel_cache: Option<PathBuf>,
}

/// Per-kernel timing with events (off unless enabled; not during capture).
struct Profile {
    events: Vec<sys::CUevent>,
    /// (function, start event index) of each timed launch.
    launches: Vec<(sys::CUfunction, usize)>,
}

pub struct Gpu {
    pub info: DeviceInfo,
    profile: std::cell::RefCell<Option<Profile>>,
    pub(crate) ctx: sys::CUcontext,
    dev: sys::CUdevice,
    pub(crate) stream: sys::CUstream,
    /// The kernel modules ([`kernel_modules`]); a kernel is in one of them.
    modules: Vec<sys::CUmodule>,
    funcs: HashMap<String, sys::CUfunction>,
    /// Launch with programmatic dependent launch (sm_90+, `$KILN_CUDA_PDL`
    /// not 0): a kernel may start while the previous one finishes; every
    /// kernel waits (`griddepcontrol.wait`) before touching what earlier
    /// kernels wrote, so only work that needs nothing from them (the
    /// GEMVs' weight prefetch, launch and block scheduling) overlaps.
    pub pdl: bool,
    /// Kernels launched twice each time (`$KILN_CUDA_TWICE`, comma-separated
    /// names): what one more launch of a kernel costs in place, for
    /// profiling without hardware counters. Outputs are then wrong.
    twice: Vec<sys::CUfunction>,
    /// Kernels never launched (`$KILN_CUDA_SKIP`, comma-separated names):
    /// the most that fusing a kernel away could gain in place, since its
    /// work and its boundary are both gone. Outputs are then wrong.
    skip: Vec<sys::CUfunction>,
    /// A no-op kernel launched before every kernel (`$KILN_CUDA_BOUNDARY=1`):
    /// what one more kernel boundary costs in place. Outputs stay right.
    boundary: Option<sys::CUfunction>,
    /// [`Gpu::blocks_per_sm`]'s answers, asked once per (kernel, block):
    /// the norm-fused GEMVs size their grid with it on every launch.
    occupancy: std::cell::RefCell<Vec<(sys::CUfunction, u32, u32)>>,
    /// Dynamic shared memory bytes of the kernels that take some
    /// ([`Gpu::set_dyn_smem`]); every launch of such a kernel passes them.
    dyn_smem: Vec<(sys::CUfunction, u32)>,
    /// A timeline build's stamp ring ([`Gpu::timeline_reset`]).
    tl_buf: std::cell::RefCell<Option<DevBuf>>,
    /// The preferred shared-memory carveout (percent) for the kernels whose
    /// names start with one of the prefixes (`$KILN_CUDA_CARVEOUT=P1,P2:PCT`,
    /// an A/B knob): an SM runs one L1 / shared split at a time, so a kernel
    /// without shared memory (Gemma's plain O GEMV) can leave its SMs in a
    /// split that the next kernel's blocks do not fit until it ends.
    carveout: Option<(Vec<String>, i32)>,
}

// SAFETY: the handles are plain driver handles; every use makes the context
// current on the calling thread first.
unsafe impl Send for Gpu {}

/// The kernel sources, in the order of one text of them all.
pub const SOURCES: [(&str, &str); 12] = [
    ("common.cu", include_str!("../kernels/common.cu")),
    ("quant.cu", include_str!("../kernels/quant.cu")),
    ("repack.cu", include_str!("../kernels/repack.cu")),
    ("mm.cu", include_str!("../kernels/mm.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("gemv.cu", include_str!("../kernels/gemv.cu")),
    ("mmq.cu", include_str!("../kernels/mmq.cu")),
    ("ops.cu", include_str!("../kernels/ops.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    (
        "attention_f32.cu",
        include_str!("../kernels/attention_f32.cu"),
    ),
    (
        "attention_f16.cu",
        include_str!("../kernels/attention_f16.cu"),
    ),
    ("flash.cu", include_str!("../kernels/flash.cu")),
];

/// What every kernel module starts with: device helpers and the quantized
/// layouts, no kernels.
pub const PRELUDE: [&str; 2] = ["common.cu", "quant.cu"];

/// The kernel modules: each is the prelude, then these files. Compiled as
/// separate modules, a cold start compiles them on parallel threads and a
/// source change recompiles only the modules that include it. A file in
/// more than one module (attention.cu: templates and macros, its kernel
/// list `ATTENTION_KERNELS` expanded once per K/V type) instantiates no
/// kernel. A timeline build compiles everything as one module: its stamp
/// ring is one device global.
pub const MODULES: [(&str, &[&str]); 9] = [
    ("repack", &["repack.cu"]),
    ("mm", &["mm.cu"]),
    ("matmul", &["matmul.cu"]),
    ("gemv", &["gemv.cu"]),
    ("mmq", &["mmq.cu"]),
    ("ops", &["ops.cu"]),
    ("attention_f32", &["attention.cu", "attention_f32.cu"]),
    ("attention_f16", &["attention.cu", "attention_f16.cu"]),
    ("flash", &["flash.cu"]),
];

fn concat<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut s = String::new();
    for name in names {
        let src = SOURCES.iter().find(|f| f.0 == name).map_or("", |f| f.1);
        s.push_str(&format!("// @file {name}\n"));
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// Every source in one text.
pub fn kernel_source() -> String {
    concat(SOURCES.iter().map(|f| f.0))
}

/// The modules' sources, by name (a timeline build: one module of all).
pub fn kernel_modules() -> Vec<(&'static str, String)> {
    if timeline_on() {
        return vec![("all", kernel_source())];
    }
    MODULES
        .iter()
        .map(|(name, files)| (*name, concat(PRELUDE.iter().chain(files.iter()).copied())))
        .collect()
}

/// FNV-1a, 64 bits: the cache key of a source text (not security relevant).
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where compiled kernels are kept: `$KILN_CUDA_CACHE`, else
/// `$XDG_CACHE_HOME/kiln/cuda`, else `$HOME/.cache/kiln/cuda`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KILN_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("kiln/cuda"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln/cuda"))
}

fn nvrtc_options(arch: &str) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-default-device".into(),
    ];
    if timeline_on() {
        o.push("-DKILN_TIMELINE".into());
        o.push(format!("-DTL_GRIDS={TL_GRIDS}"));
        o.push(format!("-DTL_BLOCKS={TL_BLOCKS}"));
        o.push(format!("-DTL_WORDS={TL_WORDS}"));
        o.push(format!("-DTL_SEEN={TL_SEEN}ull"));
    }
    o
}

/// The timeline ring (common.cu takes its shape from these): a slot of
/// TL_WORDS u64 per (grid launch number mod TL_GRIDS, block < TL_BLOCKS);
/// TL_SEEN marks a slot's last word once its block has waited.
const TL_GRIDS: usize = 256;
const TL_BLOCKS: usize = 8192;
const TL_WORDS: usize = 8;
const TL_SEEN: u64 = 1 << 21;
const TL_BYTES: usize = TL_GRIDS * TL_BLOCKS * TL_WORDS * 8;

/// `$KILN_CUDA_TIMELINE` set: kernels built to stamp their waits
/// ([`Gpu::timeline_reset`]; a diagnostic build, not for speed).
pub fn timeline_on() -> bool {
    std::env::var_os("KILN_CUDA_TIMELINE").is_some()
}

/// Compiles `src` for `arch` (`sm_90` …) to a cubin with NVRTC.
pub fn compile_cubin(src: &str, arch: &str) -> CuResult<Vec<u8>> {
    compile_cubin_opts(src, arch, &[]).map(|(c, _)| c)
}

/// Like [`compile_cubin`] with extra NVRTC options; also returns the log.
pub fn compile_cubin_opts(src: &str, arch: &str, extra: &[&str]) -> CuResult<(Vec<u8>, String)> {
    use cudarc::nvrtc::{result as nr, sys as ns};
    if !unsafe { ns::is_culib_present() } {
        return Err(CudaError(format!(
            "NVRTC (libnvrtc.so) not found: kiln compiles its CUDA kernels at run time and \
             needs the CUDA runtime compiler; {HINT}"
        )));
    }
    guarded("NVRTC compile", || {
        let csrc = CString::new(src).map_err(|_| CudaError("kernel source has a NUL".into()))?;
        let prog = nr::create_program(&csrc, Some(c"kiln.cu"))
            .map_err(|e| CudaError(format!("nvrtcCreateProgram: {e:?}")))?;
        let mut opts = nvrtc_options(arch);
        opts.extend(extra.iter().map(|s| s.to_string()));
        // SAFETY: prog is live until destroy_program below.
        let res = unsafe { nr::compile_program(prog, &opts) };
        // SAFETY: prog is live.
        let log = unsafe { nr::get_program_log(prog) }
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                String::from_utf8_lossy(&bytes)
                    .trim_end_matches('\0')
                    .to_string()
            })
            .unwrap_or_default();
        let out = match res {
            Ok(()) => {
                let mut size = 0usize;
                // SAFETY: out-pointer; then a buffer of that size.
                let r = unsafe { ns::nvrtcGetCUBINSize(prog, &mut size) };
                r.result()
                    .map_err(|e| CudaError(format!("nvrtcGetCUBINSize: {e:?}")))?;
                let mut buf = vec![0u8; size];
                let r = unsafe { ns::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _) };
                r.result()
                    .map_err(|e| CudaError(format!("nvrtcGetCUBIN: {e:?}")))?;
                Ok((buf, log))
            }
            Err(e) => Err(CudaError(format!(
                "NVRTC could not compile the kernels for {arch} ({e:?}):\n{log}"
            ))),
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { nr::destroy_program(prog) };
        out
    })
}

/// A kernel module's name and cubin.
pub type NamedCubin = (&'static str, Vec<u8>);

/// What [`on_kernel_compile`] registered.
type CompileNotice = Box<dyn Fn(Option<&str>) + Send + Sync>;
static COMPILE_NOTICE: std::sync::OnceLock<CompileNotice> = std::sync::OnceLock::new();

/// Registers `f` to hear of a start's kernel compile: `Some(what)` before
/// (a cold start: tens of seconds), `None` when it is over. The first
/// registration stays.
pub fn on_kernel_compile(f: impl Fn(Option<&str>) + Send + Sync + 'static) {
    let _ = COMPILE_NOTICE.set(Box::new(f));
}

/// The kernel modules' cubins for `arch`, each from the disk cache when its
/// source, arch and NVRTC version match, else compiled (the missing ones on
/// parallel threads) and stored. Returns the cubins by module name, how
/// they were obtained and the cache folder. Needs no GPU:
/// `cached_cubins("sm_90")` fills the cache ahead of time.
pub fn cached_cubins(arch: &str) -> CuResult<(Vec<NamedCubin>, String, Option<PathBuf>)> {
    cached_cubins_in(arch, cache_dir())
}

/// [`cached_cubins`] with the cache in `dir` (None: no cache).
pub fn cached_cubins_in(
    arch: &str,
    dir: Option<PathBuf>,
) -> CuResult<(Vec<NamedCubin>, String, Option<PathBuf>)> {
    let modules = kernel_modules();
    let opts = nvrtc_options(arch).join(" ");
    let nv = nvrtc_version();
    let stems: Vec<String> = modules
        .iter()
        .map(|(_, src)| {
            let key = fnv1a(format!("{src}\n{opts}").as_bytes());
            format!("kiln-{key:016x}-{arch}")
        })
        .collect();
    let mut cubins: Vec<Option<Vec<u8>>> = stems
        .iter()
        .map(|stem| dir.as_ref().and_then(|d| cached(d, stem, nv)))
        .collect();
    let missing: Vec<usize> = (0..cubins.len()).filter(|&i| cubins[i].is_none()).collect();
    let how = if missing.is_empty() {
        "cache".to_string()
    } else {
        let t = Instant::now();
        let notice = COMPILE_NOTICE.get();
        if let Some(f) = notice {
            let place = dir.as_ref().map_or(String::new(), |d| {
                format!("; kept in {} for later starts", d.display())
            });
            f(Some(&format!(
                "compiling {} of {} CUDA kernel modules for {arch} (once per kiln build, \
                 driver and GPU type{place})",
                missing.len(),
                modules.len()
            )));
        }
        let built = compile_parallel(&missing, &modules, arch);
        if let Some(f) = notice {
            f(None);
        }
        for (i, cubin) in built? {
            if let (Some(d), Some(v)) = (&dir, nv) {
                store(d, &stems[i], v, &cubin);
            }
            cubins[i] = Some(cubin);
        }
        format!(
            "compiled {} of {} modules ({} ms)",
            missing.len(),
            modules.len(),
            t.elapsed().as_millis()
        )
    };
    let named = modules
        .iter()
        .zip(cubins)
        .filter_map(|((name, _), c)| Some((*name, c?)))
        .collect();
    Ok((named, how, dir))
}

/// The cache file of a module's `stem` built by NVRTC `a.b`.
fn cubin_file(dir: &Path, stem: &str, (a, b): (i32, i32)) -> PathBuf {
    dir.join(format!("{stem}-nvrtc{a}.{b}.cubin"))
}

/// A cached cubin of `stem` for NVRTC version `nv`; without NVRTC, any
/// cached build of that source and arch.
fn cached(dir: &Path, stem: &str, nv: Option<(i32, i32)>) -> Option<Vec<u8>> {
    if let Some(v) = nv {
        return std::fs::read(cubin_file(dir, stem, v)).ok();
    }
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        (name.starts_with(stem) && name.ends_with(".cubin"))
            .then(|| std::fs::read(e.path()).ok())
            .flatten()
    })
}

/// Writes a cubin into the cache (through a temporary file, so a reader
/// never sees half of one); a cache that cannot be written is skipped.
fn store(dir: &Path, stem: &str, nv: (i32, i32), cubin: &[u8]) {
    let p = cubin_file(dir, stem, nv);
    let tmp = dir.join(format!("{stem}.{}.tmp", std::process::id()));
    if std::fs::create_dir_all(dir).is_err()
        || std::fs::write(&tmp, cubin).is_err()
        || std::fs::rename(&tmp, &p).is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Compiles `modules[i]` for each i in `which`, as many at once as the
/// machine has cores, largest first: (i, cubin) pairs.
fn compile_parallel(
    which: &[usize],
    modules: &[(&str, String)],
    arch: &str,
) -> CuResult<Vec<(usize, Vec<u8>)>> {
    let mut order = which.to_vec();
    order.sort_by_key(|&i| std::cmp::Reverse(modules[i].1.len()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(order.len());
    std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut out = Vec::new();
                    while let Some(&i) =
                        order.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        let cubin = compile_cubin(&modules[i].1, arch)
                            .map_err(|e| CudaError(format!("{} (module {})", e.0, modules[i].0)))?;
                        out.push((i, cubin));
                    }
                    Ok(out)
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            let built: CuResult<Vec<_>> = w
                .join()
                .unwrap_or_else(|_| Err(CudaError("an NVRTC thread panicked".into())));
            all.extend(built?);
        }
        Ok(all)
    })
}

/// The kernel `name` from whichever of `modules` holds it.
fn find_function(modules: &[sys::CUmodule], name: &str) -> Option<sys::CUfunction> {
    let c = CString::new(name).ok()?;
    modules
        .iter()
        // SAFETY: the modules are live.
        .find_map(|&m| unsafe { dr::module::get_function(m, c.clone()) }.ok())
}

impl Gpu {
    /// Opens device `ordinal`: driver and device checks, context, stream,
    /// and the kernel module for the device's architecture.
    pub fn new(ordinal: usize) -> CuResult<Gpu> {
        if !driver_present() {
            return Err(CudaError(format!(
                "no CUDA driver found (libcuda.so could not be loaded); {HINT}"
            )));
        }
        guarded("CUDA initialisation", || Self::open(ordinal))
    }

    fn open(ordinal: usize) -> CuResult<Gpu> {
        drv(
            "init (is an NVIDIA GPU present and its driver loaded?)",
            dr::init(),
        )?;
        let mut ver = 0i32;
        // SAFETY: out-pointer.
        drv("driver version", unsafe {
            sys::cuDriverGetVersion(&mut ver).result()
        })?;
        if ver < 12000 {
            return Err(CudaError(format!(
                "the CUDA driver supports CUDA {}.{}, kiln needs 12.0 or newer; update the \
                 NVIDIA driver or {HINT}",
                ver / 1000,
                ver % 1000 / 10
            )));
        }
        let count = drv("device count", dr::device::get_count())?;
        if count <= 0 {
            return Err(CudaError(format!("no CUDA device found; {HINT}")));
        }
        if ordinal >= count as usize {
            return Err(CudaError(format!(
                "CUDA device {ordinal} does not exist ({count} found)"
            )));
        }
        let dev = drv("device", dr::device::get(ordinal as i32))?;
        let attr = |a: sys::CUdevice_attribute| {
            // SAFETY: valid device.
            drv("device attribute", unsafe {
                dr::device::get_attribute(dev, a)
            })
        };
        use sys::CUdevice_attribute as A;
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        // Double data rate: two transfers a clock of the bus.
        let peak_bandwidth = match (
            attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        ) {
            (Ok(khz), Ok(bits)) if khz > 0 && bits > 0 => {
                f64::from(khz) * 1e3 * 2.0 * f64::from(bits) / 8.0
            }
            _ => 0.0,
        };
        let name = dr::device::get_name(dev).unwrap_or_else(|_| "?".into());
        // SAFETY: valid device.
        let total_mem = drv("total memory", unsafe { dr::device::total_mem(dev) })?;
        if cc.0 < 7 {
            return Err(CudaError(format!(
                "{name} has compute capability {}.{}; kiln's kernels need 7.0 or newer; {HINT}",
                cc.0, cc.1
            )));
        }
        let nvrtc = nvrtc_version();
        if let Some((a, _)) = nvrtc {
            if a * 1000 > ver {
                return Err(CudaError(format!(
                    "NVRTC {a}.x builds kernels the driver (CUDA {}.{}) cannot load; update the \
                     NVIDIA driver or {HINT}",
                    ver / 1000,
                    ver % 1000 / 10
                )));
            }
        }
        // SAFETY: valid device; released in Drop.
        let ctx = drv("context", unsafe { dr::primary_ctx::retain(dev) })?;
        drv("set context", unsafe { dr::ctx::set_current(ctx) })?;
        let stream = drv(
            "stream",
            dr::stream::create(dr::stream::StreamKind::NonBlocking),
        )?;
        let arch = format!("sm_{}{}", cc.0, cc.1);
        let (cubins, how, cache) = cached_cubins(&arch)?;
        let modules = cubins
            .iter()
            .map(|(name, cubin)| {
                // SAFETY: a complete cubin image, kept alive for the call.
                let m = unsafe { dr::module::load_data(cubin.as_ptr() as *const c_void) };
                m.or_else(|e| {
                    // A cached cubin the driver rejects (a damaged cache
                    // file) is rebuilt when its file is gone.
                    let place = cache.as_ref().map_or(String::new(), |d| {
                        format!(
                            " (cached in {}: deleting that folder rebuilds it)",
                            d.display()
                        )
                    });
                    drv(&format!("loading kernel module '{name}'{place}"), Err(e))
                })
            })
            .collect::<CuResult<Vec<_>>>()?;
        let info = DeviceInfo {
            name,
            cc,
            sms,
            driver_version: ver,
            nvrtc,
            total_mem,
            peak_bandwidth,
            kernels: how,
            kernel_cache: cache,
        };
        let named = |var: &str| -> Vec<sys::CUfunction> {
            std::env::var(var)
                .unwrap_or_default()
                .split(',')
                .filter_map(|n| find_function(&modules, n.trim()))
                .collect()
        };
        let twice = named("KILN_CUDA_TWICE");
        let skip = named("KILN_CUDA_SKIP");
        let boundary = if std::env::var("KILN_CUDA_BOUNDARY").is_ok_and(|v| v == "1") {
            find_function(&modules, "nop")
        } else {
            None
        };
        Ok(Gpu {
            info,
            ctx,
            dev,
            stream,
            modules,
            funcs: HashMap::new(),
            profile: std::cell::RefCell::new(None),
            pdl: cc.0 >= 9 && std::env::var("KILN_CUDA_PDL").map_or(true, |v| v != "0"),
            twice,
            skip,
            boundary,
            occupancy: std::cell::RefCell::new(Vec::new()),
            dyn_smem: Vec::new(),
            tl_buf: std::cell::RefCell::new(None),
            carveout: std::env::var("KILN_CUDA_CARVEOUT").ok().and_then(|v| {
                let (names, pct) = v.rsplit_once(':')?;
                let pct = pct
                    .trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|p| (0..=100).contains(p))?;
                Some((
                    names.split(',').map(|n| n.trim().to_string()).collect(),
                    pct,
                ))
            }),
        })
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> CuResult<()> {
        // SAFETY: ctx is live while self is.
        drv("set context", unsafe { dr::ctx::set_current(self.ctx) })
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> CuResult<(usize, usize)> {
        self.bind()?;
        drv("memory info", dr::mem_get_info())
    }

    /// The kernel `name` from the module.
    pub fn func(&mut self, name: &str) -> CuResult<sys::CUfunction> {
        if let Some(&f) = self.funcs.get(name) {
            return Ok(f);
        }
        let f = find_function(&self.modules, name)
            .ok_or_else(|| CudaError(format!("kernel '{name}' is in no kernel module")))?;
        if let Some((names, pct)) = &self.carveout {
            if names.iter().any(|n| name.starts_with(n.as_str())) {
                // SAFETY: f is a live function of this context; a refusal
                // leaves the driver's own choice.
                let _ = unsafe {
                    sys::cuFuncSetAttribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                        *pct,
                    )
                };
            }
        }
        self.funcs.insert(name.to_string(), f);
        Ok(f)
    }

    /// Enqueues `f` on the stream. Allocates nothing.
    pub(crate) fn launch(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> CuResult<()> {
        self.launch_cluster(f, grid, block, 1, args)
    }

    /// Thread-block clusters (sm_90+): blocks in groups that share shared
    /// memory and a barrier.
    pub fn clusters(&self) -> bool {
        self.info.cc.0 >= 9
    }

    /// The largest cluster of `block`-thread blocks, a power of two up to
    /// `want`, that `f` can run with at least one cluster resident (clusters
    /// past 8 blocks need the non-portable opt-in, set here); 1 without
    /// clusters.
    pub(crate) fn max_cluster(&self, f: sys::CUfunction, block: u32, want: u32) -> u32 {
        if !self.clusters() {
            return 1;
        }
        // SAFETY: f is a live function of this context; a failure only
        // leaves the portable limit of 8 in force.
        let _ = unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
        };
        let mut c = want.next_power_of_two();
        while c > 1 {
            let mut attr = sys::CUlaunchAttribute_st {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue { pad: [0; 64] },
            };
            attr.value.clusterDim.x = c;
            attr.value.clusterDim.y = 1;
            attr.value.clusterDim.z = 1;
            let cfg = sys::CUlaunchConfig_st {
                gridDimX: c,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: self.dyn_smem_of(f),
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            let mut n: std::ffi::c_int = 0;
            // SAFETY: cfg and attr outlive the call; n is written.
            let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f, &cfg) };
            if r == sys::CUresult::CUDA_SUCCESS && n >= 1 {
                return c;
            }
            c /= 2;
        }
        1
    }

    /// Launches `f` with `bytes` of dynamic shared memory from now on
    /// (past the 48 KiB a block gets without asking, the driver is asked).
    pub(crate) fn set_dyn_smem(&mut self, f: sys::CUfunction, bytes: u32) -> CuResult<()> {
        // SAFETY: f is a live function of this context.
        let r = unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        };
        drv("dynamic shared memory", r.result())?;
        self.dyn_smem.retain(|&(g, _)| g != f);
        self.dyn_smem.push((f, bytes));
        self.occupancy.borrow_mut().retain(|&(g, _, _)| g != f);
        Ok(())
    }

    fn dyn_smem_of(&self, f: sys::CUfunction) -> u32 {
        self.dyn_smem
            .iter()
            .find(|&&(g, _)| g == f)
            .map_or(0, |&(_, b)| b)
    }

    /// Blocks of `block` threads of `f` that one SM holds at once (at
    /// least 1).
    pub(crate) fn blocks_per_sm(&self, f: sys::CUfunction, block: u32) -> u32 {
        let mut known = self.occupancy.borrow_mut();
        if let Some(&(_, _, n)) = known.iter().find(|&&(g, b, _)| g == f && b == block) {
            return n;
        }
        let mut n: std::ffi::c_int = 0;
        // SAFETY: f is a live function of this context; n is written.
        let r = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                f,
                block as i32,
                self.dyn_smem_of(f) as usize,
            )
        };
        let n = if r == sys::CUresult::CUDA_SUCCESS {
            n.max(1) as u32
        } else {
            1
        };
        known.push((f, block, n));
        n
    }

    /// [`Gpu::launch`] with the grid's x dimension in clusters of `cluster`
    /// blocks (1: none; more needs [`Gpu::clusters`] and divides grid.0).
    pub(crate) fn launch_cluster(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        cluster: u32,
        args: &[Arg],
    ) -> CuResult<()> {
        const MAX: usize = 40;
        if args.len() > MAX {
            return Err(CudaError("too many kernel arguments".into()));
        }
        let mut slots = [0u64; MAX];
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX];
        for (i, a) in args.iter().enumerate() {
            slots[i] = match *a {
                Arg::P(p) => p,
                Arg::I(v) => u64::from(v as u32),
                Arg::F(v) => u64::from(v.to_bits()),
            };
        }
        for (i, p) in ptrs.iter_mut().enumerate().take(args.len()) {
            // Little-endian: a 4-byte argument is read from the slot's start.
            *p = (&mut slots[i]) as *mut u64 as *mut c_void;
        }
        if self.skip.contains(&f) {
            return Ok(());
        }
        let mut prof = self.profile.borrow_mut();
        let timed = match prof.as_mut() {
            Some(p) if 2 * p.launches.len() + 2 <= p.events.len() => {
                let i = 2 * p.launches.len();
                p.launches.push((f, i));
                // SAFETY: live event and stream.
                drv("event", unsafe {
                    dr::event::record(p.events[i], self.stream)
                })?;
                Some(p.events[i + 1])
            }
            _ => None,
        };
        if let Some(nop) = self.boundary {
            self.launch_once(nop, (1, 1, 1), 32, 1, &mut [])?;
        }
        if self.twice.contains(&f) {
            self.launch_once(f, grid, block, cluster, &mut ptrs[..args.len()])?;
        }
        let r = self.launch_once(f, grid, block, cluster, &mut ptrs[..args.len()]);
        if let Some(ev) = timed {
            // SAFETY: live event and stream.
            drv("event", unsafe { dr::event::record(ev, self.stream) })?;
        }
        r
    }

    fn launch_once(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        cluster: u32,
        ptrs: &mut [*mut c_void],
    ) -> CuResult<()> {
        let smem = self.dyn_smem_of(f);
        // SAFETY: the arguments match the kernel's parameters (checked by
        // the callers' construction); slots outlive the call.
        if self.pdl || cluster > 1 {
            let none = sys::CUlaunchAttribute_st {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_IGNORE,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue { pad: [0; 64] },
            };
            let mut attrs = [none, none];
            let mut na = 0;
            if self.pdl {
                attrs[na].id =
                    sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attrs[na].value.programmaticStreamSerializationAllowed = 1;
                na += 1;
            }
            if cluster > 1 {
                attrs[na].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                attrs[na].value.clusterDim.x = cluster;
                attrs[na].value.clusterDim.y = 1;
                attrs[na].value.clusterDim.z = 1;
                na += 1;
            }
            let cfg = sys::CUlaunchConfig_st {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream,
                attrs: attrs.as_mut_ptr(),
                numAttrs: na as u32,
            };
            // SAFETY: as launch_kernel below; cfg and attrs outlive the call.
            drv("kernel launch", unsafe {
                sys::cuLaunchKernelEx(&cfg, f, ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
            })
        } else {
            drv("kernel launch", unsafe {
                dr::launch_kernel(f, grid, (block, 1, 1), smem, self.stream, ptrs)
            })
        }
    }

    /// Empties the stamps of a timeline build (queued on the stream); the
    /// first call allocates their ring and points the kernels at it.
    pub fn timeline_reset(&self) -> CuResult<()> {
        let mut buf = self.tl_buf.borrow_mut();
        let ring = match buf.as_ref() {
            Some(b) => b.ptr,
            None => {
                let b = DevBuf::alloc(TL_BYTES)?;
                let (p, _) = self.timeline_global("kiln_tl_ptr")?;
                // SAFETY: an 8-byte device global of the live module.
                drv("timeline pointer", unsafe {
                    dr::memcpy_htod_sync(p, &[b.ptr])
                })?;
                buf.insert(b).ptr
            }
        };
        // SAFETY: the ring is TL_BYTES long.
        drv("timeline reset", unsafe {
            dr::memset_d8_async(ring, 0, TL_BYTES, self.stream)
        })
    }

    /// The stamps since [`Gpu::timeline_reset`], one row per block that
    /// waited: [grid slot, block, before the wait, after it, marks 1..5
    /// (0: not reached), blocks << 41 | threads << 30 | SM << 22].
    pub fn timeline_read(&self) -> CuResult<Vec<[u64; 10]>> {
        self.sync()?;
        let buf = self.tl_buf.borrow();
        let Some(b) = buf.as_ref() else {
            return Ok(Vec::new());
        };
        let mut v = vec![0u64; TL_BYTES / 8];
        // SAFETY: the ring is TL_BYTES long; the stream is synced.
        drv("timeline read", unsafe {
            dr::memcpy_dtoh_sync(&mut v, b.ptr)
        })?;
        let mut rows = Vec::new();
        for (i, s) in v.chunks_exact(TL_WORDS).enumerate() {
            let shape = s[TL_WORDS - 1];
            if shape & TL_SEEN != 0 {
                let mut row = [0u64; 10];
                row[0] = (i / TL_BLOCKS) as u64;
                row[1] = (i % TL_BLOCKS) as u64;
                row[2..9].copy_from_slice(&s[..TL_WORDS - 1]);
                row[9] = shape & !TL_SEEN;
                rows.push(row);
            }
        }
        Ok(rows)
    }

    fn timeline_global(&self, name: &str) -> CuResult<(sys::CUdeviceptr, usize)> {
        let c = CString::new(name).map_err(|_| CudaError("bad symbol name".into()))?;
        // A timeline build is one module (kernel_modules).
        let m = self
            .modules
            .first()
            .copied()
            .unwrap_or(std::ptr::null_mut());
        // SAFETY: module is live.
        drv(
            &format!("'{name}' (a timeline build: $KILN_CUDA_TIMELINE)"),
            unsafe { dr::module::get_global(m, c) },
        )
    }

    /// Starts timing every launch with events (up to `max` launches).
    pub fn profile_start(&self, max: usize) -> CuResult<()> {
        self.bind()?;
        let mut p = self.profile.borrow_mut();
        if p.is_none() {
            let mut events = Vec::with_capacity(2 * max);
            for _ in 0..2 * max {
                events.push(drv(
                    "event",
                    dr::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
                )?);
            }
            *p = Some(Profile {
                events,
                launches: Vec::new(),
            });
        }
        if let Some(p) = p.as_mut() {
            p.launches.clear();
        }
        Ok(())
    }

    /// Stops timing; returns (kernel name, launches, total ms), slowest first.
    pub fn profile_stop(&self) -> CuResult<Vec<(String, usize, f64)>> {
        self.sync()?;
        let Some(p) = self.profile.borrow_mut().take() else {
            return Ok(Vec::new());
        };
        let mut agg: HashMap<String, (usize, f64)> = HashMap::new();
        for &(f, i) in &p.launches {
            // SAFETY: both events were recorded and the stream is synced.
            let ms = drv("event time", unsafe {
                dr::event::elapsed(p.events[i], p.events[i + 1])
            })?;
            let name = self
                .funcs
                .iter()
                .find(|(_, &g)| g == f)
                .map_or("?".to_string(), |(n, _)| n.clone());
            let e = agg.entry(name).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += f64::from(ms);
        }
        for e in p.events {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { dr::event::destroy(e) };
        }
        let mut v: Vec<_> = agg.into_iter().map(|(n, (c, t))| (n, c, t)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        Ok(v)
    }

    pub fn upload_async<T>(&self, dst: u64, src: &[T]) -> CuResult<()> {
        // SAFETY: callers pass a destination large enough for src.
        drv("upload", unsafe {
            dr::memcpy_htod_async(dst, src, self.stream)
        })
    }

    pub fn download_async<T>(&self, dst: &mut [T], src: u64) -> CuResult<()> {
        // SAFETY: callers pass a source holding dst.len() elements; the host
        // slice stays borrowed until `sync`.
        drv("download", unsafe {
            dr::memcpy_dtoh_async(dst, src, self.stream)
        })
    }

    /// The device's copy rate in bytes read + written a second (the decode
    /// floor's bandwidth): `reps` device-to-device copies of `bytes`, after
    /// one untimed, between two events on the stream.
    pub fn copy_bandwidth(&self, bytes: usize, reps: usize) -> CuResult<f64> {
        self.bind()?;
        // What the bytes are does not matter to the copy's rate.
        let src = DevBuf::alloc(bytes)?;
        let dst = DevBuf::alloc(bytes)?;
        let copy = || {
            // SAFETY: both buffers hold `bytes` and outlive the sync below.
            drv("copy", unsafe {
                dr::memcpy_dtod_async(dst.ptr, src.ptr, bytes, self.stream)
            })
        };
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = drv("event", dr::event::create(flags))?;
        let end = drv("event", dr::event::create(flags));
        let ev = match end {
            Ok(end) => [start, end],
            Err(e) => {
                // SAFETY: created above, destroyed once.
                let _ = unsafe { dr::event::destroy(start) };
                return Err(e);
            }
        };
        let timed = (|| {
            copy()?;
            // SAFETY: live events on the live stream.
            drv("event", unsafe { dr::event::record(ev[0], self.stream) })?;
            for _ in 0..reps {
                copy()?;
            }
            drv("event", unsafe { dr::event::record(ev[1], self.stream) })?;
            self.sync()?;
            // SAFETY: both recorded, the stream synced.
            drv("event time", unsafe { dr::event::elapsed(ev[0], ev[1]) })
        })();
        for e in ev {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { dr::event::destroy(e) };
        }
        let ms = f64::from(timed?);
        if ms <= 0.0 {
            return Err(CudaError("copy bandwidth: no time elapsed".into()));
        }
        Ok(2.0 * bytes as f64 * reps as f64 / (ms / 1e3))
    }

    pub fn sync(&self) -> CuResult<()> {
        // SAFETY: valid stream.
        drv("synchronize", unsafe {
            dr::stream::synchronize(self.stream)
        })
    }

    pub fn begin_capture(&self) -> CuResult<()> {
        // SAFETY: valid stream.
        drv("graph capture", unsafe {
            dr::stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    /// Ends a capture and instantiates it.
    pub fn end_capture(&self) -> CuResult<Graph> {
        // SAFETY: valid stream in capture mode.
        let g = drv("graph capture", unsafe {
            dr::stream::end_capture(self.stream)
        })?;
        // SAFETY: g is a valid graph.
        let exec = unsafe { dr::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) };
        match exec {
            Ok(exec) => Ok(Graph { graph: g, exec }),
            Err(e) => {
                let _ = unsafe { dr::graph::destroy(g) };
                drv("graph instantiate", Err(e))
            }
        }
    }

    pub fn replay(&self, g: &Graph) -> CuResult<()> {
        // SAFETY: exec and stream are live.
        drv("graph launch", unsafe {
            dr::graph::launch(g.exec, self.stream)
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the handles were created by `open` and are released once.
        unsafe {
            let _ = dr::ctx::set_current(self.ctx);
            let _ = dr::stream::synchronize(self.stream);
            for &m in &self.modules {
                let _ = dr::module::unload(m);
            }
            let _ = dr::stream::destroy(self.stream);
            let _ = dr::primary_ctx::release(self.dev);
        }
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by end_capture, destroyed once.
        unsafe {
            let _ = dr::graph::exec_destroy(self.exec);
            let _ = dr::graph::destroy(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache's round trip without NVRTC (CI has none): a stored cubin is
    /// found by its stem and NVRTC version, by its stem alone where NVRTC is
    /// missing, and not under another stem or version.
    #[test]
    fn cache_round_trip() {
        let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
        let stem = "kiln-0123456789abcdef-sm_90";
        store(&dir, stem, (13, 0), b"cubin bytes");
        assert_eq!(
            cached(&dir, stem, Some((13, 0))).as_deref(),
            Some(&b"cubin bytes"[..])
        );
        assert_eq!(
            cached(&dir, stem, None).as_deref(),
            Some(&b"cubin bytes"[..])
        );
        assert_eq!(cached(&dir, stem, Some((13, 1))), None);
        assert_eq!(cached(&dir, "kiln-fedcba9876543210-sm_90", None), None);
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(names, vec![format!("{stem}-nvrtc13.0.cubin")]);
    }

    /// Each module is the prelude and its files, every source at most once.
    #[test]
    fn modules_are_the_prelude_and_their_files() {
        let modules = kernel_modules();
        assert_eq!(modules.len(), MODULES.len());
        for ((name, src), (mname, files)) in modules.iter().zip(MODULES) {
            assert_eq!(*name, mname);
            let parts: Vec<&str> = src
                .lines()
                .filter_map(|l| l.strip_prefix("// @file "))
                .collect();
            let want: Vec<&str> = PRELUDE.iter().chain(files.iter()).copied().collect();
            assert_eq!(parts, want, "{name}");
            for f in want {
                assert!(SOURCES.iter().any(|s| s.0 == f), "{f} is not a source");
            }
        }
    }
}
