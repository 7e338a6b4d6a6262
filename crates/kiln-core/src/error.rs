//! Engine errors: each names the thing and the limit.

use std::fmt;

use kiln_format::FormatError;

#[derive(Debug)]
pub enum EngineError {
    /// The model file is unusable (missing tensor, bad metadata …).
    Format(FormatError),
    /// The model uses something this engine cannot run (yet).
    Unsupported(String),
    /// A request does not fit: prompt longer than the context, token id out
    /// of the vocabulary, unknown sequence slot …
    Input(String),
    /// The KV block pool has no free block left.
    KvFull { group: usize, blocks: usize },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Format(e) => write!(f, "{e}"),
            EngineError::Unsupported(m) => write!(f, "unsupported: {m}"),
            EngineError::Input(m) => write!(f, "{m}"),
            EngineError::KvFull { group, blocks } => write!(
                f,
                "KV cache full: all {blocks} blocks of layer group {group} are in use \
                 (raise the context size or lower the number of parallel sequences)"
            ),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Format(e) => Some(e),
            _ => None,
        }
    }
}

impl From<FormatError> for EngineError {
    fn from(e: FormatError) -> Self {
        EngineError::Format(e)
    }
}
