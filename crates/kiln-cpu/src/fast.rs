//! Which fast kernel reads a matrix, and the projection step that runs one or
//! more matrices over the same input in a single pool dispatch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kiln_format::{GgmlType, Model};

use crate::packed::PackedMat;
use crate::pool::{SyncPtr, ThreadPool};
use crate::quant::QAct;
use crate::weights::Mat;
use crate::{Local, RowJob};

/// Which kernels the backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// SIMD kernels where the CPU and weight type have one (integer dot
    /// products against 8-bit activations for quantized weights), the
    /// reference elsewhere.
    #[default]
    Fast,
    /// The scalar reference everywhere: dequantize each row, f32 dot.
    Reference,
}

impl Kernels {
    /// `KILN_CPU_KERNELS=reference` forces the reference path.
    pub fn from_env() -> Kernels {
        match std::env::var("KILN_CPU_KERNELS") {
            Ok(v) if v.eq_ignore_ascii_case("reference") => Kernels::Reference,
            _ => Kernels::Fast,
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Quant(unsafe fn(&crate::avx2::QJob<'_>)),
    #[cfg(target_arch = "x86_64")]
    Float(unsafe fn(&crate::avx2::FJob<'_>)),
}

/// The fast kernel for weights of type `ty` on this CPU, if any.
pub(crate) fn kernel_for(ty: GgmlType) -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::avx2 as k;
        use GgmlType::*;
        if !crate::simd::has_avx2() {
            return None;
        }
        Some(match ty {
            Q4_0 => Kernel::Quant(k::rows_q4_0),
            Q4_1 => Kernel::Quant(k::rows_q4_1),
            Q5_0 => Kernel::Quant(k::rows_q5_0),
            Q5_1 => Kernel::Quant(k::rows_q5_1),
            Q8_0 => Kernel::Quant(k::rows_q8_0),
            Q2K => Kernel::Quant(k::rows_q2_k),
            Q3K => Kernel::Quant(k::rows_q3_k),
            Q4K => Kernel::Quant(k::rows_q4_k),
            Q5K => Kernel::Quant(k::rows_q5_k),
            Q6K => Kernel::Quant(k::rows_q6_k),
            F32 => Kernel::Float(k::rows_f32),
            F16 => Kernel::Float(k::rows_f16),
            BF16 => Kernel::Float(k::rows_bf16),
            _ => return None,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// One matrix of a projection: `y[t][r] = W[r] · x[t] + bias[r]`.
pub(crate) struct Op<'a> {
    pub w: &'a Mat,
    pub bias: Option<&'a [f32]>,
    pub y: SyncPtr,
}

/// Runs every op over the same `n` input rows `x` (`cols` wide) in one pool
/// dispatch, each op's rows split evenly over the threads. Quantizes `x`
/// into `xq` first when a quantized kernel needs it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project(
    pool: &ThreadPool,
    locals: &[Mutex<Local>],
    m: &Model,
    kernels: Kernels,
    xq: &mut QAct,
    x: &[f32],
    n: usize,
    ops: &[Op<'_>],
) {
    let Some(cols) = ops.first().map(|o| o.w.cols()) else {
        return;
    };
    debug_assert!(ops.iter().all(|o| o.w.cols() == cols) && x.len() >= n * cols);
    let fast = kernels == Kernels::Fast;
    let mut quantized = false;
    if fast && xq.fits(n, cols) {
        let needs = ops.iter().any(|o| {
            o.w.packed().is_some()
                || matches!(
                    o.w.raw(m).and_then(|(ty, _, _)| kernel_for(ty)),
                    Some(Kernel::Quant(_))
                )
        });
        if needs {
            xq.quantize_on(Some(pool), x, n, cols);
            quantized = true;
        }
    }
    let xq = &*xq;
    let nt = pool.n_threads();
    // Work units: groups of eight rows (packed) or rows, claimed in chunks
    // from one counter over all ops, so a descheduled thread's share is
    // taken by the others. A unit's result does not depend on who runs it.
    let mut plan = [(0usize, 0usize, false); MAX_OPS];
    let mut total = 0;
    for (k, op) in ops.iter().enumerate().take(MAX_OPS) {
        let packed =
            op.w.packed()
                .is_some_and(|p| fast && packed_fits(p, quantized.then_some(xq), n, op.bias));
        let (units, align) = match op.w.packed() {
            Some(p) if packed => (p.groups(), 1),
            _ => (op.w.rows(), 4),
        };
        let chunk = (units / (CHUNKS_PER_THREAD * nt))
            .max(1)
            .next_multiple_of(align);
        plan[k] = (units, chunk, packed);
        total += units.div_ceil(chunk);
    }
    debug_assert!(ops.len() <= MAX_OPS);
    let next = AtomicUsize::new(0);
    pool.run(&|tid| loop {
        let mut i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            return;
        }
        let mut k = 0;
        while i >= plan[k].0.div_ceil(plan[k].1) {
            i -= plan[k].0.div_ceil(plan[k].1);
            k += 1;
        }
        let (op, (units, chunk, packed)) = (&ops[k], plan[k]);
        let (u0, u1) = (i * chunk, ((i + 1) * chunk).min(units));
        if packed {
            if let Some(p) = op.w.packed() {
                run_packed(p, op.bias, xq, n, op.y, u0, u1);
            }
            continue;
        }
        let (r0, r1) = (u0, u1);
        if fast {
            if let Some((ty, bytes, row_bytes)) = op.w.raw(m) {
                let mat = RawMat {
                    ty,
                    bytes,
                    row_bytes,
                    rows: op.w.rows(),
                    cols: op.w.cols(),
                };
                let q = quantized.then_some(xq);
                if run_fast(&mat, op.bias, x, q, n, op.y, r0, r1) {
                    continue;
                }
            }
        }
        let Some(local) = locals.get(tid) else {
            continue;
        };
        let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
        RowJob {
            m,
            w: op.w,
            bias: op.bias,
            x,
            n,
            y: op.y,
            r0,
            r1,
        }
        .run_any(&mut local.row);
    });
}

/// Most matrices one [`project`] call runs.
const MAX_OPS: usize = 4;
/// Chunks each thread claims per op on average (more: better balance on a
/// busy machine, more atomic operations).
const CHUNKS_PER_THREAD: usize = 4;

/// Whether [`run_packed`] can run `p` over `xq` (the same answer on every
/// thread, so a matmul is either all packed or all not).
pub(crate) fn packed_fits(
    p: &PackedMat,
    xq: Option<&QAct>,
    n: usize,
    bias: Option<&[f32]>,
) -> bool {
    crate::simd::has_avx2()
        && xq.is_some_and(|q| q.cols == p.cols && q.n == n)
        && bias.is_none_or(|b| b.len() >= p.rows)
}

/// Groups `g0..g1` of `y = W x + bias` over packed weights (checked by
/// [`packed_fits`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_packed(
    p: &PackedMat,
    bias: Option<&[f32]>,
    xq: &QAct,
    n: usize,
    y: SyncPtr,
    g0: usize,
    g1: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if g1 > p.groups() || !packed_fits(p, Some(xq), n, bias) {
            return false;
        }
        let job = crate::gemm::PJob {
            w: p,
            x: xq,
            n,
            y: y.ptr(),
            ystride: p.rows,
            g0,
            g1,
            bias,
        };
        // SAFETY: the CPU has AVX2/FMA/F16C and xq holds n rows of
        // p.cols (packed_fits); the rows of groups g0..g1 of y belong to
        // this thread alone.
        unsafe { crate::gemm::gemm(&job) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (p, bias, xq, n, y, g0, g1);
        false
    }
}

/// A matrix as stored.
pub(crate) struct RawMat<'a> {
    pub ty: GgmlType,
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
}

/// Rows `r0..r1` of `y = W x + bias` with a fast kernel; false if none
/// applies (no kernel for the type, or quantized input missing).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_fast(
    w: &RawMat<'_>,
    bias: Option<&[f32]>,
    x: &[f32],
    xq: Option<&QAct>,
    n: usize,
    y: SyncPtr,
    r0: usize,
    r1: usize,
) -> bool {
    let Some(k) = kernel_for(w.ty) else {
        return false;
    };
    let (ty, bytes, row_bytes, rows, cols) = (w.ty, w.bytes, w.row_bytes, w.rows, w.cols);
    let (bs, ts) = (ty.block_size(), ty.type_size());
    #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
    let whole = cols % bs == 0 && row_bytes == cols / bs * ts;
    if !whole || bytes.len() < rows * row_bytes || r1 > rows || bias.is_some_and(|b| b.len() < rows)
    {
        return false;
    }
    match k {
        #[cfg(target_arch = "x86_64")]
        Kernel::Quant(f) => {
            let Some(xq) = xq.filter(|q| q.cols == cols && q.n == n) else {
                return false;
            };
            let job = crate::avx2::QJob {
                w: bytes.as_ptr(),
                row_bytes,
                nb: cols / ty.block_size(),
                x: xq,
                n,
                y: y.ptr(),
                ystride: rows,
                r0,
                r1,
                bias,
            };
            // SAFETY: the CPU has the kernel's features (kernel_for checked);
            // `bytes` holds `rows` rows of `row_bytes`; xq holds n rows of
            // `cols`; rows r0..r1 of y belong to this thread alone.
            unsafe { f(&job) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Float(f) => {
            let job = crate::avx2::FJob {
                w: bytes.as_ptr(),
                row_bytes,
                cols,
                x,
                n,
                y: y.ptr(),
                ystride: rows,
                r0,
                r1,
                bias,
            };
            if x.len() < n * cols {
                return false;
            }
            // SAFETY: as above, with x holding n rows of `cols` f32.
            unsafe { f(&job) };
            true
        }
    }
}

#[cfg(test)]
#[path = "fast_tests.rs"]
mod tests;
