//! kiln-format: everything about model files and nothing about running them.
//!
//! GGUF (read via mmap, write), Hugging Face safetensors folders, the ggml
//! tensor types with their reference dequantization, the canonical tensor
//! names, and `ModelConfig`. Later stages never learn which format a tensor
//! came from.

pub mod dequant;
pub mod error;
pub mod ggml_type;
pub mod gguf;

pub use error::{ErrorKind, FormatError, Result};
pub use ggml_type::GgmlType;
