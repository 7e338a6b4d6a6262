//! Quantizer throughput (a benchmark, not a test):
//! `cargo run --release -p kiln-format --example quantize_speed`.
//! `KILN_QUANT_THREADS` sets the threads (default: all cores).

use std::time::Instant;

use kiln_format::quantize::quantize_par;
use kiln_format::GgmlType;

fn main() {
    let threads = std::env::var("KILN_QUANT_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let n = 1 << 24;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let x: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
        })
        .collect();
    for name in ["Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"] {
        let Some(ty) = GgmlType::from_name(name) else {
            eprintln!("unknown type {name}");
            continue;
        };
        let t = Instant::now();
        let q = match quantize_par(ty, &x, threads) {
            Ok(q) => q,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{name:5} {threads} threads: {:7.1} M values/s ({} bytes, {dt:.2} s)",
            n as f64 / dt / 1e6,
            q.len()
        );
    }
}
