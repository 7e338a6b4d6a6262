//! kiln-core: the model layer of kiln, independent of any backend.
//!
//! * [`arch::ArchDescriptor`]: everything that differs between architectures,
//!   as plain data resolved at load. Backends run one decoder driven by it.
//! * [`rope::RopeTable`]: cos/sin tables precomputed at load (interleaved or
//!   NeoX pairs; linear, Llama-3, per-frequency factors, YaRN).
//! * [`kv::KvTables`]: the paged KV cache's block allocator: per sequence
//!   block tables per layer group, sliding-window groups release blocks.
//!   Backends own the storage the block ids index.
//! * [`backend::Backend`]: one forward step over a [`backend::Batch`] of
//!   tokens from several sequences.
//! * [`sampler::Sampler`]: the CPU sampler chain.
//! * [`engine::Engine`]: sequences, chunked prefill, decode, generation with
//!   stop tokens, stop strings ([`stop::StopStrings`]) and limits. (The
//!   engine layer lives here for now; it moves to `kiln-engine` when the
//!   scheduler for concurrent requests arrives.)

pub mod arch;
pub mod backend;
pub mod engine;
pub mod error;
pub mod kv;
pub mod rope;
pub mod sampler;
pub mod stop;

pub use arch::{ArchDescriptor, LayerDesc};
pub use backend::{Backend, Batch};
pub use engine::{Engine, EngineOptions, FinishReason, Generation, Timings};
pub use error::{EngineError, Result};
pub use kv::{KvLayout, KvTables, KvType, KvTypes};
pub use sampler::{DeviceSampling, Sampler, SamplerParams};
pub use stop::StopStrings;
