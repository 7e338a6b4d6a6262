//! One error type for everything that reads model files. Every error names the
//! file (or folder) it came from and what was wrong, so a user can act on it.

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct FormatError {
    pub path: PathBuf,
    pub kind: ErrorKind,
}

#[derive(Debug)]
pub enum ErrorKind {
    Io(std::io::Error),
    /// The bytes do not follow the format; the string says where and how.
    Malformed(String),
    /// The file is valid but uses something kiln does not handle.
    Unsupported(String),
    /// A required field or tensor is absent.
    Missing(String),
    /// A field holds a value that is out of range or inconsistent.
    Invalid(String),
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

impl FormatError {
    pub fn new(path: impl AsRef<Path>, kind: ErrorKind) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            kind,
        }
    }
    pub fn io(path: impl AsRef<Path>, e: std::io::Error) -> Self {
        Self::new(path, ErrorKind::Io(e))
    }
    pub fn malformed(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Malformed(msg.into()))
    }
    pub fn unsupported(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Unsupported(msg.into()))
    }
    pub fn missing(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Missing(msg.into()))
    }
    pub fn invalid(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Invalid(msg.into()))
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match &self.kind {
            ErrorKind::Io(e) => write!(f, "{p}: {e}"),
            ErrorKind::Malformed(m) => write!(f, "{p}: malformed: {m}"),
            ErrorKind::Unsupported(m) => write!(f, "{p}: unsupported: {m}"),
            ErrorKind::Missing(m) => write!(f, "{p}: missing {m}"),
            ErrorKind::Invalid(m) => write!(f, "{p}: invalid {m}"),
        }
    }
}

impl std::error::Error for FormatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}
