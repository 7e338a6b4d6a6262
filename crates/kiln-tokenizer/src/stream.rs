//! Streaming detokenization.
//!
//! A model produces one token at a time, but one character can span several
//! tokens (a byte-level BPE token can end in the middle of a UTF-8 sequence; a
//! SentencePiece byte-fallback character is 2–4 `<0xNN>` tokens). The
//! [`StreamDecoder`] holds text back until it is complete and only ever emits
//! what the full decode of all tokens so far will contain at that position:
//! the concatenation of everything it emits (plus [`StreamDecoder::finish`])
//! equals `Tokenizer::decode` of all the ids.
//!
//! Method: keep a short window of ids (the tokens since the previous emission
//! point, plus the ones not yet emitted), decode the window, and emit the part
//! after the already-emitted prefix once the decoded text does not end in an
//! incomplete character (U+FFFD). The window start moves forward at every
//! emission, so the cost per token stays constant over long generations.

use crate::error::Result;
use crate::Tokenizer;

/// Incremental decoder; see the module documentation. Create with
/// [`Tokenizer::stream_decoder`].
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    /// Ids from the last emission point on.
    ids: Vec<u32>,
    /// Decode of `ids[..prefix_len]`, already emitted.
    prefix: String,
    prefix_len: usize,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tok: &'a Tokenizer, skip_special: bool) -> Self {
        Self {
            tok,
            skip_special,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_len: 0,
        }
    }

    /// Feed one id; returns the text that became final with it, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        if text.len() > self.prefix.len() && !text.ends_with('\u{FFFD}') {
            self.emit(text)
        } else {
            Ok(None)
        }
    }

    /// Flush whatever is held back (an incomplete character at the very end is
    /// emitted as U+FFFD, exactly as the full decode shows it).
    pub fn finish(&mut self) -> Result<Option<String>> {
        if self.ids.len() == self.prefix_len {
            return Ok(None);
        }
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        if text.len() > self.prefix.len() {
            self.emit(text)
        } else {
            Ok(None)
        }
    }

    fn emit(&mut self, text: String) -> Result<Option<String>> {
        // Decoders used here are prefix-stable: decoding a longer window only
        // appends. Should one not be, emit nothing rather than wrong text.
        if !text.starts_with(self.prefix.as_str()) {
            return Ok(None);
        }
        let new = text[self.prefix.len()..].to_string();
        // Keep the ids after the old emission point as context for the next
        // window (a window never starts in the middle of a character).
        let drop = self.prefix_len;
        self.ids.drain(..drop);
        self.prefix_len = self.ids.len();
        self.prefix = self.tok.decode(&self.ids, self.skip_special)?;
        Ok(Some(new))
    }
}
