//! Weights as stored: matrices stay in the mapped file and are decoded a row
//! at a time; vectors (norms, biases) are small and decoded once at load.

use std::sync::Arc;

use kiln_core::{EngineError, Result};
use kiln_format::dequant::{dequantize_row, dequantize_to_vec, is_supported};
use kiln_format::{GgmlType, Model, ModelTensor, TensorType};

use crate::packed::{self, PackedMat};

/// A `[rows, cols]` matrix (`y = W x` takes `cols` inputs to `rows` outputs).
pub(crate) enum Mat {
    /// Rows `row0..row0 + rows` of a mapped tensor.
    Mapped {
        tensor: ModelTensor,
        ty: GgmlType,
        row0: usize,
        rows: usize,
        cols: usize,
        /// The rows repacked for the GEMM kernels ([`Mat::pack`]).
        packed: Option<Box<PackedMat>>,
    },
    /// Decoded at load: only for layouts the row kernels cannot read as
    /// stored (HF GPT-2 `Conv1D` weights are `[in, out]`).
    Owned {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
}

fn ggml_type(m: &Model, t: &ModelTensor) -> Result<GgmlType> {
    match t.ty {
        TensorType::Ggml(ty) if is_supported(ty) => Ok(ty),
        other => Err(EngineError::Unsupported(format!(
            "tensor '{}' of type {other} in {} (the CPU backend reads ggml types)",
            t.name,
            m.path.display()
        ))),
    }
}

fn decode_all(m: &Model, t: &ModelTensor) -> Result<Vec<f32>> {
    let ty = ggml_type(m, t)?;
    dequantize_to_vec(ty, m.data(t))
        .map_err(|e| EngineError::Unsupported(format!("tensor '{}': {e}", t.name)))
}

impl Mat {
    /// The whole tensor `name`, as `[out, in]`.
    pub fn load(m: &Model, name: &str) -> Result<Mat> {
        let t = m.require(name)?;
        let shape = t.logical_shape();
        let (rows, cols) = match shape.as_slice() {
            [r, c] => (*r as usize, *c as usize),
            other => {
                return Err(EngineError::Unsupported(format!(
                    "tensor '{name}' has shape {other:?}, a matrix was expected"
                )))
            }
        };
        Self::from_tensor(m, t, rows, cols)
    }

    fn from_tensor(m: &Model, t: &ModelTensor, rows: usize, cols: usize) -> Result<Mat> {
        let ty = ggml_type(m, t)?;
        if t.transposed {
            let data = t.to_logical(decode_all(m, t)?);
            return Ok(Mat::Owned { data, rows, cols });
        }
        #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
        if cols % ty.block_size() != 0 {
            return Err(EngineError::Unsupported(format!(
                "tensor '{}': rows of {cols} values are not whole {ty} blocks",
                t.name
            )));
        }
        Ok(Mat::Mapped {
            tensor: t.clone(),
            ty,
            row0: 0,
            rows,
            cols,
            packed: None,
        })
    }

    /// Splits a fused projection into consecutive row ranges.
    pub fn split(self, sizes: &[usize]) -> Result<Vec<Mat>> {
        let total: usize = sizes.iter().sum();
        if total != self.rows() {
            return Err(EngineError::Unsupported(format!(
                "fused projection has {} rows, expected {total}",
                self.rows()
            )));
        }
        let mut out = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for &n in sizes {
            out.push(match &self {
                Mat::Mapped {
                    tensor,
                    ty,
                    row0,
                    cols,
                    ..
                } => Mat::Mapped {
                    tensor: tensor.clone(),
                    ty: *ty,
                    row0: row0 + start,
                    rows: n,
                    cols: *cols,
                    packed: None,
                },
                Mat::Owned { data, cols, .. } => Mat::Owned {
                    data: data[start * cols..(start + n) * cols].to_vec(),
                    rows: n,
                    cols: *cols,
                },
            });
            start += n;
        }
        Ok(out)
    }

    /// Arena bytes the packed copy of this matrix needs, if its type has a
    /// packed layout.
    pub fn packed_len(&self, m: &Model) -> Option<usize> {
        let (ty, bytes, rb) = self.raw(m)?;
        packed::packed_len(ty, bytes, rb, self.rows(), self.cols())
    }

    /// Repacks the rows for the GEMM kernels into `arena` at `off`
    /// ([`Mat::packed_len`] bytes), on `threads` threads, where the type has
    /// a packed layout (the mapped rows stay for the reference path and row
    /// lookups).
    ///
    /// # Safety
    /// As [`packed::pack_into`]: no other use of that range of the arena
    /// during the call.
    pub unsafe fn pack_into(
        &mut self,
        m: &Model,
        threads: usize,
        arena: &Arc<packed::Arena>,
        off: usize,
    ) {
        let p = self.raw(m).and_then(|(ty, bytes, rb)| {
            // SAFETY: the caller's contract.
            unsafe {
                packed::pack_into(ty, bytes, rb, self.rows(), self.cols(), threads, arena, off)
            }
        });
        if let Mat::Mapped { packed, .. } = self {
            *packed = p.map(Box::new);
        }
    }

    pub fn packed(&self) -> Option<&PackedMat> {
        match self {
            Mat::Mapped { packed, .. } => packed.as_deref(),
            Mat::Owned { .. } => None,
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            Mat::Mapped { rows, .. } | Mat::Owned { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Mat::Mapped { cols, .. } | Mat::Owned { cols, .. } => *cols,
        }
    }

    /// The matrix's rows as stored: `(type, bytes of rows 0..rows, bytes per
    /// row)`; decoded-at-load matrices are F32. `None` if the mapped tensor
    /// is shorter than its shape says (the reference path then reads zeros).
    pub fn raw<'a>(&'a self, m: &'a Model) -> Option<(GgmlType, &'a [u8], usize)> {
        match self {
            Mat::Owned { data, rows, cols } => {
                let bytes = data.get(..rows * cols)?;
                // SAFETY: f32 has no padding; u8 has alignment 1.
                let b = unsafe {
                    std::slice::from_raw_parts(bytes.as_ptr() as *const u8, bytes.len() * 4)
                };
                Some((GgmlType::F32, b, cols * 4))
            }
            Mat::Mapped {
                tensor,
                ty,
                row0,
                rows,
                cols,
                ..
            } => {
                let row_bytes = cols / ty.block_size() * ty.type_size();
                let start = row0.checked_mul(row_bytes)?;
                let end = start.checked_add(rows.checked_mul(row_bytes)?)?;
                Some((*ty, m.data(tensor).get(start..end)?, row_bytes))
            }
        }
    }

    /// Row `r` as f32: borrowed when stored as aligned little-endian f32,
    /// else decoded into `scratch` (`cols` long).
    #[inline]
    pub fn row<'a>(&'a self, m: &'a Model, r: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        match self {
            Mat::Owned { data, cols, .. } => &data[r * cols..(r + 1) * cols],
            Mat::Mapped {
                tensor,
                ty,
                row0,
                cols,
                ..
            } => {
                let data = m.data(tensor);
                let row = row0 + r;
                if *ty == GgmlType::F32 && cfg!(target_endian = "little") {
                    if let Some(bytes) = data.get(row * cols * 4..(row + 1) * cols * 4) {
                        // SAFETY: any bit pattern is a valid f32.
                        let (pre, mid, post) = unsafe { bytes.align_to::<f32>() };
                        if pre.is_empty() && post.is_empty() {
                            return mid;
                        }
                    }
                }
                let out = &mut scratch[..*cols];
                if dequantize_row(*ty, data, *cols, row, out).is_err() {
                    out.fill(0.0);
                }
                out
            }
        }
    }
}

/// A 1-D tensor decoded to f32, plus `offset` (norm weights).
pub(crate) fn vector(m: &Model, name: &str, len: usize, offset: f32) -> Result<Vec<f32>> {
    let t = m.require(name)?;
    let mut v = decode_all(m, t)?;
    if v.len() != len {
        return Err(EngineError::Unsupported(format!(
            "tensor '{name}' has {} values, expected {len}",
            v.len()
        )));
    }
    if offset != 0.0 {
        v.iter_mut().for_each(|x| *x += offset);
    }
    Ok(v)
}

pub(crate) fn opt_vector(
    m: &Model,
    name: &str,
    len: usize,
    offset: f32,
) -> Result<Option<Vec<f32>>> {
    if m.tensor(name).is_none() {
        return Ok(None);
    }
    vector(m, name, len, offset).map(Some)
}
