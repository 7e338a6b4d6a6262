//! Sequences over a backend: chunked prefill, one-token decode for one or
//! many sequences, mixed steps of several sequences' decode tokens and
//! prefill chunks ([`Engine::step`], continuous batching), and generation
//! with stop tokens and limits.
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

/// Which logits rows a [`Feed`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    /// The last token's row.
    Last,
    /// One row per token.
    All,
}

/// One sequence's part of a forward step ([`Engine::step`]): `tokens` go to
/// sequence `slot` at its next positions (after [`Engine::seq_len`]).
#[derive(Debug, Clone, Copy)]
pub struct Feed<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    pub logits: Logits,
}

impl Feed<'_> {
    fn rows(&self) -> usize {
        match self.logits {
            Logits::None => 0,
            Logits::Last => usize::from(!self.tokens.is_empty()),
            Logits::All => self.tokens.len(),
        }
    }
}

/// What a token callback wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

/// Device sampling for a capable sampler whose step has no draw (greedy).
const GREEDY_DEVICE: DeviceSampling = DeviceSampling {
    temperature: 0.0,
    top_k: 0,
    seed: 0,
};

pub struct Engine<B: Backend> {
    pub backend: B,
    kv: KvTables,
    vocab: usize,
    max_batch: usize,
    /// Logits rows one step may return.
    logit_rows: usize,
    logits: Vec<f32>,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    seqs: Vec<u32>,
    want: Vec<bool>,
}

impl<B: Backend> Engine<B> {
    /// `layout` must be the one the backend's KV storage was made for.
    pub fn new(backend: B, layout: KvLayout) -> Self {
        let rows = backend.max_batch_tokens();
        Self::with_logit_rows(backend, layout, rows)
    }

    /// Like [`Engine::new`], with room for only `rows` logits rows per step
    /// (a server needs one per running sequence, not one per token; prefill
    /// with every token's logits then goes in chunks of `rows`).
    pub fn with_logit_rows(backend: B, layout: KvLayout, rows: usize) -> Self {
        let vocab = backend.desc().vocab_size;
        let max_batch = backend.max_batch_tokens().max(1);
        let logit_rows = rows.clamp(1, max_batch);
        Engine {
            vocab,
            max_batch,
            logit_rows,
            logits: vec![0.0; vocab * logit_rows],
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

    /// The block tables, for callers that manage the pool themselves (a
    /// scheduler reserving ahead with its own eviction, clearing, truncating).
    pub fn kv_mut(&mut self) -> &mut KvTables {
        &mut self.kv
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

    /// Stages one forward step: each feed's tokens at its slot's next
    /// positions, KV reserved. Everything is checked before anything is
    /// reserved: known tokens, room in the context, distinct slots, at most
    /// the backend's batch and the logits rows. Returns the logits rows.
    fn stage<'a>(&mut self, feeds: impl Iterator<Item = Feed<'a>> + Clone) -> Result<usize> {
        let (mut n, mut rows) = (0, 0);
        for (i, f) in feeds.clone().enumerate() {
            self.check_tokens(f.tokens)?;
            self.check_fits(f.slot, f.tokens.len())?;
            if feeds.clone().take(i).any(|g| g.slot == f.slot) {
                return Err(EngineError::Input(format!(
                    "sequence {} appears twice in one step",
                    f.slot
                )));
            }
            n += f.tokens.len();
            rows += f.rows();
        }
        if n > self.max_batch {
            return Err(EngineError::Input(format!(
                "{n} tokens in one step, the backend takes {}",
                self.max_batch
            )));
        }
        if rows > self.logit_rows {
            return Err(EngineError::Input(format!(
                "{rows} logits rows in one step, the engine holds {}",
                self.logit_rows
            )));
        }
        self.tokens.clear();
        self.positions.clear();
        self.seqs.clear();
        self.want.clear();
        for f in feeds {
            let pos = self.kv.len(f.slot);
            self.kv.reserve(f.slot, pos + f.tokens.len())?;
            let last = f.tokens.len().saturating_sub(1);
            for (i, &t) in f.tokens.iter().enumerate() {
                self.tokens.push(t);
                self.positions.push((pos + i) as u32);
                self.seqs.push(f.slot as u32);
                self.want.push(match f.logits {
                    Logits::None => false,
                    Logits::Last => i == last,
                    Logits::All => true,
                });
            }
        }
        Ok(rows)
    }

    /// Records the staged feeds' tokens as written.
    fn commit<'a>(&mut self, feeds: impl Iterator<Item = Feed<'a>>) {
        for f in feeds {
            let len = self.kv.len(f.slot) + f.tokens.len();
            self.kv.commit(f.slot, len);
        }
    }

    /// One forward step over several sequences at once — decode tokens and
    /// prefill chunks mixed, as a continuous-batching scheduler plans them.
    /// Returns the requested logits rows, in feed order. On an error nothing
    /// is committed (KV reserved for the feeds stays reserved).
    pub fn step(&mut self, feeds: &[Feed<'_>]) -> Result<&mut [f32]> {
        let rows = self.stage(feeds.iter().copied())?;
        self.run_staged()?;
        self.commit(feeds.iter().copied());
        Ok(&mut self.logits[..rows * self.vocab])
    }

    /// Like [`Engine::step`], but the backend samples each requested row on
    /// its device with the matching entry of `params` and only the ids come
    /// back (`ids[i]` for the i-th row). Call only when
    /// [`Backend::samples_on_device`].
    pub fn step_sampled(
        &mut self,
        feeds: &[Feed<'_>],
        params: &[DeviceSampling],
        ids: &mut [u32],
    ) -> Result<()> {
        let rows: usize = feeds.iter().map(Feed::rows).sum();
        if params.len() < rows || ids.len() < rows {
            return Err(EngineError::Input(format!(
                "{rows} rows to sample, with {} sampling settings and room for {} ids",
                params.len(),
                ids.len()
            )));
        }
        self.stage(feeds.iter().copied())?;
        self.run_staged_sampled(params, ids)?;
        self.commit(feeds.iter().copied());
        Ok(())
    }

    /// Runs the staged batch with sampling on the device.
    fn run_staged_sampled(&mut self, params: &[DeviceSampling], ids: &mut [u32]) -> Result<()> {
        let batch = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            seqs: &self.seqs,
            want_logits: &self.want,
        };
        self.backend.forward_sampled(&batch, &self.kv, params, ids)
    }

    /// Feeds `tokens` to sequence `slot` in chunks of the backend's batch
    /// size (of the logits rows with `all_logits`). Each chunk's logits rows
    /// (every token's with `all_logits`, else only the last token's) are
    /// appended to `out` when given. Returns the number of rows the last
    /// chunk left in `self.logits`.
    fn feed(
        &mut self,
        slot: usize,
        tokens: &[u32],
        all_logits: bool,
        mut out: Option<&mut Vec<f32>>,
    ) -> Result<usize> {
        self.check_tokens(tokens)?;
        self.check_fits(slot, tokens.len())?;
        let size = if all_logits {
            self.max_batch.min(self.logit_rows)
        } else {
            self.max_batch
        };
        let mut rows = 0;
        for (ci, chunk) in tokens.chunks(size).enumerate() {
            let last_chunk = (ci + 1) * size >= tokens.len();
            let f = Feed {
                slot,
                tokens: chunk,
                logits: match (all_logits, last_chunk) {
                    (true, _) => Logits::All,
                    (false, true) => Logits::Last,
                    (false, false) => Logits::None,
                },
            };
            rows = self.stage(std::iter::once(f))?;
            self.run_staged()?;
            self.commit(std::iter::once(f));
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
        let mut id = [0u32];
        self.run_staged_sampled(&[s], &mut id)?;
        self.commit(Self::decode_feeds(&[(slot, token)]));
        Ok(id[0])
    }

    /// `n` decode steps of `slot` sampled on the device, the first fed
    /// `token` and each later one the id before it, as [`Engine::generate`]
    /// runs them (with no stop test): pipelined where the backend queues
    /// steps, so the device never waits for the host between tokens.
    /// Returns the last id (`token` when `n` is 0). Call only when
    /// [`Backend::samples_on_device`].
    pub fn decode_chain(
        &mut self,
        slot: usize,
        token: u32,
        n: usize,
        s: DeviceSampling,
    ) -> Result<u32> {
        if !self.backend.pipelines_sampling() {
            let mut t = token;
            for _ in 0..n {
                t = self.decode_sampled(slot, t, s)?;
            }
            return Ok(t);
        }
        let mut id = [token];
        let mut queued = 0;
        let mut run = || -> Result<()> {
            for i in 0..n {
                self.enqueue_decode(slot, (i == 0).then_some(token), s)?;
                queued += 1;
                if queued == 2 {
                    self.backend.wait_sampled(&mut id)?;
                    queued -= 1;
                }
            }
            Ok(())
        };
        let r = run();
        // After an error, the steps already queued still come back (their
        // ids dropped) so the backend's queue starts empty next time.
        for _ in 0..queued {
            self.backend.wait_sampled(&mut id)?;
        }
        r.map(|()| id[0])
    }

    /// Queues one decode step of `slot` sampled on the device: fed `token`,
    /// or with `None` the id the previously queued step samples.
    fn enqueue_decode(&mut self, slot: usize, token: Option<u32>, s: DeviceSampling) -> Result<()> {
        let t = token.unwrap_or(0);
        self.stage_decode(&[(slot, t)])?;
        let batch = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            seqs: &self.seqs,
            want_logits: &self.want,
        };
        self.backend
            .enqueue_sampled(&batch, &self.kv, &[s], token.is_none())?;
        self.commit(Self::decode_feeds(&[(slot, t)]));
        Ok(())
    }

    /// One token for each of several sequences (distinct slots); returns
    /// their logits, one row each, in order.
    pub fn decode_batch(&mut self, items: &[(usize, u32)]) -> Result<&mut [f32]> {
        self.stage_decode(items)?;
        self.run_staged()?;
        self.commit(Self::decode_feeds(items));
        Ok(&mut self.logits[..items.len() * self.vocab])
    }

    fn decode_feeds(items: &[(usize, u32)]) -> impl Iterator<Item = Feed<'_>> + Clone {
        items.iter().map(|(slot, token)| Feed {
            slot: *slot,
            tokens: std::slice::from_ref(token),
            logits: Logits::Last,
        })
    }

    /// Stages one token for each of `items`' sequences (KV reserved).
    fn stage_decode(&mut self, items: &[(usize, u32)]) -> Result<()> {
        self.stage(Self::decode_feeds(items)).map(|_| ())
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
        let pipelined = self.backend.pipelines_sampling() && sampler.device_capable();
        // Steps queued on the backend (pipelined): 1 when the step feeding
        // `next` is already queued.
        let mut queued = 0usize;
        let mut run = || -> Result<FinishReason> {
            Ok(loop {
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
                if queued == 0 && self.kv.len(slot) + 1 > self.ctx() {
                    break FinishReason::Context;
                }
                if pipelined {
                    // Queue the step feeding `next` (unless a speculative one
                    // already does), then, where another token may follow, the
                    // step after it fed with the id the first samples on the
                    // device; then wait for the first's id only.
                    if queued == 0 {
                        let s = sampler.device_step().unwrap_or(GREEDY_DEVICE);
                        self.enqueue_decode(slot, Some(next), s)?;
                        queued = 1;
                    }
                    if out.len() + 1 < max_tokens && self.kv.len(slot) < self.ctx() {
                        let s = sampler.device_step().unwrap_or(GREEDY_DEVICE);
                        self.enqueue_decode(slot, None, s)?;
                        queued += 1;
                    }
                    let mut id = [0u32];
                    self.backend.wait_sampled(&mut id)?;
                    queued -= 1;
                    next = id[0];
                    continue;
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
            })
        };
        let finish = run();
        // Steps still queued come back with their ids dropped and their KV
        // positions taken back, leaving what the plain loop leaves: a
        // speculative one fed the token that ended the run, or, after an
        // error, the ones queued before it (else the next call would read
        // their ids as its own).
        while queued > 0 {
            let mut id = [0u32];
            self.backend.wait_sampled(&mut id)?;
            queued -= 1;
            let len = self.kv.len(slot);
            self.kv.truncate(slot, len - 1);
        }
        let finish = finish?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::ArchDescriptor;

    /// A batch as the backend saw it: tokens, positions, sequences, wants.
    type Seen = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<bool>);

    /// Records each batch; a logits row is (token, position, sequence, 0…).
    struct Echo {
        desc: ArchDescriptor,
        batches: Vec<Seen>,
        /// Ids of queued steps, oldest first (pipelining on when Some).
        queued: Option<std::collections::VecDeque<u32>>,
        /// Enqueues that succeed before one fails (then none fails again).
        fail_enqueue: Option<usize>,
    }

    impl Backend for Echo {
        fn desc(&self) -> &ArchDescriptor {
            &self.desc
        }
        fn max_batch_tokens(&self) -> usize {
            8
        }
        fn forward(&mut self, b: &Batch<'_>, kv: &KvTables, logits: &mut [f32]) -> Result<()> {
            b.check(self.desc.vocab_size, 8, kv)?;
            let mut row = 0;
            for i in 0..b.len() {
                if b.want_logits[i] {
                    let r = &mut logits[row * 10..(row + 1) * 10];
                    r.fill(0.0);
                    r[..3].copy_from_slice(&[
                        b.tokens[i] as f32,
                        b.positions[i] as f32,
                        b.seqs[i] as f32,
                    ]);
                    row += 1;
                }
            }
            self.batches.push((
                b.tokens.to_vec(),
                b.positions.to_vec(),
                b.seqs.to_vec(),
                b.want_logits.to_vec(),
            ));
            Ok(())
        }
        fn samples_on_device(&self) -> bool {
            true
        }
        /// "Samples" (token + position + temperature) of each wanted row.
        fn forward_sampled(
            &mut self,
            b: &Batch<'_>,
            kv: &KvTables,
            params: &[DeviceSampling],
            ids: &mut [u32],
        ) -> Result<()> {
            let mut rows = vec![0.0; 10 * b.n_logits()];
            self.forward(b, kv, &mut rows)?;
            for (i, r) in rows.chunks(10).enumerate() {
                ids[i] = (r[0] + r[1] + params[i].temperature) as u32;
            }
            Ok(())
        }
        fn pipelines_sampling(&self) -> bool {
            self.queued.is_some()
        }
        /// One sequence a step; a chained step is fed the last queued id.
        fn enqueue_sampled(
            &mut self,
            b: &Batch<'_>,
            kv: &KvTables,
            params: &[DeviceSampling],
            chain: bool,
        ) -> Result<()> {
            if let Some(n) = self.fail_enqueue {
                self.fail_enqueue = n.checked_sub(1);
                if n == 0 {
                    return Err(EngineError::Input("enqueue failed".into()));
                }
            }
            let q = self.queued.take().expect("pipelining on");
            assert!(q.len() < 2, "at most two steps queued");
            let fed = [match (chain, q.back()) {
                (true, Some(&id)) => id,
                _ => b.tokens[0],
            }];
            let b = Batch { tokens: &fed, ..*b };
            let mut id = [0];
            let r = self.forward_sampled(&b, kv, params, &mut id);
            let mut q = q;
            if r.is_ok() {
                q.push_back(id[0]);
            }
            self.queued = Some(q);
            r
        }
        fn wait_sampled(&mut self, ids: &mut [u32]) -> Result<()> {
            ids[0] = self
                .queued
                .as_mut()
                .and_then(|q| q.pop_front())
                .expect("a queued step");
            Ok(())
        }
    }

    fn engine(logit_rows: usize) -> Engine<Echo> {
        let desc = ArchDescriptor::test_tiny(&[None], 16);
        let layout = KvLayout::plan(&desc, 16, 3, 4, 8);
        let echo = Echo {
            desc,
            batches: Vec::new(),
            queued: None,
            fail_enqueue: None,
        };
        Engine::with_logit_rows(echo, layout, logit_rows)
    }

    #[test]
    fn step_mixes_decode_tokens_and_prefill_chunks() {
        let mut e = engine(3);
        e.prefill(0, &[1, 2, 3]).unwrap();
        let feeds = [
            Feed {
                slot: 0,
                tokens: &[4],
                logits: Logits::Last,
            },
            Feed {
                slot: 1,
                tokens: &[5, 6, 7],
                logits: Logits::None,
            },
            Feed {
                slot: 2,
                tokens: &[8, 9],
                logits: Logits::Last,
            },
        ];
        let rows = e.step(&feeds).unwrap().to_vec();
        // One row per feed that asked, in feed order: (token, position, seq).
        assert_eq!(rows.len(), 20);
        assert_eq!(&rows[..3], &[4.0, 3.0, 0.0]);
        assert_eq!(&rows[10..13], &[9.0, 1.0, 2.0]);
        let (t, p, s, w) = e.backend.batches.last().unwrap().clone();
        assert_eq!(t, [4, 5, 6, 7, 8, 9]);
        assert_eq!(p, [3, 0, 1, 2, 0, 1]);
        assert_eq!(s, [0, 1, 1, 1, 2, 2]);
        assert_eq!(w, [true, false, false, false, false, true]);
        assert_eq!((e.seq_len(0), e.seq_len(1), e.seq_len(2)), (4, 3, 2));
        // The next chunk continues where the last one stopped.
        let rows = e
            .step(&[Feed {
                slot: 1,
                tokens: &[1],
                logits: Logits::All,
            }])
            .unwrap();
        assert_eq!(&rows[..3], &[1.0, 3.0, 1.0]);
    }

    #[test]
    fn step_sampled_returns_ids_in_row_order() {
        let mut e = engine(3);
        let greedy = |t| DeviceSampling {
            temperature: t,
            top_k: 0,
            seed: 0,
        };
        let feeds = [
            Feed {
                slot: 2,
                tokens: &[3, 4],
                logits: Logits::Last,
            },
            Feed {
                slot: 0,
                tokens: &[5],
                logits: Logits::None,
            },
            Feed {
                slot: 1,
                tokens: &[6],
                logits: Logits::Last,
            },
        ];
        let mut ids = [0u32; 2];
        e.step_sampled(&feeds, &[greedy(0.0), greedy(2.0)], &mut ids)
            .unwrap();
        assert_eq!(ids, [4 + 1, 6 + 2]);
        assert_eq!((e.seq_len(0), e.seq_len(1), e.seq_len(2)), (1, 1, 2));
        // Too few settings: an error before anything is staged.
        let more = [Feed {
            slot: 2,
            tokens: &[1],
            logits: Logits::Last,
        }];
        assert!(e.step_sampled(&more, &[], &mut ids).is_err());
        assert_eq!((e.seq_len(0), e.seq_len(1), e.seq_len(2)), (1, 1, 2));
        assert_eq!(e.decode_sampled(0, 7, greedy(0.0)).unwrap(), 7 + 1);
        assert_eq!(e.seq_len(0), 2);
    }

    #[test]
    fn decode_chain_feeds_each_id_to_the_next_step() {
        let greedy = DeviceSampling {
            temperature: 0.0,
            top_k: 0,
            seed: 0,
        };
        // Each "sampled" id is token + position: the chain from 3 at
        // positions 0, 1, 2, 3 gives 3, 4, 6, 9.
        for pipelined in [false, true] {
            let mut e = engine(1);
            e.backend.queued = pipelined.then(Default::default);
            assert_eq!(e.decode_chain(0, 3, 0, greedy).unwrap(), 3);
            assert_eq!(e.decode_chain(0, 3, 4, greedy).unwrap(), 9);
            assert_eq!(e.seq_len(0), 4);
            let fed: Vec<u32> = e.backend.batches.iter().map(|b| b.0[0]).collect();
            // Pipelined steps see a placeholder; the backend feeds the id.
            if !pipelined {
                assert_eq!(fed, [3, 3, 4, 6]);
            }
            // Past the KV cache's blocks: an error, with nothing left queued.
            assert!(e.decode_chain(0, 1, 100, greedy).is_err());
            assert!(e.backend.queued.as_ref().is_none_or(|q| q.is_empty()));
        }
    }

    #[test]
    fn generate_leaves_nothing_queued_after_an_error() {
        let run = |e: &mut Engine<Echo>, slot| {
            let mut s = Sampler::new(crate::sampler::SamplerParams::greedy(), 10);
            e.generate(slot, &[3], &mut s, 4, true, &|_| false, &mut |_| {
                Control::Continue
            })
        };
        let pipelined = || {
            let mut e = engine(1);
            e.backend.queued = Some(Default::default());
            e
        };
        let want = run(&mut pipelined(), 1).unwrap().tokens;
        assert_eq!(want, [0, 1, 3, 6]);
        // The speculative (second) enqueue fails with the first step queued:
        // its id comes back dropped and its KV position is taken back, so
        // the next run reads only its own ids.
        let mut e = pipelined();
        e.backend.fail_enqueue = Some(1);
        assert!(run(&mut e, 0).is_err());
        assert!(e.backend.queued.as_ref().is_some_and(|q| q.is_empty()));
        assert_eq!(e.seq_len(0), 1);
        assert_eq!(run(&mut e, 1).unwrap().tokens, want);
    }

    #[test]
    fn step_checks_before_it_reserves() {
        let mut e = engine(2);
        let f = |slot, tokens: &'static [u32], logits| Feed {
            slot,
            tokens,
            logits,
        };
        let bad: [&[Feed]; 5] = [
            &[f(0, &[1], Logits::Last), f(0, &[2], Logits::Last)],
            &[
                f(0, &[1, 2, 3, 4, 5], Logits::None),
                f(1, &[1; 4], Logits::None),
            ],
            &[f(0, &[1, 2, 3], Logits::All)],
            &[f(1, &[10], Logits::Last)],
            &[f(2, &[1; 17], Logits::None)],
        ];
        for feeds in bad {
            assert!(e.step(feeds).is_err(), "{feeds:?}");
            assert!((0..3).all(|s| e.seq_len(s) == 0 && !e.kv().is_active(s)));
        }
        assert!(e.backend.batches.is_empty());
        // With two logits rows, every-token prefill goes in chunks of two.
        let mut out = Vec::new();
        e.prefill_into(0, &[1, 2, 3], true, &mut out).unwrap();
        assert_eq!(out.len(), 30);
        assert_eq!(e.backend.batches.len(), 2);
        assert_eq!(e.seq_len(0), 3);
    }
}
