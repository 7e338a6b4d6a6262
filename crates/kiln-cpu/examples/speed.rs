//! Quick decode/prefill timing for development:
//! `cargo run --release -p kiln-cpu --example speed -- MODEL [threads] [prompt] [gen] [reps]`.
//! `KILN_CPU_KERNELS=reference` times the scalar reference path.

use std::sync::Arc;
use std::time::Instant;

use kiln_core::{ArchDescriptor, Engine, KvLayout};
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_format::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: speed MODEL [threads] [prompt] [gen] [reps]")?;
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (threads, np, ng, reps) = (num(2, 2), num(3, 128), num(4, 64), num(5, 3));
    let model = Arc::new(Model::open(std::path::Path::new(path))?);
    let desc = ArchDescriptor::from_model(&model)?;
    let vocab = desc.vocab_size;
    let layout = KvLayout::plan(&desc, np + ng + 8, 1, 16, np.max(1));
    let backend = CpuBackend::new(
        model,
        desc,
        layout.clone(),
        np.max(1),
        CpuOptions { threads },
    )?;
    let mut e = Engine::new(backend, layout);
    let prompt: Vec<u32> = (0..np as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect();
    for r in 0..reps {
        e.reset(0);
        let t = Instant::now();
        let mut tok = kiln_core::sampler::argmax(e.prefill(0, &prompt)?);
        let pp = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..ng {
            tok = kiln_core::sampler::argmax(e.decode(0, tok)?);
        }
        let tg = t.elapsed().as_secs_f64();
        println!(
            "rep {r}: pp{np} {:.1} tok/s, tg{ng} {:.1} tok/s",
            np as f64 / pp,
            ng as f64 / tg
        );
    }
    Ok(())
}
