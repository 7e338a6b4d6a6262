//! Shared helpers for the model tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_core::{ArchDescriptor, Engine, EngineOptions, KvLayout};
use kiln_cpu::{CpuBackend, CpuOptions, Kernels};
use kiln_format::Model;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures")
}

/// An engine with the default kernels ([`Kernels::from_env`]).
pub fn engine(path: &Path, opts: EngineOptions, threads: usize) -> Engine<CpuBackend> {
    engine_with(path, opts, threads, Kernels::from_env())
}

pub fn engine_with(
    path: &Path,
    opts: EngineOptions,
    threads: usize,
    kernels: Kernels,
) -> Engine<CpuBackend> {
    let model = Arc::new(Model::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    let desc = ArchDescriptor::from_model(&model).unwrap();
    let layout = KvLayout::plan(
        &desc,
        opts.ctx,
        opts.max_seqs,
        opts.block_size,
        opts.max_chunk,
    );
    let backend = CpuBackend::new(
        model,
        desc,
        layout.clone(),
        opts.max_chunk,
        CpuOptions { threads },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut backend = backend;
    backend.set_kernels(kernels);
    Engine::new(backend, layout)
}

pub struct Arrays(Vec<u8>);

impl Arrays {
    pub fn open(path: &Path) -> Self {
        Arrays(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }
    fn view(&self, name: &str) -> (safetensors::Dtype, Vec<usize>, Vec<u8>) {
        let st = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (t.dtype(), t.shape().to_vec(), t.data().to_vec())
    }
    pub fn has(&self, name: &str) -> bool {
        safetensors::SafeTensors::deserialize(&self.0)
            .unwrap()
            .tensor(name)
            .is_ok()
    }
    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (dt, shape, data) = self.view(name);
        assert_eq!(dt, safetensors::Dtype::F32, "{name}");
        (
            shape,
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
    pub fn ids(&self, name: &str) -> Vec<u32> {
        let (dt, _, data) = self.view(name);
        assert_eq!(dt, safetensors::Dtype::I64, "{name}");
        data.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    }
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn argmax(x: &[f32]) -> u32 {
    kiln_core::sampler::argmax(x)
}
