//! Single kernels on explicit inputs, for checks against the CPU reference.

use kiln_format::GgmlType;

use crate::backend::{kernel_type_name, repack, repacked_name, Repackers};
use crate::gpu::{Arg, CuResult, CudaError, DevBuf, Gpu};

/// `y[t][r] = W[r] · x[t]` for `n` tokens with the GEMV kernel of `ty`
/// (`w` holds `rows` rows of `cols` values stored as `ty`).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    repacked: bool,
) -> CuResult<Vec<f32>> {
    let name = kernel_type_name(ty).ok_or_else(|| CudaError(format!("no kernel for {ty}")))?;
    let p = product_buffers(gpu, ty, w, rows, cols, repacked, x, n * rows)?;
    let name = p.repacked.unwrap_or(name);
    let (nt, suffix) = match n {
        1 => (1, 1),
        2 => (2, 2),
        3 | 4 => (4, 4),
        _ => (8, 8),
    };
    let f = gpu.func(&format!("mm_{name}_{suffix}"))?;
    gpu.launch(
        f,
        (rows.div_ceil(4) as u32, n.div_ceil(nt) as u32, 1),
        128,
        &p.many(&[Arg::P(p.x.ptr)], n, rows),
    )?;
    fetch(gpu, &p.y, n * rows)
}

/// `y[r] = W[r] · x` with the one-token GEMV of `ty` (4 rows per warp).
pub fn matvec(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    repacked: bool,
) -> CuResult<Vec<f32>> {
    let name = kernel_type_name(ty).ok_or_else(|| CudaError(format!("no kernel for {ty}")))?;
    let p = product_buffers(gpu, ty, w, rows, cols, repacked, x, rows)?;
    let name = p.repacked.unwrap_or(name);
    let f = gpu.func(&format!("mv_{name}"))?;
    gpu.launch(
        f,
        (rows.div_ceil(16) as u32, 1, 1),
        128,
        &p.one(&[Arg::P(p.x.ptr)]),
    )?;
    fetch(gpu, &p.y, rows)
}

/// Rows `ids` of `w` decoded by the embedding kernel of `ty`, times `scale`:
/// fed as tokens, and again as a chained step's sampled ids (an error when
/// the two differ).
pub fn embed(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    cols: usize,
    ids: &[u32],
    scale: f32,
) -> CuResult<Vec<f32>> {
    let name = kernel_type_name(ty).ok_or_else(|| CudaError(format!("no kernel for {ty}")))?;
    let row_bytes = cols / ty.block_size() * ty.type_size();
    gpu.bind()?;
    let dw = DevBuf::from_bytes(w)?;
    let di = DevBuf::from_bytes(
        &ids.iter()
            .flat_map(|i| i.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    // Zeros: the chain word off, and placeholder tokens / ids.
    let zeros = DevBuf::zeroed(4 * ids.len().max(1))?;
    let one = DevBuf::from_bytes(&1u32.to_le_bytes())?;
    let f = gpu.func(&format!("embed_{name}"))?;
    let mut run = |tokens: u64, chain: u64, sampled: u64| -> CuResult<Vec<f32>> {
        let dy = DevBuf::from_f32(&vec![f32::NAN; ids.len() * cols])?;
        gpu.launch(
            f,
            (ids.len() as u32, 1, 1),
            128,
            &[
                Arg::P(dw.ptr),
                Arg::P(row_bytes as u64),
                Arg::I(cols as i32),
                Arg::P(tokens),
                Arg::P(chain),
                Arg::P(sampled),
                Arg::P(zeros.ptr),
                Arg::F(scale),
                Arg::P(0),
                Arg::P(dy.ptr),
            ],
        )?;
        fetch(gpu, &dy, ids.len() * cols)
    };
    let fed = run(di.ptr, zeros.ptr, zeros.ptr)?;
    let chained = run(zeros.ptr, one.ptr, di.ptr)?;
    if fed
        .iter()
        .zip(&chained)
        .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        return Err(CudaError(format!(
            "embed_{name}: a chained step's rows differ from the fed tokens'"
        )));
    }
    Ok(fed)
}

/// The greedy id of each row of `logits` (`rows` x `cols`) from
/// `argmax_rows`, sliced as the backend slices it; launched twice (the
/// slices' counters must be back at zero after each launch), both results.
pub fn argmax(gpu: &mut Gpu, logits: &[f32], cols: usize) -> CuResult<(Vec<u32>, Vec<u32>)> {
    use crate::backend::{argmax_slices, ARGMAX_SLICES};
    let rows = logits.len() / cols;
    gpu.bind()?;
    let dl = DevBuf::from_f32(&logits[..rows * cols])?;
    let part = DevBuf::zeroed(rows * ARGMAX_SLICES * 8)?;
    let count = DevBuf::zeroed(rows * 4)?;
    let f = gpu.func("argmax_rows")?;
    let mut run = || -> CuResult<Vec<u32>> {
        let dout = DevBuf::zeroed(rows * 4)?;
        gpu.launch(
            f,
            (argmax_slices(cols) as u32, rows as u32, 1),
            256,
            &[
                Arg::P(dl.ptr),
                Arg::P(cols as u64),
                Arg::P(dout.ptr),
                Arg::P(part.ptr),
                Arg::P(part.ptr + (rows * ARGMAX_SLICES * 4) as u64),
                Arg::P(count.ptr),
            ],
        )?;
        fetch(gpu, &dout, rows)
    };
    Ok((run()?, run()?))
}

/// One sampled id per row of `logits` (`rows` x `cols`) with the GPU
/// sampler (Gumbel-max over the top k), one parameter set per row.
pub fn sample(
    gpu: &mut Gpu,
    logits: &[f32],
    cols: usize,
    params: &[crate::GpuSampling],
) -> CuResult<Vec<u32>> {
    let rows = params.len();
    gpu.bind()?;
    let dl = DevBuf::from_f32(&logits[..rows * cols])?;
    let host: Vec<u32> = params
        .iter()
        .flat_map(crate::backend::sampling_words)
        .collect();
    let dp = DevBuf::from_bytes(
        &host
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    let dout = DevBuf::zeroed(rows * 4)?;
    let f = gpu.func("sample_rows")?;
    gpu.launch(
        f,
        (rows as u32, 1, 1),
        1024,
        &[
            Arg::P(dl.ptr),
            Arg::P(cols as u64),
            Arg::P(dp.ptr),
            Arg::P(dout.ptr),
        ],
    )?;
    fetch(gpu, &dout, rows)
}

/// The decode GEMV of `ty` as the backend runs it for one token: the 16-byte
/// load kernel for float types, or `x` quantized to 8-bit blocks and the
/// integer kernel for quantized ones. Returns `y` and, for the latter, the
/// quantized activations (`q`, per-block `d`) the kernel used.
pub type FastMatvec = (Vec<f32>, Option<(Vec<i8>, Vec<f32>)>);

pub fn matvec_fast(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    repacked: bool,
) -> CuResult<FastMatvec> {
    let float = crate::backend::mvf_type_name(ty);
    let p = product_buffers(gpu, ty, w, rows, cols, repacked, x, rows)?;
    let quant = p.repacked.or(crate::backend::mvq_type_name(ty));
    let grid = (rows.div_ceil(8) as u32, 1, 1);
    let mut xq = None;
    if let Some(name) = float {
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        if p.row_bytes % 16 != 0 {
            return Err(CudaError(format!(
                "{cols} {ty} values are not a multiple of 16 bytes"
            )));
        }
        let f = gpu.func(&format!("mvf_{name}"))?;
        gpu.launch(f, grid, 256, &p.one(&[Arg::P(p.x.ptr)]))?;
    } else if let Some(name) = quant {
        let nb = cols / 32;
        let (q, d, s) = quantize_q8(gpu, &p.x, nb)?;
        // The backend's one-token kernel for this matrix.
        let streaming = crate::backend::mvqs_kernel(ty, p.repacked.is_some(), cols);
        let (f, grid, threads) = match streaming {
            Some((u, n)) => {
                let t = crate::backend::MVQS_THREADS;
                let f = gpu.func(&format!("mvqs{u}_{n}"))?;
                (f, rows.div_ceil(t as usize / 32), t)
            }
            None => (
                gpu.func(&format!(
                    "{}_{name}",
                    if crate::backend::mvq_narrow(ty, p.repacked.is_some(), cols) {
                        "mvq2"
                    } else {
                        "mvq"
                    }
                ))?,
                rows.div_ceil(8 * crate::backend::MVQ_ROWS),
                256,
            ),
        };
        gpu.launch(
            f,
            (grid as u32, 1, 1),
            threads,
            &p.one(&[Arg::P(q.ptr), Arg::P(d.ptr), Arg::P(s.ptr)]),
        )?;
        let qb: Vec<u8> = fetch(gpu, &q, cols)?;
        xq = Some((
            qb.into_iter().map(|b| b as i8).collect(),
            fetch(gpu, &d, nb)?,
        ));
    } else {
        return Err(CudaError(format!("no fast decode GEMV for {ty}")));
    }
    Ok((fetch(gpu, &p.y, rows)?, xq))
}

/// The few-token decode GEMV of `ty` (`mvf_nt_*`, or `x` quantized per token
/// and `mvq_nt_*`) for `n` tokens; `y[t][r]`.
#[allow(clippy::too_many_arguments)]
pub fn matvec_fast_nt(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    repacked: bool,
) -> CuResult<Vec<f32>> {
    let p = product_buffers(gpu, ty, w, rows, cols, repacked, &x[..n * cols], n * rows)?;
    let grid = (rows.div_ceil(8) as u32, n.div_ceil(8) as u32, 1);
    if let Some(name) = crate::backend::mvf_type_name(ty) {
        let f = gpu.func(&format!("mvf_nt_{name}"))?;
        gpu.launch(
            f,
            (
                (rows.div_ceil(8 * crate::backend::MVF_NT_ROWS)) as u32,
                grid.1,
                1,
            ),
            256,
            &p.many(&[Arg::P(p.x.ptr)], n, rows),
        )?;
    } else if let Some(name) = p.repacked.or(crate::backend::mvq_type_name(ty)) {
        let (q, d, s) = quantize_q8(gpu, &p.x, n * cols / 32)?;
        let f = gpu.func(&format!("mvq_nt_{name}"))?;
        gpu.launch(
            f,
            grid,
            256,
            &p.many(&[Arg::P(q.ptr), Arg::P(d.ptr), Arg::P(s.ptr)], n, rows),
        )?;
    } else {
        return Err(CudaError(format!("no fast decode GEMV for {ty}")));
    }
    fetch(gpu, &p.y, n * rows)
}

/// The tensor-core product of batched steps (`mmq_*`, as the backend
/// launches it) of a repacked matrix of `ty` with `n` tokens, x quantized
/// per token as the GEMVs take it; `y[t][r]`, and the kernels' 8-bit inputs
/// (values, scales) for checks on them.
#[allow(clippy::type_complexity)]
pub fn matmul_mmq(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> CuResult<(Vec<f32>, Vec<i8>, Vec<f32>)> {
    let p = product_buffers(gpu, ty, w, rows, cols, true, &x[..n * cols], n * rows)?;
    let name = p.repacked.unwrap_or_default();
    let m = crate::mmq::mmq_types()
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| CudaError(format!("no mmq kernel for {ty}")))?;
    let f = crate::mmq::load(gpu, name, m.run_bytes)?;
    let reduce = gpu.func("mmq_reduce")?;
    let (q, d, s) = quantize_q8(gpu, &p.x, n * cols / 32)?;
    let part_floats = crate::mmq::splits(rows, cols, gpu.info.sms.max(1) as usize) * n * rows;
    let part = DevBuf::zeroed(part_floats * 4)?;
    crate::mmq::MmqCall {
        w: p.w.ptr,
        row_bytes: p.row_bytes,
        rows,
        cols,
        xq: [Arg::P(q.ptr), Arg::P(d.ptr), Arg::P(s.ptr)],
        n,
        y: p.y.ptr,
        ystride: rows,
        bias: 0,
        part: part.ptr,
        part_floats,
    }
    .launch(gpu, &f, reduce, false)?;
    let qv: Vec<u8> = fetch(gpu, &q, n * cols)?;
    Ok((
        fetch(gpu, &p.y, n * rows)?,
        qv.into_iter().map(|v| v as i8).collect(),
        fetch(gpu, &d, n * cols / 32)?,
    ))
}

/// `nb` blocks of 32 values at `x` quantized by `quantize_q8`: (q, d, s).
fn quantize_q8(gpu: &mut Gpu, x: &DevBuf, nb: usize) -> CuResult<(DevBuf, DevBuf, DevBuf)> {
    let q = DevBuf::zeroed(nb * 32)?;
    let d = DevBuf::zeroed(nb * 4)?;
    let s = DevBuf::zeroed(nb * 4)?;
    let f = gpu.func("quantize_q8")?;
    gpu.launch(
        f,
        (nb.div_ceil(8) as u32, 1, 1),
        256,
        &[
            Arg::P(x.ptr),
            Arg::I(nb as i32),
            Arg::P(q.ptr),
            Arg::P(d.ptr),
            Arg::P(s.ptr),
        ],
    )?;
    Ok((q, d, s))
}

/// Whether the backend repacks matrices of `ty` with `cols` columns.
pub fn repacks(ty: GgmlType, cols: usize) -> bool {
    crate::backend::repack_layout(ty, cols).is_some()
}

/// Bytes a row of `cols` values of `ty` takes once repacked: the padded rows
/// of a layout written out of place, else the file's.
pub fn repacked_row_bytes(ty: GgmlType, cols: usize) -> usize {
    crate::backend::padded_row_bytes(ty, cols).unwrap_or(cols / ty.block_size() * ty.type_size())
}

/// A product's device buffers: weights, input, a NaN-filled output.
struct Product {
    /// The weights (the GEMVs read them through `w_args`).
    w: DevBuf,
    x: DevBuf,
    y: DevBuf,
    /// The kernels' name suffix of the repacked layout, when repacked.
    repacked: Option<&'static str>,
    row_bytes: usize,
    /// Every GEMV kernel's first arguments: weights, row bytes, rows, cols.
    w_args: [Arg; 4],
}

/// `w`, `x` and `y_len` output floats on the device. With `repacked`, the
/// weights are rearranged as the backend does at load (an error when `ty` or
/// `cols` is not repacked).
#[allow(clippy::too_many_arguments)]
fn product_buffers(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    repacked: bool,
    x: &[f32],
    y_len: usize,
) -> CuResult<Product> {
    gpu.bind()?;
    let mut dw = DevBuf::from_bytes(w)?;
    let mut suffix = None;
    let mut row_bytes = cols / ty.block_size() * ty.type_size();
    if repacked {
        let f = Repackers::load(gpu)?;
        match (repack(gpu, &f, ty, dw.ptr, rows, cols)?, repacked_name(ty)) {
            (Some(r), Some(name)) => {
                suffix = Some(name);
                if let Some((buf, rb)) = r.moved {
                    gpu.sync()?;
                    dw = buf;
                    row_bytes = rb;
                }
            }
            _ => return Err(CudaError(format!("{ty} x {cols} is not repacked"))),
        }
    }
    let w_args = [
        Arg::P(dw.ptr),
        Arg::P(row_bytes as u64),
        Arg::I(rows as i32),
        Arg::I(cols as i32),
    ];
    Ok(Product {
        w: dw,
        x: DevBuf::from_f32(x)?,
        y: DevBuf::from_f32(&vec![f32::NAN; y_len])?,
        repacked: suffix,
        row_bytes,
        w_args,
    })
}

/// `w_args` then `rest`.
fn args(w_args: &[Arg; 4], rest: &[Arg]) -> Vec<Arg> {
    [&w_args[..], rest].concat()
}

impl Product {
    /// A one-token GEMV's arguments (as the backend's `mm` builds them):
    /// weights, x (f32, or 8-bit values, scales and sums), y, no bias.
    fn one(&self, x: &[Arg]) -> Vec<Arg> {
        args(
            &self.w_args,
            &[x, &[Arg::P(self.y.ptr), Arg::P(0)]].concat(),
        )
    }

    /// A several-token GEMV's: weights, x, the token count, y with row
    /// stride `ystride`, no bias.
    fn many(&self, x: &[Arg], n: usize, ystride: usize) -> Vec<Arg> {
        let rest = [
            Arg::I(n as i32),
            Arg::P(self.y.ptr),
            Arg::I(ystride as i32),
            Arg::P(0),
        ];
        args(&self.w_args, &[x, &rest].concat())
    }
}

/// Rows of `w` decoded by the GEMM path's dequantization kernel of `ty`
/// (`repacked`: of the repacked layout): the f16 bits.
pub fn dequant_rows(
    gpu: &mut Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    repacked: bool,
) -> CuResult<Vec<u16>> {
    let name = kernel_type_name(ty).ok_or_else(|| CudaError(format!("no kernel for {ty}")))?;
    let p = product_buffers(
        gpu,
        ty,
        w,
        rows,
        cols,
        repacked,
        &[0.0],
        (rows * cols).div_ceil(2),
    )?;
    let f = gpu.func(&format!("deq_{}", p.repacked.unwrap_or(name)))?;
    gpu.launch(
        f,
        ((rows * cols.div_ceil(32)).div_ceil(256) as u32, 1, 1),
        256,
        &args(&p.w_args, &[Arg::P(p.y.ptr), Arg::I(0)]),
    )?;
    fetch(gpu, &p.y, rows * cols)
}

/// The flash-attention kernel for head dim `hd` (64 or 128) on one chunk:
/// `q` n rows of `heads * hd` f32; `k` / `v` L rows of `kv_heads * hd` f16
/// bits (keys 0..L-1, L = p0 + n); query row i at position p0 + i sees the
/// keys up to it (and above it minus `window` when `window > 0`). Returns
/// the n x heads * hd f32 output.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    gpu: &mut Gpu,
    hd: usize,
    heads: usize,
    kv_heads: usize,
    q: &[f32],
    k: &[u16],
    v: &[u16],
    p0: usize,
    scale: f32,
    softcap: f32,
    window: i32,
) -> CuResult<Vec<f32>> {
    let qd = heads * hd;
    let kvd = kv_heads * hd;
    let n = q.len() / qd;
    let keys = k.len() / kvd;
    if keys != p0 + n || v.len() != k.len() {
        return Err(CudaError(format!(
            "flash: {keys} keys for p0 {p0} + {n} rows"
        )));
    }
    let f = gpu.func(&format!("flash_d{hd}"))?;
    let bytes = |x: &[u16]| x.iter().flat_map(|h| h.to_le_bytes()).collect::<Vec<u8>>();
    gpu.bind()?;
    let dq = DevBuf::from_f32(q)?;
    let dk = DevBuf::from_bytes(&bytes(k))?;
    let dv = DevBuf::from_bytes(&bytes(v))?;
    let dy = DevBuf::from_f32(&vec![f32::NAN; n * qd])?;
    let call = crate::backend::FlashCall {
        q: dq.ptr,
        qstride: qd,
        k: dk.ptr,
        v: dv.ptr,
        kvd,
        heads,
        n,
        keys,
        p0,
        group: heads / kv_heads,
        scale,
        softcap,
        window,
        out: dy.ptr,
        ostride: qd,
    };
    call.launch(gpu, f)?;
    fetch(gpu, &dy, n * qd)
}

/// The first `len` values of `buf`, after everything queued so far.
fn fetch<T: Copy + Default>(gpu: &mut Gpu, buf: &DevBuf, len: usize) -> CuResult<Vec<T>> {
    let mut v = vec![T::default(); len];
    gpu.download_async(&mut v, buf.ptr)?;
    gpu.sync()?;
    Ok(v)
}

/// One-token GEMVs chained as in decode, for kernel-design A/B runs
/// (`cuda_check --gemv-micro`): `layers` copies of each (rows, cols) shape
/// filled with random bytes (the timing does not depend on the values),
/// then `kernel` launched over them in layer order, captured in one graph
/// (programmatic dependent launch as in the backend). Returns the seconds
/// per replay of the whole chain and of each shape's own chain.
pub struct GemvChain {
    mats: Vec<Vec<DevBuf>>,
    shapes: Vec<(usize, usize)>,
    row_bytes: Vec<usize>,
    x: DevBuf,
    xq: DevBuf,
    xd: DevBuf,
    xs: DevBuf,
    y: DevBuf,
}

impl GemvChain {
    /// `row_bytes(cols)`: the stored bytes of a row.
    pub fn new(
        gpu: &mut Gpu,
        shapes: &[(usize, usize)],
        layers: usize,
        row_bytes: &dyn Fn(usize) -> usize,
    ) -> CuResult<GemvChain> {
        gpu.bind()?;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let chunk: Vec<u64> = (0..(8 << 20))
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // f16 scales from these bytes stay finite: clear each 16-bit
                // lane's top exponent bit.
                seed & 0xbfff_bfff_bfff_bfff
            })
            .collect();
        let rb: Vec<usize> = shapes.iter().map(|&(_, c)| row_bytes(c)).collect();
        let mut mats = Vec::new();
        for _ in 0..layers {
            let mut l = Vec::new();
            for (i, &(rows, _)) in shapes.iter().enumerate() {
                let bytes = rows * rb[i];
                let b = DevBuf::alloc(bytes)?;
                let mut off = 0;
                while off < bytes {
                    let n = (bytes - off).min(chunk.len() * 8) / 8;
                    gpu.upload_async(b.ptr + off as u64, &chunk[..n.max(1)])?;
                    off += n.max(1) * 8;
                }
                l.push(b);
            }
            mats.push(l);
        }
        let cols = shapes.iter().map(|s| s.1).max().unwrap_or(32);
        let rows = shapes.iter().map(|s| s.0).max().unwrap_or(1);
        let xv: Vec<f32> = (0..cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let x = DevBuf::from_f32(&xv)?;
        let (xq, xd, xs) = quantize_q8(gpu, &x, cols / 32)?;
        gpu.sync()?;
        Ok(GemvChain {
            mats,
            shapes: shapes.to_vec(),
            row_bytes: rb,
            x,
            xq,
            xd,
            xs,
            y: DevBuf::alloc(rows * 4)?,
        })
    }

    /// `float`: the kernel takes f32 x (`mvf_*`), else 8-bit x. Grid:
    /// ceil(rows / rows_per_block) blocks of `block` threads, at most
    /// `max_blocks`.
    #[allow(clippy::too_many_arguments)]
    pub fn time(
        &self,
        gpu: &mut Gpu,
        kernel: &str,
        float: bool,
        rows_per_block: usize,
        max_blocks: usize,
        block: u32,
        reps: usize,
    ) -> CuResult<Vec<f64>> {
        let f = gpu.func(kernel)?;
        let mut out = Vec::new();
        for only in std::iter::once(None).chain((0..self.shapes.len()).map(Some)) {
            gpu.begin_capture()?;
            for l in &self.mats {
                for (i, &(rows, cols)) in self.shapes.iter().enumerate() {
                    if only.is_some_and(|o| o != i) {
                        continue;
                    }
                    let w = [
                        Arg::P(l[i].ptr),
                        Arg::P(self.row_bytes[i] as u64),
                        Arg::I(rows as i32),
                        Arg::I(cols as i32),
                    ];
                    let xa = if float {
                        vec![Arg::P(self.x.ptr)]
                    } else {
                        vec![
                            Arg::P(self.xq.ptr),
                            Arg::P(self.xd.ptr),
                            Arg::P(self.xs.ptr),
                        ]
                    };
                    let a = args(&w, &[xa, vec![Arg::P(self.y.ptr), Arg::P(0)]].concat());
                    let grid = rows.div_ceil(rows_per_block).min(max_blocks);
                    gpu.launch(f, (grid as u32, 1, 1), block, &a)?;
                }
            }
            let g = gpu.end_capture()?;
            gpu.replay(&g)?;
            gpu.sync()?;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                gpu.replay(&g)?;
            }
            gpu.sync()?;
            out.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        Ok(out)
    }

    /// The bytes one replay of the whole chain reads, then of each shape's.
    pub fn bytes(&self) -> Vec<usize> {
        let per: Vec<usize> = self
            .shapes
            .iter()
            .zip(&self.row_bytes)
            .map(|(s, rb)| s.0 * rb * self.mats.len())
            .collect();
        std::iter::once(per.iter().sum()).chain(per).collect()
    }
}

/// What one phase of a decode step costs when phases meet at a grid-wide
/// barrier inside one persistent kernel, against one phase a kernel under
/// programmatic dependent launch (`cuda_check --sync-micro`): `blocks`
/// blocks of `block` threads, each phase writing `w` floats a block and
/// then reading `r` floats of what all blocks wrote. Returns (µs a phase
/// in one kernel, µs a phase as its own kernel in a graph); Err when the
/// grid does not fit resident (the barrier would never open) or a spin
/// gave up.
pub fn sync_micro(
    gpu: &mut Gpu,
    blocks: u32,
    block: u32,
    phases: usize,
    w: usize,
    r: usize,
) -> CuResult<(f64, f64)> {
    gpu.bind()?;
    let rounds = gpu.func("sync_rounds")?;
    let one = gpu.func("sync_phase")?;
    let resident = gpu.blocks_per_sm(rounds, block) * gpu.info.sms.max(1) as u32;
    if blocks > resident {
        return Err(CudaError(format!(
            "{blocks} blocks of {block} threads do not fit resident ({resident})"
        )));
    }
    let buf = DevBuf::zeroed(2 * (blocks as usize * w).max(1) * 4)?;
    let sink = DevBuf::zeroed(16)?;
    let err = DevBuf::zeroed(16)?;
    let n = phases as i32;
    // sync_phase's arguments for phase i; sync_rounds takes the same after
    // its counter and error flag, with the phase count in i's place.
    let phase = |i: i32| {
        [
            Arg::P(buf.ptr),
            Arg::I(i),
            Arg::I(w as i32),
            Arg::I(r as i32),
            Arg::P(sink.ptr),
        ]
    };
    // Warm-up launch, then the timed one, each from a zeroed counter.
    let mut persistent = 0.0;
    for _ in 0..2 {
        let count = DevBuf::zeroed(16)?;
        let args = [&[Arg::P(count.ptr), Arg::P(err.ptr)][..], &phase(n)].concat();
        gpu.sync()?;
        let t = std::time::Instant::now();
        gpu.launch(rounds, (blocks, 1, 1), block, &args)?;
        gpu.sync()?;
        persistent = t.elapsed().as_secs_f64() / phases as f64;
    }
    let mut flag = [0u32; 4];
    gpu.download_async(&mut flag, err.ptr)?;
    gpu.sync()?;
    if flag[0] != 0 {
        return Err(CudaError("a barrier spin gave up".into()));
    }
    gpu.begin_capture()?;
    for i in 0..n {
        gpu.launch(one, (blocks, 1, 1), block, &phase(i))?;
    }
    let g = gpu.end_capture()?;
    gpu.replay(&g)?;
    gpu.sync()?;
    let reps = 5;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        gpu.replay(&g)?;
    }
    gpu.sync()?;
    let kernels = t.elapsed().as_secs_f64() / (reps * phases) as f64;
    Ok((persistent * 1e6, kernels * 1e6))
}
