//! The continuous-batching scheduler: one engine thread owns the backend and
//! the KV block tables and runs forward steps over every live sequence.
//!
//! Each step is **one** [`Engine::step`] (one [`Backend::forward`]) over a
//! mixed batch: one token for every sequence that is decoding, then prompt
//! chunks of sequences that are prefilling, up to a token budget per step. New requests join between
//! steps; a finished, cancelled or disconnected sequence leaves at once and
//! its slot (and KV blocks) go back to the pool.
//!
//! A sequence is just its token list: the positions already in the cache are
//! `kv.len(slot)`, the rest still has to be fed. Prefill, decode and
//! recompute after preemption are all "feed what is not in the cache yet".
//!
//! Prefix caching (per slot): a finished sequence leaves its tokens' KV in
//! its slot. A new sequence takes the idle slot whose cached tokens share the
//! longest prefix with its prompt and only feeds the rest, so the next turn
//! of a chat, or a repeated system prompt, is not prefilled again. Cached
//! slots are evicted (least recently used first) when their slot or blocks
//! are needed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use kiln_core::engine::{Feed, Logits};
use kiln_core::kv::NO_BLOCK;
use kiln_core::{Backend, DeviceSampling, Engine, EngineError, KvLayout, Sampler, SamplerParams};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token.
    Stop,
    /// `max_tokens` or the context.
    Length,
    /// The client went away or asked to stop (stop string).
    Cancelled,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The most likely tokens (id, logprob), best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    Token {
        index: usize,
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        index: usize,
        finish: Finish,
        prompt_tokens: usize,
        cached_tokens: usize,
        completion_tokens: usize,
    },
    Error {
        index: usize,
        message: String,
    },
}

/// One sequence to generate (one choice of a request).
pub struct SeqRequest {
    /// The choice index reported back in events.
    pub index: usize,
    pub prompt: Arc<[u32]>,
    pub params: SamplerParams,
    /// Tokens to generate at most (already capped by the context).
    pub max_tokens: usize,
    pub ignore_eos: bool,
    /// `Some(k)`: report the sampled token's logprob and the `k` best.
    pub logprobs: Option<usize>,
    /// Set to stop the sequence (stop string reached by the reader).
    pub cancel: Arc<AtomicBool>,
    pub tx: UnboundedSender<SeqEvent>,
    pub arrived: Instant,
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequence slots (running sequences at most).
    pub parallel: usize,
    /// Tokens per forward step (decode tokens + prefill chunks).
    pub step_tokens: usize,
    /// Sequences waiting for a slot at most; more are refused.
    pub max_queue: usize,
    pub prefix_cache: bool,
    /// Stop tokens (end of sequence).
    pub eos: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull { limit: usize },
    ShuttingDown,
}

enum Msg {
    Submit(Vec<SeqRequest>),
    CancelAll,
}

/// Facts about the running engine.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// What the backend calls itself ("cpu, 2 threads", "cuda").
    pub backend: String,
    pub ctx: usize,
    pub vocab: usize,
    pub kv_blocks: usize,
    pub step_tokens: usize,
}

/// Handle to the engine thread.
pub struct Scheduler {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    closing: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub info: EngineInfo,
}

impl Scheduler {
    /// Starts the engine thread. `make` builds the backend, its KV layout
    /// and its name on that thread (backends need not be `Send`).
    pub fn spawn<B, F>(cfg: SchedulerConfig, metrics: Arc<Metrics>, make: F) -> Result<Self, String>
    where
        B: Backend + 'static,
        F: FnOnce() -> Result<(B, KvLayout, String), String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Msg>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<EngineInfo, String>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let q = Arc::clone(&queued);
        let max_queue = cfg.max_queue;
        let thread = std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || {
                let (backend, layout, name) = match make() {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let mut core = Core::new(backend, layout, cfg, metrics, q);
                let _ = ready_tx.send(Ok(core.info(name)));
                core.run(rx);
            })
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        let info = ready_rx
            .recv()
            .map_err(|_| "the engine thread stopped while loading".to_string())??;
        Ok(Scheduler {
            tx: Mutex::new(Some(tx)),
            queued,
            max_queue,
            closing: AtomicBool::new(false),
            thread: Mutex::new(Some(thread)),
            info,
        })
    }

    /// Queues the sequences of one request (all or none).
    pub fn submit(&self, seqs: Vec<SeqRequest>) -> Result<(), SubmitError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let n = seqs.len();
        let before = self.queued.fetch_add(n, Ordering::SeqCst);
        if before + n > self.max_queue {
            self.queued.fetch_sub(n, Ordering::SeqCst);
            return Err(SubmitError::QueueFull {
                limit: self.max_queue,
            });
        }
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref().map(|t| t.send(Msg::Submit(seqs))) {
            Some(Ok(())) => Ok(()),
            _ => {
                self.queued.fetch_sub(n, Ordering::SeqCst);
                Err(SubmitError::ShuttingDown)
            }
        }
    }

    /// Refuses new requests from now on.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Ends every queued and running sequence with an error event.
    pub fn cancel_all(&self) {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = guard.as_ref() {
            let _ = t.send(Msg::CancelAll);
        }
    }

    /// Stops the engine thread once its work is done (call `cancel_all`
    /// first to not wait for running sequences) and waits for it.
    pub fn shutdown(&self) {
        self.close();
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.cancel_all();
        self.shutdown();
    }
}

/// A sequence owned by the engine thread.
struct Seq {
    req: SeqRequest,
    /// Prompt, then every generated token (the last one is not in the cache yet).
    tokens: Vec<u32>,
    prompt_len: usize,
    cached: usize,
    generated: usize,
    sampler: Sampler,
    last_emit: Option<Instant>,
    slot: usize,
    /// Its KV was dropped to make room; it goes back to the queue.
    preempted: bool,
}

enum Outcome {
    Finish(Finish),
    Fail(String),
    Preempt,
}

#[derive(Default)]
struct Slot {
    busy: bool,
    /// Tokens whose KV the (idle) slot holds, for prefix reuse.
    cached: Vec<u32>,
    last_used: u64,
}

struct Core<B: Backend> {
    /// The backend and the KV block tables; the scheduler reserves and
    /// frees blocks itself (prefix cache, eviction, preemption).
    engine: Engine<B>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    vocab: usize,
    ctx: usize,
    step_tokens: usize,
    slots: Vec<Slot>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    clock: u64,
    lp_row: Vec<f32>,
    /// This step's feeds: (running index, tokens fed, wants logits).
    plan: Vec<(usize, usize, bool)>,
    /// Greedy settings and the ids they give, for steps sampled on the
    /// device (one per running sequence at most).
    greedy: Vec<DeviceSampling>,
    ids: Vec<u32>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<B: Backend> Core<B> {
    fn new(
        backend: B,
        layout: KvLayout,
        mut cfg: SchedulerConfig,
        metrics: Arc<Metrics>,
        queued: Arc<AtomicUsize>,
    ) -> Self {
        let vocab = backend.desc().vocab_size;
        cfg.parallel = cfg.parallel.clamp(1, layout.max_seqs);
        let step_tokens = cfg
            .step_tokens
            .min(backend.max_batch_tokens())
            .max(cfg.parallel.min(backend.max_batch_tokens()))
            .max(1);
        let ctx = layout.max_ctx;
        let total = layout.total_blocks();
        // One logits row per running sequence at most.
        let engine = Engine::with_logit_rows(backend, layout, cfg.parallel);
        let slots = (0..cfg.parallel).map(|_| Slot::default()).collect();
        metrics.kv_blocks_total.set(total as u64);
        metrics.kv_blocks_free.set(total as u64);
        metrics.slots_total.set(cfg.parallel as u64);
        Core {
            lp_row: vec![0.0; vocab],
            plan: Vec::with_capacity(cfg.parallel),
            greedy: vec![
                DeviceSampling {
                    temperature: 0.0,
                    top_k: 0,
                    seed: 0,
                };
                cfg.parallel
            ],
            ids: vec![0; cfg.parallel],
            engine,
            cfg,
            metrics,
            queued,
            vocab,
            ctx,
            step_tokens,
            slots,
            waiting: VecDeque::new(),
            running: Vec::new(),
            clock: 0,
        }
    }

    fn info(&self, backend: String) -> EngineInfo {
        EngineInfo {
            backend,
            ctx: self.ctx,
            vocab: self.vocab,
            kv_blocks: self.engine.kv().layout().total_blocks(),
            step_tokens: self.step_tokens,
        }
    }

    fn run(&mut self, rx: mpsc::Receiver<Msg>) {
        let mut open = true;
        loop {
            // Intake: block when idle, otherwise take what has arrived.
            if self.running.is_empty() && self.waiting.is_empty() {
                if !open {
                    break;
                }
                match rx.recv() {
                    Ok(m) => self.take(m),
                    Err(_) => break,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.take(m),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            self.step();
            self.publish();
        }
        self.publish();
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Submit(reqs) => {
                for req in reqs {
                    let prompt_len = req.prompt.len();
                    let mut tokens = Vec::with_capacity(prompt_len + req.max_tokens + 1);
                    tokens.extend_from_slice(&req.prompt);
                    let sampler = Sampler::new(req.params.clone(), self.vocab);
                    self.waiting.push_back(Seq {
                        req,
                        tokens,
                        prompt_len,
                        cached: 0,
                        generated: 0,
                        sampler,
                        last_emit: None,
                        slot: usize::MAX,
                        preempted: false,
                    });
                }
            }
            Msg::CancelAll => {
                while let Some(s) = self.waiting.pop_front() {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    self.fail_detached(s, "the server is shutting down");
                }
                while let Some(s) = self.running.pop() {
                    self.fail(s, "the server is shutting down");
                }
            }
        }
    }

    fn is_cancelled(s: &Seq) -> bool {
        s.req.cancel.load(Ordering::Relaxed) || s.req.tx.is_closed()
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        let mut dropped = Vec::new();
        self.waiting.retain_mut(|s| {
            if Self::is_cancelled(s) {
                dropped.push((s.req.index, s.req.tx.clone(), s.prompt_len));
                false
            } else {
                true
            }
        });
        let n = before - self.waiting.len();
        if n > 0 {
            self.queued.fetch_sub(n, Ordering::SeqCst);
        }
        for (index, tx, prompt_len) in dropped {
            self.metrics.finished_cancelled.inc();
            let _ = tx.send(SeqEvent::Done {
                index,
                finish: Finish::Cancelled,
                prompt_tokens: prompt_len,
                cached_tokens: 0,
                completion_tokens: 0,
            });
        }
        let mut i = 0;
        while i < self.running.len() {
            if Self::is_cancelled(&self.running[i]) {
                let s = self.running.swap_remove(i);
                self.finish(s, Finish::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Blocks of `group` held by the slot's table.
    fn held_blocks(&self, slot: usize) -> usize {
        (0..self.engine.kv().layout().groups.len())
            .map(|g| {
                self.engine
                    .kv()
                    .table(slot, g)
                    .iter()
                    .filter(|&&b| b != NO_BLOCK)
                    .count()
            })
            .sum()
    }

    fn free_blocks(&self) -> usize {
        (0..self.engine.kv().layout().groups.len())
            .map(|g| self.engine.kv().free_blocks(g))
            .sum()
    }

    /// Picks a slot for `tokens`: the idle slot with the longest reusable
    /// prefix, else an empty one, else the least recently used idle one.
    /// Returns (slot, positions kept).
    fn pick_slot(&mut self, tokens: &[u32]) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        if self.cfg.prefix_cache {
            for (i, s) in self.slots.iter().enumerate() {
                if s.busy || s.cached.is_empty() {
                    continue;
                }
                // Keep at least one token to feed: its logits start generation.
                let keep = common_prefix(&s.cached, tokens).min(tokens.len().saturating_sub(1));
                if keep > 0
                    && best.is_none_or(|(_, k)| keep > k)
                    && self.engine.kv().can_truncate(i, keep)
                {
                    best = Some((i, keep));
                }
            }
        }
        if let Some((slot, keep)) = best {
            // Checked by can_truncate above, so this cannot refuse.
            if self.engine.kv_mut().truncate(slot, keep) {
                return Some((slot, keep));
            }
        }
        let slot = self
            .slots
            .iter()
            .position(|s| !s.busy && s.cached.is_empty())
            .or_else(|| {
                self.slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.busy)
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(i, _)| i)
            })?;
        self.evict(slot);
        Some((slot, 0))
    }

    fn evict(&mut self, slot: usize) {
        self.engine.kv_mut().clear(slot);
        self.slots[slot].cached.clear();
    }

    /// Evicts idle cached slots (LRU first) until `need` blocks are free.
    fn make_room(&mut self, need: usize) -> bool {
        while self.free_blocks() < need {
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.busy && !s.cached.is_empty())
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i);
            match victim {
                Some(v) => self.evict(v),
                None => return false,
            }
        }
        true
    }

    fn blocks_for(&self, positions: usize) -> usize {
        let l = self.engine.kv().layout();
        let per_group = positions.div_ceil(l.block_size);
        l.groups
            .iter()
            .map(|g| match g.window {
                None => per_group,
                Some(w) => per_group.min((w + self.step_tokens).div_ceil(l.block_size) + 1),
            })
            .sum()
    }

    fn admit(&mut self) {
        while self.running.len() < self.cfg.parallel {
            let Some(front) = self.waiting.front() else {
                break;
            };
            // Room for the whole prompt (plus the first generated token).
            let need = self.blocks_for(front.tokens.len() + 1);
            let total = self.engine.kv().layout().total_blocks();
            if need > total {
                let Some(s) = self.waiting.pop_front() else {
                    break;
                };
                self.queued.fetch_sub(1, Ordering::SeqCst);
                let msg =
                    format!("the sequence needs {need} KV blocks, the pool has {total} in all");
                self.fail_detached(s, &msg);
                continue;
            }
            let tokens = front.tokens.clone();
            let Some((slot, keep)) = self.pick_slot(&tokens) else {
                break;
            };
            let held = self.held_blocks(slot);
            if !self.running.is_empty() && !self.make_room(need.saturating_sub(held)) {
                // Wait for running sequences to free blocks.
                if keep == 0 {
                    self.evict(slot);
                }
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, Ordering::SeqCst);
            self.clock += 1;
            let sl = &mut self.slots[slot];
            sl.busy = true;
            sl.cached.clear();
            sl.last_used = self.clock;
            s.slot = slot;
            if s.generated == 0 {
                // Not a resumed (preempted) sequence.
                s.cached = keep;
                self.metrics.prompt_tokens.add(s.prompt_len as u64);
                self.metrics.prompt_tokens_cached.add(keep as u64);
            }
            self.running.push(s);
        }
    }

    /// Reserves KV for `ri` up to `len` positions, evicting cached slots and
    /// then preempting the latest admitted sequence not planned in this step
    /// when the pool is full. Returns false when that cannot make room.
    fn reserve(&mut self, ri: usize, len: usize) -> Result<bool, EngineError> {
        loop {
            let slot = self.running[ri].slot;
            match self.engine.kv_mut().reserve(slot, len) {
                Ok(()) => return Ok(true),
                Err(EngineError::KvFull { .. }) => {}
                Err(e) => return Err(e),
            }
            let free_before = self.free_blocks();
            if self.make_room(free_before + 1) {
                continue;
            }
            let victim = (0..self.running.len())
                .filter(|&j| {
                    j != ri && !self.running[j].preempted && !self.plan.iter().any(|p| p.0 == j)
                })
                .max_by_key(|&j| self.slots[self.running[j].slot].last_used);
            let Some(v) = victim else {
                return Ok(false);
            };
            // Its blocks go back now; it leaves `running` after this step.
            let s = &mut self.running[v];
            s.preempted = true;
            self.engine.kv_mut().clear(s.slot);
            self.metrics.preemptions.inc();
        }
    }

    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        self.plan.clear();
        let mut budget = self.step_tokens;
        // Decoding sequences first (one token each), then prefill chunks, each
        // group oldest first.
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| {
            let s = &self.running[i];
            let todo = s.tokens.len() - self.engine.kv().len(s.slot);
            (todo > 1, self.slots[s.slot].last_used)
        });
        let mut out: Vec<(usize, Outcome)> = Vec::new();
        for &ri in &order {
            if budget == 0 {
                break;
            }
            if self.running[ri].preempted {
                continue;
            }
            let (fed, total) = {
                let s = &self.running[ri];
                (self.engine.kv().len(s.slot), s.tokens.len())
            };
            let n = (total - fed).min(budget);
            if n == 0 {
                continue;
            }
            match self.reserve(ri, fed + n) {
                Ok(true) => {}
                Ok(false) => {
                    // Nothing to preempt: it waits for planned sequences to
                    // finish, unless it is alone (the pool is too small).
                    if self.plan.is_empty()
                        && self.running.iter().filter(|s| !s.preempted).count() == 1
                    {
                        out.push((ri, Outcome::Fail("the KV cache is full".into())));
                    }
                    continue;
                }
                Err(e) => {
                    out.push((ri, Outcome::Fail(e.to_string())));
                    continue;
                }
            }
            self.plan.push((ri, n, fed + n == total));
            budget -= n;
        }
        if !self.plan.is_empty() {
            self.forward_and_sample(&mut out);
        }
        for (i, s) in self.running.iter().enumerate() {
            if s.preempted {
                out.push((i, Outcome::Preempt));
            }
        }
        out.sort_by_key(|o| o.0);
        out.dedup_by_key(|o| o.0);
        let mut preempted = Vec::new();
        for (ri, o) in out.into_iter().rev() {
            let s = self.running.swap_remove(ri);
            match o {
                Outcome::Finish(f) => self.finish(s, f),
                Outcome::Fail(m) => self.fail(s, &m),
                Outcome::Preempt => preempted.push(s),
            }
        }
        for mut s in preempted {
            let sl = &mut self.slots[s.slot];
            sl.busy = false;
            sl.cached.clear();
            s.slot = usize::MAX;
            s.preempted = false;
            self.queued.fetch_add(1, Ordering::SeqCst);
            self.waiting.push_front(s);
        }
    }

    /// Whether `s`'s next token can be picked on the device with the result
    /// the host would give: greedy, nothing applied to the logits first
    /// (bias, penalties), no logprobs. (Device sampling at a temperature
    /// draws other random numbers than the host, so a seeded request's
    /// output would depend on what else is in the step: not done.)
    fn device_greedy(s: &mut Seq) -> bool {
        // Greedy settings never touch the sampler's RNG in device_step.
        s.req.logprobs.is_none()
            && s.sampler.params.temperature <= 0.0
            && s.sampler.device_step().is_some()
    }

    /// Runs the planned step, commits it and samples every sequence whose
    /// last fed token gave logits — on the device when the backend can and
    /// every such sequence is greedy (only ids come back), else on the host
    /// from logits rows.
    fn forward_and_sample(&mut self, out: &mut Vec<(usize, Outcome)>) {
        let n_rows = self.plan.iter().filter(|p| p.2).count();
        let running = &mut self.running;
        let on_device = self.engine.backend.samples_on_device()
            && n_rows <= self.greedy.len()
            && self
                .plan
                .iter()
                .all(|&(ri, _, want)| !want || Self::device_greedy(&mut running[ri]));
        let kv = self.engine.kv();
        let feeds: Vec<Feed<'_>> = self
            .plan
            .iter()
            .map(|&(ri, n, want)| {
                let s = &self.running[ri];
                let fed = kv.len(s.slot);
                Feed {
                    slot: s.slot,
                    tokens: &s.tokens[fed..fed + n],
                    logits: if want { Logits::Last } else { Logits::None },
                }
            })
            .collect();
        let n_tokens: usize = feeds.iter().map(|f| f.tokens.len()).sum();
        let res = if on_device {
            self.engine
                .step_sampled(&feeds, &self.greedy[..n_rows], &mut self.ids[..n_rows])
                .map(|()| None)
        } else {
            self.engine.step(&feeds).map(Some)
        };
        self.metrics.engine_steps.inc();
        self.metrics.observe_batch(n_tokens);
        let mut rows = match res {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("engine error: {e}");
                for p in &self.plan {
                    out.push((p.0, Outcome::Fail(msg.clone())));
                }
                return;
            }
        };
        // Logits rows follow feed order.
        let now = Instant::now();
        let vocab = self.vocab;
        let mut row = 0;
        for &(ri, _, want) in &self.plan {
            if !want {
                continue;
            }
            let s = &mut self.running[ri];
            let id = match rows.as_deref_mut() {
                Some(rows) => {
                    let logits = &mut rows[row * vocab..(row + 1) * vocab];
                    if s.req.logprobs.is_some() {
                        self.lp_row.copy_from_slice(logits);
                    }
                    s.sampler.sample(logits, &s.tokens)
                }
                None => self.ids[row],
            };
            row += 1;
            match s.last_emit {
                None => self
                    .metrics
                    .observe_ttft(now.duration_since(s.req.arrived).as_secs_f64()),
                Some(t) => self
                    .metrics
                    .observe_itl(now.duration_since(t).as_secs_f64()),
            }
            s.last_emit = Some(now);
            if !s.req.ignore_eos && self.cfg.eos.contains(&id) {
                out.push((ri, Outcome::Finish(Finish::Stop)));
                continue;
            }
            let logprob = s.req.logprobs.map(|k| logprob_of(&self.lp_row, id, k));
            s.tokens.push(id);
            s.generated += 1;
            self.metrics.generation_tokens.inc();
            let sent = s.req.tx.send(SeqEvent::Token {
                index: s.req.index,
                id,
                logprob,
            });
            if sent.is_err() {
                out.push((ri, Outcome::Finish(Finish::Cancelled)));
            } else if s.generated >= s.req.max_tokens || s.tokens.len() > self.ctx {
                out.push((ri, Outcome::Finish(Finish::Length)));
            }
        }
    }

    /// Ends a running sequence: reports, and leaves its KV as prefix cache
    /// (or frees it).
    fn finish(&mut self, s: Seq, f: Finish) {
        match f {
            Finish::Stop => self.metrics.finished_stop.inc(),
            Finish::Length => self.metrics.finished_length.inc(),
            Finish::Cancelled => self.metrics.finished_cancelled.inc(),
        }
        let tx = s.req.tx.clone();
        let done = SeqEvent::Done {
            index: s.req.index,
            finish: f,
            prompt_tokens: s.prompt_len,
            cached_tokens: s.cached,
            completion_tokens: s.generated,
        };
        self.release(s);
        // Gauges first: a client that got its answer sees them updated.
        self.publish();
        let _ = tx.send(done);
    }

    fn release(&mut self, s: Seq) {
        if s.slot >= self.slots.len() {
            return;
        }
        let fed = self.engine.kv().len(s.slot);
        let sl = &mut self.slots[s.slot];
        sl.busy = false;
        if self.cfg.prefix_cache && fed > 0 {
            let mut t = s.tokens;
            t.truncate(fed);
            sl.cached = t;
        } else {
            sl.cached.clear();
            self.engine.kv_mut().clear(s.slot);
        }
    }

    fn fail(&mut self, s: Seq, msg: &str) {
        self.metrics.finished_error.inc();
        if s.slot < self.slots.len() {
            let slot = s.slot;
            self.slots[slot].busy = false;
            self.evict(slot);
        }
        self.publish();
        let _ = s.req.tx.send(SeqEvent::Error {
            index: s.req.index,
            message: msg.to_string(),
        });
    }

    fn fail_detached(&mut self, s: Seq, msg: &str) {
        self.metrics.finished_error.inc();
        let _ = s.req.tx.send(SeqEvent::Error {
            index: s.req.index,
            message: msg.to_string(),
        });
    }

    fn publish(&self) {
        let m = &self.metrics;
        let total = self.engine.kv().layout().total_blocks();
        let free = self.free_blocks();
        let cached: usize = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy)
            .map(|(i, _)| self.held_blocks(i))
            .sum();
        m.kv_blocks_used.set((total - free) as u64);
        m.kv_blocks_free.set(free as u64);
        m.kv_blocks_cached.set(cached as u64);
        m.running.set(self.running.len() as u64);
        m.queue_depth.set(self.queued.load(Ordering::SeqCst) as u64);
    }
}

/// Log-softmax of the raw logits: the chosen token's logprob and the `k` best.
fn logprob_of(row: &[f32], id: u32, k: usize) -> TokenLogprob {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &l) in row.iter().enumerate() {
            if top.len() < k || l > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, v)| v >= l);
                top.insert(at, (i as u32, l));
                top.truncate(k);
            }
        }
    }
    TokenLogprob {
        logprob: row.get(id as usize).map_or(f32::NEG_INFINITY, |&l| l - lse),
        top: top.into_iter().map(|(i, l)| (i, l - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_normalized() {
        let row = [1.0f32, 3.0, 2.0, 0.0];
        let lp = logprob_of(&row, 2, 2);
        let total: f32 = row.iter().map(|&l| (l - 2.0 + lp.logprob).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((lp.top[1].1 - lp.logprob).abs() < 1e-6);
    }

    #[test]
    fn prefix() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
