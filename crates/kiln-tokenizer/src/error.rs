//! The crate's error type. Every error names where the problem is (a file, a
//! folder, a metadata key or a template) and what is wrong with it.

use std::fmt;

/// Everything that can go wrong while loading a tokenizer, encoding, decoding or
/// rendering a chat template.
#[derive(Debug)]
pub enum Error {
    /// The model file itself could not be read (I/O, bad GGUF structure).
    Format(kiln_format::FormatError),
    /// A file could not be read.
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The tokenizer description is missing something or is inconsistent.
    /// `origin` names the file (and key) the problem was found in.
    Invalid { origin: String, message: String },
    /// The file uses a tokenizer kind kiln does not implement.
    Unsupported { origin: String, message: String },
    /// Encoding or decoding failed inside the tokenizer pipeline.
    Tokenize { origin: String, message: String },
    /// A chat template failed to compile or to render.
    Template { origin: String, message: String },
    /// The messages given to a chat template are malformed.
    Request(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(origin: impl fmt::Display, message: impl Into<String>) -> Self {
        Error::Invalid {
            origin: origin.to_string(),
            message: message.into(),
        }
    }
    pub(crate) fn unsupported(origin: impl fmt::Display, message: impl Into<String>) -> Self {
        Error::Unsupported {
            origin: origin.to_string(),
            message: message.into(),
        }
    }
    pub(crate) fn tokenize(origin: impl fmt::Display, message: impl Into<String>) -> Self {
        Error::Tokenize {
            origin: origin.to_string(),
            message: message.into(),
        }
    }
    pub(crate) fn template(origin: impl fmt::Display, message: impl Into<String>) -> Self {
        Error::Template {
            origin: origin.to_string(),
            message: message.into(),
        }
    }
    pub(crate) fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Format(e) => write!(f, "{e}"),
            Error::Io { path, source } => write!(f, "{path}: {source}"),
            Error::Invalid { origin, message } => {
                write!(f, "{origin}: invalid tokenizer: {message}")
            }
            Error::Unsupported { origin, message } => write!(f, "{origin}: unsupported: {message}"),
            Error::Tokenize { origin, message } => {
                write!(f, "{origin}: tokenizer error: {message}")
            }
            Error::Template { origin, message } => {
                write!(f, "{origin}: chat template error: {message}")
            }
            Error::Request(m) => write!(f, "invalid chat request: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Format(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kiln_format::FormatError> for Error {
    fn from(e: kiln_format::FormatError) -> Self {
        Error::Format(e)
    }
}
