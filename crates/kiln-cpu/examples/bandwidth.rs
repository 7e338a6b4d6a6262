//! Read bandwidth with N threads (the decode floor's denominator):
//! `cargo run --release -p kiln-cpu --example bandwidth -- [threads] [MiB] [reps]`.
//! Each thread sums its half of a buffer far larger than the caches; prints
//! the best and median GB/s over the repetitions.

use std::time::Instant;

#[inline(never)]
fn sum(chunk: &[u64]) -> u64 {
    // Eight independent lanes so the loop is bound by loads, not adds.
    let mut acc = [0u64; 8];
    for (i, c) in chunk.chunks_exact(8).enumerate() {
        // Prefetch 4 KiB ahead, as the kernels do (the VM's hardware
        // prefetch alone reaches much less).
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetch never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                chunk.as_ptr().wrapping_add(i * 8 + 512) as *const i8,
            )
        };
        for j in 0..8 {
            acc[j] = acc[j].wrapping_add(c[j]);
        }
    }
    acc.iter().fold(0, |a, &b| a.wrapping_add(b))
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = args.first().copied().unwrap_or(2).max(1);
    let mib = args.get(1).copied().unwrap_or(1024);
    let reps = args.get(2).copied().unwrap_or(10).max(1);
    let n = mib * (1 << 20) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    let per = n.div_ceil(threads);
    let mut rates = Vec::new();
    let mut check = 0u64;
    for _ in 0..reps {
        let t = Instant::now();
        let s: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = buf.chunks(per).map(|c| sc.spawn(move || sum(c))).collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        check = check.wrapping_add(s);
        rates.push((n * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(|a, b| b.total_cmp(a));
    println!(
        "threads {threads}, {mib} MiB: best {:.1} GB/s, median {:.1} GB/s (check {})",
        rates[0],
        rates[rates.len() / 2],
        check % 10
    );
}
