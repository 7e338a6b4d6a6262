//! kiln-cpu: the CPU backend.
//!
//! One decoder for every architecture, driven by the
//! [`ArchDescriptor`](kiln_core::ArchDescriptor). Weights are read as stored
//! (mmap): each matmul decodes a weight row once with the reference
//! dequantization and dots it with every token of the batch; rows are split
//! across a persistent thread pool. Scratch buffers and the paged KV storage
//! are allocated at load; [`CpuBackend::forward`] allocates nothing.
//!
//! Two kernel sets: the scalar reference (dequantize a row, f32 dot), and
//! the fast kernels ([`Kernels::Fast`], the default where the CPU has AVX2):
//! activations quantized to 8 bits per block of 32 and integer dot products.
//! For the fast kernels the layer matrices of the common quantized types
//! (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K) are repacked at load, eight
//! rows interleaved (`packed.rs`), and run by a GEMM kernel (`gemm.rs`,
//! tiles of 8 rows × 4 tokens) for prefill and decode alike; the copy
//! replaces the mapped rows on the hot path (same size, +3% for Q4_K/Q5_K;
//! `KILN_CPU_REPACK=0` turns it off). The output matrix is repacked too;
//! a tied embedding gets a packed copy for the logits while token lookups
//! read the mapped rows. Other matrices (other types, an untied embedding)
//! are read as stored. `KILN_CPU_KERNELS=reference`
//! or [`CpuBackend::set_kernels`] selects the reference.

mod attn;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod fast;
#[cfg(target_arch = "x86_64")]
mod gemm;
mod kernels;
mod kvf16;
mod packed;
mod pool;
mod quant;
mod weights;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kiln_core::kv::{KvLayout, KvTables};
use kiln_core::rope::{inv_freqs, RopeTable};
use kiln_core::{ArchDescriptor, Backend, Batch, EngineError, Result};
use kiln_format::{Model, NormKind};

use attn::{Attn, KvRef};
pub use fast::Kernels;
use fast::{project, Op};
pub use kernels::dot;
pub use kiln_core::kv::{KvType, KvTypes};
use pool::SyncPtr;
pub use pool::ThreadPool;
use quant::QAct;
use weights::{opt_vector, vector, Mat};

struct Norm {
    w: Vec<f32>,
    b: Option<Vec<f32>>,
}

impl Norm {
    fn load(m: &Model, d: &ArchDescriptor, stem: &str) -> Result<Norm> {
        Ok(Norm {
            w: vector(m, &format!("{stem}.weight"), d.hidden, d.norm_weight_offset)?,
            b: opt_vector(m, &format!("{stem}.bias"), d.hidden, 0.0)?,
        })
    }
    /// Normalizes each `width`-long row of `x` into `out`.
    fn rows(&self, kind: NormKind, x: &[f32], out: &mut [f32], width: usize, eps: f32) {
        for (xr, or) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            kernels::norm(kind, xr, or, &self.w, self.b.as_deref(), eps);
        }
    }

    fn load_opt(m: &Model, d: &ArchDescriptor, stem: &str) -> Result<Option<Norm>> {
        if m.tensor(&format!("{stem}.weight")).is_none() {
            return Ok(None);
        }
        Self::load(m, d, stem).map(Some)
    }
}

struct Layer {
    attn_norm: Norm,
    q: Mat,
    k: Mat,
    v: Mat,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Mat,
    o_bias: Option<Vec<f32>>,
    post_attn_norm: Option<Norm>,
    ffn_norm: Norm,
    gate: Option<Mat>,
    gate_bias: Option<Vec<f32>>,
    up: Mat,
    up_bias: Option<Vec<f32>>,
    down: Mat,
    down_bias: Option<Vec<f32>>,
    post_ffn_norm: Option<Norm>,
}

/// Repacks every packable matrix of the layers and `out` into one arena
/// (`packed::Arena`): layers split over the threads, then `out` (the
/// largest) split by rows.
fn pack_all(m: &Model, layers: &mut [Layer], out: &mut Mat, threads: usize) {
    let mut jobs: Vec<(&mut Mat, usize)> = Vec::new();
    let mut total = 0usize;
    for w in layers.iter_mut().flat_map(|l| l.mats_mut()) {
        if let Some(len) = w.packed_len(m) {
            jobs.push((w, total));
            total += len;
        }
    }
    let out_off = total;
    let out_len = out.packed_len(m);
    total += out_len.unwrap_or(0);
    if total == 0 {
        return;
    }
    let arena = packed::Arena::new(total);
    let per = jobs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for part in jobs.chunks_mut(per) {
            let arena = &arena;
            s.spawn(move || {
                for (w, off) in part.iter_mut() {
                    // SAFETY: each job's range `off..off + packed_len` is
                    // its own; nothing reads the arena yet.
                    unsafe { w.pack_into(m, 1, arena, *off) };
                }
            });
        }
    });
    if out_len.is_some() {
        // SAFETY: as above; the layers' packing is done.
        unsafe { out.pack_into(m, threads, &arena, out_off) };
    }
}

fn check_shape(name: &str, w: &Mat, rows: usize, cols: usize) -> Result<()> {
    if w.rows() != rows || w.cols() != cols {
        return Err(EngineError::Unsupported(format!(
            "tensor '{name}' is [{}, {}], expected [{rows}, {cols}]",
            w.rows(),
            w.cols()
        )));
    }
    Ok(())
}

/// Whether layer weights are repacked at load for the GEMM kernels: on
/// where the CPU has them, unless `KILN_CPU_REPACK=0` (the fast kernels
/// then read the weights as stored).
fn repack_enabled() -> bool {
    simd::has_avx2() && !matches!(std::env::var("KILN_CPU_REPACK").as_deref(), Ok("0" | "off"))
}

impl Layer {
    /// The layer's matrices (those that may be repacked).
    fn mats_mut(&mut self) -> impl Iterator<Item = &mut Mat> {
        [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.o,
            &mut self.up,
            &mut self.down,
        ]
        .into_iter()
        .chain(self.gate.as_mut())
    }

    fn load(m: &Model, d: &ArchDescriptor, i: usize) -> Result<Layer> {
        let p = |n: &str| format!("blk.{i}.{n}");
        let (hid, qd, kvd, inter) = (d.hidden, d.q_dim(), d.kv_dim(), d.intermediate);
        let mat = |n: &str, rows: usize, cols: usize| -> Result<Mat> {
            let name = p(&format!("{n}.weight"));
            let w = Mat::load(m, &name)?;
            check_shape(&name, &w, rows, cols)?;
            Ok(w)
        };
        let bias = |n: &str, len: usize| opt_vector(m, &p(&format!("{n}.bias")), len, 0.0);
        let (q, k, v, q_bias, k_bias, v_bias) = if d.fused_qkv {
            let w = mat("attn_qkv", qd + 2 * kvd, hid)?;
            let mut parts = w.split(&[qd, kvd, kvd])?.into_iter();
            let b = bias("attn_qkv", qd + 2 * kvd)?;
            let (qb, kb, vb) = match b {
                Some(b) => (
                    Some(b[..qd].to_vec()),
                    Some(b[qd..qd + kvd].to_vec()),
                    Some(b[qd + kvd..].to_vec()),
                ),
                None => (None, None, None),
            };
            let missing = || EngineError::Unsupported("fused qkv split".into());
            (
                parts.next().ok_or_else(missing)?,
                parts.next().ok_or_else(missing)?,
                parts.next().ok_or_else(missing)?,
                qb,
                kb,
                vb,
            )
        } else {
            (
                mat("attn_q", qd, hid)?,
                mat("attn_k", kvd, hid)?,
                mat("attn_v", kvd, hid)?,
                bias("attn_q", qd)?,
                bias("attn_k", kvd)?,
                bias("attn_v", kvd)?,
            )
        };
        let off = d.norm_weight_offset;
        let (q_norm, k_norm) = if d.qk_norm {
            (
                Some(vector(m, &p("attn_q_norm.weight"), d.head_dim, off)?),
                Some(vector(m, &p("attn_k_norm.weight"), d.head_dim, off)?),
            )
        } else {
            (None, None)
        };
        let gate = if d.gated_ffn {
            Some(mat("ffn_gate", inter, hid)?)
        } else {
            None
        };
        Ok(Layer {
            attn_norm: Norm::load(m, d, &p("attn_norm"))?,
            q,
            k,
            v,
            q_bias,
            k_bias,
            v_bias,
            q_norm,
            k_norm,
            o: mat("attn_output", hid, qd)?,
            o_bias: bias("attn_output", hid)?,
            post_attn_norm: if d.post_attn_norm {
                Norm::load_opt(m, d, &p("post_attention_norm"))?
            } else {
                None
            },
            ffn_norm: Norm::load(m, d, &p("ffn_norm"))?,
            gate,
            gate_bias: bias("ffn_gate", inter)?,
            up: mat("ffn_up", inter, hid)?,
            up_bias: bias("ffn_up", inter)?,
            down: mat("ffn_down", hid, inter)?,
            down_bias: bias("ffn_down", hid)?,
            post_ffn_norm: if d.post_ffn_norm {
                Norm::load_opt(m, d, &p("post_ffw_norm"))?
            } else {
                None
            },
        })
    }
}

struct Weights {
    embd: Mat,
    pos_embd: Option<Mat>,
    layers: Vec<Layer>,
    out_norm: Norm,
    /// `None`: tied to `embd`.
    output: Option<Mat>,
}

/// Per-thread scratch.
pub(crate) struct Local {
    row: Vec<f32>,
    scores: Vec<f32>,
}

/// Activations of one forward call, sized for `max_batch` tokens.
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    tmp: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    sel: Vec<f32>,
    seln: Vec<f32>,
}

/// K and V storage per KV group: `[block][layer in group][pos in block][kv_dim]`.
struct KvStore {
    k: Vec<KvBuf>,
    v: Vec<KvBuf>,
}

/// One group's K or V storage.
enum KvBuf {
    F32(Vec<f32>),
    /// f16 bits.
    F16(Vec<u16>),
}

impl KvBuf {
    fn new(ty: KvType, len: usize) -> KvBuf {
        match ty {
            KvType::F32 => KvBuf::F32(vec![0.0; len]),
            KvType::F16 => KvBuf::F16(vec![0; len]),
        }
    }

    /// Stores `src` at element `at`.
    fn store(&mut self, fast: bool, at: usize, src: &[f32]) {
        match self {
            KvBuf::F32(b) => b[at..at + src.len()].copy_from_slice(src),
            KvBuf::F16(b) => kvf16::store_f16(fast, src, &mut b[at..at + src.len()]),
        }
    }

    fn as_ref(&self) -> KvRef<'_> {
        match self {
            KvBuf::F32(b) => KvRef::F32(b),
            KvBuf::F16(b) => KvRef::F16(b),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    pub threads: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

pub struct CpuBackend {
    model: Arc<Model>,
    desc: ArchDescriptor,
    layout: KvLayout,
    w: Weights,
    ropes: Vec<RopeTable>,
    pool: ThreadPool,
    locals: Vec<Mutex<Local>>,
    s: Scratch,
    kv: KvStore,
    max_batch: usize,
    kernels: Kernels,
    /// The current projection input, quantized.
    xq: QAct,
    kv_types: KvTypes,
}

impl CpuBackend {
    /// Loads the weights' layout (not their bytes: they stay mapped) and
    /// allocates KV storage for `layout` (f32) and scratch for `max_batch`
    /// tokens.
    pub fn new(
        model: Arc<Model>,
        desc: ArchDescriptor,
        layout: KvLayout,
        max_batch: usize,
        opts: CpuOptions,
    ) -> Result<Self> {
        Self::with_kv(model, desc, layout, max_batch, opts, KvTypes::default())
    }

    /// [`CpuBackend::new`] with K and V stored as `kv` says.
    pub fn with_kv(
        model: Arc<Model>,
        desc: ArchDescriptor,
        layout: KvLayout,
        max_batch: usize,
        opts: CpuOptions,
        kv_types: KvTypes,
    ) -> Result<Self> {
        let m = &*model;
        let d = &desc;
        let max_batch = max_batch.max(1);
        let embd = Mat::load(m, "token_embd.weight")?;
        check_shape("token_embd.weight", &embd, d.vocab_size, d.hidden)?;
        let pos_embd = if d.learned_positions {
            let p = Mat::load(m, "position_embd.weight")?;
            if p.cols() != d.hidden {
                return Err(EngineError::Unsupported(
                    "position_embd.weight width differs from the hidden size".into(),
                ));
            }
            if layout.max_ctx > p.rows() {
                return Err(EngineError::Input(format!(
                    "context {} exceeds the model's {} learned positions",
                    layout.max_ctx,
                    p.rows()
                )));
            }
            Some(p)
        } else {
            None
        };
        let mut layers = (0..d.n_layers)
            .map(|i| Layer::load(m, d, i))
            .collect::<Result<Vec<_>>>()?;
        let kernels = Kernels::from_env();
        let mut output = if d.tied_embeddings {
            None
        } else {
            let o = Mat::load(m, "output.weight")?;
            check_shape("output.weight", &o, d.vocab_size, d.hidden)?;
            Some(o)
        };
        let mut embd = embd;
        if kernels == Kernels::Fast && repack_enabled() {
            // The layer matrices, and the output matrix or the tied
            // embedding (a packed copy for the logits; token lookups still
            // read the mapped rows).
            let out_mat = output.as_mut().unwrap_or(&mut embd);
            pack_all(m, &mut layers, out_mat, opts.threads.max(1));
        }
        let w = Weights {
            embd,
            pos_embd,
            layers,
            out_norm: Norm::load(m, d, "output_norm")?,
            output,
        };

        let mut ropes = Vec::new();
        if let Some(r) = &d.rope {
            let ff = match m.tensor("rope_freqs.weight") {
                Some(_) => Some(vector(m, "rope_freqs.weight", r.dim / 2, 0.0)?),
                None => None,
            };
            let (f, s) = inv_freqs(r, r.theta, true, ff.as_deref());
            ropes.push(RopeTable::new(r.dim, r.style, &f, s, layout.max_ctx));
            if let Some(tl) = r.theta_local {
                let (f, s) = inv_freqs(r, tl, false, None);
                ropes.push(RopeTable::new(r.dim, r.style, &f, s, layout.max_ctx));
            }
        }

        let pool = ThreadPool::new(opts.threads);
        let max_in = d.hidden.max(d.q_dim()).max(d.intermediate);
        let locals = (0..pool.n_threads())
            .map(|_| {
                Mutex::new(Local {
                    row: vec![0.0; 4 * max_in],
                    scores: vec![0.0; layout.max_ctx],
                })
            })
            .collect();
        let b = max_batch;
        let s = Scratch {
            x: vec![0.0; b * d.hidden],
            xn: vec![0.0; b * d.hidden],
            q: vec![0.0; b * d.q_dim()],
            k: vec![0.0; b * d.kv_dim()],
            v: vec![0.0; b * d.kv_dim()],
            att: vec![0.0; b * d.q_dim()],
            tmp: vec![0.0; b * d.hidden],
            gate: vec![0.0; b * d.intermediate],
            up: vec![0.0; b * d.intermediate],
            sel: vec![0.0; b * d.hidden],
            seln: vec![0.0; b * d.hidden],
        };
        let elems = |g: usize| layout.groups[g].n_blocks * layout.block_elems(g);
        let kv = KvStore {
            k: (0..layout.groups.len())
                .map(|g| KvBuf::new(kv_types.k, elems(g)))
                .collect(),
            v: (0..layout.groups.len())
                .map(|g| KvBuf::new(kv_types.v, elems(g)))
                .collect(),
        };
        let xq = QAct::new(max_batch, max_in.max(d.hidden));
        Ok(CpuBackend {
            model,
            desc,
            layout,
            w,
            ropes,
            pool,
            locals,
            s,
            kv,
            max_batch,
            kernels,
            xq,
            kv_types,
        })
    }

    /// How K and V are stored.
    pub fn kv_types(&self) -> KvTypes {
        self.kv_types
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The kernel set in use (default: [`Kernels::from_env`]).
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    pub fn set_kernels(&mut self, k: Kernels) {
        self.kernels = k;
    }
}

/// Rows `r0..r1` of one matmul, reference kernels.
pub(crate) struct RowJob<'a> {
    pub m: &'a Model,
    pub w: &'a Mat,
    pub bias: Option<&'a [f32]>,
    pub x: &'a [f32],
    pub n: usize,
    pub y: SyncPtr,
    pub r0: usize,
    pub r1: usize,
}

impl RowJob<'_> {
    /// [`RowJob::run`], compiled for AVX2 where the CPU has it.
    pub(crate) fn run_any(&self, scratch: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd::has_avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
            unsafe { simd::rows_avx2(self, scratch) };
            return;
        }
        self.run(scratch)
    }

    #[inline(always)]
    fn run(&self, scratch: &mut [f32]) {
        let (rows, cols, n) = (self.w.rows(), self.w.cols(), self.n);
        let yp = self.y.ptr();
        let b = |r: usize| self.bias.map_or(0.0, |b| b[r]);
        let mut r = self.r0;
        // Four rows at a time: decode them into scratch, then dot each token.
        while r + 4 <= self.r1 {
            let (s01, s23) = scratch[..4 * cols].split_at_mut(2 * cols);
            let (s0, s1) = s01.split_at_mut(cols);
            let (s2, s3) = s23.split_at_mut(cols);
            let w0 = self.w.row(self.m, r, s0);
            let w1 = self.w.row(self.m, r + 1, s1);
            let w2 = self.w.row(self.m, r + 2, s2);
            let w3 = self.w.row(self.m, r + 3, s3);
            for t in 0..n {
                let v = kernels::dot4([w0, w1, w2, w3], &self.x[t * cols..(t + 1) * cols]);
                for (k, v) in v.iter().enumerate() {
                    // SAFETY: rows r0..r1 of every token belong to this
                    // thread alone; t * rows + r + k < n * rows <= y.len().
                    unsafe { *yp.add(t * rows + r + k) = v + b(r + k) };
                }
            }
            r += 4;
        }
        while r < self.r1 {
            let row = self.w.row(self.m, r, &mut scratch[..cols]);
            for t in 0..n {
                let v = kernels::dot(row, &self.x[t * cols..(t + 1) * cols]) + b(r);
                // SAFETY: as above.
                unsafe { *yp.add(t * rows + r) = v };
            }
            r += 1;
        }
    }
}

mod simd {
    /// Whether the AVX2 kernels (AVX2, FMA, F16C) can run here.
    pub fn has_avx2() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The same scalar code, compiled for AVX2 (8-wide vectors).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2(job: &super::RowJob<'_>, scratch: &mut [f32]) {
        job.run(scratch)
    }
}

impl Backend for CpuBackend {
    fn desc(&self) -> &ArchDescriptor {
        &self.desc
    }

    fn max_batch_tokens(&self) -> usize {
        self.max_batch
    }

    fn forward(&mut self, batch: &Batch<'_>, kvt: &KvTables, logits: &mut [f32]) -> Result<()> {
        let n = batch.len();
        let d = &self.desc;
        if n == 0 {
            return Ok(());
        }
        batch.check(d.vocab_size, self.max_batch, kvt)?;
        let bs = self.layout.block_size;
        let n_out = batch.n_logits();
        if logits.len() < n_out * d.vocab_size {
            return Err(EngineError::Input("logits buffer too small".into()));
        }

        let m = &*self.model;
        let (pool, locals, w, s, kv, xq) = (
            &self.pool,
            &self.locals[..],
            &self.w,
            &mut self.s,
            &mut self.kv,
            &mut self.xq,
        );
        let kernels = self.kernels;
        let (hid, qd, kvd, hd, inter) =
            (d.hidden, d.q_dim(), d.kv_dim(), d.head_dim, d.intermediate);
        let eps = d.norm_eps;

        // Embeddings.
        for i in 0..n {
            let x = &mut s.x[i * hid..(i + 1) * hid];
            let mut guard = locals[0].lock().unwrap_or_else(|e| e.into_inner());
            let row = w.embd.row(m, batch.tokens[i] as usize, &mut guard.row);
            for (o, &v) in x.iter_mut().zip(row) {
                *o = v * d.embedding_scale;
            }
            if let Some(pe) = &w.pos_embd {
                let row = pe.row(m, batch.positions[i] as usize, &mut guard.row);
                kernels::axpy(x, 1.0, row);
            }
        }

        for (li, layer) in w.layers.iter().enumerate() {
            let ld = d.layers[li];
            if li == 0 {
                // Later layers' input norm ran with the previous residual.
                layer
                    .attn_norm
                    .rows(d.norm, &s.x[..n * hid], &mut s.xn[..n * hid], hid, eps);
            }
            project(
                pool,
                locals,
                m,
                kernels,
                xq,
                &s.xn,
                n,
                &[
                    Op {
                        w: &layer.q,
                        bias: layer.q_bias.as_deref(),
                        y: SyncPtr(s.q.as_mut_ptr()),
                    },
                    Op {
                        w: &layer.k,
                        bias: layer.k_bias.as_deref(),
                        y: SyncPtr(s.k.as_mut_ptr()),
                    },
                    Op {
                        w: &layer.v,
                        bias: layer.v_bias.as_deref(),
                        y: SyncPtr(s.v.as_mut_ptr()),
                    },
                ],
            );
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                kernels::rms_heads(&mut s.q[..n * qd], hd, qn, eps);
                kernels::rms_heads(&mut s.k[..n * kvd], hd, kn, eps);
            }
            if let Some(rope) = self.ropes.get(ld.rope_table) {
                for i in 0..n {
                    let pos = batch.positions[i] as usize;
                    for h in s.q[i * qd..(i + 1) * qd].chunks_exact_mut(hd) {
                        rope.apply(h, pos);
                    }
                    for h in s.k[i * kvd..(i + 1) * kvd].chunks_exact_mut(hd) {
                        rope.apply(h, pos);
                    }
                }
            }
            // Store K/V.
            let (g, lig) = self.layout.layer_slot[li];
            let nlg = self.layout.groups[g].layers.len();
            for i in 0..n {
                let (pos, seq) = (batch.positions[i] as usize, batch.seqs[i] as usize);
                let blk = kvt.table(seq, g)[pos / bs] as usize;
                let at = ((blk * nlg + lig) * bs + pos % bs) * kvd;
                let fast = kernels == Kernels::Fast;
                kv.k[g].store(fast, at, &s.k[i * kvd..(i + 1) * kvd]);
                kv.v[g].store(fast, at, &s.v[i * kvd..(i + 1) * kvd]);
            }
            // Attention over (token, head) pairs.
            {
                let job = Attn {
                    kc: kv.k[g].as_ref(),
                    vc: kv.v[g].as_ref(),
                    q: &s.q[..],
                    att: SyncPtr(s.att.as_mut_ptr()),
                    batch,
                    kvt,
                    g,
                    nlg,
                    lig,
                    bs,
                    kvd,
                    qd,
                    hd,
                    n_heads: d.n_heads,
                    group: d.n_heads / d.n_kv_heads,
                    scale: d.attn_scale,
                    softcap: d.attn_softcap,
                    causal: d.causal,
                    window: ld.window,
                };
                let items = n * d.n_heads;
                let nt = pool.n_threads();
                let fast = kernels == Kernels::Fast;
                // Chunks of items claimed from a counter, last tokens
                // (the longest rows under a causal mask) first.
                let chunk = (items / (8 * nt)).max(1);
                let next = AtomicUsize::new(0);
                pool.run(&|tid| {
                    let Some(local) = locals.get(tid) else { return };
                    let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c * chunk >= items {
                            return;
                        }
                        let hi = items - c * chunk;
                        job.run(fast, hi.saturating_sub(chunk), hi, &mut local.scores);
                    }
                });
            }
            project(
                pool,
                locals,
                m,
                kernels,
                xq,
                &s.att,
                n,
                &[Op {
                    w: &layer.o,
                    bias: layer.o_bias.as_deref(),
                    y: SyncPtr(s.tmp.as_mut_ptr()),
                }],
            );
            residual_norm(
                pool,
                d.norm,
                (&mut s.x, &mut s.xn),
                &s.tmp,
                layer.post_attn_norm.as_ref(),
                Some(&layer.ffn_norm),
                n,
                hid,
                eps,
            );
            {
                let up = Op {
                    w: &layer.up,
                    bias: layer.up_bias.as_deref(),
                    y: SyncPtr(s.up.as_mut_ptr()),
                };
                let ops = match &layer.gate {
                    Some(gate) => [
                        up,
                        Op {
                            w: gate,
                            bias: layer.gate_bias.as_deref(),
                            y: SyncPtr(s.gate.as_mut_ptr()),
                        },
                    ],
                    None => [
                        up,
                        Op {
                            w: &layer.up,
                            bias: None,
                            y: SyncPtr(std::ptr::null_mut()),
                        },
                    ],
                };
                let k = if layer.gate.is_some() { 2 } else { 1 };
                project(pool, locals, m, kernels, xq, &s.xn, n, &ops[..k]);
            }
            let (act, gated) = (d.activation, layer.gate.is_some());
            #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
            if kernels == Kernels::Fast && n >= 8 && inter % 8 == 0 && pool.n_threads() > 1 {
                // Split by tokens (whole vectors of 8, so every element is
                // computed as on one thread).
                let (g, up, nt) = (
                    SyncPtr(s.gate.as_mut_ptr()),
                    &s.up[..n * inter],
                    pool.n_threads(),
                );
                pool.run(&|tid| {
                    let (t0, t1) = (n * tid / nt, n * (tid + 1) / nt);
                    if t0 < t1 {
                        // SAFETY: tokens t0..t1 of gate belong to this
                        // thread; gate holds n * inter values.
                        let gs = unsafe {
                            std::slice::from_raw_parts_mut(
                                g.ptr().add(t0 * inter),
                                (t1 - t0) * inter,
                            )
                        };
                        kernels::ffn_act(true, act, gated, gs, &up[t0 * inter..t1 * inter]);
                    }
                });
            } else {
                kernels::ffn_act(
                    kernels == Kernels::Fast,
                    act,
                    gated,
                    &mut s.gate[..n * inter],
                    &s.up[..n * inter],
                );
            }
            project(
                pool,
                locals,
                m,
                kernels,
                xq,
                &s.gate,
                n,
                &[Op {
                    w: &layer.down,
                    bias: layer.down_bias.as_deref(),
                    y: SyncPtr(s.tmp.as_mut_ptr()),
                }],
            );
            residual_norm(
                pool,
                d.norm,
                (&mut s.x, &mut s.xn),
                &s.tmp,
                layer.post_ffn_norm.as_ref(),
                w.layers.get(li + 1).map(|l| &l.attn_norm),
                n,
                hid,
                eps,
            );
        }

        // Final norm and logits for the tokens that want them.
        let mut k = 0;
        for i in 0..n {
            if batch.want_logits[i] {
                s.sel[k * hid..(k + 1) * hid].copy_from_slice(&s.x[i * hid..(i + 1) * hid]);
                k += 1;
            }
        }
        w.out_norm
            .rows(d.norm, &s.sel[..k * hid], &mut s.seln[..k * hid], hid, eps);
        if k > 0 {
            let out_w = w.output.as_ref().unwrap_or(&w.embd);
            project(
                pool,
                locals,
                m,
                kernels,
                xq,
                &s.seln,
                k,
                &[Op {
                    w: out_w,
                    bias: None,
                    y: SyncPtr(logits.as_mut_ptr()),
                }],
            );
            if let Some(c) = d.final_softcap {
                for l in &mut logits[..k * d.vocab_size] {
                    *l = (*l / c).tanh() * c;
                }
            }
        }
        Ok(())
    }
}

/// Per token: `x += y`, or `x += post_norm(y)` when the layer has a
/// post-norm; then `xn = next(x)` when `next` is given. Tokens split over
/// the pool's threads for batches of 8 or more (each token's arithmetic is
/// the same either way).
#[allow(clippy::too_many_arguments)]
fn residual_norm(
    pool: &ThreadPool,
    kind: NormKind,
    (x, xn): (&mut [f32], &mut [f32]),
    y: &[f32],
    post: Option<&Norm>,
    next: Option<&Norm>,
    n: usize,
    hid: usize,
    eps: f32,
) {
    let run = |x: &mut [f32], xn: &mut [f32], y: &[f32], nt: usize| {
        residual(kind, x, y, post, nt, hid, eps);
        if let Some(norm) = next {
            norm.rows(kind, x, xn, hid, eps);
        }
    };
    let nt = pool.n_threads();
    if n < 8 || nt == 1 {
        run(&mut x[..n * hid], &mut xn[..n * hid], &y[..n * hid], n);
        return;
    }
    assert!(x.len() >= n * hid && xn.len() >= n * hid && y.len() >= n * hid);
    let (xp, xnp) = (SyncPtr(x.as_mut_ptr()), SyncPtr(xn.as_mut_ptr()));
    pool.run(&|tid| {
        let (t0, t1) = (n * tid / nt, n * (tid + 1) / nt);
        if t0 < t1 {
            let len = (t1 - t0) * hid;
            // SAFETY: tokens t0..t1 of x and xn belong to this thread; both
            // hold n * hid values (checked above).
            let (xs, xns) = unsafe {
                (
                    std::slice::from_raw_parts_mut(xp.ptr().add(t0 * hid), len),
                    std::slice::from_raw_parts_mut(xnp.ptr().add(t0 * hid), len),
                )
            };
            run(xs, xns, &y[t0 * hid..t1 * hid], t1 - t0);
        }
    });
}

/// `x += y`, or `x += post_norm(y)` when the layer has a post-norm, per token.
fn residual(
    kind: NormKind,
    x: &mut [f32],
    y: &[f32],
    post: Option<&Norm>,
    n: usize,
    hid: usize,
    eps: f32,
) {
    for i in 0..n {
        let r = i * hid..(i + 1) * hid;
        match post {
            Some(p) => add_normed(kind, &y[r.clone()], &mut x[r], &p.w, p.b.as_deref(), eps),
            None => kernels::axpy(&mut x[r.clone()], 1.0, &y[r]),
        }
    }
}

/// `x += norm(y)` without a temporary.
fn add_normed(kind: NormKind, y: &[f32], x: &mut [f32], w: &[f32], b: Option<&[f32]>, eps: f32) {
    let n = y.len().max(1) as f64;
    match kind {
        NormKind::Rms => {
            let ss: f64 = y.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let inv = (1.0 / (ss / n + f64::from(eps)).sqrt()) as f32;
            for ((o, &v), &w) in x.iter_mut().zip(y).zip(w) {
                *o += v * inv * w;
            }
        }
        NormKind::Layer => {
            let mean = y.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let var = y
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            for (i, (o, &v)) in x.iter_mut().zip(y).enumerate() {
                *o += ((f64::from(v) - mean) * inv) as f32 * w[i]
                    + b.and_then(|b| b.get(i)).copied().unwrap_or(0.0);
            }
        }
    }
}
