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
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets (or replaces) a metadata key. Setting `general.alignment` to a
    /// u32 power of two changes the alignment used for tensor data.
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
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
        let want = tensor_bytes(ty, ne).map_err(bad)?;
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
        let alignment = alignment_of(&self.metadata);
        let infos = self
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.ty, t.ne.as_slice(), t.data.len() as u64));
        w.write_all(&encode_header(&self.metadata, infos, alignment))?;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            w.write_all(&vec![0u8; padding(t.data.len() as u64, alignment)])?;
        }
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

/// Zero bytes that bring `len` up to a multiple of `alignment`.
pub(crate) fn padding(len: u64, alignment: u64) -> usize {
    (len.div_ceil(alignment) * alignment - len) as usize
}

/// `general.alignment` when it is a u32 power of two, else ggml's default
/// (what readers, ours included, will use).
pub(crate) fn alignment_of(metadata: &[(String, Value)]) -> u64 {
    match metadata.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
        _ => DEFAULT_ALIGNMENT,
    }
}

/// A tensor's byte size, or why its type and shape cannot be written.
pub(crate) fn tensor_bytes(ty: GgmlType, ne: &[u64]) -> std::result::Result<u64, String> {
    if ne.is_empty() || ne.len() > MAX_DIMS {
        return Err(format!("{} dimensions (1 to {MAX_DIMS} allowed)", ne.len()));
    }
    if !ne[0].is_multiple_of(ty.block_size() as u64) {
        return Err(format!(
            "row length {} is not a multiple of the {ty} block size",
            ne[0]
        ));
    }
    ty.bytes_for(ne.iter().product())
        .ok_or_else(|| "size overflows".to_string())
}

/// The header (magic, counts, metadata, tensor infos) padded to
/// `alignment`, for tensors `(name, type, ne, bytes)` whose data follows in
/// this order, each starting at an aligned offset.
pub(crate) fn encode_header<'a>(
    metadata: &[(String, Value)],
    tensors: impl ExactSizeIterator<Item = (&'a str, GgmlType, &'a [u64], u64)>,
    alignment: u64,
) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(GGUF_MAGIC);
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut h, k);
        h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut h, v);
    }
    let mut offset = 0u64;
    for (name, ty, ne, bytes) in tensors {
        put_str(&mut h, name);
        h.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            h.extend_from_slice(&d.to_le_bytes());
        }
        h.extend_from_slice(&ty.id().to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        offset += bytes + padding(bytes, alignment) as u64;
    }
    let pad = padding(h.len() as u64, alignment);
    h.resize(h.len() + pad, 0);
    h
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
