//! Sequences over a backend: chunked prefill, one-token decode for one or
//! many sequences, and generation with stop tokens and limits.
//!
//! Every buffer is allocated in [`Engine::new`]; [`Engine::decode`] and the
//! generation loop allocate nothing (the `kiln-cpu` tests prove it with a
//! counting allocator).

use std::time::Instant;

use crate::backend::{Backend, Batch};
use crate::error::{EngineError, Result};
use crate::kv::{KvLayout, KvTables};
use crate::sampler::{DeviceSampling, Sampler};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Positions per sequence.
    pub ctx: usize,
    /// Sequences that can be live at once.
    pub max_seqs: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Tokens per forward call during prefill (the backend's scratch size).
    pub max_chunk: usize,
}

impl EngineOptions {
    /// The context to plan for: `requested` (0 = the model's own), capped at
    /// what the model was trained for; by default at most 4096 so the KV
    /// pool of a 128k-context model does not take all memory.
    pub fn resolve_ctx(requested: Option<usize>, model_ctx: usize) -> usize {
        let model_ctx = model_ctx.max(1);
        match requested {
            Some(0) => model_ctx,
            Some(n) => n.min(model_ctx),
            None => model_ctx.min(4096),
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            ctx: 4096,
            max_seqs: 1,
            block_size: 16,
            max_chunk: 256,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (end of sequence).
    Stop,
    /// The token limit.
    Length,
    /// The context is full.
    Context,
    /// A stop string, or the caller stopped it.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Context => "context",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_secs: f64,
    pub gen_tokens: usize,
    pub gen_secs: f64,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_secs)
    }
    pub fn gen_tps(&self) -> f64 {
        rate(self.gen_tokens, self.gen_secs)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated tokens (a final stop token is not included).
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub timings: Timings,
}

/// What a token callback wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

pub struct Engine<B: Backend> {
    pub backend: B,
    kv: KvTables,
    vocab: usize,
    max_batch: usize,
    logits: Vec<f32>,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    seqs: Vec<u32>,
    want: Vec<bool>,
}

impl<B: Backend> Engine<B> {
    /// `layout` must be the one the backend's KV storage was made for.
    pub fn new(backend: B, layout: KvLayout) -> Self {
        let vocab = backend.desc().vocab_size;
        let max_batch = backend.max_batch_tokens().max(1);
        Engine {
            vocab,
            max_batch,
            logits: vec![0.0; vocab * max_batch],
            tokens: Vec::with_capacity(max_batch),
            positions: Vec::with_capacity(max_batch),
            seqs: Vec::with_capacity(max_batch),
            want: Vec::with_capacity(max_batch),
            kv: KvTables::new(layout),
            backend,
        }
    }

    pub fn kv(&self) -> &KvTables {
        &self.kv
    }

    pub fn ctx(&self) -> usize {
        self.kv.layout().max_ctx
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Positions already in the cache for `slot`.
    pub fn seq_len(&self, slot: usize) -> usize {
        self.kv.len(slot)
    }

    /// Forgets sequence `slot` (its blocks return to the pool).
    pub fn reset(&mut self, slot: usize) {
        self.kv.clear(slot);
    }

    /// Keeps only the first `len` positions of `slot`; false (and nothing
    /// changed) when a sliding window already dropped what position `len`
    /// would need. See [`KvTables::truncate`].
    pub fn truncate(&mut self, slot: usize, len: usize) -> bool {
        self.kv.truncate(slot, len)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.vocab) {
            Some(t) => Err(EngineError::Input(format!(
                "token id {t} is outside the vocabulary (size {})",
                self.vocab
            ))),
            None => Ok(()),
        }
    }

    fn check_fits(&self, slot: usize, n: usize) -> Result<()> {
        let have = self.kv.len(slot);
        if have + n > self.ctx() {
            return Err(EngineError::Input(if have == 0 {
                format!(
                    "the prompt is {n} tokens but the context holds {} (raise -c/--ctx-size)",
                    self.ctx()
                )
            } else {
                format!(
                    "{n} more tokens after {have} already in the sequence exceed the context of {}",
                    self.ctx()
                )
            }));
        }
        Ok(())
    }

    /// Runs the batch currently staged in the buffers.
    fn run_staged(&mut self) -> Result<()> {
        let batch = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            seqs: &self.seqs,
            want_logits: &self.want,
        };
        self.backend.forward(&batch, &self.kv, &mut self.logits)
    }

    /// Feeds `tokens` to sequence `slot` in chunks of the backend's batch
    /// size. Each chunk's logits rows (every token's with `all_logits`, else
    /// only the last token's) are appended to `out` when given. Returns the
    /// number of rows the last chunk left in `self.logits`.
    fn feed(
        &mut self,
        slot: usize,
        tokens: &[u32],
        all_logits: bool,
        mut out: Option<&mut Vec<f32>>,
    ) -> Result<usize> {
        self.check_tokens(tokens)?;
        self.check_fits(slot, tokens.len())?;
        let mut pos = self.kv.len(slot);
        let mut rows = 0;
        for (ci, chunk) in tokens.chunks(self.max_batch).enumerate() {
            let last_chunk = (ci + 1) * self.max_batch >= tokens.len();
            self.kv.reserve(slot, pos + chunk.len())?;
            self.tokens.clear();
            self.positions.clear();
            self.seqs.clear();
            self.want.clear();
            for (i, &t) in chunk.iter().enumerate() {
                self.tokens.push(t);
                self.positions.push((pos + i) as u32);
                self.seqs.push(slot as u32);
                self.want
                    .push(all_logits || (last_chunk && i + 1 == chunk.len()));
            }
            self.run_staged()?;
            pos += chunk.len();
            self.kv.commit(slot, pos);
            rows = self.want.iter().filter(|&&w| w).count();
            if let Some(out) = out.as_deref_mut() {
                out.extend_from_slice(&self.logits[..rows * self.vocab]);
            }
        }
        Ok(rows)
    }

    /// Feeds `tokens` to sequence `slot` in chunks. With `all_logits`, the
    /// logits of every token are appended to `out` (`tokens.len() × vocab`);
    /// otherwise only the last token's row is (`vocab`).
    pub fn prefill_into(
        &mut self,
        slot: usize,
        tokens: &[u32],
        all_logits: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.feed(slot, tokens, all_logits, Some(out)).map(|_| ())
    }

    /// Feeds `tokens` to `slot`; returns the last token's logits.
    pub fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<&mut [f32]> {
        if tokens.is_empty() {
            return Err(EngineError::Input("empty prompt".into()));
        }
        let rows = self.feed(slot, tokens, false, None)?;
        Ok(&mut self.logits[..rows * self.vocab])
    }

    /// One token for one sequence; returns its logits.
    pub fn decode(&mut self, slot: usize, token: u32) -> Result<&mut [f32]> {
        self.decode_batch(&[(slot, token)])
    }

    /// One token for one sequence, sampled by the backend on its device
    /// (only the id comes back). Call only when
    /// [`Backend::samples_on_device`].
    pub fn decode_sampled(&mut self, slot: usize, token: u32, s: DeviceSampling) -> Result<u32> {
        self.stage_decode(&[(slot, token)])?;
        let batch = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            seqs: &self.seqs,
            want_logits: &self.want,
        };
        let mut id = [0u32];
        self.backend
            .forward_sampled(&batch, &self.kv, &[s], &mut id)?;
        let len = self.kv.len(slot) + 1;
        self.kv.commit(slot, len);
        Ok(id[0])
    }

    /// One token for each of several sequences (distinct slots); returns
    /// their logits, one row each, in order.
    pub fn decode_batch(&mut self, items: &[(usize, u32)]) -> Result<&mut [f32]> {
        self.stage_decode(items)?;
        self.run_staged()?;
        for &(slot, _) in items {
            let len = self.kv.len(slot) + 1;
            self.kv.commit(slot, len);
        }
        Ok(&mut self.logits[..items.len() * self.vocab])
    }

    /// Stages one token for each of `items`' sequences (KV reserved).
    fn stage_decode(&mut self, items: &[(usize, u32)]) -> Result<()> {
        if items.len() > self.max_batch {
            return Err(EngineError::Input(format!(
                "{} sequences in one step, the backend takes {}",
                items.len(),
                self.max_batch
            )));
        }
        self.tokens.clear();
        self.positions.clear();
        self.seqs.clear();
        self.want.clear();
        for &(slot, token) in items {
            if token as usize >= self.vocab {
                return Err(EngineError::Input(format!(
                    "token id {token} is outside the vocabulary (size {})",
                    self.vocab
                )));
            }
            self.check_fits(slot, 1)?;
            let pos = self.kv.len(slot);
            self.kv.reserve(slot, pos + 1)?;
            self.tokens.push(token);
            self.positions.push(pos as u32);
            self.seqs.push(slot as u32);
            self.want.push(true);
        }
        Ok(())
    }

    /// Generates after `prompt` (appended to what `slot` already holds).
    ///
    /// `is_stop(id)` ends generation at a stop token unless `ignore_eos`;
    /// `on_token` sees every other token as it is sampled and can stop the
    /// run (stop strings, Ctrl-C). The last sampled token is not fed back,
    /// so a later turn can start with it.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        slot: usize,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        ignore_eos: bool,
        is_stop: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> Control,
    ) -> Result<Generation> {
        let mut history: Vec<u32> = Vec::with_capacity(prompt.len() + max_tokens + 1);
        history.extend_from_slice(prompt);
        let mut out = Vec::with_capacity(max_tokens);
        let t0 = Instant::now();
        let logits = self.prefill(slot, prompt)?;
        let mut next = sampler.sample(logits, &history);
        // Decode steps sample on the device when the backend can and the
        // sampler's settings allow (only the id crosses back).
        let on_device = self.backend.samples_on_device();
        let prompt_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let finish = loop {
            if !ignore_eos && is_stop(next) {
                break FinishReason::Stop;
            }
            out.push(next);
            history.push(next);
            if on_token(next) == Control::Stop {
                break FinishReason::Cancelled;
            }
            if out.len() >= max_tokens {
                break FinishReason::Length;
            }
            if self.kv.len(slot) + 1 > self.ctx() {
                break FinishReason::Context;
            }
            let dev = if on_device {
                sampler.device_step()
            } else {
                None
            };
            next = match dev {
                Some(s) => self.decode_sampled(slot, next, s)?,
                None => {
                    let logits = self.decode(slot, next)?;
                    sampler.sample(logits, &history)
                }
            };
        };
        Ok(Generation {
            timings: Timings {
                prompt_tokens: prompt.len(),
                prompt_secs,
                gen_tokens: out.len(),
                gen_secs: t1.elapsed().as_secs_f64(),
            },
            tokens: out,
            finish,
        })
    }
}
