//! `kiln tokenize` (owned by the tokenizer work; see kiln-tokenizer).

use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model folder.
    pub model: std::path::PathBuf,
    /// Text to tokenize.
    pub text: Option<String>,
}

pub fn run(_args: Args) -> CliResult {
    Err("kiln tokenize is not implemented yet".into())
}
