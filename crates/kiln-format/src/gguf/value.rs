//! GGUF metadata values: the twelve scalar/string/array types and typed arrays.
//!
//! Arrays are stored typed (`Vec<u32>`, `Vec<String>` …) rather than as a
//! `Vec` of boxed values: a 262k-entry vocabulary or score table stays one
//! compact allocation, and the tokenizer reads it without matching per item.

use std::fmt;

/// On-disk ids of GGUF metadata value types (`gguf_type` in gguf.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Smallest number of bytes one value of this type occupies on disk; used
    /// to reject counts that could not possibly fit in the rest of the file
    /// before anything is allocated.
    pub(crate) fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed metadata array; `Array` holds nested arrays (each typed itself).
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type widened to i128, so callers need not care whether a
    /// converter wrote u32 or u64 for a count.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Floats, and integers converted to f64 (some converters write a float
    /// field such as `rope.freq_base` as an integer).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// Integer arrays of any width as i64 (token types are i32 in practice,
    /// but nothing in the format requires that).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }

    /// Float arrays (and integer arrays) as f32, e.g. token scores.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => self
                .to_i64_vec()
                .map(|v| v.into_iter().map(|x| x as f32).collect()),
        }
    }
}

/// Short human-readable rendering; long arrays are elided (`kiln inspect`).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => {
                if s.chars().count() > 60 {
                    let head: String = s.chars().take(57).collect();
                    write!(f, "{:?}… ({} chars)", head, s.chars().count())
                } else {
                    write!(f, "{s:?}")
                }
            }
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Debug>(f: &mut fmt::Formatter<'_>, ty: &str, v: &[T]) -> fmt::Result {
            const SHOWN: usize = 4;
            write!(f, "[{ty}; {}] [", v.len())?;
            for (i, x) in v.iter().take(SHOWN).enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{x:?}")?;
            }
            if v.len() > SHOWN {
                write!(f, ", …")?;
            }
            write!(f, "]")
        }
        let ty = self.element_type().name();
        match self {
            Array::U8(v) => list(f, ty, v),
            Array::I8(v) => list(f, ty, v),
            Array::U16(v) => list(f, ty, v),
            Array::I16(v) => list(f, ty, v),
            Array::U32(v) => list(f, ty, v),
            Array::I32(v) => list(f, ty, v),
            Array::F32(v) => list(f, ty, v),
            Array::Bool(v) => list(f, ty, v),
            Array::String(v) => list(f, ty, v),
            Array::Array(v) => write!(f, "[array; {}]", v.len()),
            Array::U64(v) => list(f, ty, v),
            Array::I64(v) => list(f, ty, v),
            Array::F64(v) => list(f, ty, v),
        }
    }
}
