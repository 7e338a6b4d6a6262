//! GGUF files: a memory-mapped reader (v2 and v3) and a writer.
//!
//! Shapes: GGUF stores `ne`, innermost dimension first (`ne[0]` is the row
//! length). [`TensorInfo::shape`] gives the row-major order the rest of kiln
//! uses (outermost first, as PyTorch and safetensors write it).

mod read;
mod value;
pub(crate) mod write;

use std::collections::HashMap;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

pub use read::DEFAULT_ALIGNMENT;
pub use value::{Array, Value, ValueType};
pub use write::GgufWriter;

use crate::error::{FormatError, Result};
use crate::ggml_type::GgmlType;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;

/// The bytes a [`Gguf`] was parsed from: a read-only map of the file, or an
/// owned buffer (tests, files produced in memory).
pub enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// One tensor's entry in the GGUF header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `ne[0]` is the innermost (row) length.
    pub ne: Vec<u64>,
    /// Offset from the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Row-major shape, outermost first.
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A parsed GGUF file. Metadata is decoded eagerly (it is small); tensor data
/// stays in the mapping and is handed out as slices.
pub struct Gguf {
    path: PathBuf,
    storage: Storage,
    pub version: u32,
    pub alignment: u64,
    /// Absolute file offset of the tensor data section.
    pub data_start: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: the map is read-only; as with every mmap-based loader, a
        // file truncated by another process while mapped can fault. kiln
        // does not write model files it has mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        read::parse(path.to_path_buf(), Storage::Mmap(map))
    }

    /// Parses a GGUF image held in memory; `path` only labels errors.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Vec<u8>) -> Result<Self> {
        read::parse(path.as_ref().to_path_buf(), Storage::Owned(bytes))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// `general.architecture`, required by every GGUF model file.
    pub fn architecture(&self) -> Result<&str> {
        match self.get("general.architecture") {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(FormatError::invalid(
                &self.path,
                format!(
                    "general.architecture is a {}, expected a string",
                    v.value_type().name()
                ),
            )),
            None => Err(FormatError::missing(
                &self.path,
                "metadata key general.architecture",
            )),
        }
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from the mapping (bounds were checked at
    /// parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.storage[start..start + t.n_bytes as usize]
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        &self.storage
    }

    pub fn file_size(&self) -> u64 {
        self.storage.len() as u64
    }
}
