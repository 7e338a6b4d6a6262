//! kiln-format: everything about model files and nothing about running them.
//!
//! GGUF (read via mmap, write), Hugging Face safetensors folders, the ggml
//! tensor types with their reference dequantization, the canonical tensor
//! names, and `ModelConfig`. Later stages never learn which format a tensor
//! came from.

pub mod config;
pub mod dequant;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod model;
pub mod names;
pub mod quantize;
mod shapes;

pub use config::{Activation, Arch, ModelConfig, NormKind, RopeConfig, RopeScaling, RopeStyle};
pub use error::{ErrorKind, FormatError, Result};
pub use ggml_type::GgmlType;
pub use model::{Format, Model, ModelTensor, TensorType};
