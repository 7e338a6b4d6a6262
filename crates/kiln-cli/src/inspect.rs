//! `kiln inspect`.

use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model folder.
    pub path: std::path::PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: Args) -> CliResult {
    Err("kiln inspect is not implemented yet".into())
}
