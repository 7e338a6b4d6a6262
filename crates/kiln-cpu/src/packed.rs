//! Weights repacked at load for the GEMM kernels (`gemm.rs`): eight rows
//! interleaved per record, nibbles pre-split, scales of the eight rows side
//! by side.
//!
//! A matrix becomes `ceil(rows / 8)` groups of eight rows (the last padded
//! with zero rows); a group is a run of records, one per super-block of the
//! type (32 columns for the legacy types, 256 for the k-quants). A record
//! holds, per 32-column chunk, eight 32-byte vectors: vector `j` byte `i` is
//! row `i / 4`, column `4j + i % 4` of the chunk, so one `maddubs` of vector
//! `j` against the token's four bytes at `4j` broadcast gives the eight
//! rows' partial sums side by side, and a chunk's eight vectors add up in
//! 16-bit lanes before one `madd` (no horizontal sums, one convert and one
//! FMA per chunk for eight rows).
//!
//! Weights are stored as unsigned integers (`q`, the offset `-8`/`-16`/
//! `-32` or the min applied through the activation sums), the same values
//! the reference dequantization uses. Layouts (`d`, `m`, `dmin` are the
//! rows' f16 fields as stored, eight side by side):
//!
//! | type | record (bytes) |
//! | --- | --- |
//! | Q4_0 | d 16, nibbles 128 (= 8 × 18) |
//! | Q4_1 | d 16, m 16, nibbles 128 (= 8 × 20) |
//! | Q5_0 | d 16, bit 4 32, nibbles 128 (= 8 × 22) |
//! | Q5_1 | d 16, m 16, bit 4 32, nibbles 128 (= 8 × 24) |
//! | Q8_0 | d 16, bytes 256 (= 8 × 34) |
//! | Q4_K | d 16, dmin 16, scales 8×8, mins 8×8, 8 × nibbles 128 (8 × 144 + 32) |
//! | Q5_K | d 16, dmin 16, scales 8×8, mins 8×8, 8 × (bit 4 32, nibbles 128) (8 × 176 + 32) |
//! | Q6_K | d 16, scales 16×8 (i8), 8 × (bits 4–5 64, nibbles 128) (= 8 × 210) |
//!
//! Nibble plane: 4 vectors of 32 bytes; vector `p`'s low nibbles are weight
//! vector `p`, its high nibbles weight vector `p + 4`. Bit-4 plane (5-bit
//! types): byte `i` bit `k` is bit 4 of weight vector `k`, lane `i`. Bits
//! 4–5 (Q6_K): two vectors, the first holding weight vectors 0–3 (bits
//! `2k..2k+2` for vector `k`), the second vectors 4–7.

use std::sync::Arc;

use kiln_format::GgmlType;

/// Rows per group.
pub(crate) const ROWS: usize = 8;

/// A matrix repacked for the GEMM kernels.
pub(crate) struct PackedMat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Records per group (super-blocks per row).
    pub nrec: usize,
    pub rec_bytes: usize,
    /// The buffer holding the records (shared by the model's matrices).
    arena: Arc<Arena>,
    /// Where this matrix's `groups * nrec * rec_bytes` bytes start
    /// (64-byte aligned).
    off: usize,
}

impl PackedMat {
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(ROWS)
    }

    pub fn bytes(&self) -> &[u8] {
        let n = self.groups() * self.nrec * self.rec_bytes;
        &self.arena.as_slice()[self.off..self.off + n]
    }
}

/// One buffer for the packed copies of a model's matrices. Large arenas
/// are 2 MiB aligned and asked to be backed by transparent huge pages
/// (Linux `madvise(MADV_HUGEPAGE)`): decode streams every packed byte once
/// per token, and with 4 KiB pages that is a TLB miss (a two-level page
/// walk in a VM) every 4 KiB. One arena rather than one allocation per
/// matrix, so rounding to 2 MiB costs at most 2 MiB in all.
pub(crate) struct Arena {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned (like a Vec<u8>); it is written only through
// `pack_into`, whose callers guarantee disjoint ranges and no readers.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

/// Arenas at least this large get huge pages.
const HUGE_MIN: usize = 4 << 20;
const HUGE: usize = 2 << 20;

impl Arena {
    /// `len` bytes, uninitialized until packed into (`pack_into` writes
    /// every byte of its range, in the packing thread: the first touch, so
    /// the page faults are spread over the threads).
    pub fn new(len: usize) -> Arc<Arena> {
        let huge = len >= HUGE_MIN && huge_pages_enabled();
        let (size, align) = if huge {
            (len.next_multiple_of(HUGE), HUGE)
        } else {
            (len.max(1), 64)
        };
        let layout = std::alloc::Layout::from_size_align(size, align)
            .unwrap_or_else(|_| std::alloc::Layout::new::<u64>());
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        if huge {
            advise_huge(raw, size);
        }
        Arc::new(Arena { ptr, len, layout })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds `len` bytes; every byte a matrix
        // reads was written by `pack_into` before any reader exists.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Huge pages for packed weights, unless `KILN_CPU_HUGEPAGES=0`.
fn huge_pages_enabled() -> bool {
    cfg!(target_os = "linux")
        && !matches!(
            std::env::var("KILN_CPU_HUGEPAGES").as_deref(),
            Ok("0" | "off")
        )
}

#[cfg(target_os = "linux")]
fn advise_huge(p: *mut u8, len: usize) {
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    // SAFETY: `p..p + len` is one allocation of ours, 2 MiB aligned; the
    // advice changes no contents (failure just leaves 4 KiB pages).
    unsafe { madvise(p.cast(), len, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: *mut u8, _: usize) {}

/// Record size for `ty`, if it has a packed layout.
pub(crate) fn record_bytes(ty: GgmlType) -> Option<usize> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => 144,
        Q4_1 => 160,
        Q5_0 => 176,
        Q5_1 => 192,
        Q8_0 => 272,
        Q4K => 1184,
        Q5K => 1440,
        Q6K => 1680,
        _ => return None,
    })
}

/// Arena bytes for the packed copy of `rows` rows of `cols` values of type
/// `ty` stored in `bytes` (`row_bytes` per row), rounded up to 64 so the
/// next matrix stays aligned; `None` if the type has no packed layout or
/// the sizes do not fit.
pub(crate) fn packed_len(
    ty: GgmlType,
    bytes: &[u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
) -> Option<usize> {
    let rec_bytes = record_bytes(ty)?;
    let (bs, ts) = (ty.block_size(), ty.type_size());
    #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
    if cols == 0 || cols % bs != 0 || row_bytes != cols / bs * ts || bytes.len() < rows * row_bytes
    {
        return None;
    }
    Some((rows.div_ceil(ROWS) * (cols / bs) * rec_bytes).next_multiple_of(64))
}

/// One chunk of eight rows as unsigned quants.
type Chunk = [[u8; 32]; ROWS];

#[inline]
fn f16_at(b: &[u8], at: usize) -> [u8; 2] {
    [b[at], b[at + 1]]
}

/// Q4_K/Q5_K's 6-bit scale and min of sub-block `j`.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The nibble plane of a chunk (128 bytes).
fn put_nibbles(out: &mut [u8], q: &Chunk) {
    for p in 0..4 {
        for i in 0..32 {
            let (r, c) = (i / 4, 4 * p + i % 4);
            out[32 * p + i] = (q[r][c] & 0x0f) | ((q[r][c + 16] & 0x0f) << 4);
        }
    }
}

/// The bit-4 plane of a chunk (32 bytes).
fn put_bit4(out: &mut [u8], q: &Chunk) {
    for i in 0..32 {
        let mut b = 0u8;
        for k in 0..8 {
            b |= ((q[i / 4][4 * k + i % 4] >> 4) & 1) << k;
        }
        out[i] = b;
    }
}

/// Q6_K's bits 4–5 of a chunk (64 bytes).
fn put_bits45(out: &mut [u8], q: &Chunk) {
    for half in 0..2 {
        for i in 0..32 {
            let mut b = 0u8;
            for k in 0..4 {
                b |= ((q[i / 4][4 * (4 * half + k) + i % 4] >> 4) & 3) << (2 * k);
            }
            out[32 * half + i] = b;
        }
    }
}

/// Repacks `rows` rows of `cols` values of type `ty` stored in `bytes`
/// (`row_bytes` per row) into an arena of its own. `None` if the type has
/// no packed layout or the sizes do not fit. Groups are split over
/// `threads` threads.
#[cfg(test)]
pub(crate) fn pack(
    ty: GgmlType,
    bytes: &[u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    threads: usize,
) -> Option<PackedMat> {
    let len = packed_len(ty, bytes, row_bytes, rows, cols)?;
    let arena = Arena::new(len);
    // SAFETY: the arena is new: nothing else reads or writes it.
    unsafe { pack_into(ty, bytes, row_bytes, rows, cols, threads, &arena, 0) }
}

/// [`pack`] into `arena` at `off` (`packed_len` bytes from there).
///
/// # Safety
/// No other thread may read or write `off..off + packed_len(..)` of the
/// arena during the call (ranges of concurrent calls are disjoint).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_into(
    ty: GgmlType,
    bytes: &[u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    threads: usize,
    arena: &Arc<Arena>,
    off: usize,
) -> Option<PackedMat> {
    let len = packed_len(ty, bytes, row_bytes, rows, cols)?;
    let rec_bytes = record_bytes(ty)?;
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if off.checked_add(len)? > arena.len {
        return None;
    }
    let nrec = cols / bs;
    let groups = rows.div_ceil(ROWS);
    // SAFETY: in bounds (checked); exclusive by the caller's contract.
    let out = unsafe { std::slice::from_raw_parts_mut(arena.ptr.as_ptr().add(off), len) };
    let group_bytes = nrec * rec_bytes;
    // The rounding to 64 bytes past the last group.
    out[groups * group_bytes..].fill(0);
    // Groups `g0..` into `part` (whole groups).
    let pack_part = |g0: usize, part: &mut [u8]| {
        // Padding rows' fields are skipped by `pack_record`: start from 0.
        part.fill(0);
        let mut q: Chunk = [[0; 32]; ROWS];
        for (gi, grp) in part.chunks_exact_mut(group_bytes).enumerate() {
            let g = g0 + gi;
            for b in 0..nrec {
                let rec = &mut grp[b * rec_bytes..][..rec_bytes];
                // The source blocks of the group's rows (None: padding row).
                let blk = |r: usize| -> Option<&[u8]> {
                    let row = g * ROWS + r;
                    (row < rows).then(|| &bytes[row * row_bytes + b * ts..][..ts])
                };
                pack_record(ty, rec, &blk, &mut q);
            }
        }
    };
    let body = &mut out[..groups * group_bytes];
    let threads = threads.clamp(1, groups.max(1));
    if threads == 1 {
        pack_part(0, body);
    } else {
        let per = groups.div_ceil(threads);
        std::thread::scope(|s| {
            for (i, part) in body.chunks_mut(per * group_bytes).enumerate() {
                let pack_part = &pack_part;
                s.spawn(move || pack_part(i * per, part));
            }
        });
    }
    Some(PackedMat {
        ty,
        rows,
        cols,
        nrec,
        rec_bytes,
        arena: arena.clone(),
        off,
    })
}

fn pack_record<'a>(
    ty: GgmlType,
    rec: &mut [u8],
    blk: &dyn Fn(usize) -> Option<&'a [u8]>,
    q: &mut Chunk,
) {
    use GgmlType::*;
    // The eight rows' blocks, looked up once (not a dynamic call per byte).
    let rows: [Option<&'a [u8]>; ROWS] = std::array::from_fn(blk);
    let blk = |r: usize| rows[r];
    // Scale fields: copy the f16 at `src` of each row to `dst + 2r`.
    let f16s = |rec: &mut [u8], dst: usize, src: usize| {
        for r in 0..ROWS {
            if let Some(b) = blk(r) {
                rec[dst + 2 * r..dst + 2 * r + 2].copy_from_slice(&f16_at(b, src));
            }
        }
    };
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 => {
            let (has_m, five) = (matches!(ty, Q4_1 | Q5_1), matches!(ty, Q5_0 | Q5_1));
            let qs_at = match ty {
                Q4_0 => 2,
                Q4_1 => 4,
                Q5_0 => 6,
                _ => 8,
            };
            let qh_at = if has_m { 4 } else { 2 };
            for (r, qr) in q.iter_mut().enumerate() {
                let Some(b) = blk(r) else {
                    *qr = [0; 32];
                    continue;
                };
                let qh = if five {
                    u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]])
                } else {
                    0
                };
                for i in 0..16 {
                    let hl = ((qh >> i) & 1) as u8;
                    let hh = ((qh >> (i + 16)) & 1) as u8;
                    qr[i] = (b[qs_at + i] & 0x0f) | (hl << 4);
                    qr[i + 16] = (b[qs_at + i] >> 4) | (hh << 4);
                }
            }
            f16s(rec, 0, 0);
            let mut at = 16;
            if has_m {
                f16s(rec, 16, 2);
                at = 32;
            }
            if five {
                put_bit4(&mut rec[at..at + 32], q);
                at += 32;
            }
            put_nibbles(&mut rec[at..at + 128], q);
        }
        Q8_0 => {
            f16s(rec, 0, 0);
            // Vector j, row r: the row's bytes 4j..4j+4 (padding rows stay 0).
            for (r, b) in rows.iter().enumerate() {
                let Some(b) = b else { continue };
                for j in 0..8 {
                    let at = 16 + 32 * j + 4 * r;
                    rec[at..at + 4].copy_from_slice(&b[2 + 4 * j..2 + 4 * j + 4]);
                }
            }
        }
        Q4K | Q5K => {
            let five = ty == Q5K;
            f16s(rec, 0, 0);
            f16s(rec, 16, 2);
            let chunk_bytes = if five { 160 } else { 128 };
            for c in 0..8 {
                for (r, qr) in q.iter_mut().enumerate() {
                    let Some(b) = blk(r) else {
                        *qr = [0; 32];
                        rec[32 + 8 * c + r] = 0;
                        rec[96 + 8 * c + r] = 0;
                        continue;
                    };
                    let (sc, mn) = scale_min_k4(c, &b[4..16]);
                    rec[32 + 8 * c + r] = sc;
                    rec[96 + 8 * c + r] = mn;
                    let (g, hi) = (c / 2, c % 2);
                    let qs = if five { &b[48..176] } else { &b[16..144] };
                    for l in 0..32 {
                        let nib = if hi == 0 {
                            qs[32 * g + l] & 0x0f
                        } else {
                            qs[32 * g + l] >> 4
                        };
                        let h = if five { (b[16 + l] >> c) & 1 } else { 0 };
                        qr[l] = nib | (h << 4);
                    }
                }
                let at = 160 + chunk_bytes * c;
                if five {
                    put_bit4(&mut rec[at..at + 32], q);
                    put_nibbles(&mut rec[at + 32..at + 160], q);
                } else {
                    put_nibbles(&mut rec[at..at + 128], q);
                }
            }
        }
        Q6K => {
            f16s(rec, 0, 208);
            for s in 0..16 {
                for r in 0..ROWS {
                    rec[16 + 8 * s + r] = blk(r).map_or(0, |b| b[192 + s]);
                }
            }
            for c in 0..8 {
                let (h, k) = (c / 4, c % 4);
                for (r, qr) in q.iter_mut().enumerate() {
                    let Some(b) = blk(r) else {
                        *qr = [0; 32];
                        continue;
                    };
                    let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
                    for l in 0..32 {
                        let lo = match k {
                            0 => ql[l] & 0x0f,
                            1 => ql[l + 32] & 0x0f,
                            2 => ql[l] >> 4,
                            _ => ql[l + 32] >> 4,
                        };
                        qr[l] = lo | (((qh[l] >> (2 * k)) & 3) << 4);
                    }
                }
                let at = 144 + 192 * c;
                put_bits45(&mut rec[at..at + 64], q);
                put_nibbles(&mut rec[at + 64..at + 192], q);
            }
        }
        _ => {}
    }
}

/// The values of a packed matrix, dequantized (tests: the layout alone
/// against the reference dequantization).
#[cfg(test)]
pub(crate) fn unpack_f32(p: &PackedMat) -> Vec<f32> {
    use GgmlType::*;
    let f16 = |b: &[u8], at: usize| f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]));
    let nib = |plane: &[u8], r: usize, c: usize| {
        // weight vector j = c / 4 (c < 16: low nibble of vector p = j).
        let (j, i) = (c / 4, 4 * r + c % 4);
        if j < 4 {
            plane[32 * j + i] & 0x0f
        } else {
            plane[32 * (j - 4) + i] >> 4
        }
    };
    let bit4 = |plane: &[u8], r: usize, c: usize| (plane[4 * r + c % 4] >> (c / 4)) & 1;
    let bs = p.cols / p.nrec;
    let mut out = vec![0.0f32; p.rows * p.cols];
    let data = p.bytes();
    for row in 0..p.rows {
        let (g, r) = (row / ROWS, row % ROWS);
        for b in 0..p.nrec {
            let rec = &data[(g * p.nrec + b) * p.rec_bytes..][..p.rec_bytes];
            for e in 0..bs {
                let (c, k) = (e / 32, e % 32);
                let v = match p.ty {
                    Q4_0 => f16(rec, 2 * r) * (f32::from(nib(&rec[16..], r, k)) - 8.0),
                    Q4_1 => {
                        f16(rec, 2 * r) * f32::from(nib(&rec[32..], r, k)) + f16(rec, 16 + 2 * r)
                    }
                    Q5_0 => {
                        let q = nib(&rec[48..], r, k) | (bit4(&rec[16..], r, k) << 4);
                        f16(rec, 2 * r) * (f32::from(q) - 16.0)
                    }
                    Q5_1 => {
                        let q = nib(&rec[64..], r, k) | (bit4(&rec[32..], r, k) << 4);
                        f16(rec, 2 * r) * f32::from(q) + f16(rec, 16 + 2 * r)
                    }
                    Q8_0 => {
                        f16(rec, 2 * r) * f32::from(rec[16 + 32 * (k / 4) + 4 * r + k % 4] as i8)
                    }
                    Q4K | Q5K => {
                        let (sc, mn) = (rec[32 + 8 * c + r], rec[96 + 8 * c + r]);
                        let q = if p.ty == Q4K {
                            nib(&rec[160 + 128 * c..], r, k)
                        } else {
                            let at = 160 + 160 * c;
                            nib(&rec[at + 32..], r, k) | (bit4(&rec[at..], r, k) << 4)
                        };
                        f16(rec, 2 * r) * f32::from(sc) * f32::from(q)
                            - f16(rec, 16 + 2 * r) * f32::from(mn)
                    }
                    Q6K => {
                        let at = 144 + 192 * c;
                        let j = k / 4;
                        let h = (rec[at + 32 * (j / 4) + 4 * r + k % 4] >> (2 * (j % 4))) & 3;
                        let q = nib(&rec[at + 64..], r, k) | (h << 4);
                        let sc = rec[16 + 8 * (e / 16) + r] as i8;
                        f16(rec, 2 * r) * f32::from(sc) * (f32::from(q) - 32.0)
                    }
                    _ => 0.0,
                };
                out[row * p.cols + b * bs + e] = v;
            }
        }
    }
    out
}

#[cfg(test)]
fn f16_to_f32(h: u16) -> f32 {
    let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((h >> 10) & 0x1f);
    let m = f32::from(h & 0x3ff);
    s * match e {
        0 => m * 2f32.powi(-24),
        31 => f32::INFINITY,
        _ => (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}
