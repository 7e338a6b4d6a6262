//! GGUF v2/v3 reader over a byte slice (normally an mmap).
//!
//! Every count and length read from the file is checked against the bytes
//! that remain before anything is allocated, so a hostile header costs at most
//! as much memory as the file is long. Tensor data is never copied: callers
//! get slices into the mapping.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::value::{Array, Value, ValueType};
use super::{Gguf, Storage, TensorInfo, GGUF_MAGIC, MAX_DIMS};
use crate::error::{FormatError, Result};
use crate::ggml_type::GgmlType;

/// ggml's default when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Nested arrays deeper than this are rejected (recursion guard; real files
/// use at most one level).
const MAX_ARRAY_DEPTH: u32 = 8;

struct Cursor<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
    /// What is being read, for error messages ("tensor info 3", "metadata key 'x'").
    ctx: String,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn err(&self, msg: impl std::fmt::Display) -> FormatError {
        let ctx = if self.ctx.is_empty() {
            String::new()
        } else {
            format!("{}: ", self.ctx)
        };
        FormatError::malformed(self.path, format!("{ctx}{msg} (at byte {})", self.pos))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "needs {n} bytes but the file has only {} left (truncated?)",
                self.remaining()
            )));
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format!("bool byte is {b}, not 0 or 1"))),
        }
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(format!("string of {len} bytes is not valid UTF-8 ({e})"))),
        }
    }

    /// A count of items each at least `min_size` bytes long: rejected unless
    /// they could all fit in the rest of the file.
    fn count(&mut self, what: &str, min_size: u64) -> Result<usize> {
        let n = self.u64()?;
        let fits = n
            .checked_mul(min_size)
            .is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(self.err(format!(
                "{what} count {n} cannot fit in the {} bytes left in the file",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let id = self.u32()?;
        ValueType::from_id(id).ok_or_else(|| self.err(format!("unknown metadata value type {id}")))
    }

    fn value(&mut self, ty: ValueType, depth: u32) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8()?),
            ValueType::I8 => Value::I8(self.u8()? as i8),
            ValueType::U16 => Value::U16(self.u16()?),
            ValueType::I16 => Value::I16(self.u16()? as i16),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(self.u32()? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32()?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string()?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(self.u64()? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64()?)),
            ValueType::Array => Value::Array(self.array_value(depth)?),
        })
    }

    fn array_value(&mut self, depth: u32) -> Result<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
        }
        let ty = self.value_type()?;
        let n = self.count("array element", ty.min_encoded_size())?;
        macro_rules! read_vec {
            ($variant:ident, $read:expr) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push($read(&mut *self)?);
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n as u64)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(n as u64)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => read_vec!(U16, Self::u16),
            ValueType::I16 => read_vec!(I16, |c: &mut Self| c.u16().map(|v| v as i16)),
            ValueType::U32 => read_vec!(U32, Self::u32),
            ValueType::I32 => read_vec!(I32, |c: &mut Self| c.u32().map(|v| v as i32)),
            ValueType::F32 => read_vec!(F32, |c: &mut Self| c.u32().map(f32::from_bits)),
            ValueType::Bool => read_vec!(Bool, Self::bool),
            ValueType::String => read_vec!(String, Self::string),
            ValueType::U64 => read_vec!(U64, Self::u64),
            ValueType::I64 => read_vec!(I64, |c: &mut Self| c.u64().map(|v| v as i64)),
            ValueType::F64 => read_vec!(F64, |c: &mut Self| c.u64().map(f64::from_bits)),
            ValueType::Array => read_vec!(Array, |c: &mut Self| c.array_value(depth + 1)),
        })
    }
}

/// Parses a whole GGUF file held in `storage`; `path` is only for messages.
pub(super) fn parse(path: PathBuf, storage: Storage) -> Result<Gguf> {
    let buf: &[u8] = &storage;
    let mut c = Cursor {
        path: &path,
        buf,
        pos: 0,
        ctx: "header".into(),
    };
    let magic = c.array::<4>()?;
    if &magic != GGUF_MAGIC {
        return Err(FormatError::malformed(
            &path,
            format!("not a GGUF file: magic bytes are {magic:02x?}, expected \"GGUF\""),
        ));
    }
    let version = c.u32()?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(FormatError::unsupported(
                &path,
                "GGUF version 1 (32-bit counts); re-convert the model with a current llama.cpp",
            ))
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(FormatError::unsupported(
                &path,
                "big-endian GGUF; kiln reads little-endian files only",
            ))
        }
        v => {
            return Err(FormatError::unsupported(
                &path,
                format!("GGUF version {v} (kiln reads versions 2 and 3)"),
            ))
        }
    }
    // Smallest tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
    let n_tensors = c.count("tensor", 24)?;
    // Smallest key/value: key length (8) + value type (4) + one byte.
    let n_kv = c.count("metadata key/value", 13)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut meta_index: HashMap<String, usize> = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        c.ctx = format!("metadata entry {i}");
        let key = c.string()?;
        c.ctx = format!("metadata key '{key}'");
        let ty = c.value_type()?;
        let value = c.value(ty, 0)?;
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(c.err("key appears twice"));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .map(|(_, v)| v)
    {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some(v) => {
            return Err(FormatError::invalid(
                &path,
                format!("general.alignment = {v}: must be a u32 power of two"),
            ))
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        c.ctx = format!("tensor info {i}");
        let name = c.string()?;
        c.ctx = format!("tensor '{name}'");
        let n_dims = c.u32()?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(c.err(format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64()?);
        }
        let type_id = c.u32()?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| c.err(format!("unknown ggml tensor type id {type_id}")))?;
        let offset = c.u64()?;
        let n_elements = ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0 && n < (1u64 << 62))
            .ok_or_else(|| c.err(format!("dimensions {ne:?} are zero or overflow")))?;
        if ne[0] % ty.block_size() as u64 != 0 {
            return Err(c.err(format!(
                "row length {} is not a multiple of the {ty} block size {}",
                ne[0],
                ty.block_size()
            )));
        }
        let n_bytes = ty
            .bytes_for(n_elements)
            .ok_or_else(|| c.err("byte size overflows"))?;
        if offset % alignment != 0 {
            return Err(c.err(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if tensor_index.insert(name.clone(), tensors.len()).is_some() {
            return Err(c.err("tensor name appears twice"));
        }
        tensors.push(TensorInfo {
            name,
            ty,
            ne,
            offset,
            n_bytes,
        });
    }

    let header_end = c.pos as u64;
    let data_start = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    if data_start > file_len && !tensors.is_empty() {
        return Err(FormatError::malformed(
            &path,
            format!("tensor data should start at byte {data_start} but the file is {file_len} bytes (truncated?)"),
        ));
    }
    let data_len = file_len.saturating_sub(data_start);

    // Bounds and overlap: sort by offset, then each must end before the next starts.
    let mut by_offset: Vec<usize> = (0..tensors.len()).collect();
    by_offset.sort_by_key(|&i| tensors[i].offset);
    let mut prev_end = 0u64;
    let mut prev_name: Option<&str> = None;
    for &i in &by_offset {
        let t = &tensors[i];
        let end = t.offset.saturating_add(t.n_bytes);
        if end > data_len {
            return Err(FormatError::malformed(
                &path,
                format!(
                    "tensor '{}' ({} bytes at data offset {}) ends past the end of the file ({} data bytes; truncated?)",
                    t.name, t.n_bytes, t.offset, data_len
                ),
            ));
        }
        if let Some(prev) = prev_name {
            if t.offset < prev_end {
                return Err(FormatError::malformed(
                    &path,
                    format!("tensor '{}' overlaps tensor '{prev}'", t.name),
                ));
            }
        }
        prev_end = end;
        prev_name = Some(&t.name);
    }

    Ok(Gguf {
        path,
        storage,
        version,
        alignment,
        data_start,
        metadata,
        meta_index,
        tensors,
        tensor_index,
    })
}
