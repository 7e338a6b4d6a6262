//! Stop strings over streamed text: text that could still be the start of a
//! stop string is held back until it cannot match.

#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Adds `piece`; appends the text that is safe to show to `out`. Returns
    /// true when a stop string completed: the text before it is in `out`,
    /// the stop string and anything after it are dropped.
    pub fn push(&mut self, piece: &str, out: &mut String) -> bool {
        if self.stops.is_empty() {
            out.push_str(piece);
            return false;
        }
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            out.push_str(&self.held[..at]);
            self.held.clear();
            return true;
        }
        // Longest suffix of `held` that is a proper prefix of a stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        out.push_str(&self.held[..keep]);
        self.held.drain(..keep);
        false
    }

    /// Releases what is held (end of generation without a match).
    pub fn flush(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_matches() {
        let mut s = StopStrings::new(["</end>".to_string(), "STOP".to_string()]);
        let mut out = String::new();
        assert!(!s.push("hello </", &mut out));
        assert_eq!(out, "hello ");
        assert!(!s.push("en", &mut out));
        assert_eq!(out, "hello ");
        assert!(!s.push("x ST", &mut out));
        assert_eq!(out, "hello </enx ");
        assert!(s.push("OP tail", &mut out));
        assert_eq!(out, "hello </enx ");
        let mut s = StopStrings::new(["ab".to_string()]);
        let mut out = String::new();
        assert!(!s.push("é a", &mut out));
        s.flush(&mut out);
        assert_eq!(out, "é a");
    }
}
