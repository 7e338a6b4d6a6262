//! A GGUF writer that streams tensor data: the header (metadata and every
//! tensor's name, type and shape) is written first, then each tensor's bytes
//! in order as they are produced, so a converter holds one tensor at a time
//! instead of the whole file. The layout is the same as
//! [`crate::gguf::GgufWriter`]'s (GGUF v3, data aligned to
//! `general.alignment`, default 32).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};
use crate::ggml_type::GgmlType;
use crate::gguf::write::{alignment_of, encode_header, padding, tensor_bytes};
use crate::gguf::Value;

/// One tensor of the plan: name, type, `ne` (ggml order, row length first).
#[derive(Debug, Clone)]
pub struct PlannedTensor {
    pub name: String,
    pub ty: GgmlType,
    pub ne: Vec<u64>,
}

impl PlannedTensor {
    pub fn n_bytes(&self) -> u64 {
        self.ty
            .bytes_for(self.ne.iter().product())
            .unwrap_or(u64::MAX)
    }
}

pub struct GgufStreamWriter {
    path: PathBuf,
    out: BufWriter<File>,
    plan: Vec<PlannedTensor>,
    alignment: u64,
    next: usize,
    /// Bytes written into the data section so far.
    pos: u64,
}

impl GgufStreamWriter {
    /// Creates the file and writes the header. Tensors must then be given
    /// with [`write_tensor`](Self::write_tensor) in plan order.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &[(String, Value)],
        plan: Vec<PlannedTensor>,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let alignment = alignment_of(metadata);
        for t in &plan {
            tensor_bytes(t.ty, &t.ne)
                .map_err(|m| FormatError::invalid(&path, format!("tensor '{}': {m}", t.name)))?;
        }
        let infos = plan
            .iter()
            .map(|t| (t.name.as_str(), t.ty, t.ne.as_slice(), t.n_bytes()));
        let h = encode_header(metadata, infos, alignment);
        let f = File::create(&path).map_err(|e| FormatError::io(&path, e))?;
        let mut out = BufWriter::with_capacity(8 << 20, f);
        out.write_all(&h).map_err(|e| FormatError::io(&path, e))?;
        Ok(Self {
            path,
            out,
            plan,
            alignment,
            next: 0,
            pos: 0,
        })
    }

    /// The tensor whose data comes next, if any.
    pub fn next_tensor(&self) -> Option<&PlannedTensor> {
        self.plan.get(self.next)
    }

    /// Writes the next tensor's data (exactly its planned size).
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<()> {
        let t = self
            .plan
            .get(self.next)
            .ok_or_else(|| FormatError::invalid(&self.path, "more tensors written than planned"))?;
        if data.len() as u64 != t.n_bytes() {
            return Err(FormatError::invalid(
                &self.path,
                format!(
                    "tensor '{}': {} bytes given, {} planned",
                    t.name,
                    data.len(),
                    t.n_bytes()
                ),
            ));
        }
        let io = |e| FormatError::io(&self.path, e);
        self.out.write_all(data).map_err(io)?;
        self.pos += data.len() as u64;
        let pad = padding(self.pos, self.alignment);
        self.out
            .write_all(&vec![0u8; pad])
            .map_err(|e| FormatError::io(&self.path, e))?;
        self.pos += pad as u64;
        self.next += 1;
        Ok(())
    }

    /// Flushes the file; every planned tensor must have been written.
    pub fn finish(mut self) -> Result<()> {
        if self.next != self.plan.len() {
            return Err(FormatError::invalid(
                &self.path,
                format!(
                    "{} of {} planned tensors written",
                    self.next,
                    self.plan.len()
                ),
            ));
        }
        self.out.flush().map_err(|e| FormatError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, GgufWriter};

    /// The streamed file is byte-identical to `GgufWriter`'s.
    #[test]
    fn same_bytes_as_gguf_writer() {
        let meta = vec![
            (
                "general.architecture".to_string(),
                Value::String("llama".into()),
            ),
            ("a.u32".to_string(), Value::U32(7)),
            ("a.f32".to_string(), Value::F32(0.5)),
            ("a.b".to_string(), Value::Bool(true)),
            (
                "a.strs".to_string(),
                Value::Array(Array::String(vec!["x".into(), "yz".into()])),
            ),
            ("a.i32s".to_string(), Value::Array(Array::I32(vec![-1, 2]))),
            (
                "a.nested".to_string(),
                Value::Array(Array::Array(vec![Array::U8(vec![1, 2, 3])])),
            ),
        ];
        let tensors = [
            ("t0", GgmlType::F32, vec![3u64], vec![1u8; 12]),
            ("t1", GgmlType::Q8_0, vec![32u64, 2], vec![2u8; 68]),
            ("t2", GgmlType::F16, vec![5u64], vec![3u8; 10]),
        ];
        let mut w = GgufWriter::new();
        for (k, v) in &meta {
            w.set(k.clone(), v.clone());
        }
        for (n, ty, ne, d) in &tensors {
            w.add_tensor(*n, *ty, ne, d.clone()).unwrap();
        }
        let dir = std::env::temp_dir().join(format!("kiln-gguf-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.gguf");
        let plan = tensors
            .iter()
            .map(|(n, ty, ne, _)| PlannedTensor {
                name: n.to_string(),
                ty: *ty,
                ne: ne.clone(),
            })
            .collect();
        let mut s = GgufStreamWriter::create(&p, &meta, plan).unwrap();
        for (_, _, _, d) in &tensors {
            s.write_tensor(d).unwrap();
        }
        assert!(s.write_tensor(&[0]).is_err());
        s.finish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), w.to_bytes());
        std::fs::remove_dir_all(&dir).ok();
    }
}
