//! `kiln tokenize`: show how a model's tokenizer splits a text, or render a
//! conversation with the model's chat template and tokenize the result.
//!
//! ```text
//! kiln tokenize MODEL "Hello world"            # one line per token: id and piece
//! kiln tokenize MODEL "Hello world" --json     # {"ids": [...], "pieces": [...]}
//! kiln tokenize MODEL --chat conversation.json # rendered text, then the tokens
//! ```
//!
//! The chat file holds OpenAI-style messages: a bare array or an object with a
//! `messages` array (and optionally `tools`).

use std::path::PathBuf;

use kiln_tokenizer::{chat::messages_from_json, ChatRequest, Tokenizer};

use crate::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file, Hugging Face model folder, or tokenizer.json.
    pub model: PathBuf,
    /// Text to tokenize.
    pub text: Option<String>,
    /// Render this conversation (OpenAI messages JSON: an array, or {"messages": [...], "tools": [...]})
    /// with the model's chat template, then tokenize it.
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub chat: Option<PathBuf>,
    /// With --chat: do not append the assistant turn header.
    #[arg(long, requires = "chat")]
    pub no_generation_prompt: bool,
    /// Do not add the model's BOS/EOS tokens.
    #[arg(long)]
    pub no_add_special: bool,
    /// Treat special-token text (e.g. "<|im_end|>") as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print JSON: {"ids": [...], "pieces": [...]} (with --chat also "text").
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> CliResult {
    let tok = Tokenizer::load(&args.model)?;
    let (rendered, ids) = match (&args.chat, &args.text) {
        (Some(file), _) => {
            let raw =
                std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
            let json: serde_json::Value = serde_json::from_str(&raw)
                .map_err(|e| format!("{}: not valid JSON: {e}", file.display()))?;
            let messages =
                messages_from_json(&json).map_err(|e| format!("{}: {e}", file.display()))?;
            let req = ChatRequest {
                messages,
                tools: json.get("tools").filter(|t| !t.is_null()),
                add_generation_prompt: !args.no_generation_prompt,
                extra: None,
            };
            let text = tok.render_chat_request(&req)?;
            let ids = if args.no_add_special {
                tok.encode(&text, false, !args.no_parse_special)?
            } else {
                tok.encode_chat_prompt(&text)?
            };
            (Some(text), ids)
        }
        (None, Some(text)) => (
            None,
            tok.encode(text, !args.no_add_special, !args.no_parse_special)?,
        ),
        (None, None) => return Err("give a TEXT to tokenize or --chat FILE".into()),
    };
    let pieces: Vec<&str> = ids
        .iter()
        .map(|&i| tok.token_piece(i).unwrap_or(""))
        .collect();
    let mut out = String::new();
    if args.json {
        let mut j = serde_json::json!({ "ids": ids, "pieces": pieces });
        if let Some(t) = rendered {
            j["text"] = serde_json::Value::String(t);
        }
        out.push_str(&serde_json::to_string_pretty(&j)?);
        out.push('\n');
    } else {
        if let Some(t) = &rendered {
            out.push_str(t);
            out.push_str("\n----\n");
        }
        for (id, piece) in ids.iter().zip(&pieces) {
            let mark = if tok.is_eos(*id) {
                "  (stop)"
            } else if tok.is_special(*id) {
                "  (special)"
            } else {
                ""
            };
            let text = tok.decode(&[*id], false)?;
            out.push_str(&format!("{id:>8}  {piece:?}  -> {text:?}{mark}\n"));
        }
        out.push_str(&format!("{} tokens\n", ids.len()));
    }
    write_stdout(&out)
}

/// Print, treating a closed pipe (`kiln tokenize ... | head`) as success.
fn write_stdout(s: &str) -> CliResult {
    use std::io::Write;
    let mut so = std::io::stdout().lock();
    match so.write_all(s.as_bytes()).and_then(|_| so.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/fixtures/tokenizer/llamacpp/ggml-vocab-gpt-2.gguf")
    }

    fn args(text: Option<&str>, chat: Option<PathBuf>, json: bool) -> Args {
        Args {
            model: vocab(),
            text: text.map(str::to_string),
            chat,
            no_generation_prompt: false,
            no_add_special: false,
            no_parse_special: false,
            json,
        }
    }

    #[test]
    fn tokenize_text_and_chat() {
        assert!(run(args(Some("Hello world"), None, false)).is_ok());
        assert!(run(args(Some("Hello world"), None, true)).is_ok());
        let f =
            std::env::temp_dir().join(format!("kiln-tokenize-chat-{}.json", std::process::id()));
        std::fs::write(&f, r#"{"messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
        assert!(run(args(None, Some(f.clone()), true)).is_ok());
        std::fs::write(&f, r#"[{"content": "no role"}]"#).unwrap();
        let e = run(args(None, Some(f.clone()), false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("role"), "{e}");
        let _ = std::fs::remove_file(&f);
        assert!(run(args(None, None, false)).is_err());
    }
}
