//! kiln-cuda: the CUDA backend.
//!
//! * [`gpu`]: driver checks (a missing driver or GPU is an error that
//!   suggests `--device cpu`, never a crash), the context and stream, the
//!   kernels (CUDA C in `kernels/`, compiled at run time by NVRTC for the
//!   device's own `sm_XX`, cached on disk by source hash, arch and NVRTC
//!   version), device buffers, launches and CUDA graphs.
//! * [`CudaBackend`]: [`kiln_core::Backend`] for every architecture the CPU
//!   backend runs, over weights uploaded once and kept as stored
//!   (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K–Q6_K/F16/BF16/F32 read directly by the
//!   GEMV kernels), paged f32 KV cache, decode steps replayed as CUDA graphs,
//!   greedy argmax on the GPU ([`CudaBackend::forward_greedy`]).
//! * [`testing`]: single kernels against the CPU reference (used by the
//!   device check example).
//!
//! Everything builds without CUDA installed (libraries are loaded at run
//! time).

mod backend;
pub mod gpu;
mod l2ahead;
mod mmq;
mod pinned;
pub mod testing;

pub use backend::{
    kernel_type_name, parse_bytes, CudaBackend, CudaOptions, GpuSampling, MemoryPlan,
};
pub use gpu::{driver_present, CudaError, DeviceInfo, Gpu};
