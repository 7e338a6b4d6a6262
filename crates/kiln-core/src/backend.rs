//! The interface every backend implements: one forward step over a batch of
//! tokens drawn from any number of sequences.

use crate::arch::ArchDescriptor;
use crate::error::{EngineError, Result};
use crate::kv::{KvTables, NO_BLOCK};
use crate::sampler::DeviceSampling;

/// Tokens of one forward step. All slices have the same length; token `i`
/// belongs to sequence slot `seqs[i]` at position `positions[i]`. Tokens of
/// one sequence appear in increasing, consecutive positions, and every
/// earlier position of that sequence is already in the cache.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub seqs: &'a [u32],
    /// Which tokens need a row of logits.
    pub want_logits: &'a [bool],
}

impl Batch<'_> {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    pub fn n_logits(&self) -> usize {
        self.want_logits.iter().filter(|&&w| w).count()
    }

    /// What every backend relies on before it touches memory: equal field
    /// lengths, at most `max_batch` tokens, ids inside the vocabulary,
    /// positions inside the context, and a KV block for every position.
    pub fn check(&self, vocab_size: usize, max_batch: usize, kv: &KvTables) -> Result<()> {
        let n = self.len();
        if n > max_batch
            || self.positions.len() != n
            || self.seqs.len() != n
            || self.want_logits.len() != n
        {
            return Err(EngineError::Input(format!(
                "batch of {n} tokens (max {max_batch}) with mismatched field lengths"
            )));
        }
        let layout = kv.layout();
        let bs = layout.block_size;
        for i in 0..n {
            let (tok, pos, seq) = (
                self.tokens[i] as usize,
                self.positions[i] as usize,
                self.seqs[i] as usize,
            );
            if tok >= vocab_size || pos >= layout.max_ctx {
                return Err(EngineError::Input(format!(
                    "token {tok} at position {pos}: vocabulary {vocab_size}, context {}",
                    layout.max_ctx
                )));
            }
            for g in 0..layout.groups.len() {
                if kv
                    .table(seq, g)
                    .get(pos / bs)
                    .is_none_or(|&b| b == NO_BLOCK)
                {
                    return Err(EngineError::Input(format!(
                        "sequence {seq} has no KV block for position {pos}"
                    )));
                }
            }
        }
        Ok(())
    }
}

pub trait Backend {
    fn desc(&self) -> &ArchDescriptor;

    /// Most tokens one [`Backend::forward`] call takes (its scratch size).
    fn max_batch_tokens(&self) -> usize;

    /// Runs the model over `batch`: stores each token's K/V at its position
    /// in the blocks `kv` assigns (already reserved by the caller), and writes
    /// one row of `vocab_size` logits per token with `want_logits`, in batch
    /// order, to the front of `logits`.
    fn forward(&mut self, batch: &Batch<'_>, kv: &KvTables, logits: &mut [f32]) -> Result<()>;

    /// Whether [`Backend::enqueue_sampled`] and [`Backend::wait_sampled`]
    /// are implemented.
    fn pipelines_sampling(&self) -> bool {
        false
    }

    /// Like [`Backend::forward_sampled`] for a step of one token per
    /// sequence, but returns once the step is queued, so the host can queue
    /// the next step before it reads this one's ids. With `chain`, each
    /// row's input token is the id the previous queued step sampled for the
    /// same row (`batch.tokens` are placeholders). Ids come back in queue
    /// order from [`Backend::wait_sampled`]; at most two steps are queued.
    fn enqueue_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[DeviceSampling],
        chain: bool,
    ) -> Result<()> {
        let _ = (batch, kv, params, chain);
        Err(EngineError::Input(
            "this backend does not queue sampled steps".into(),
        ))
    }

    /// The ids of the oldest step queued by [`Backend::enqueue_sampled`]
    /// (one per row), waiting for it.
    fn wait_sampled(&mut self, ids: &mut [u32]) -> Result<()> {
        let _ = ids;
        Err(EngineError::Input(
            "this backend does not queue sampled steps".into(),
        ))
    }

    /// Whether [`Backend::forward_sampled`] is implemented.
    fn samples_on_device(&self) -> bool {
        false
    }

    /// The device memory's measured copy rate (bytes read + written a
    /// second), the bandwidth of a decode floor; `None` where the backend
    /// has no device of its own (the CPU's floor is measured by its caller).
    fn copy_bandwidth(&mut self) -> Option<f64> {
        None
    }

    /// Like [`Backend::forward`], but each row that wants logits is sampled
    /// by the backend with its own entry of `params` and only the ids come
    /// back (in batch order). Backends without device sampling return an
    /// error and run nothing.
    fn forward_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[DeviceSampling],
        ids: &mut [u32],
    ) -> Result<()> {
        let _ = (batch, kv, params, ids);
        Err(EngineError::Input(
            "this backend does not sample on its device".into(),
        ))
    }
}

/// A backend chosen at run time (`--device`) drives the same engine.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn desc(&self) -> &ArchDescriptor {
        (**self).desc()
    }
    fn max_batch_tokens(&self) -> usize {
        (**self).max_batch_tokens()
    }
    fn forward(&mut self, batch: &Batch<'_>, kv: &KvTables, logits: &mut [f32]) -> Result<()> {
        (**self).forward(batch, kv, logits)
    }
    fn samples_on_device(&self) -> bool {
        (**self).samples_on_device()
    }
    fn copy_bandwidth(&mut self) -> Option<f64> {
        (**self).copy_bandwidth()
    }
    fn pipelines_sampling(&self) -> bool {
        (**self).pipelines_sampling()
    }
    fn enqueue_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[DeviceSampling],
        chain: bool,
    ) -> Result<()> {
        (**self).enqueue_sampled(batch, kv, params, chain)
    }
    fn wait_sampled(&mut self, ids: &mut [u32]) -> Result<()> {
        (**self).wait_sampled(ids)
    }
    fn forward_sampled(
        &mut self,
        batch: &Batch<'_>,
        kv: &KvTables,
        params: &[DeviceSampling],
        ids: &mut [u32],
    ) -> Result<()> {
        (**self).forward_sampled(batch, kv, params, ids)
    }
}
