//! Device check for the CUDA backend, in one run:
//!
//! 1. device, driver, NVRTC and the kernel cache;
//! 2. op level: every GEMV / embedding kernel against the CPU reference
//!    dequantization on random blocks of awkward sizes;
//! 3. model level: every tiny fixture — F32 GGUF and HF folder against
//!    transformers' float64 logits, quantized GGUFs against the CPU backend on
//!    the same file — all positions through chunked prefill, then 16 greedy
//!    steps through the decode path (graph replay, GPU argmax);
//! 4. speed (with `--bench`): random-weight Llama-3.2-1B-shaped models built
//!    in memory, prefill and batch-1 decode tok/s.
//!
//! `cargo run --release -p kiln-cuda --example cuda_check -- [--bench] [--fixtures DIR]`
//! Exits 1 if any check fails; with no GPU it says so and exits 2.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kiln_core::{
    ArchDescriptor, Backend, Batch, Engine, EngineOptions, KvLayout, KvTables, KvTypes,
};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_cuda::{CudaBackend, CudaOptions, Gpu};
use kiln_format::gguf::{Gguf, GgufWriter, Value};
use kiln_format::{GgmlType, Model};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Random bytes that are valid blocks of `ty` with sane scales.
fn random_blocks(ty: GgmlType, n_elems: usize, rng: &mut Rng, scale: f32) -> Vec<u8> {
    let nb = n_elems / ty.block_size();
    let ts = ty.type_size();
    let mut v = vec![0u8; nb * ts];
    for c in v.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
    let put = |b: &mut [u8], at: usize, x: f32| {
        b[at..at + 2].copy_from_slice(&f16_bits(x).to_le_bytes());
    };
    use GgmlType::*;
    for b in v.chunks_mut(ts) {
        match ty {
            F32 => b.copy_from_slice(&(rng.f() * scale).to_le_bytes()),
            F16 => put(b, 0, rng.f() * scale),
            BF16 => b.copy_from_slice(&((rng.f() * scale).to_bits() >> 16).to_le_bytes()[..2]),
            Q4_0 | Q5_0 | Q8_0 => put(b, 0, rng.f().abs() * scale / 8.0 + 1e-4),
            Q4_1 | Q5_1 => {
                put(b, 0, rng.f().abs() * scale / 8.0 + 1e-4);
                put(b, 2, rng.f() * scale);
            }
            Q2K => {
                put(b, 80, rng.f().abs() * scale / 8.0);
                put(b, 82, rng.f().abs() * scale / 8.0);
            }
            Q3K => put(b, 108, rng.f().abs() * scale / 8.0),
            Q4K | Q5K => {
                put(b, 0, rng.f().abs() * scale / 32.0);
                put(b, 2, rng.f().abs() * scale / 32.0);
            }
            Q6K => put(b, 208, rng.f().abs() * scale / 64.0),
            _ => {}
        }
    }
    v
}

const TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn op_checks(gpu: &mut Gpu, failures: &mut Vec<String>) {
    println!("\n## op level: GEMV and embedding kernels vs CPU reference dequantization");
    println!("| type | rows x cols | tokens | GEMV max rel err | embed max abs err |");
    println!("|---|---|---|---|---|");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for ty in TYPES {
        let cols = match ty.block_size() {
            1 if ty == GgmlType::F32 => 100,
            1 => 72,
            32 => 96,
            _ => 512,
        };
        let rows = 37;
        let w = random_blocks(ty, rows * cols, &mut rng, 0.5);
        let mut deq = vec![0.0f32; rows * cols];
        kiln_format::dequant::dequantize(ty, &w, &mut deq).expect("dequant");
        let mut worst = 0.0f64;
        let mut toks = Vec::new();
        for n in [1usize, 2, 3, 8, 13] {
            // n = 1: the one-token GEMV (4 rows per warp); else the batched one.
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let y = if n == 1 {
                kiln_cuda::testing::matvec(gpu, ty, &w, rows, cols, &x, false)
            } else {
                kiln_cuda::testing::matmul(gpu, ty, &w, rows, cols, &x, n, false)
            };
            let y = match y {
                Ok(y) => y,
                Err(e) => {
                    failures.push(format!("matmul {ty}: {e}"));
                    continue;
                }
            };
            let mut num = 0.0f64;
            let mut den = 0.0f64;
            for t in 0..n {
                for r in 0..rows {
                    let want: f64 = (0..cols)
                        .map(|c| f64::from(deq[r * cols + c]) * f64::from(x[t * cols + c]))
                        .sum();
                    let got = f64::from(y[t * rows + r]);
                    num = num.max((got - want).abs());
                    den = den.max(want.abs());
                    if !got.is_finite() {
                        num = f64::INFINITY;
                    }
                }
            }
            worst = worst.max(num / den.max(1e-30));
            toks.push(n.to_string());
        }
        let ids: Vec<u32> = vec![5, 0, 36, 5, 17];
        let emb = match kiln_cuda::testing::embed(gpu, ty, &w, cols, &ids, 1.5) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("embed {ty}: {e}"));
                continue;
            }
        };
        let mut eworst = 0.0f32;
        for (i, &id) in ids.iter().enumerate() {
            for c in 0..cols {
                let want = deq[id as usize * cols + c] * 1.5;
                let got = emb[i * cols + c];
                eworst = eworst.max(if got.is_finite() {
                    (got - want).abs()
                } else {
                    f32::INFINITY
                });
            }
        }
        let ok = worst <= 1e-5 && eworst <= 1e-5;
        if !ok {
            failures.push(format!("op {ty}: gemv rel {worst:.2e}, embed {eworst:.2e}"));
        }
        println!(
            "| {ty} | {rows} x {cols} | {} | {worst:.2e} | {eworst:.2e} {}|",
            toks.join(","),
            if ok { "" } else { "FAIL " }
        );
    }
}

/// The decode GEMVs (16-byte loads for float weights; 8-bit activations
/// and integer dot products for quantized ones) against f64 sums over the
/// dequantized weights and the activations the kernel used.
fn fast_op_checks(gpu: &mut Gpu, failures: &mut Vec<String>) {
    println!("\n## op level: decode GEMVs (mvf / quantize_q8 + mvq) vs f64");
    println!("| type | rows x cols | max rel err vs f64 on the kernel's inputs | 8-bit x: bit-exact | rel err vs f32 x (what 8-bit x costs) | 2/8/11 tokens = 1 token, bit for bit | repacked = plain, bit for bit |");
    println!("|---|---|---|---|---|---|---|");
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for ty in TYPES {
        let bs = ty.block_size();
        let sizes: Vec<usize> = match bs {
            1 if ty == GgmlType::F32 => vec![100, 2052],
            1 => vec![72, 2056],
            32 => vec![96, 2240, 2304, 4608, 16640],
            _ => vec![512, 1536, 2048, 2304, 4608, 16640],
        };
        for cols in sizes {
            let rows = 37;
            let w = random_blocks(ty, rows * cols, &mut rng, 0.5);
            let mut deq = vec![0.0f32; rows * cols];
            kiln_format::dequant::dequantize(ty, &w, &mut deq).expect("dequant");
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let (y, xq) = match kiln_cuda::testing::matvec_fast(gpu, ty, &w, rows, cols, &x, false)
            {
                Ok(r) => r,
                Err(e) if e.0.starts_with("no fast decode GEMV") => continue,
                Err(e) => {
                    failures.push(format!("fast matvec {ty} {cols}: {e}"));
                    continue;
                }
            };
            // The activations the kernel saw, and the CPU's quantization of x
            // (kiln-cpu QAct: d = amax / 127, round half to even).
            let mut exact_q = true;
            let xk: Vec<f64> = match &xq {
                None => x.iter().map(|&v| f64::from(v)).collect(),
                Some((q, d)) => {
                    for b in 0..cols / 32 {
                        let blk = &x[b * 32..b * 32 + 32];
                        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                        let dd = amax / 127.0;
                        let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
                        exact_q &= d[b].to_bits() == dd.to_bits();
                        for i in 0..32 {
                            exact_q &= q[b * 32 + i] == (blk[i] * id).round_ties_even() as i8;
                        }
                    }
                    (0..cols)
                        .map(|c| f64::from(d[c / 32]) * f64::from(q[c]))
                        .collect()
                }
            };
            let (mut num, mut den, mut num32) = (0.0f64, 0.0f64, 0.0f64);
            for r in 0..rows {
                let row = &deq[r * cols..(r + 1) * cols];
                let want: f64 = row.iter().zip(&xk).map(|(&a, &b)| f64::from(a) * b).sum();
                let want32: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let got = f64::from(y[r]);
                num = num.max(if got.is_finite() {
                    (got - want).abs()
                } else {
                    f64::INFINITY
                });
                num32 = num32.max((got - want32).abs());
                den = den.max(want32.abs());
            }
            let rel = num / den.max(1e-30);
            // Several tokens at once: each token's result bit-identical to
            // its one-token product (batch invariance).
            let mut nt_same = true;
            for n in [2usize, 8, 11] {
                let xs: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                match kiln_cuda::testing::matvec_fast_nt(gpu, ty, &w, rows, cols, &xs, n, false) {
                    Ok(yn) => {
                        for t in 0..n {
                            let one = kiln_cuda::testing::matvec_fast(
                                gpu,
                                ty,
                                &w,
                                rows,
                                cols,
                                &xs[t * cols..(t + 1) * cols],
                                false,
                            );
                            nt_same &= one
                                .is_ok_and(|(y1, _)| same_bits(&y1, &yn[t * rows..(t + 1) * rows]));
                        }
                    }
                    Err(e) => {
                        failures.push(format!("fast matvec nt {ty} {cols}: {e}"));
                        nt_same = false;
                    }
                }
            }
            // The repacked layout (Q4_0 / Q8_0 / Q4_K / Q6_K / Q3_K / Q2_K matrices; Q6_K rows
            // of 512 / 1,536 values into padded rows): the same
            // integers and scales in another order, so every kernel that
            // reads it gives the plain layout's results bit for bit.
            let repacked = if kiln_cuda::testing::repacks(ty, cols) {
                let xs: Vec<f32> = (0..8 * cols).map(|_| rng.f()).collect();
                match repacked_same(gpu, ty, &w, rows, cols, &x, &xs) {
                    Ok(same) => Some(same),
                    Err(e) => {
                        failures.push(format!("repacked {ty} {cols}: {e}"));
                        Some(false)
                    }
                }
            } else {
                None
            };
            let ok = rel <= 1e-5 && exact_q && nt_same && repacked != Some(false);
            if !ok {
                failures.push(format!(
                    "fast op {ty} {cols}: rel {rel:.2e}, q8 exact {exact_q}, repacked {repacked:?}"
                ));
            }
            println!(
                "| {ty} | {rows} x {cols} | {rel:.2e} | {} | {:.2e} | {} | {} {}|",
                if xq.is_some() {
                    if exact_q {
                        "yes"
                    } else {
                        "NO"
                    }
                } else {
                    "-"
                },
                num32 / den.max(1e-30),
                if nt_same { "yes" } else { "NO" },
                match repacked {
                    None => "-",
                    Some(true) => "yes",
                    Some(false) => "NO",
                },
                if ok { "" } else { "FAIL " }
            );
        }
    }
}

/// The tensor-core product of batched steps (`mmq_*`) against f64 sums over
/// the dequantized weights and the 8-bit activations it used; a token's
/// result the same bits whatever the step's token count (the split count
/// depends on the matrix only); and within rounding of the few-token GEMV.
fn mmq_checks(gpu: &mut Gpu, failures: &mut Vec<String>) {
    println!("\n## op level: batched-step tensor-core products (mmq) vs f64");
    println!("| type | rows x cols | tokens | max rel err vs f64 on the kernel's inputs | 3/8/16/37/64 tokens = 100, bit for bit | max rel diff vs mvq_nt (16 tokens) |");
    println!("|---|---|---|---|---|---|");
    let mut rng = Rng(0x5151_7a7a_0101_c3c3);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q3K,
        GgmlType::Q2K,
    ] {
        for (rows, cols) in [(37, 2048), (200, 2304), (37, 4608), (130, 16640)] {
            let w = random_blocks(ty, rows * cols, &mut rng, 0.5);
            let mut deq = vec![0.0f32; rows * cols];
            kiln_format::dequant::dequantize(ty, &w, &mut deq).expect("dequant");
            let n = 100;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let (y, q, d) = match kiln_cuda::testing::matmul_mmq(gpu, ty, &w, rows, cols, &x, n) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("mmq {ty} {rows}x{cols}: {e}"));
                    continue;
                }
            };
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for t in 0..n {
                let xk: Vec<f64> = (0..cols)
                    .map(|c| f64::from(d[t * cols / 32 + c / 32]) * f64::from(q[t * cols + c]))
                    .collect();
                for r in 0..rows {
                    let row = &deq[r * cols..(r + 1) * cols];
                    let want: f64 = row.iter().zip(&xk).map(|(&a, &b)| f64::from(a) * b).sum();
                    let got = f64::from(y[t * rows + r]);
                    num = num.max(if got.is_finite() {
                        (got - want).abs()
                    } else {
                        f64::INFINITY
                    });
                    den = den.max(want.abs());
                }
            }
            let rel = num / den.max(1e-30);
            let mut same = true;
            for m in [3usize, 8, 16, 37, 64] {
                match kiln_cuda::testing::matmul_mmq(gpu, ty, &w, rows, cols, &x, m) {
                    // The first m tokens' rows of the 100-token product.
                    Ok((ym, _, _)) => same &= same_bits(&ym, &y[..ym.len().min(y.len())]),
                    Err(e) => {
                        failures.push(format!("mmq {ty} {rows}x{cols} {m} tokens: {e}"));
                        same = false;
                    }
                }
            }
            let gemv = kiln_cuda::testing::matvec_fast_nt(gpu, ty, &w, rows, cols, &x, 16, true);
            let vs_gemv = match gemv {
                Ok(yg) => {
                    let top = yg.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let diff = yg
                        .iter()
                        .zip(&y)
                        .fold(0.0f32, |a, (g, m)| a.max((g - m).abs()));
                    f64::from(diff) / f64::from(top).max(1e-30)
                }
                Err(e) => {
                    failures.push(format!("mvq_nt {ty} {rows}x{cols}: {e}"));
                    f64::INFINITY
                }
            };
            let ok = rel <= 1e-5 && same && vs_gemv <= 1e-5;
            if !ok {
                failures.push(format!(
                    "mmq {ty} {rows}x{cols}: rel {rel:.2e}, invariant {same}, vs mvq_nt {vs_gemv:.2e}"
                ));
            }
            println!(
                "| {ty} | {rows} x {cols} | {n} | {rel:.2e} | {} | {vs_gemv:.2e} {}|",
                if same { "yes" } else { "NO" },
                if ok { "" } else { "FAIL " }
            );
        }
    }
}

// ------------------------------------------------------------- fixtures

struct Arrays(Vec<u8>);

impl Arrays {
    fn open(path: &Path) -> Option<Self> {
        std::fs::read(path).ok().map(Arrays)
    }
    fn raw(&self, name: &str) -> Option<(Vec<usize>, Vec<u8>, safetensors::Dtype)> {
        let st = safetensors::SafeTensors::deserialize(&self.0).ok()?;
        let t = st.tensor(name).ok()?;
        Some((t.shape().to_vec(), t.data().to_vec(), t.dtype()))
    }
    fn f32(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        let (s, d, _) = self.raw(name)?;
        Some((
            s,
            d.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
    fn ids(&self, name: &str) -> Option<Vec<u32>> {
        let (_, d, _) = self.raw(name)?;
        Some(
            d.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as u32)
                .collect(),
        )
    }
}

fn opts() -> EngineOptions {
    EngineOptions {
        ctx: 64,
        max_seqs: 1,
        block_size: 4,
        max_chunk: 7,
    }
}

fn layout_for(desc: &ArchDescriptor, o: EngineOptions) -> KvLayout {
    KvLayout::plan(desc, o.ctx, o.max_seqs, o.block_size, o.max_chunk)
}

fn cuda_engine(
    model: &Arc<Model>,
    o: EngineOptions,
    graphs: bool,
) -> Result<Engine<CudaBackend>, String> {
    cuda_engine_with(model, o, graphs, true)
}

/// `exact`: f32 activations in every GEMV (else 8-bit ones in one-token GEMVs).
fn cuda_engine_with(
    model: &Arc<Model>,
    o: EngineOptions,
    graphs: bool,
    exact: bool,
) -> Result<Engine<CudaBackend>, String> {
    cuda_engine_opts(
        model,
        o,
        CudaOptions {
            graphs,
            exact,
            ..CudaOptions::default()
        },
    )
}

fn cuda_engine_opts(
    model: &Arc<Model>,
    o: EngineOptions,
    co: CudaOptions,
) -> Result<Engine<CudaBackend>, String> {
    cuda_engine_seen(model, o, co, |_| {})
}

/// [`cuda_engine_opts`], `see` shown the backend before the engine takes it.
fn cuda_engine_seen(
    model: &Arc<Model>,
    o: EngineOptions,
    co: CudaOptions,
    see: impl FnOnce(&CudaBackend),
) -> Result<Engine<CudaBackend>, String> {
    let desc = ArchDescriptor::from_model(model).map_err(|e| e.to_string())?;
    let layout = layout_for(&desc, o);
    let b = CudaBackend::new(model.clone(), desc, layout.clone(), o.max_chunk, co)
        .map_err(|e| e.to_string())?;
    see(&b);
    Ok(Engine::new(b, layout))
}

fn cpu_engine(model: &Arc<Model>, o: EngineOptions) -> Result<Engine<CpuBackend>, String> {
    cpu_engine_kv(model, o, KvTypes::default())
}

fn cpu_engine_kv(
    model: &Arc<Model>,
    o: EngineOptions,
    kv: KvTypes,
) -> Result<Engine<CpuBackend>, String> {
    let desc = ArchDescriptor::from_model(model).map_err(|e| e.to_string())?;
    let layout = layout_for(&desc, o);
    let b = CpuBackend::with_kv(
        model.clone(),
        desc,
        layout.clone(),
        o.max_chunk,
        CpuOptions::default(),
        kv,
    )
    .map_err(|e| e.to_string())?;
    Ok(Engine::new(b, layout))
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_finite() {
                (x - y).abs()
            } else {
                f32::INFINITY
            }
        })
        .fold(0.0, f32::max)
}

/// Whether two results are the same floats, bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())
}

fn max_mag(a: &[f32]) -> f32 {
    a.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// Greedy continuation with the engine (logits path): tokens.
fn greedy_engine<B: Backend>(
    e: &mut Engine<B>,
    prompt: &[u32],
    steps: usize,
) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    let l = e.prefill(0, prompt).map_err(|e| e.to_string())?;
    let mut next = kiln_core::sampler::argmax(l);
    for _ in 0..steps {
        out.push(next);
        let l = e.decode(0, next).map_err(|e| e.to_string())?;
        next = kiln_core::sampler::argmax(l);
    }
    Ok(out)
}

/// Greedy continuation through `forward_greedy` (argmax on the GPU).
fn greedy_gpu(model: &Arc<Model>, prompt: &[u32], steps: usize) -> Result<Vec<u32>, String> {
    let o = opts();
    let desc = ArchDescriptor::from_model(model).map_err(|e| e.to_string())?;
    let layout = layout_for(&desc, o);
    let mut b = CudaBackend::new(
        model.clone(),
        desc,
        layout.clone(),
        o.max_chunk,
        // The exact GEMVs, as the logits-path engines it is compared with.
        CudaOptions {
            exact: true,
            ..CudaOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let mut kv = KvTables::new(layout);
    let mut ids = [0u32; 1];
    let mut pos = 0usize;
    // prefill in chunks; only the last token wants logits
    let chunks: Vec<&[u32]> = prompt.chunks(o.max_chunk).collect();
    for (ci, c) in chunks.iter().enumerate() {
        kv.reserve(0, pos + c.len()).map_err(|e| e.to_string())?;
        let positions: Vec<u32> = (pos..pos + c.len()).map(|p| p as u32).collect();
        let seqs = vec![0u32; c.len()];
        let want: Vec<bool> = (0..c.len())
            .map(|i| ci + 1 == chunks.len() && i + 1 == c.len())
            .collect();
        let batch = Batch {
            tokens: c,
            positions: &positions,
            seqs: &seqs,
            want_logits: &want,
        };
        b.forward_greedy(&batch, &kv, &mut ids)
            .map_err(|e| e.to_string())?;
        pos += c.len();
        kv.commit(0, pos);
    }
    let mut out = Vec::new();
    let mut next = ids[0];
    for _ in 0..steps {
        out.push(next);
        kv.reserve(0, pos + 1).map_err(|e| e.to_string())?;
        let batch = Batch {
            tokens: &[next],
            positions: &[pos as u32],
            seqs: &[0],
            want_logits: &[true],
        };
        b.forward_greedy(&batch, &kv, &mut ids)
            .map_err(|e| e.to_string())?;
        pos += 1;
        kv.commit(0, pos);
        next = ids[0];
    }
    Ok(out)
}

struct Row {
    model: String,
    file: String,
    against: String,
    max_abs: f32,
    rel: f32,
    greedy: String,
    ok: bool,
}

impl Row {
    /// A check that could not run: its error in the greedy column, failed.
    fn failed(model: &str, file: &str, against: &str, e: &str) -> Row {
        Row {
            model: model.into(),
            file: file.into(),
            against: against.into(),
            max_abs: f32::NAN,
            rel: f32::NAN,
            greedy: format!("error: {e}"),
            ok: false,
        }
    }
}

fn check_f32(dir: &Path, name: &str, rows: &mut Vec<Row>) {
    let Some(r) = Arrays::open(&dir.join("ref_hf.safetensors")) else {
        return;
    };
    let (Some(ids), Some((_, want)), Some(prompt), Some(gen)) = (
        r.ids("input_ids"),
        r.f32("logits"),
        r.ids("prompt_ids"),
        r.ids("generated_ids"),
    ) else {
        return;
    };
    for path in [dir.join(format!("gguf/{name}-f32.gguf")), dir.join("hf")] {
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("?")
            .to_string();
        let row = (|| -> Result<Row, String> {
            let model = Arc::new(Model::open(&path).map_err(|e| e.to_string())?);
            let mut e = cuda_engine(&model, opts(), true)?;
            let mut out = Vec::new();
            e.prefill_into(0, &ids, true, &mut out)
                .map_err(|e| e.to_string())?;
            let d = max_abs(&out, &want);
            let rel = d / max_mag(&want);
            let mut e = e_reset(e);
            let g1 = greedy_engine(&mut e, &prompt, gen.len())?;
            let g2 = greedy_gpu(&model, &prompt, gen.len())?;
            // Engine::generate: decode steps sampled on the device.
            e.reset(0);
            let mut sampler =
                kiln_core::Sampler::new(kiln_core::SamplerParams::greedy(), e.vocab_size());
            let g3 = e
                .generate(
                    0,
                    &prompt,
                    &mut sampler,
                    gen.len(),
                    true,
                    &|_| false,
                    &mut |_| kiln_core::engine::Control::Continue,
                )
                .map_err(|e| e.to_string())?
                .tokens;
            // The pipelined loop leaves the KV as the plain one: the last
            // token (Length) or the stop token is not fed.
            let kv_len_ok = e.seq_len(0) == prompt.len() + gen.len() - 1;
            let stop_at = gen.get(5).copied().unwrap_or(u32::MAX);
            let first = gen.iter().position(|&t| t == stop_at).unwrap_or(0);
            e.reset(0);
            let mut sampler =
                kiln_core::Sampler::new(kiln_core::SamplerParams::greedy(), e.vocab_size());
            let g4 = e
                .generate(
                    0,
                    &prompt,
                    &mut sampler,
                    gen.len(),
                    false,
                    &|t| t == stop_at,
                    &mut |_| kiln_core::engine::Control::Continue,
                )
                .map_err(|e| e.to_string())?;
            let stop_ok = g4.tokens == gen[..first]
                && g4.finish == kiln_core::FinishReason::Stop
                && e.seq_len(0) == prompt.len() + first;
            let same = |g: &[u32]| g.iter().zip(&gen).take_while(|(a, b)| a == b).count();
            let (s1, s2, s3) = (same(&g1), same(&g2), same(&g3));
            Ok(Row {
                model: name.into(),
                file: file.clone(),
                against: "HF f64".into(),
                max_abs: d,
                rel,
                greedy: format!(
                    "{s1}/{n} logits path, {s2}/{n} GPU argmax, {s3}/{n} Engine::generate (pipelined; KV {}, stop {})",
                    if kv_len_ok { "ok" } else { "WRONG" },
                    if stop_ok { "ok" } else { "WRONG" },
                    n = gen.len()
                ),
                ok: d <= 1e-3
                    && s1 == gen.len()
                    && s2 == gen.len()
                    && s3 == gen.len()
                    && kv_len_ok
                    && stop_ok,
            })
        })();
        rows.push(row.unwrap_or_else(|e| Row::failed(name, &file, "HF f64", &e)));
    }
}

/// A fresh engine on the same backend (reset slot 0).
fn e_reset<B: Backend>(mut e: Engine<B>) -> Engine<B> {
    e.reset(0);
    e
}

fn check_quant(dir: &Path, name: &str, types: &[&str], rows: &mut Vec<Row>) {
    for t in types {
        let path = dir.join(format!("gguf/{name}-{t}.gguf"));
        if !path.exists() {
            continue;
        }
        let file = format!("{name}-{t}.gguf");
        let row = (|| -> Result<Row, String> {
            let r = Arrays::open(&dir.join(format!("ref_llamacpp_{t}.safetensors")))
                .ok_or("no reference")?;
            let ids = r.ids("input_ids").ok_or("no input_ids")?;
            let model = Arc::new(Model::open(&path).map_err(|e| e.to_string())?);
            let mut ec = cuda_engine(&model, opts(), true)?;
            let mut gpu_out = Vec::new();
            ec.prefill_into(0, &ids, true, &mut gpu_out)
                .map_err(|e| e.to_string())?;
            let mut ep = cpu_engine(&model, opts())?;
            let mut cpu_out = Vec::new();
            ep.prefill_into(0, &ids, true, &mut cpu_out)
                .map_err(|e| e.to_string())?;
            let d = max_abs(&gpu_out, &cpu_out);
            let deq = r
                .f32("logits_hf_dequant_f64")
                .map(|(_, v)| max_abs(&gpu_out, &v))
                .unwrap_or(f32::NAN);
            let prompt = &ids[..8.min(ids.len())];
            let gc = greedy_engine(&mut e_reset(ec), prompt, 16)?;
            let gp = greedy_engine(&mut e_reset(ep), prompt, 16)?;
            let gg = greedy_gpu(&model, prompt, 16)?;
            let same = |g: &[u32]| g.iter().zip(&gp).take_while(|(a, b)| a == b).count();
            // Pass/fail against the float64 reference on the dequantized
            // weights: the CPU backend may quantize activations (llama.cpp
            // style) and then differs from it by ~1e-1; its numbers are shown.
            Ok(Row {
                model: name.into(),
                file: file.clone(),
                against: format!("HF-dequant f64 (CPU backend: {d:.1e})"),
                max_abs: deq,
                rel: deq / max_mag(&cpu_out),
                greedy: format!(
                    "GPU argmax = logits path: {}; = CPU: {}/16",
                    gc == gg,
                    same(&gc)
                ),
                ok: deq <= 1e-3 && gc == gg,
            })
        })();
        rows.push(row.unwrap_or_else(|e| Row::failed(name, &file, "CPU", &e)));
        // The default decode path: one token per step, 8-bit activations in
        // the GEMVs (as the CPU's fast kernels and llama.cpp). Held to the
        // CPU fast path's own rule: within 1.5x its distance from the f64
        // reference + 0.02.
        let row = (|| -> Result<Row, String> {
            let r = Arrays::open(&dir.join(format!("ref_llamacpp_{t}.safetensors")))
                .ok_or("no reference")?;
            let ids = r.ids("input_ids").ok_or("no input_ids")?;
            let (_, want) = r.f32("logits_hf_dequant_f64").ok_or("no f64 logits")?;
            let model = Arc::new(Model::open(&path).map_err(|e| e.to_string())?);
            let mut ef = cuda_engine_with(&model, opts(), true, false)?;
            let mut fast = Vec::new();
            for &id in &ids {
                fast.extend_from_slice(ef.decode(0, id).map_err(|e| e.to_string())?);
            }
            let mut ep = cpu_engine(&model, opts())?;
            let mut cpu = Vec::new();
            for &id in &ids {
                cpu.extend_from_slice(ep.decode(0, id).map_err(|e| e.to_string())?);
            }
            let d = max_abs(&fast, &want);
            let dc = max_abs(&cpu, &want);
            let prompt = &ids[..8.min(ids.len())];
            let gf = greedy_engine(&mut e_reset(ef), prompt, 16)?;
            let gp = greedy_engine(&mut e_reset(ep), prompt, 16)?;
            let same = gf.iter().zip(&gp).take_while(|(a, b)| a == b).count();
            Ok(Row {
                model: name.into(),
                file: file.clone(),
                against: format!(
                    "HF-dequant f64, 8-bit x decode (CPU fast: {dc:.1e}, GPU-CPU {:.1e})",
                    max_abs(&fast, &cpu)
                ),
                max_abs: d,
                rel: d / max_mag(&want),
                greedy: format!("= CPU fast: {same}/16"),
                ok: d <= 1.5 * dc + 0.02,
            })
        })();
        rows.push(row.unwrap_or_else(|e| Row::failed(name, &file, "CPU", &e)));
    }
}

/// The f16 KV cache (`CudaOptions::kv`) on a tiny float model: all
/// positions through prefill chunks and greedy decode steps against
/// transformers' f64 logits, held to kiln-cpu's f16-cache tolerance (5e-3:
/// the stored K/V lose all but 11 significant bits; f32 KV is held to
/// 1e-3), greedy tokens unchanged; and against the CPU backend's f16 cache
/// (the same rounding of the same values, but K/V computed in a different
/// f32 order can land one f16 step apart: 1e-3).
fn check_f16_kv(dir: &Path, name: &str, rows: &mut Vec<Row>) {
    const TOL: f32 = 5e-3;
    let row = (|| -> Result<Row, String> {
        let r = Arrays::open(&dir.join("ref_hf.safetensors")).ok_or("no reference")?;
        let ids = r.ids("input_ids").ok_or("input_ids")?;
        let (_, want) = r.f32("logits").ok_or("logits")?;
        let prompt = r.ids("prompt_ids").ok_or("prompt")?;
        let gen = r.ids("generated_ids").ok_or("gen")?;
        let (shape, seq) = r.f32("gen_seq_logits").ok_or("gen_seq_logits")?;
        let v = shape[1];
        let path = dir.join(format!("gguf/{name}-f32.gguf"));
        let model = Arc::new(Model::open(&path).map_err(|e| e.to_string())?);
        let co = CudaOptions {
            exact: true,
            kv: KvTypes::F16,
            ..CudaOptions::default()
        };
        let mut e = cuda_engine_opts(&model, opts(), co)?;
        let mut out = Vec::new();
        e.prefill_into(0, &ids, true, &mut out)
            .map_err(|e| e.to_string())?;
        let d = max_abs(&out, &want);
        let mut ec = cpu_engine_kv(&model, opts(), KvTypes::F16)?;
        let mut cpu_out = Vec::new();
        ec.prefill_into(0, &ids, true, &mut cpu_out)
            .map_err(|e| e.to_string())?;
        let dc = max_abs(&out, &cpu_out);
        e.reset(0);
        let mut logits = e.prefill(0, &prompt).map_err(|e| e.to_string())?.to_vec();
        let mut worst = 0.0f32;
        let mut same = 0;
        for (i, &tok) in gen.iter().enumerate() {
            let row = &seq[(prompt.len() - 1 + i) * v..(prompt.len() + i) * v];
            worst = worst.max(max_abs(&logits, row));
            if kiln_core::sampler::argmax(&logits) == tok && same == i {
                same += 1;
            }
            logits = e.decode(0, tok).map_err(|e| e.to_string())?.to_vec();
        }
        Ok(Row {
            model: name.into(),
            file: format!("{name}-f32.gguf, f16 KV"),
            against: format!("HF f64 (CPU f16 KV: {dc:.1e}; decode steps {worst:.1e})"),
            max_abs: d,
            rel: d / max_mag(&want),
            greedy: format!("{same}/{}", gen.len()),
            ok: d <= TOL && worst <= TOL && dc <= 1e-3 && same == gen.len(),
        })
    })();
    rows.push(row.unwrap_or_else(|e| Row::failed(name, "f16 KV", "HF f64", &e)));
}

/// Prefill in chunks of 64 (the GEMM attention's, `ATT_GEMM_MIN`) of a
/// sliding-window model past its window: the K/V gather must start at the
/// chunk's first query's window, since the blocks before it are released
/// (NO_BLOCK in the table; reading them faulted). Logits of the 16-bit GEMM
/// attention against the same engine with it off (the tiled kernel, f32;
/// the products alike), and against kiln-cpu as information. Tolerance, of
/// the largest |logit|: 4e-3, the f16 products' rounding (2^-11 a value)
/// measured 8.5e-4 on the H200 (GEMM vs CPU 3.9e-3 absolute, tiled vs CPU
/// 4.4e-6; NOTES.md item 113).
fn check_window_chunks(dir: &Path, name: &str, rows: &mut Vec<Row>) {
    const TOL: f32 = 4e-3;
    let row = (|| -> Result<Row, String> {
        let model = Arc::new(Model::open(dir.join("hf")).map_err(|e| e.to_string())?);
        let o = EngineOptions {
            ctx: 256,
            max_seqs: 1,
            block_size: 4,
            max_chunk: 64,
        };
        let ids: Vec<u32> = (0..200u32).map(|i| (3 + 5 * i) % 384).collect();
        let prefill = |gemm: bool| {
            with_env_restored(&["KILN_CUDA_ATT_GEMM_MIN"], || {
                if !gemm {
                    std::env::set_var("KILN_CUDA_ATT_GEMM_MIN", "0");
                }
                let mut e = cuda_engine_with(&model, o, true, false)?;
                let mut out = Vec::new();
                e.prefill_into(0, &ids, true, &mut out)
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(out)
            })
        };
        let (gemm, tiled) = (prefill(true)?, prefill(false)?);
        let mut c = cpu_engine(&model, o)?;
        let mut cpu = Vec::new();
        c.prefill_into(0, &ids, true, &mut cpu)
            .map_err(|e| e.to_string())?;
        let v = gemm.len() / ids.len();
        let same = gemm
            .chunks(v)
            .zip(tiled.chunks(v))
            .filter(|(a, b)| kiln_core::sampler::argmax(a) == kiln_core::sampler::argmax(b))
            .count();
        let d = max_abs(&gemm, &tiled);
        let rel = d / max_mag(&tiled);
        Ok(Row {
            model: name.into(),
            file: "hf, 200 tokens in chunks of 64".into(),
            against: format!(
                "tiled attention (GEMM vs CPU {:.1e}, tiled vs CPU {:.1e})",
                max_abs(&gemm, &cpu),
                max_abs(&tiled, &cpu)
            ),
            max_abs: d,
            rel,
            // Argmax agreement as information: 200 rows of a random model hold
            // near-ties that f16 rounding may flip.
            greedy: format!("argmax {same}/{}", ids.len()),
            ok: gemm.len() == tiled.len() && rel <= TOL,
        })
    })();
    rows.push(row.unwrap_or_else(|e| Row::failed(name, "window chunks", "tiled", &e)));
}

/// Two sequences decoded in the same steps (graph for n = 2) against the
/// reference, like kiln-cpu's batch test.
fn check_batch(dir: &Path, name: &str, rows: &mut Vec<Row>) {
    let row = (|| -> Result<Row, String> {
        let r = Arrays::open(&dir.join("ref_hf.safetensors")).ok_or("no reference")?;
        let prompt = r.ids("prompt_ids").ok_or("prompt")?;
        let gen = r.ids("generated_ids").ok_or("gen")?;
        let (shape, seq) = r.f32("gen_seq_logits").ok_or("gen_seq_logits")?;
        let v = shape[1];
        let mut o = opts();
        o.max_seqs = 3;
        let model = Arc::new(Model::open(dir.join("hf")).map_err(|e| e.to_string())?);
        let mut e = cuda_engine(&model, o, true)?;
        e.prefill(1, &[9, 8, 7, 6, 5, 4, 3, 200, 201, 202, 203])
            .map_err(|e| e.to_string())?;
        let mut logits = e.prefill(0, &prompt).map_err(|e| e.to_string())?.to_vec();
        let mut other = 11u32;
        let mut worst = 0.0f32;
        let mut same = 0;
        for (i, &want) in gen.iter().enumerate() {
            let row = &seq[(prompt.len() - 1 + i) * v..(prompt.len() + i) * v];
            worst = worst.max(max_abs(&logits, row));
            if kiln_core::sampler::argmax(&logits) == want && same == i {
                same += 1;
            }
            let l = e
                .decode_batch(&[(1, other), (0, want)])
                .map_err(|e| e.to_string())?;
            other = kiln_core::sampler::argmax(&l[..v]);
            logits = l[v..2 * v].to_vec();
        }
        Ok(Row {
            model: name.into(),
            file: "hf, 2 seqs/step".into(),
            against: "HF f64 (step logits)".into(),
            max_abs: worst,
            rel: worst / max_mag(&seq),
            greedy: format!("{same}/{}", gen.len()),
            ok: worst <= 1e-3 && same == gen.len(),
        })
    })();
    rows.push(row.unwrap_or_else(|e| Row::failed(name, "batch", "HF f64", &e)));
}

/// A fusion (`set` turns it on or off in the options) against the separate
/// kernels: bit-identical logits over 12 one-sequence and 12 two-sequence
/// decode steps of a 2-layer synthetic model of the Llama-3.2-1B shape in
/// `ty`. `CudaOptions::fuse_qkv`, the decode attention doing qkv_post's work:
/// the fixtures' heads of 16 and 32 dims never take it (head dim 64 here,
/// GGUF RoPE pairs; the NeoX halves and Qwen3's head norms were compared
/// on the device with `--logits`, docs/BENCHMARKS.md), without the wide
/// decode attention, which only fused steps take.
/// `CudaOptions::fuse_norm`, the norms and residual adds inside the GEMVs:
/// the fixtures take it too, at their widths; here at 2,048 values a row.
/// `hd` 128 / 256: the narrower models of 128- / 256-dim heads ([`synth_llama_hd`]).
fn fused_check(
    rows: &mut Vec<Row>,
    what: &str,
    ty: GgmlType,
    hd: usize,
    set: fn(&mut CudaOptions, bool),
) {
    fused_check_within(rows, what, ty, hd, None, 0.0, set)
}

/// [`fused_check`] where the fusion rounds apart from the separate kernels:
/// the largest difference within `tol` of the largest |logit| (0: bit for bit);
/// `heads`: query / KV heads other than the shape's ([`synth_llama_hd`]).
fn fused_check_within(
    rows: &mut Vec<Row>,
    what: &str,
    ty: GgmlType,
    hd: usize,
    heads: Option<(usize, usize)>,
    tol: f32,
    set: fn(&mut CudaOptions, bool),
) {
    // The logits, and whether one-token steps ran the fused norms (a row
    // whose fused run fell back to the separate kernels would compare a
    // path with itself).
    let run = |model: &Arc<Model>, fuse: bool| -> Result<(Vec<f32>, bool), String> {
        let mut o = opts();
        o.max_seqs = 2;
        let mut co = CudaOptions::default();
        set(&mut co, fuse);
        let mut norms = false;
        // The wide decode attention takes only fused steps: it is compared
        // with the sliced kernels on its own (layout_check, Layout::Wide).
        let mut e = with_env_restored(&["KILN_CUDA_ATT_WIDE"], || {
            std::env::set_var("KILN_CUDA_ATT_WIDE", "0");
            cuda_engine_seen(model, o, co, |b| norms = b.fused_norms())
        })?;
        let err = |e: kiln_core::EngineError| e.to_string();
        let mut out = e
            .prefill(0, &[11, 12, 13, 14, 15, 16, 17, 18, 19])
            .map_err(err)?
            .to_vec();
        out.extend_from_slice(e.prefill(1, &[21, 22, 23, 24, 25]).map_err(err)?);
        let (mut a, mut b) = (5u32, 7u32);
        for _ in 0..12 {
            let l = e.decode(0, a).map_err(err)?.to_vec();
            a = kiln_core::sampler::argmax(&l);
            out.extend_from_slice(&l);
            let l = e.decode_batch(&[(0, a), (1, b)]).map_err(err)?.to_vec();
            let v = l.len() / 2;
            a = kiln_core::sampler::argmax(&l[..v]);
            b = kiln_core::sampler::argmax(&l[v..]);
            out.extend_from_slice(&l);
        }
        Ok((out, norms))
    };
    let row = (|| -> Result<Row, String> {
        let model = Arc::new(synth_llama_hd(ty, 2, hd, heads)?);
        let (mut on, mut off) = (CudaOptions::default(), CudaOptions::default());
        set(&mut on, true);
        set(&mut off, false);
        let ((plain, _), (fused, norms)) = (run(&model, false)?, run(&model, true)?);
        if on.fuse_norm && !off.fuse_norm && !norms {
            return Err("the fused run took the separate kernels".into());
        }
        let diff = max_abs(&plain, &fused);
        let rel = diff / max_mag(&plain);
        let same = same_bits(&plain, &fused);
        Ok(Row {
            model: match heads {
                Some((q, kv)) => format!("synthetic, {q} / {kv} heads of {hd}, 2 layers"),
                None => format!("synthetic, head dim {hd}, 2 layers"),
            },
            file: format!("{}, {what} fused", ty.name()),
            against: format!("separate {what}"),
            max_abs: diff,
            rel,
            greedy: match (same, tol > 0.0) {
                (true, _) => "bit-identical".into(),
                (false, false) => "differs".into(),
                (false, true) => format!("within {tol:.0e}"),
            },
            ok: same || rel <= tol,
        })
    })();
    rows.push(row.unwrap_or_else(|e| {
        Row::failed(
            "synthetic 1B shape",
            &format!("fused {what}"),
            &format!("separate {what}"),
            &e,
        )
    }));
}

/// A decode attention layout against the backend's other kernels.
/// `Layout::Grouped`: the grouped decode attention (a block per four query heads of a KV
/// group; from position 8 here, `KILN_CUDA_ATT_GROUP_CTX`) against a block
/// per head (`KILN_CUDA_ATT_GROUP=0`) on a 2-layer synthetic model
/// ([`synth_llama_hd`]): the logits of a 300-token prompt (chunks of 7),
/// a 40-token one, and 12 one-sequence and 12 two-sequence decode steps,
/// the same tokens fed to both; the grouped run twice, with the backend's
/// slices and with one (`KILN_CUDA_ATT_SPLIT=1`: a warp then walks ~19
/// positions, so head dim 64 takes whole tiles of four and refills them).
/// Not bit for bit: the grouped blocks sum a
/// score over 8 or 16 lanes of 8 dims (the others over 32 lanes of 2 or 4)
/// and spread a slice's positions over 16 warps (the others over 4 or 8).
/// Tolerance, of the largest |logit|: 1e-4 with an f32 cache, 1e-3 with f16
/// (a K / V value rounding to the other neighbour moves by an f16 ulp), every
/// argmax the same; 3e-2 where the attention writes the O projection's 8-bit
/// input (Q8_0: an input rounding to the other neighbour moves by 1/127 of
/// its block's largest, and with it every later value; measured 1.3e-2 to
/// 1.7e-2 where float O weights give 5e-7 to 8e-7). There a near tie may
/// flip an argmax (any flip's top-2 gap is within twice the largest
/// difference), so those rows hold to the tolerance only.
/// `Layout::Wide`: the same for the wide decode attention (a block of 32
/// or 16 warps per query head, one slice; every step of up to 8 tokens here)
/// against the backend's default without it (`KILN_CUDA_ATT_WIDE=0`): its
/// positions spread over 32 or 16 warps, merged in shared memory.
/// `Layout::Deep`: the same for head dim 256's deep kernels (16 warps a
/// block in steps of few blocks) against 4 warps (`KILN_CUDA_ATT_DEEP=0`).
/// `Layout::TensorCore`: the grouped kernels' tensor-core walk over an f16
/// cache against their CUDA-core walk, 1e-4 with float O weights (the same
/// f16 values, summed in another order, the weights split in two f16s).
fn layout_check(
    rows: &mut Vec<Row>,
    ty: GgmlType,
    hd: usize,
    heads: Option<(usize, usize)>,
    f16_kv: bool,
    layout: Layout,
) {
    // The logits, and the vocabulary (a row's length).
    let run =
        |model: &Arc<Model>, on: bool, one_slice: bool| -> Result<(Vec<f32>, usize), String> {
            let mut o = opts();
            o.ctx = 512;
            o.max_seqs = 2;
            let mut co = CudaOptions::default();
            if f16_kv {
                co.kv = KvTypes::F16;
            }
            let vars = [
                "KILN_CUDA_ATT_DEEP",
                "KILN_CUDA_ATT_GROUP",
                "KILN_CUDA_ATT_GROUP_CTX",
                "KILN_CUDA_ATT_SPLIT",
                "KILN_CUDA_ATT_TC",
                "KILN_CUDA_ATT_TC_CTX",
                "KILN_CUDA_ATT_WIDE",
                "KILN_CUDA_ATT_WIDE_CTX",
            ];
            let mut e = with_env_restored(&vars, || {
                match layout {
                    Layout::Deep => {
                        if on {
                            std::env::remove_var("KILN_CUDA_ATT_DEEP");
                        } else {
                            std::env::set_var("KILN_CUDA_ATT_DEEP", "0");
                        }
                        std::env::set_var("KILN_CUDA_ATT_WIDE", "0");
                    }
                    Layout::Grouped => {
                        att_switch("KILN_CUDA_ATT_GROUP", on);
                        std::env::set_var("KILN_CUDA_ATT_WIDE", "0");
                    }
                    Layout::Wide if on => {
                        std::env::remove_var("KILN_CUDA_ATT_WIDE");
                        std::env::set_var("KILN_CUDA_ATT_WIDE_CTX", "100000");
                    }
                    Layout::Wide => std::env::set_var("KILN_CUDA_ATT_WIDE", "0"),
                    Layout::TensorCore => {
                        att_switch("KILN_CUDA_ATT_GROUP", true);
                        std::env::set_var("KILN_CUDA_ATT_WIDE", "0");
                        if on {
                            std::env::remove_var("KILN_CUDA_ATT_TC");
                            std::env::set_var("KILN_CUDA_ATT_TC_CTX", "8");
                        } else {
                            std::env::set_var("KILN_CUDA_ATT_TC", "0");
                        }
                    }
                }
                if one_slice {
                    std::env::set_var("KILN_CUDA_ATT_SPLIT", "1");
                }
                cuda_engine_opts(model, o, co)
            })?;
            let err = |e: kiln_core::EngineError| e.to_string();
            let prompt: Vec<u32> = (0..300u32).map(|i| 11 + (i * 37) % 1000).collect();
            let mut out = e.prefill(0, &prompt).map_err(err)?.to_vec();
            out.extend_from_slice(e.prefill(1, &prompt[..40]).map_err(err)?);
            for i in 0..12u32 {
                out.extend_from_slice(e.decode(0, 100 + i).map_err(err)?);
                out.extend_from_slice(e.decode_batch(&[(0, 200 + i), (1, 300 + i)]).map_err(err)?);
            }
            Ok((out, e.vocab_size()))
        };
    let kv = if f16_kv { ", f16 KV" } else { "" };
    let tol = match (ty.is_quantized(), f16_kv, layout) {
        (true, _, _) => 3e-2,
        // Both walks read the same f16 values: only the sums' order and the
        // weights' f16 split (~2^-22 of a product) differ.
        (false, true, Layout::TensorCore) => 1e-4,
        (false, true, _) => 1e-3,
        (false, false, _) => 1e-4,
    };
    let shape = heads.map_or(String::new(), |(q, kv)| format!(", {q} / {kv} heads"));
    let model_name = format!("synthetic, head dim {hd}{shape}, 2 layers");
    let (what, against, variants) = match layout {
        Layout::Deep => ("deep (16 warps)", "4 warps a block", &[false, true][..]),
        Layout::Grouped => ("grouped", "a block per head", &[false, true][..]),
        Layout::Wide => ("wide", "sliced blocks", &[false][..]),
        Layout::TensorCore => ("tensor-core walk", "CUDA-core walk", &[false, true][..]),
    };
    let file = format!("{}, {what} attention{kv}", ty.name());
    let row = (|| -> Result<Row, String> {
        let model = Arc::new(synth_llama_hd(ty, 2, hd, heads)?);
        let (plain, v) = run(&model, false, false)?;
        let rows_n = plain.len() / v;
        let (mut d, mut same) = (0.0f32, rows_n);
        for &one_slice in variants {
            let (grouped, _) = run(&model, true, one_slice)?;
            d = d.max(max_abs(&plain, &grouped));
            let agree = (0..rows_n)
                .filter(|&r| {
                    let s = r * v..(r + 1) * v;
                    kiln_core::sampler::argmax(&plain[s.clone()])
                        == kiln_core::sampler::argmax(&grouped[s])
                })
                .count();
            same = same.min(agree);
        }
        let rel = d / max_mag(&plain);
        Ok(Row {
            model: model_name.clone(),
            file: file.clone(),
            against: against.into(),
            max_abs: d,
            rel,
            greedy: format!("{same}/{rows_n} argmax"),
            ok: rel <= tol && (same == rows_n || ty.is_quantized()),
        })
    })();
    rows.push(row.unwrap_or_else(|e| Row::failed(&model_name, &file, against, &e)));
}

/// The decode attention layouts [`layout_check`] compares with the
/// backend's other one.
#[derive(Clone, Copy)]
enum Layout {
    Grouped,
    Wide,
    Deep,
    /// The grouped kernels' tensor-core walk (f16 cache, head dim 128)
    /// against their CUDA-core walk (`KILN_CUDA_ATT_TC=0`), both from
    /// position 8.
    TensorCore,
}

/// An attention layout switched by the backend's environment (`var`, e.g.
/// KILN_CUDA_ATT_GROUP, and `var`_CTX): `on`, from position 8; off, never.
fn att_switch(var: &str, on: bool) {
    let ctx = format!("{var}_CTX");
    std::env::remove_var(var);
    std::env::remove_var(&ctx);
    if on {
        std::env::set_var(ctx, "8");
    } else {
        std::env::set_var(var, "0");
    }
}

/// Runs `f`, then puts the environment variables `vars` back as they were.
fn with_env_restored<T>(vars: &[&str], f: impl FnOnce() -> T) -> T {
    let saved: Vec<_> = vars.iter().map(|&k| (k, std::env::var(k))).collect();
    let r = f();
    for (k, v) in saved {
        match v {
            Ok(v) => std::env::set_var(k, v),
            Err(_) => std::env::remove_var(k),
        }
    }
    r
}

fn model_checks(fixtures: &Path, failures: &mut Vec<String>) {
    println!(
        "\n## model level: tiny fixtures (all positions via prefill chunks of 7, KV blocks of 4)"
    );
    let mut rows = Vec::new();
    let tiny = fixtures.join("tiny");
    let q5 = ["f16", "q8_0", "q4_0", "q4_1", "q5_0"];
    for (name, quants) in [
        ("llama", &q5[..]),
        ("qwen2", &q5[..]),
        ("qwen3", &q5[..]),
        ("gemma3", &q5[..]),
        ("gpt2", &["f16", "q8_0", "q4_0"][..]),
        ("llama_kq", &["q4_k", "q6_k", "q4_k_m"][..]),
    ] {
        let dir = tiny.join(name);
        if name != "llama_kq" {
            check_f32(&dir, name, &mut rows);
        }
        check_quant(&dir, name, quants, &mut rows);
    }
    // The 2- and 3-bit k-quants: tests/data/kq_low beside the fixtures.
    if let Some(low) = fixtures.parent().map(|d| d.join("kq_low")) {
        check_quant(&low, "llama_kq", &["q2_k", "q3_k", "q3_k_m"], &mut rows);
    }
    for name in ["qwen3", "gemma3"] {
        check_batch(&tiny.join(name), name, &mut rows);
    }
    check_window_chunks(&tiny.join("gemma3"), "gemma3", &mut rows);
    for name in ["llama", "qwen2", "qwen3", "gemma3", "gpt2"] {
        check_f16_kv(&tiny.join(name), name, &mut rows);
    }
    fused_check(&mut rows, "qkv_post", GgmlType::Q8_0, 64, |o, on| {
        o.fuse_qkv = on
    });
    // The f16 cache: the fused decode attention reads its own position's
    // K/V rounded as the cache holds them, so it still equals the separate
    // kernels bit for bit; float O weights take the L2-window kernels, head
    // dim 128 the cluster ones.
    for (ty, hd) in [
        (GgmlType::Q8_0, 64),
        (GgmlType::F16, 64),
        (GgmlType::Q8_0, 128),
        (GgmlType::F16, 128),
    ] {
        fused_check(&mut rows, "qkv_post, f16 KV", ty, hd, |o, on| {
            o.fuse_qkv = on;
            o.kv = KvTypes::F16;
        });
    }
    // Steps switch from the cluster merge to the global one (graphs keyed
    // by it) once positions pass KILN_CUDA_ATT_CLUSTER_CTX (8 here): the
    // same logits as the global merge throughout. (The variables as they
    // were are restored after.)
    // Head dim 256 takes the cluster at every depth.
    with_env_restored(
        &["KILN_CUDA_ATT_CLUSTER", "KILN_CUDA_ATT_CLUSTER_CTX"],
        || {
            fused_check(
                &mut rows,
                "cluster merge below 8",
                GgmlType::Q8_0,
                128,
                |_, on| att_switch("KILN_CUDA_ATT_CLUSTER", on),
            );
            fused_check(&mut rows, "cluster merge", GgmlType::Q8_0, 256, |_, on| {
                att_switch("KILN_CUDA_ATT_CLUSTER", on)
            })
        },
    );
    // The grouped decode attention against a block per head: heads of 64
    // and 128 dims, groups of 4 (the usual shapes), 7 (blocks of 4 and 3)
    // and 3 (one head a block a copy), float O weights (the L2-window
    // kernels) and Q8_0, an f16 cache.
    for (ty, hd, heads, f16) in [
        (GgmlType::Q8_0, 64, None, false),
        (GgmlType::F16, 64, None, false),
        (GgmlType::Q8_0, 128, None, false),
        (GgmlType::F16, 128, None, false),
        (GgmlType::Q8_0, 64, Some((28, 4)), false),
        (GgmlType::F16, 64, Some((28, 4)), false),
        (GgmlType::Q8_0, 128, Some((12, 4)), false),
        (GgmlType::F16, 128, Some((12, 4)), false),
        (GgmlType::Q8_0, 128, None, true),
        (GgmlType::F16, 64, None, true),
    ] {
        layout_check(&mut rows, ty, hd, heads, f16, Layout::Grouped);
    }
    // The deep decode attention at head dim 256 (16 warps a block: the
    // one-sequence steps here, and the two-sequence ones at 8 slices)
    // against 4 warps (KILN_CUDA_ATT_DEEP=0).
    for (ty, f16) in [
        (GgmlType::Q8_0, false),
        (GgmlType::F16, false),
        (GgmlType::Q8_0, true),
    ] {
        layout_check(&mut rows, ty, 256, None, f16, Layout::Deep);
    }
    // The grouped kernels' tensor-core walk (f16 cache, head dim 128)
    // against their CUDA-core walk: groups of 4 and 3 (blocks of 4 heads),
    // of 7 and 5 (one block of 8), of 12 (two blocks of 6, each storing the
    // own row its tiles read back), float and Q8_0 O weights; with one slice
    // a warp walks two or three tiles.
    for (ty, heads) in [
        (GgmlType::F16, None),
        (GgmlType::F16, Some((12, 4))),
        (GgmlType::F16, Some((28, 4))),
        (GgmlType::F16, Some((40, 8))),
        (GgmlType::F16, Some((48, 4))),
        (GgmlType::Q8_0, None),
    ] {
        layout_check(&mut rows, ty, 128, heads, true, Layout::TensorCore);
    }
    // The wide decode attention (head dims 64, 128 and 256): Q8_0 O weights
    // (it writes their 8-bit input), float (its L2-window kernels up to
    // 128), a group of 7, an f16 cache.
    for (ty, hd, heads, f16) in [
        (GgmlType::Q8_0, 64, None, false),
        (GgmlType::F16, 64, None, false),
        (GgmlType::Q8_0, 64, Some((28, 4)), false),
        (GgmlType::F16, 64, None, true),
        (GgmlType::Q8_0, 128, None, false),
        (GgmlType::F16, 128, None, false),
        (GgmlType::Q8_0, 128, None, true),
        (GgmlType::Q8_0, 256, None, false),
        (GgmlType::F16, 256, None, false),
        (GgmlType::Q8_0, 256, None, true),
    ] {
        layout_check(&mut rows, ty, hd, heads, f16, Layout::Wide);
    }
    // And every tiny model (groups of 2 and 1, whose prompts stay below
    // the bounds) against HF with it from position 0.
    with_env_restored(&["KILN_CUDA_ATT_GROUP", "KILN_CUDA_ATT_GROUP_CTX"], || {
        std::env::remove_var("KILN_CUDA_ATT_GROUP");
        std::env::set_var("KILN_CUDA_ATT_GROUP_CTX", "0");
        let mut grouped = Vec::new();
        for name in ["llama", "qwen2", "qwen3", "gemma3", "gpt2"] {
            check_f32(&tiny.join(name), name, &mut grouped);
        }
        for name in ["llama", "qwen3"] {
            check_f16_kv(&tiny.join(name), name, &mut grouped);
        }
        for mut r in grouped {
            r.model = format!("{} (grouped attention)", r.model);
            rows.push(r);
        }
    });
    // The float fused norm scales each row's sum by 1 / rms at its end (the
    // separate add_norm scales x before the product), so its last bits
    // differ; the quantized ones stage add_norm's 8-bit x, bit for bit.
    for (ty, tol) in [
        (GgmlType::Q4_0, 0.0),
        (GgmlType::Q5_0, 0.0),
        (GgmlType::Q4_1, 0.0),
        (GgmlType::F16, 1e-5),
        (GgmlType::Q4K, 0.0),
        (GgmlType::Q5K, 0.0),
        (GgmlType::Q6K, 0.0),
        (GgmlType::Q3K, 0.0),
        (GgmlType::Q2K, 0.0),
    ] {
        fused_check_within(&mut rows, "add_norm", ty, 64, None, tol, |o, on| {
            o.fuse_norm = on
        });
    }
    // QKV products of more rows than the float fused-norm GEMV has resident
    // warps (528 blocks of 8 on 132 SMs): its last round's rows (1,920 of
    // 64 / 16 heads of 64: 6,144 rows, the 8B's count; 896 of 64 / 8's 5,120)
    // in halves, summed apart from the separate kernels' whole rows.
    for heads in [(64, 16), (64, 8)] {
        fused_check_within(
            &mut rows,
            "add_norm",
            GgmlType::F16,
            64,
            Some(heads),
            1e-5,
            |o, on| o.fuse_norm = on,
        );
    }
    // act_mul inside the norm-fused gate|up GEMV, against the norm-fused run without.
    // F16 at the 8B's 4,096 columns: `mvfg_f16` (warp pairs of gate and up rows; rows
    // of at least 8 KB).
    fused_check_within(
        &mut rows,
        "act_mul",
        GgmlType::F16,
        128,
        Some((32, 8)),
        0.0,
        |o, on| o.fuse_glu = on,
    );
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q3K,
        GgmlType::Q2K,
    ] {
        fused_check(&mut rows, "act_mul", ty, 64, |o, on| o.fuse_glu = on);
    }
    println!("| model | file | against | max abs | rel (to max |ref|) | greedy 16 | |");
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.2e} | {:.2e} | {} | {} |",
            r.model,
            r.file,
            r.against,
            r.max_abs,
            r.rel,
            r.greedy,
            if r.ok { "ok" } else { "FAIL" }
        );
        if !r.ok {
            failures.push(format!("{} {}: {}", r.model, r.file, r.greedy));
        }
    }
}

// ------------------------------------------------------------- speed

/// A Llama-3.2-1B-shaped GGUF (random weights of `ty`), built in memory.
fn synth_llama(ty: GgmlType, layers: usize) -> Result<Model, String> {
    synth_llama_hd(ty, layers, 64, None)
}

/// `synth_llama`, or with `hd` 128 a narrower Llama of the 8B's heads
/// (head dim 128, GQA 4: the decode attention's cluster kernels); `heads`
/// (query, KV) instead of the shape's own.
fn synth_llama_hd(
    ty: GgmlType,
    layers: usize,
    hd: usize,
    heads: Option<(usize, usize)>,
) -> Result<Model, String> {
    let (hid, q, kv, inter, vocab) = match (hd, heads) {
        // Llama-3.1-8B's rows (4,096 values, 32 / 8 heads of 128), a smaller FFN and
        // vocabulary.
        (128, Some((32, 8))) => (4096usize, 32usize, 8usize, 4096usize, 32_000usize),
        (128, _) => (1024, 8, 2, 2048, 32_000),
        // Gemma 3 1B's heads (4 / 1 of 256 on 1,152 values), Llama's layers.
        (256, _) => (1152, 4, 1, 2048, 32_000),
        _ => (2048, 32, 8, 8192, 128_256),
    };
    let (heads, kv_heads) = heads.unwrap_or((q, kv));
    let mut w = GgufWriter::new();
    let a = "llama";
    w.set("general.architecture", Value::String(a.into()));
    w.set(format!("{a}.embedding_length"), Value::U32(hid as u32));
    w.set(format!("{a}.block_count"), Value::U32(layers as u32));
    w.set(
        format!("{a}.attention.head_count"),
        Value::U32(heads as u32),
    );
    w.set(
        format!("{a}.attention.head_count_kv"),
        Value::U32(kv_heads as u32),
    );
    w.set(format!("{a}.feed_forward_length"), Value::U32(inter as u32));
    w.set(format!("{a}.context_length"), Value::U32(131_072));
    w.set(format!("{a}.attention.key_length"), Value::U32(hd as u32));
    w.set(format!("{a}.attention.value_length"), Value::U32(hd as u32));
    w.set(format!("{a}.vocab_size"), Value::U32(vocab as u32));
    w.set(format!("{a}.rope.freq_base"), Value::F32(500_000.0));
    w.set(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut mat =
        |w: &mut GgufWriter, name: String, rows: usize, cols: usize| -> Result<(), String> {
            let data = random_blocks(ty, rows * cols, &mut rng, 0.05);
            w.add_tensor(name, ty, &[cols as u64, rows as u64], data)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
    let ones = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect() };
    mat(&mut w, "token_embd.weight".into(), vocab, hid)?;
    w.add_tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[hid as u64],
        ones(hid),
    )
    .map_err(|e| e.to_string())?;
    for l in 0..layers {
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        w.add_tensor(p("attn_norm"), GgmlType::F32, &[hid as u64], ones(hid))
            .map_err(|e| e.to_string())?;
        w.add_tensor(p("ffn_norm"), GgmlType::F32, &[hid as u64], ones(hid))
            .map_err(|e| e.to_string())?;
        mat(&mut w, p("attn_q"), heads * hd, hid)?;
        mat(&mut w, p("attn_k"), kv_heads * hd, hid)?;
        mat(&mut w, p("attn_v"), kv_heads * hd, hid)?;
        mat(&mut w, p("attn_output"), hid, heads * hd)?;
        mat(&mut w, p("ffn_gate"), inter, hid)?;
        mat(&mut w, p("ffn_up"), inter, hid)?;
        mat(&mut w, p("ffn_down"), hid, inter)?;
    }
    let bytes = w.to_bytes();
    drop(w);
    let g = Gguf::from_bytes(
        format!("synth-llama-hd{hd}-{heads}-{kv_heads}-{ty}.gguf"),
        bytes,
    )
    .map_err(|e| e.to_string())?;
    Model::from_gguf(g).map_err(|e| e.to_string())
}

/// The prefill flash-attention kernel against f64 attention on the same
/// f16-rounded Q/K/V: head dims 64 and 128, GQA groups 1-4, chunks that are
/// not whole tiles, later chunks (p0 > 0), a sliding window, a softcap.
/// Tolerance: P is rounded to f16 before P·V (as the GEMM path does), so
/// the error is a few f16 ulps of the largest |V|: 4e-3 of it.
fn flash_checks(gpu: &mut Gpu, failures: &mut Vec<String>) {
    println!("\n## op level: prefill flash attention vs f64");
    if gpu.info.cc.0 < 8 {
        println!(
            "skipped: the flash kernel needs sm_80 (this device: sm_{}{})",
            gpu.info.cc.0, gpu.info.cc.1
        );
        return;
    }
    println!("| head dim | heads / kv heads | rows | p0 | window | softcap | max abs err / max abs V | |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut rng = Rng(0x5eed_f1a5_0000_0001);
    let h16 = |x: f32| half::f16::from_f32(x);
    for (hd, heads, kvh, n, p0, window, softcap) in [
        (128usize, 4usize, 2usize, 150usize, 0usize, 0i32, 0.0f32),
        (128, 2, 2, 64, 0, 0, 0.0),
        (128, 4, 1, 1, 37, 0, 0.0),
        (128, 8, 2, 77, 300, 0, 0.0),
        (64, 8, 2, 200, 0, 0, 0.0),
        (64, 4, 4, 17, 5, 0, 0.0),
        (64, 6, 2, 130, 60, 40, 0.0),
        (128, 4, 2, 129, 0, 0, 20.0),
        (64, 4, 1, 96, 100, 64, 30.0),
    ] {
        let (qd, kvd, keys) = (heads * hd, kvh * hd, p0 + n);
        // Spread scores a few units wide so the softmax is not flat.
        let q: Vec<f32> = (0..n * qd).map(|_| rng.f() * 2.0).collect();
        let k: Vec<u16> = (0..keys * kvd).map(|_| f16_bits(rng.f() * 2.0)).collect();
        let v: Vec<u16> = (0..keys * kvd).map(|_| f16_bits(rng.f())).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let got = match kiln_cuda::testing::flash_attention(
            gpu, hd, heads, kvh, &q, &k, &v, p0, scale, softcap, window,
        ) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("flash d{hd}: {e}"));
                continue;
            }
        };
        let kf = |i: usize| half::f16::from_bits(k[i]).to_f64();
        let vf = |i: usize| half::f16::from_bits(v[i]).to_f64();
        let mut err = 0.0f64;
        for i in 0..n {
            let pos = p0 + i;
            let lo = if window > 0 {
                (pos + 1).saturating_sub(window as usize)
            } else {
                0
            };
            for h in 0..heads {
                let kh = h / (heads / kvh);
                let qr: Vec<f64> = (0..hd)
                    .map(|e| h16(q[i * qd + h * hd + e]).to_f64())
                    .collect();
                let s: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let dot: f64 = (0..hd).map(|e| qr[e] * kf(j * kvd + kh * hd + e)).sum();
                        let x = dot * scale as f64;
                        if softcap > 0.0 {
                            (x / softcap as f64).tanh() * softcap as f64
                        } else {
                            x
                        }
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for e in 0..hd {
                    let o: f64 = (lo..=pos)
                        .zip(&w)
                        .map(|(j, p)| p * vf(j * kvd + kh * hd + e))
                        .sum::<f64>()
                        / sum;
                    let g = got[i * qd + h * hd + e] as f64;
                    err = err.max(if g.is_finite() {
                        (g - o).abs()
                    } else {
                        f64::INFINITY
                    });
                }
            }
        }
        let vmax = (0..v.len()).map(vf).fold(0.0f64, |a, x| a.max(x.abs()));
        let rel = err / vmax;
        let ok = rel <= 4e-3;
        println!(
            "| {hd} | {heads} / {kvh} | {n} | {p0} | {window} | {softcap} | {rel:.2e} | {} |",
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            failures.push(format!(
                "flash d{hd} n {n} p0 {p0} window {window} softcap {softcap}: {rel:.2e}"
            ));
        }
    }
}

/// GPU sampling against the exact distribution: softmax over the top k of
/// logits / T, estimated from 20,000 rows with different seeds (total
/// variation distance), plus determinism per seed and temp 0 = argmax.
/// Greedy argmax on the GPU against `kiln_core::sampler::argmax` on rows
/// of 100 to 128,256 entries with planted ties (across slices), NaN and
/// -inf, twice per launch set (slice counters reset).
fn argmax_checks(gpu: &mut Gpu, failures: &mut Vec<String>) {
    let mut rng = Rng(777);
    let mut all_ok = true;
    for cols in [100usize, 4096, 5000, 128_256, 262_144] {
        let rows = 6;
        let mut l: Vec<f32> = (0..rows * cols).map(|_| rng.f() * 8.0).collect();
        let row = |r: usize| r * cols..(r + 1) * cols;
        // 1: a tie between two slices (the lower index must win);
        // 2: NaN and -inf around the maximum; 3: all -inf but one NaN;
        // 4: all equal; 5: the maximum at the last entry.
        l[row(1)][cols / 3] = 100.0;
        l[row(1)][cols - 2] = 100.0;
        l[row(2)][0] = f32::NAN;
        l[row(2)][cols / 2] = f32::NEG_INFINITY;
        l[row(2)][cols / 2 + 1] = 50.0;
        l[row(3)].fill(f32::NEG_INFINITY);
        l[row(3)][cols / 4] = f32::NAN;
        l[row(4)].fill(1.5);
        l[row(5)][cols - 1] = 1e9;
        let want: Vec<u32> = (0..rows)
            .map(|r| kiln_core::sampler::argmax(&l[row(r)]))
            .collect();
        match kiln_cuda::testing::argmax(gpu, &l, cols) {
            Ok((a, b)) => {
                let ok = a == want && b == want;
                all_ok &= ok;
                if !ok {
                    failures.push(format!("argmax {cols}: {a:?} / {b:?}, want {want:?}"));
                }
            }
            Err(e) => {
                all_ok = false;
                failures.push(format!("argmax {cols}: {e}"));
            }
        }
    }
    println!(
        "\n## GPU argmax in slices = kiln_core::sampler::argmax (rows of 100 to 262,144, ties, NaN, -inf, twice): {}",
        if all_ok { "ok" } else { "FAIL" }
    );
}

fn sample_checks(gpu: &mut Gpu, failures: &mut Vec<String>) {
    println!("\n## GPU sampling (Gumbel-max over top-k), vocab 1000, 20000 draws each");
    let cols = 1000;
    let mut rng = Rng(12345);
    let base: Vec<f32> = (0..cols).map(|_| rng.f() * 4.0).collect();
    let rows = 20_000;
    let logits: Vec<f32> = (0..rows).flat_map(|_| base.iter().copied()).collect();
    for (temp, top_k) in [(1.0f32, 0u32), (0.7, 40), (1.3, 5), (0.0, 0)] {
        let params: Vec<kiln_cuda::GpuSampling> = (0..rows)
            .map(|i| kiln_cuda::GpuSampling {
                temperature: temp,
                top_k,
                seed: 0x5eed_0000 + i as u64,
            })
            .collect();
        let r = kiln_cuda::testing::sample(gpu, &logits, cols, &params)
            .and_then(|a| kiln_cuda::testing::sample(gpu, &logits, cols, &params).map(|b| (a, b)));
        let (a, b) = match r {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("sample: {e}"));
                println!("sample T={temp} k={top_k}: error {e}");
                return;
            }
        };
        let mut order: Vec<usize> = (0..cols).collect();
        order.sort_by(|&i, &j| base[j].total_cmp(&base[i]));
        let keep = if top_k == 0 { cols } else { top_k as usize };
        let mut p = vec![0.0f64; cols];
        if temp <= 0.0 {
            p[order[0]] = 1.0;
        } else {
            let m = f64::from(base[order[0]]);
            let mut z = 0.0;
            for &i in &order[..keep] {
                p[i] = ((f64::from(base[i]) - m) / f64::from(temp)).exp();
                z += p[i];
            }
            p.iter_mut().for_each(|v| *v /= z);
        }
        let mut freq = vec![0.0f64; cols];
        for &id in &a {
            freq[id as usize] += 1.0 / rows as f64;
        }
        let tv: f64 = p.iter().zip(&freq).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0;
        let outside = a.iter().filter(|&&id| p[id as usize] == 0.0).count();
        let same = a == b;
        // Expected TV distance of an exact sampler from sampling noise alone:
        // 1/2 sum_i E|f_i - p_i| ~ 1/2 sum_i sqrt(2 p_i (1 - p_i) / (pi N)).
        let noise: f64 = p
            .iter()
            .map(|&q| (2.0 * q * (1.0 - q) / (std::f64::consts::PI * rows as f64)).sqrt())
            .sum::<f64>()
            / 2.0;
        let ok = tv <= 1.25 * noise + 0.002 && outside == 0 && same;
        println!(
            "{} T={temp} top_k={top_k}: TV distance {tv:.4} (sampling noise alone: {noise:.4}), outside top-k {outside}, same ids for same seeds {same}",
            if ok { "ok  " } else { "FAIL" }
        );
        if !ok {
            failures.push(format!(
                "sample T={temp} k={top_k}: tv {tv:.4} outside {outside} same {same}"
            ));
        }
    }
}

/// Prefill of one 2048-token chunk (timed like llama-bench's pp2048), GEMM
/// path, best of three after a warm-up.
fn bench_long() {
    println!("\n## prefill 2048 tokens in one chunk (Llama-3.2-1B shape)");
    for ty in [GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4K] {
        let r = (|| -> Result<f64, String> {
            let model = Arc::new(synth_llama(ty, 16)?);
            let desc = ArchDescriptor::from_model(&model).map_err(|e| e.to_string())?;
            let chunk = 2048;
            let layout = KvLayout::plan(&desc, chunk, 1, 16, chunk);
            let mut b = CudaBackend::new(
                model.clone(),
                desc,
                layout.clone(),
                chunk,
                CudaOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            let vocab = 128_256;
            let mut logits = vec![0.0f32; vocab];
            let prompt: Vec<u32> = (0..chunk as u32)
                .map(|i| (i * 7919) % vocab as u32)
                .collect();
            let positions: Vec<u32> = (0..chunk as u32).collect();
            let seqs = vec![0u32; chunk];
            let mut want = vec![false; chunk];
            want[chunk - 1] = true;
            let mut best = f64::MAX;
            for it in 0..4 {
                let mut kv = KvTables::new(layout.clone());
                kv.reserve(0, chunk).map_err(|e| e.to_string())?;
                let batch = Batch {
                    tokens: &prompt,
                    positions: &positions,
                    seqs: &seqs,
                    want_logits: &want,
                };
                let t = Instant::now();
                b.forward(&batch, &kv, &mut logits)
                    .map_err(|e| e.to_string())?;
                if it > 0 {
                    best = best.min(t.elapsed().as_secs_f64());
                }
            }
            Ok(chunk as f64 / best)
        })();
        match r {
            Ok(tps) => println!("| {ty} | prefill 2048: {tps:.0} tok/s |"),
            Err(e) => println!("| {ty} | error: {e} |"),
        }
    }
}

fn bench() {
    println!("\n## speed: Llama-3.2-1B shape (16 layers, hidden 2048, vocab 128256, tied), random weights");
    println!("| type | weights read/token | prefill 512 tok/s (GEMM) | prefill 512 tok/s (GEMV) | decode tok/s: graph+GPU argmax | graph+logits | no graph | GB/s (graph+argmax) |");
    println!("|---|---|---|---|---|---|---|---|");
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        let r = (|| -> Result<String, String> {
            let t0 = Instant::now();
            let model = Arc::new(synth_llama(ty, 16)?);
            let synth_s = t0.elapsed().as_secs_f64();
            let desc = ArchDescriptor::from_model(&model).map_err(|e| e.to_string())?;
            let ctx = 1024;
            let chunk = 512;
            let layout = KvLayout::plan(&desc, ctx, 1, 16, chunk);
            let t1 = Instant::now();
            let mut b = CudaBackend::new(
                model.clone(),
                desc,
                layout.clone(),
                chunk,
                CudaOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            let load_s = t1.elapsed().as_secs_f64();
            let wbytes = b.weight_bytes_per_token();
            let vocab = 128_256;
            let mut logits = vec![0.0f32; vocab];
            let mut ids = [0u32; 1];
            let prompt: Vec<u32> = (0..chunk as u32)
                .map(|i| (i * 7919) % vocab as u32)
                .collect();
            let positions: Vec<u32> = (0..chunk as u32).collect();
            let seqs = vec![0u32; chunk];
            let mut want = vec![false; chunk];
            want[chunk - 1] = true;
            let mut run_prefill = |b: &mut CudaBackend| -> Result<(KvTables, f64), String> {
                let mut kv = KvTables::new(layout.clone());
                kv.reserve(0, chunk).map_err(|e| e.to_string())?;
                let batch = Batch {
                    tokens: &prompt,
                    positions: &positions,
                    seqs: &seqs,
                    want_logits: &want,
                };
                let t = Instant::now();
                b.forward(&batch, &kv, &mut logits)
                    .map_err(|e| e.to_string())?;
                let s = t.elapsed().as_secs_f64();
                kv.commit(0, chunk);
                Ok((kv, s))
            };
            eprintln!("{ty}: {}", b.gemm_info());
            let gemm_min = CudaOptions::default().gemm_min.max(1);
            b.set_gemm_min(usize::MAX);
            run_prefill(&mut b)?; // warm-up
            let (_, p1) = run_prefill(&mut b)?;
            let gemv_tps = chunk as f64 / p1;
            b.set_gemm_min(gemm_min);
            run_prefill(&mut b)?; // warm-up
            let (_, p1) = run_prefill(&mut b)?;
            let (_, p2) = run_prefill(&mut b)?;
            let (_, p3) = run_prefill(&mut b)?;
            let prefill_tps = chunk as f64 / p1.min(p2).min(p3);
            let steps = 128;
            let decode = |b: &mut CudaBackend, greedy: bool, graphs: bool| -> Result<f64, String> {
                b.set_graphs(graphs);
                let mut kv = KvTables::new(layout.clone());
                let mut logits = vec![0.0f32; vocab];
                let mut ids = [0u32; 1];
                let mut tok = 1u32;
                let mut t = Instant::now();
                for pos in 0..steps + 8 {
                    if pos == 8 {
                        t = Instant::now();
                    }
                    kv.reserve(0, pos + 1).map_err(|e| e.to_string())?;
                    let batch = Batch {
                        tokens: &[tok],
                        positions: &[pos as u32],
                        seqs: &[0],
                        want_logits: &[true],
                    };
                    if greedy {
                        b.forward_greedy(&batch, &kv, &mut ids)
                            .map_err(|e| e.to_string())?;
                        tok = ids[0];
                    } else {
                        b.forward(&batch, &kv, &mut logits)
                            .map_err(|e| e.to_string())?;
                        tok = kiln_core::sampler::argmax(&logits);
                    }
                    kv.commit(0, pos + 1);
                }
                Ok(steps as f64 / t.elapsed().as_secs_f64())
            };
            let g = decode(&mut b, true, true)?;
            if ty == GgmlType::Q4_0 || ty == GgmlType::F16 {
                // Per-kernel times (events, no graph): one prefill, one decode run.
                b.gpu().profile_start(4096).map_err(|e| e.to_string())?;
                run_prefill(&mut b)?;
                let pf = b.gpu().profile_stop().map_err(|e| e.to_string())?;
                b.gpu().profile_start(8192).map_err(|e| e.to_string())?;
                let _ = decode(&mut b, true, false)?;
                let dc = b.gpu().profile_stop().map_err(|e| e.to_string())?;
                let show = |v: &[(String, usize, f64)], div: f64| {
                    v.iter()
                        .take(8)
                        .map(|(n, c, t)| {
                            format!("{n} x{} {:.3} ms", (*c as f64 / div).round(), t / div)
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                eprintln!("profile {ty} prefill 512: {}", show(&pf, 1.0));
                eprintln!(
                    "profile {ty} decode, per token: {}",
                    show(&dc, (steps + 8) as f64)
                );
            }
            let gl = decode(&mut b, false, true)?;
            let ng = decode(&mut b, true, false)?;
            let _ = (&mut ids, &mut logits);
            Ok(format!(
                "| {ty} | {:.0} MB | {prefill_tps:.0} | {gemv_tps:.0} | {g:.0} | {gl:.0} | {ng:.0} | {:.0} | (synth {synth_s:.1}s, load {load_s:.1}s)",
                wbytes as f64 / 1e6,
                wbytes as f64 * g / 1e9
            ))
        })();
        match r {
            Ok(line) => println!("{line}"),
            Err(e) => println!("| {ty} | error: {e} |"),
        }
    }
}

/// `--logits MODEL IDS OUT`: the CUDA backend's logits for every position of
/// the comma-separated token ids, written as raw little-endian f32 to OUT:
/// [prefill in one batch (cuBLAS GEMMs past 16 tokens)], [decode one token at
/// a time, default GEMVs], [decode, exact GEMVs] and [CPU backend, decode],
/// each ids.len() x vocab. For comparisons with transformers on the device.
fn dump_logits(args: &[String]) -> Result<(), String> {
    let [model, ids, out] = args else {
        return Err("--logits MODEL IDS OUT".into());
    };
    let ids: Vec<u32> = ids
        .split(',')
        .map(|t| t.trim().parse().map_err(|_| format!("bad id '{t}'")))
        .collect::<Result<_, _>>()?;
    let model = Arc::new(Model::open(Path::new(model)).map_err(|e| e.to_string())?);
    let o = EngineOptions {
        ctx: ids.len().next_power_of_two().max(64),
        max_seqs: 1,
        block_size: 16,
        max_chunk: 512,
    };
    let mut all = Vec::new();
    let t = Instant::now();
    // `$KILN_CHECK_KV=f16`: the CUDA engines' caches in f16 (the kiln-cpu
    // block stays f32).
    let kv = if std::env::var("KILN_CHECK_KV").is_ok_and(|v| v == "f16") {
        KvTypes::F16
    } else {
        KvTypes::default()
    };
    let co = CudaOptions {
        kv,
        ..CudaOptions::default()
    };
    let mut e = cuda_engine_opts(&model, o, co)?;
    eprintln!("load {:.1}s", t.elapsed().as_secs_f64());
    e.prefill_into(0, &ids, true, &mut all)
        .map_err(|e| e.to_string())?;
    let vocab = all.len() / ids.len().max(1);
    e.reset(0);
    for &id in &ids {
        all.extend_from_slice(e.decode(0, id).map_err(|e| e.to_string())?);
    }
    drop(e);
    // The same ids in 2, 3 and 4 sequences decoded together, each row
    // against the decode alone above (stdout only; the file keeps its four
    // blocks).
    let alone = &all[ids.len() * vocab..];
    for k in 2..=4usize {
        let mut e = cuda_engine_opts(&model, EngineOptions { max_seqs: k, ..o }, co)?;
        let (mut same, mut worst) = (0usize, 0.0f32);
        for (i, &id) in ids.iter().enumerate() {
            let items: Vec<(usize, u32)> = (0..k).map(|s| (s, id)).collect();
            let rows = e.decode_batch(&items).map_err(|e| e.to_string())?;
            let want = &alone[i * vocab..(i + 1) * vocab];
            for row in rows.chunks(vocab) {
                same += usize::from(same_bits(row, want));
                worst = worst.max(max_abs(row, want));
            }
        }
        println!(
            "{k} sequences decoded together = alone, bit for bit: {same} of {} rows (max abs diff {worst:.3e})",
            k * ids.len()
        );
    }
    let exact = CudaOptions { exact: true, ..co };
    let mut e = cuda_engine_opts(&model, o, exact)?;
    for &id in &ids {
        all.extend_from_slice(e.decode(0, id).map_err(|e| e.to_string())?);
    }
    drop(e);
    let mut c = cpu_engine(&model, o)?;
    for &id in &ids {
        all.extend_from_slice(c.decode(0, id).map_err(|e| e.to_string())?);
    }
    let bytes: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(out, bytes).map_err(|e| format!("{out}: {e}"))?;
    eprintln!("wrote {} logits to {out}", all.len());
    Ok(())
}

/// `--sync-micro`: a grid-wide barrier inside one persistent kernel against
/// a kernel boundary under programmatic dependent launch, per phase of a
/// decode step (`kiln_cuda::testing::sync_micro`): grids of 1, 2 and 4
/// blocks of 256 threads an SM, phases that only meet, and phases that
/// write a GEMV's outputs and read the next GEMV's x (1B and 8B hidden).
fn sync_micro() -> Result<(), String> {
    let mut gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let sms = gpu.info.sms.max(1) as u32;
    println!("| blocks | floats written a block / read a block | barrier in one kernel µs | kernel boundary µs |");
    println!("|---|---|---|---|");
    for per_sm in [1, 2, 4] {
        let blocks = per_sm * sms;
        for (w, r) in [
            (0, 0),
            (3072 / blocks as usize, 2048),
            (6144 / blocks as usize, 4096),
        ] {
            let (p, k) = kiln_cuda::testing::sync_micro(&mut gpu, blocks, 256, 2000, w, r)
                .map_err(|e| e.to_string())?;
            println!("| {blocks} | {w} / {r} | {p:.2} | {k:.2} |");
        }
    }
    Ok(())
}

/// `--gemv-micro [SHAPE/TYPE/KERNEL/ROWS_PER_BLOCK/THREADS ...]`: one-token
/// GEMV kernels timed over a model shape's layer matrices (random bytes),
/// chained in one graph as in decode; the whole chain and each matrix
/// shape's own chain, in µs per token and GB/s. SHAPE: 8b (Llama-3.1-8B
/// layers), 1b (Llama-3.2-1B), or g1b-od / 8b-od (Gemma-3-1B's / Llama-3.1-8B's
/// O and down only). A kernel taking f32 x is named `mvf_*`.
fn gemv_micro(cases: &[String]) -> Result<(), String> {
    // The backend's one-token kernels per type next to the read ceiling
    // (`mvqs*` as the backend launches them: 16 rows of 512 threads).
    // rdq*: the repacked rows' access pattern without the arithmetic
    // (`_flat`: the same bytes, a row's quants then its scales).
    const DEFAULT: [&str; 14] = [
        "8b/q4_0/mvq_q4_0/8/256",
        "8b/q4_0/mvqs4_q4_0r/16/512",
        "8b/q4_0/mvqs8_q4_0r/16/512",
        "8b/q4_0/rdq4_pat/16/512",
        "8b/q4_0/rd_rows/8/256",
        "8b/q8_0/mvq_q8_0r/8/256",
        "8b/q8_0/rdq8_pat/8/256",
        "8b/q8_0/rdq8_flat/8/256",
        "8b/q8_0/rd_rows/8/256",
        "8b/q4_k/mvq_q4_k/8/256",
        "8b/q6_k/mvq_q6_k/8/256",
        "8b/bf16/mvf_bf16/8/256",
        "1b/q4_0/mvqs4_q4_0r/16/512",
        "1b/q4_0/rd_rows/8/256",
    ];
    let cases: Vec<String> = if cases.is_empty() {
        DEFAULT.iter().map(|s| s.to_string()).collect()
    } else {
        cases.to_vec()
    };
    let mut gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    println!("| shape | type | kernel | chain µs | GB/s | µs per matrix (GB/s): qkv / o / gate_up / down |");
    println!("|---|---|---|---|---|---|");
    let mut chain: Option<(String, kiln_cuda::testing::GemvChain)> = None;
    for case in &cases {
        let f: Vec<&str> = case.split('/').collect();
        let [shape, ty, kernel, rpb, threads] = f[..] else {
            return Err(format!(
                "bad case '{case}' (SHAPE/TYPE/KERNEL/ROWS_PER_BLOCK/THREADS)"
            ));
        };
        let (shapes, layers): (Vec<(usize, usize)>, usize) = match shape {
            "8b" => (
                vec![(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
                32,
            ),
            "1b" => (
                vec![(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)],
                16,
            ),
            // The products of Gemma-3-1B (26 layers) whose rows are whole
            // super-blocks, O and down (its Q6_K matrices; NOTES.md item 104),
            // and Llama-3.1-8B's O and down beside them.
            "g1b-od" => (vec![(1152, 1024), (1152, 6912)], 26),
            "8b-od" => (vec![(4096, 4096), (4096, 14336)], 32),
            _ => return Err(format!("unknown shape '{shape}'")),
        };
        let gt = GgmlType::from_name(ty).ok_or_else(|| format!("unknown type '{ty}'"))?;
        // A repacked kernel's rows as the backend lays them out (padded
        // rows where its layout writes out of place).
        let repacked = kernel.ends_with('r') && !kernel.starts_with("rd");
        let rb = |cols: usize| {
            if repacked {
                kiln_cuda::testing::repacked_row_bytes(gt, cols)
            } else {
                cols / gt.block_size() * gt.type_size()
            }
        };
        let key = format!("{shape}/{ty}/{repacked}");
        if chain.as_ref().is_none_or(|c| c.0 != key) {
            drop(chain.take()); // free the previous matrices first
            let c = kiln_cuda::testing::GemvChain::new(&mut gpu, &shapes, layers, &rb)
                .map_err(|e| e.to_string())?;
            chain = Some((key, c));
        }
        let Some((_, c)) = &chain else { continue };
        let parse = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| format!("bad number '{s}' in '{case}'"))
        };
        // ROWS_PER_BLOCK "8p4": 8 rows per block, at most 4 blocks per SM.
        let (rpb, cap) = match rpb.split_once('p') {
            Some((r, c)) => (parse(r)?, parse(c)? * gpu.info.sms as usize),
            None => (parse(rpb)?, usize::MAX),
        };
        let float = kernel.starts_with("mvf");
        let t = c.time(
            &mut gpu,
            kernel,
            float,
            rpb,
            cap,
            parse(threads)? as u32,
            20,
        );
        let t = match t {
            Ok(t) => t,
            Err(e) => {
                println!("| {shape} | {ty} | {kernel} | error: {e} | | |");
                continue;
            }
        };
        let b = c.bytes();
        let per: Vec<String> = t[1..]
            .iter()
            .zip(&b[1..])
            .map(|(s, b)| {
                format!(
                    "{:.1} ({:.0})",
                    s * 1e6 / layers as f64,
                    *b as f64 / s / 1e9
                )
            })
            .collect();
        println!(
            "| {shape} | {ty} | {kernel} | {:.1} | {:.0} | {} |",
            t[0] * 1e6,
            b[0] as f64 / t[0] / 1e9,
            per.join(" / ")
        );
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench_on = args.iter().any(|a| a == "--bench");
    let fixtures = args
        .iter()
        .position(|a| a == "--fixtures")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures"));

    if let Some(i) = args.iter().position(|a| a == "--logits") {
        if let Err(e) = dump_logits(&args[i + 1..]) {
            println!("{e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--precompile") {
        let arch = args.get(i + 1).map_or("sm_90", |s| s.as_str());
        match kiln_cuda::gpu::cached_cubins(arch) {
            Ok((c, how, p)) => println!(
                "{arch}: {} modules, {} bytes, {how}, {p:?}",
                c.len(),
                c.iter().map(|m| m.1.len()).sum::<usize>()
            ),
            Err(e) => {
                println!("{e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.iter().any(|a| a == "--sync-micro") {
        if let Err(e) = sync_micro() {
            println!("{e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--gemv-micro") {
        if let Err(e) = gemv_micro(&args[i + 1..]) {
            println!("{e}");
            std::process::exit(1);
        }
        return;
    }
    let t = Instant::now();
    let mut gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            println!("no CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let first = t.elapsed().as_secs_f64();
    let i = gpu.info.clone();
    println!(
        "## device\n{} (sm_{}{}, {} SMs, {:.1} GiB), driver CUDA {}.{}, NVRTC {:?}",
        i.name,
        i.cc.0,
        i.cc.1,
        i.sms,
        i.total_mem as f64 / (1u64 << 30) as f64,
        i.driver_version / 1000,
        i.driver_version % 1000 / 10,
        i.nvrtc
    );
    println!(
        "kernels: {} in {first:.2}s total open; cache {:?}",
        i.kernels, i.kernel_cache
    );
    let t = Instant::now();
    match Gpu::new(0) {
        Ok(g2) => println!(
            "second open: kernels {} in {:.2}s",
            g2.info.kernels,
            t.elapsed().as_secs_f64()
        ),
        Err(e) => println!("second open failed: {e}"),
    }

    let mut failures = Vec::new();
    op_checks(&mut gpu, &mut failures);
    fast_op_checks(&mut gpu, &mut failures);
    mmq_checks(&mut gpu, &mut failures);
    argmax_checks(&mut gpu, &mut failures);
    sample_checks(&mut gpu, &mut failures);
    flash_checks(&mut gpu, &mut failures);
    drop(gpu);
    model_checks(&fixtures, &mut failures);
    if bench_on {
        bench();
        bench_long();
    }
    println!();
    if failures.is_empty() {
        println!("ALL CHECKS PASSED");
    } else {
        println!("{} FAILURES:", failures.len());
        for f in &failures {
            println!("  {f}");
        }
        std::process::exit(1);
    }
}

/// Every kernel that reads the repacked layout (8-bit-x GEMV for 1 and 8
/// tokens, f32-x GEMV for 1 and 8, dequantization for the GEMM path) against
/// the same kernel on the plain layout: bit-identical results.
fn repacked_same(
    gpu: &mut kiln_cuda::gpu::Gpu,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    xs: &[f32],
) -> kiln_cuda::gpu::CuResult<bool> {
    use kiln_cuda::testing as t;
    let checks = [
        (
            "one-token 8-bit",
            same_bits(
                &t::matvec_fast(gpu, ty, w, rows, cols, x, false)?.0,
                &t::matvec_fast(gpu, ty, w, rows, cols, x, true)?.0,
            ),
        ),
        (
            "8-token 8-bit",
            same_bits(
                &t::matvec_fast_nt(gpu, ty, w, rows, cols, xs, 8, false)?,
                &t::matvec_fast_nt(gpu, ty, w, rows, cols, xs, 8, true)?,
            ),
        ),
        (
            "one-token f32",
            same_bits(
                &t::matvec(gpu, ty, w, rows, cols, x, false)?,
                &t::matvec(gpu, ty, w, rows, cols, x, true)?,
            ),
        ),
        (
            "8-token f32",
            same_bits(
                &t::matmul(gpu, ty, w, rows, cols, xs, 8, false)?,
                &t::matmul(gpu, ty, w, rows, cols, xs, 8, true)?,
            ),
        ),
        ("dequantization", {
            let a = t::dequant_rows(gpu, ty, w, rows, cols, false)?;
            let b = t::dequant_rows(gpu, ty, w, rows, cols, true)?;
            let bad: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            if let (Some(&i), Some(&j)) = (bad.first(), bad.last()) {
                println!(
                    "  {} differ, first at row {} col {} ({:#x} vs {:#x}), last at row {} col {}",
                    bad.len(),
                    i / cols,
                    i % cols,
                    a[i],
                    b[i],
                    j / cols,
                    j % cols
                );
            }
            bad.is_empty()
        }),
    ];
    for (name, ok) in &checks {
        if !ok {
            println!("repacked {ty} {rows} x {cols}: {name} differs from the plain layout");
        }
    }
    Ok(checks.iter().all(|c| c.1))
}
