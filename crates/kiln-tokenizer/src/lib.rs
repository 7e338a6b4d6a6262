//! kiln-tokenizer: text in and out, exactly as the model was trained.
