//! GGUF writer: metadata, tensor infos and aligned tensor data, in the layout
//! llama.cpp's gguf-py and `gguf_init_from_file` read.

use std::io::{self, Write};
use std::path::Path;

use super::value::{Array, Value};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::error::{FormatError, Result};
use crate::ggml_type::GgmlType;

struct PendingTensor {
    name: String,
    ty: GgmlType,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory order: add metadata and tensors, then
/// write. Tensor data is placed in the order added, each at an aligned offset.
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets (or replaces) a metadata key. Setting `general.alignment` to a
    /// u32 power of two changes the alignment used for tensor data.
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if key == "general.alignment" {
            if let Value::U32(a) = value {
                if a > 0 && a.is_power_of_two() {
                    self.alignment = a as u64;
                }
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Adds a tensor. `ne` is in ggml order (row length first); `data` must
    /// be exactly the bytes the type and shape call for.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        ne: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let bad =
            |msg: String| FormatError::invalid("<gguf writer>", format!("tensor '{name}': {msg}"));
        if ne.is_empty() || ne.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions (1 to {MAX_DIMS} allowed)",
                ne.len()
            )));
        }
        if !ne[0].is_multiple_of(ty.block_size() as u64) {
            return Err(bad(format!(
                "row length {} is not a multiple of the {ty} block size",
                ne[0]
            )));
        }
        let n: u64 = ne.iter().product();
        let want = ty
            .bytes_for(n)
            .ok_or_else(|| bad("size overflows".into()))?;
        if want != data.len() as u64 {
            return Err(bad(format!(
                "{} data bytes given, {ty} {ne:?} needs {want}",
                data.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("name added twice".into()));
        }
        self.tensors.push(PendingTensor {
            name,
            ty,
            ne: ne.to_vec(),
            data,
        });
        Ok(self)
    }

    /// Writes the whole file.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut header = Vec::new();
        header.extend_from_slice(GGUF_MAGIC);
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut header, k);
            header.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut header, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut header, &t.name);
            header.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.ty.id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        pad(&mut header, self.alignment);
        w.write_all(&header)?;
        let mut written = 0u64;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            w.write_all(&vec![0u8; (off - written) as usize])?;
            w.write_all(&t.data)?;
            written = off + t.data.len() as u64;
        }
        let end = written.div_ceil(self.alignment) * self.alignment;
        w.write_all(&vec![0u8; (end - written) as usize])?;
        Ok(())
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write_to(&mut v);
        v
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mut f =
            io::BufWriter::new(std::fs::File::create(path).map_err(|e| FormatError::io(path, e))?);
        self.write_to(&mut f)
            .map_err(|e| FormatError::io(path, e))?;
        f.flush().map_err(|e| FormatError::io(path, e))
    }
}

fn pad(buf: &mut Vec<u8>, alignment: u64) {
    let len = buf.len() as u64;
    let target = len.div_ceil(alignment) * alignment;
    buf.resize(target as usize, 0);
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.push(*x as u8),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => put_str(buf, s),
        Value::Array(a) => put_array(buf, a),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(buf: &mut Vec<u8>, a: &Array) {
    buf.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $f:expr) => {
            for x in $v {
                #[allow(clippy::redundant_closure_call)]
                $f(buf, x);
            }
        };
    }
    match a {
        Array::U8(v) => buf.extend_from_slice(v),
        Array::I8(v) => buf.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => each!(v, |b: &mut Vec<u8>, x: &u16| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each!(v, |b: &mut Vec<u8>, x: &i16| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each!(v, |b: &mut Vec<u8>, x: &u32| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each!(v, |b: &mut Vec<u8>, x: &i32| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each!(v, |b: &mut Vec<u8>, x: &f32| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => buf.extend(v.iter().map(|&x| x as u8)),
        Array::String(v) => each!(v, |b: &mut Vec<u8>, s: &String| put_str(b, s)),
        Array::Array(v) => each!(v, put_array),
        Array::U64(v) => each!(v, |b: &mut Vec<u8>, x: &u64| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each!(v, |b: &mut Vec<u8>, x: &i64| b
            .extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each!(v, |b: &mut Vec<u8>, x: &f64| b
            .extend_from_slice(&x.to_le_bytes())),
    }
}
