//! Every fast kernel against the reference (dequantize the row, dot in f64)
//! on random blocks of awkward sizes, split over threads unevenly.

use super::*;
use kiln_format::dequant::dequantize_row;

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

/// f16 bits of a random magnitude in 2^-9..2^-2 (sign if `signed`).
fn f16_bits(r: &mut Rng, signed: bool) -> u16 {
    let exp = 6 + (r.next() % 7) as u16;
    let man = (r.next() % 1024) as u16;
    let sign = if signed && r.next() & 1 == 0 {
        0x8000
    } else {
        0
    };
    sign | (exp << 10) | man
}

/// Byte offsets of the f16 scale fields of one block.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `cols` values of type `ty`.
fn random_matrix(r: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let nb = rows * cols / bs;
    let mut b = vec![0u8; nb * ts];
    match ty {
        GgmlType::F32 => {
            for c in b.chunks_exact_mut(4) {
                c.copy_from_slice(&r.f().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in b.chunks_exact_mut(2) {
                c.copy_from_slice(&((r.f().to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in b.chunks_exact_mut(2) {
                c.copy_from_slice(&f16_bits(r, true).to_le_bytes());
            }
        }
        _ => {
            for v in b.iter_mut() {
                *v = r.next() as u8;
            }
            for blk in b.chunks_exact_mut(ts) {
                for (i, &at) in f16_fields(ty).iter().enumerate() {
                    // d may be negative in the legacy types; mins as stored.
                    let h = f16_bits(r, i == 0);
                    blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    b
}

/// `y` via the fast kernels on `threads` threads, split as `project` does.
fn fast_matmul(
    pool: &ThreadPool,
    w: &RawMat<'_>,
    bias: Option<&[f32]>,
    x: &[f32],
    n: usize,
) -> (Vec<f32>, QAct) {
    let mut xq = QAct::new(n, w.cols);
    if xq.fits(n, w.cols) {
        xq.quantize(x, n, w.cols);
    }
    let mut y = vec![f32::NAN; n * w.rows];
    let yp = SyncPtr(y.as_mut_ptr());
    let nt = pool.n_threads();
    let xqr = &xq;
    pool.run(&|tid| {
        let (r0, r1) = (w.rows * tid / nt, w.rows * (tid + 1) / nt);
        assert!(run_fast(w, bias, x, Some(xqr), n, yp, r0, r1));
    });
    (y, xq)
}

const TYPES: [GgmlType; 13] = [
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
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

#[test]
fn fast_kernels_match_reference() {
    if kernel_for(GgmlType::Q4_0).is_none() {
        eprintln!("SKIPPED: no fast kernels on this CPU");
        return;
    }
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for threads in [1, 3] {
        let pool = ThreadPool::new(threads);
        for ty in TYPES {
            let bs = ty.block_size().max(32);
            // Awkward: row counts not divisible by threads or 4; 1..3 blocks
            // (and for floats, a length that is not a multiple of 8).
            for (rows, blocks, n) in [(37, 1, 1), (13, 3, 7), (5, 2, 4), (1, 1, 2)] {
                let cols = if ty.block_size() == 1 && rows == 13 {
                    blocks * bs + 3
                } else {
                    blocks * bs
                };
                let w = random_matrix(&mut r, ty, rows, cols);
                let row_bytes = cols / ty.block_size() * ty.type_size();
                let mat = RawMat {
                    ty,
                    bytes: &w,
                    row_bytes,
                    rows,
                    cols,
                };
                let x: Vec<f32> = (0..n * cols).map(|_| r.f() * 3.0).collect();
                let bias: Vec<f32> = (0..rows).map(|_| r.f()).collect();
                let quant = matches!(kernel_for(ty), Some(Kernel::Quant(_)));
                if quant && cols % 32 != 0 {
                    continue;
                }
                let (y, xq) = fast_matmul(&pool, &mat, Some(&bias), &x, n);
                let mut wr = vec![0.0f32; cols];
                let (mut worst_q, mut worst_f) = (0.0f64, 0.0f64);
                for row in 0..rows {
                    dequantize_row(ty, &w, cols, row, &mut wr).unwrap();
                    for t in 0..n {
                        let (mut exact_q, mut exact_f, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                        for i in 0..cols {
                            let xi = if quant {
                                xq.value(t, i)
                            } else {
                                x[t * cols + i]
                            };
                            exact_q += f64::from(wr[i]) * f64::from(xi);
                            exact_f += f64::from(wr[i]) * f64::from(x[t * cols + i]);
                            mag += (f64::from(wr[i]) * f64::from(xi)).abs();
                        }
                        let got = f64::from(y[t * rows + row]) - f64::from(bias[row]);
                        // Against the same arithmetic on the quantized
                        // activations: f32 rounding only.
                        let eq = (got - exact_q).abs() / (mag + 1e-30);
                        assert!(
                            eq < 2e-6,
                            "{ty} rows {rows} cols {cols} n {n} threads {threads}: row {row} token {t}: {got} vs {exact_q} (rel {eq:e})"
                        );
                        worst_q = worst_q.max(eq);
                        worst_f = worst_f.max((got - exact_f).abs() / (mag + 1e-30));
                    }
                }
                if threads == 1 && rows == 37 {
                    eprintln!(
                        "{ty}: vs quantized-x reference {worst_q:.1e}, vs f32-x reference {worst_f:.1e} (relative to Σ|w·x|)"
                    );
                }
            }
        }
    }
}

/// A token's result does not depend on the batch it is computed in (tokens
/// are grouped by 4 in the kernels) nor on the thread count.
#[test]
fn fast_kernels_batch_invariant() {
    if kernel_for(GgmlType::Q4_0).is_none() {
        return;
    }
    let mut r = Rng(7);
    let (rows, cols, n) = (11, 256, 7);
    for ty in TYPES {
        let w = random_matrix(&mut r, ty, rows, cols);
        let mat = RawMat {
            ty,
            bytes: &w,
            row_bytes: cols / ty.block_size() * ty.type_size(),
            rows,
            cols,
        };
        let x: Vec<f32> = (0..n * cols).map(|_| r.f()).collect();
        let (all, _) = fast_matmul(&ThreadPool::new(2), &mat, None, &x, n);
        for t in 0..n {
            let (one, _) = fast_matmul(
                &ThreadPool::new(1 + t % 3),
                &mat,
                None,
                &x[t * cols..(t + 1) * cols],
                1,
            );
            assert_eq!(one[..], all[t * rows..(t + 1) * rows], "{ty} token {t}");
        }
    }
}

// ---- packed weights and the GEMM kernels ---------------------------------

const PACKED: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn pack_raw(ty: GgmlType, w: &[u8], rows: usize, cols: usize) -> crate::packed::PackedMat {
    let row_bytes = cols / ty.block_size() * ty.type_size();
    crate::packed::pack(ty, w, row_bytes, rows, cols, 1 + rows % 3).expect("packable")
}

/// The packed layout holds the same values as the stored rows.
#[test]
fn packed_layout_matches_dequant() {
    let mut r = Rng(0x5eed);
    for ty in PACKED {
        for (rows, blocks) in [(1, 1), (8, 2), (13, 1), (37, 3)] {
            let cols = blocks * ty.block_size();
            let w = random_matrix(&mut r, ty, rows, cols);
            let p = pack_raw(ty, &w, rows, cols);
            assert_eq!(p.bytes().len() * 8, p.groups() * p.nrec * p.rec_bytes * 8);
            let got = crate::packed::unpack_f32(&p);
            let mut want = vec![0.0f32; cols];
            for row in 0..rows {
                dequantize_row(ty, &w, cols, row, &mut want).unwrap();
                for i in 0..cols {
                    let (a, b) = (got[row * cols + i], want[i]);
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                        "{ty} rows {rows} row {row} col {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// `y` via the GEMM kernels on `threads` threads, groups split as
/// `project` splits them.
fn gemm_matmul(
    pool: &ThreadPool,
    p: &crate::packed::PackedMat,
    bias: Option<&[f32]>,
    x: &[f32],
    n: usize,
) -> (Vec<f32>, QAct) {
    let mut xq = QAct::new(n, p.cols);
    xq.quantize(x, n, p.cols);
    let mut y = vec![f32::NAN; n * p.rows];
    let yp = SyncPtr(y.as_mut_ptr());
    let nt = pool.n_threads();
    let ng = p.groups();
    let xqr = &xq;
    pool.run(&|tid| {
        let (g0, g1) = (ng * tid / nt, ng * (tid + 1) / nt);
        if g0 < g1 {
            assert!(run_packed(p, bias, xqr, n, yp, g0, g1));
        }
    });
    (y, xq)
}

#[test]
fn gemm_matches_reference() {
    if kernel_for(GgmlType::Q4_0).is_none() {
        eprintln!("SKIPPED: no fast kernels on this CPU");
        return;
    }
    let mut r = Rng(0x1234_5678_9abc_def1);
    for threads in [1, 3] {
        let pool = ThreadPool::new(threads);
        for ty in PACKED {
            let mut worst = 0.0f64;
            // Rows not divisible by 8 or the thread count; 1..3 super-
            // blocks; token counts around the tile of 4.
            for (rows, blocks, n) in [
                (1, 1, 1),
                (7, 2, 17),
                (13, 3, 5),
                (37, 1, 3),
                (67, 2, 9),
                (8, 1, 16),
                (29, 2, 2),
            ] {
                let cols = blocks * ty.block_size();
                let w = random_matrix(&mut r, ty, rows, cols);
                let p = pack_raw(ty, &w, rows, cols);
                let x: Vec<f32> = (0..n * cols).map(|_| r.f() * 3.0).collect();
                let bias: Vec<f32> = (0..rows).map(|_| r.f()).collect();
                let (y, xq) = gemm_matmul(&pool, &p, Some(&bias), &x, n);
                let mut wr = vec![0.0f32; cols];
                for row in 0..rows {
                    dequantize_row(ty, &w, cols, row, &mut wr).unwrap();
                    for t in 0..n {
                        let (mut exact, mut mag) = (0.0f64, 0.0f64);
                        for (i, &wi) in wr.iter().enumerate() {
                            let xi = f64::from(xq.value(t, i));
                            exact += f64::from(wi) * xi;
                            mag += (f64::from(wi) * xi).abs();
                        }
                        let got = f64::from(y[t * rows + row]) - f64::from(bias[row]);
                        let e = (got - exact).abs() / (mag + 1e-30);
                        assert!(
                            e < 2e-6,
                            "{ty} rows {rows} cols {cols} n {n} threads {threads}: row {row} token {t}: {got} vs {exact} (rel {e:e})"
                        );
                        worst = worst.max(e);
                    }
                }
            }
            if threads == 1 {
                eprintln!("{ty} gemm: vs quantized-x reference {worst:.1e} of Σ|w·x|");
            }
        }
    }
}

/// A token's GEMM result is the same bit for bit alone, in any batch, at
/// any offset in the batch, on any thread count.
#[test]
fn gemm_batch_invariant() {
    if kernel_for(GgmlType::Q4_0).is_none() {
        return;
    }
    let mut r = Rng(11);
    let (rows, n) = (21, 11);
    for ty in PACKED {
        let cols = 2 * ty.block_size().max(32);
        let w = random_matrix(&mut r, ty, rows, cols);
        let p = pack_raw(ty, &w, rows, cols);
        let x: Vec<f32> = (0..n * cols).map(|_| r.f()).collect();
        let (all, _) = gemm_matmul(&ThreadPool::new(2), &p, None, &x, n);
        let (part, _) = gemm_matmul(&ThreadPool::new(3), &p, None, &x[3 * cols..], n - 3);
        assert_eq!(part[..], all[3 * rows..], "{ty} tokens 3..");
        for t in 0..n {
            let (one, _) = gemm_matmul(
                &ThreadPool::new(1 + t % 3),
                &p,
                None,
                &x[t * cols..(t + 1) * cols],
                1,
            );
            assert_eq!(one[..], all[t * rows..(t + 1) * rows], "{ty} token {t}");
        }
    }
}
