//! A small persistent thread pool built for per-token work: `run(f)` calls
//! `f(i)` once on each of `n` threads (the caller is thread 0) and returns
//! when all are done.
//!
//! Dispatch is one atomic store; workers spin on it for a while (a decode
//! step dispatches every few tens of microseconds), then park; the caller
//! spins on a counter for completion. Nothing allocates and no lock is
//! taken while threads are busy.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

type JobRef = *const (dyn Fn(usize) + Sync + 'static);

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(300);
/// How long the caller spins on unfinished workers before it parks.
const WAIT_SPIN: Duration = Duration::from_micros(50);

struct Shared {
    /// Written by `run` only while no worker reads it (between a completed
    /// dispatch and the next `generation` bump).
    job: UnsafeCell<Option<JobRef>>,
    generation: AtomicUsize,
    pending: AtomicUsize,
    quit: AtomicBool,
    /// Per worker: parked (or about to park), so `run` must unpark it.
    parked: Vec<AtomicBool>,
    /// The thread in `run`, written like `job`; parked while it waits for
    /// slow workers (a busy machine), woken by the last one to finish.
    caller: UnsafeCell<Option<Thread>>,
    caller_parked: AtomicBool,
}

// SAFETY: `job` is published through `generation` (release/acquire) and
// only written while no worker holds it; the pointee is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    handles: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// `n` threads in all (at least 1), the caller's included.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            generation: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            parked: (0..n).map(|_| AtomicBool::new(false)).collect(),
            caller: UnsafeCell::new(None),
            caller_parked: AtomicBool::new(false),
        });
        let mut handles = Vec::new();
        for i in 1..n {
            let s = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-cpu-{i}"))
                .spawn(move || worker(i, &s));
            match spawned {
                Ok(h) => handles.push(h),
                Err(_) => break,
            }
        }
        ThreadPool {
            n: handles.len() + 1,
            threads: handles.iter().map(|h| h.thread().clone()).collect(),
            shared,
            handles,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n
    }

    /// Calls `f(i)` for `i` in `0..n_threads()`, in parallel; returns when
    /// all calls have returned. A panic in the caller's call is re-raised
    /// here (after the workers finish); a worker's panic is contained.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n == 1 {
            f(0);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only while workers may call `f`:
        // this function does not return before `pending` is back to 0.
        // No worker reads `job` now: the previous run waited for all.
        unsafe {
            *s.job.get() = Some(std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                JobRef,
            >(f as *const (dyn Fn(usize) + Sync)));
            let me = &mut *s.caller.get();
            if me
                .as_ref()
                .is_none_or(|t| t.id() != std::thread::current().id())
            {
                *me = Some(std::thread::current());
            }
        }
        s.pending.store(self.n - 1, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::SeqCst);
        for (i, t) in self.threads.iter().enumerate() {
            if s.parked[i + 1].load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let start = Instant::now();
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins & 63 != 0 || start.elapsed() < WAIT_SPIN {
                std::hint::spin_loop();
                continue;
            }
            s.caller_parked.store(true, Ordering::SeqCst);
            if s.pending.load(Ordering::SeqCst) != 0 {
                std::thread::park_timeout(Duration::from_millis(1));
            }
            s.caller_parked.store(false, Ordering::SeqCst);
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
    }
}

fn worker(i: usize, s: &Shared) {
    let mut seen = 0usize;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.quit.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins & 63 != 0 || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            s.parked[i].store(true, Ordering::SeqCst);
            if s.generation.load(Ordering::SeqCst) == seen && !s.quit.load(Ordering::SeqCst) {
                std::thread::park();
            }
            s.parked[i].store(false, Ordering::SeqCst);
        }
        // SAFETY: published by the generation bump we just saw (acquire);
        // `run` keeps the pointee alive until `pending` reaches 0.
        if let Some(f) = unsafe { *s.job.get() } {
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(i) }));
        }
        if s.pending.fetch_sub(1, Ordering::SeqCst) == 1 && s.caller_parked.load(Ordering::SeqCst) {
            // SAFETY: written before the generation bump we saw; `run` is
            // still waiting (pending was not 0), so nothing rewrites it.
            if let Some(t) = unsafe { &*s.caller.get() } {
                t.unpark();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A raw pointer that threads may share to write disjoint parts of a buffer.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub *mut f32);
// SAFETY: users write disjoint index ranges only.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper).
    #[inline(always)]
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parks_and_wakes() {
        let pool = ThreadPool::new(2);
        let hits = AtomicUsize::new(0);
        for k in 0..5 {
            if k % 2 == 1 {
                // Long enough for the worker to park.
                std::thread::sleep(Duration::from_millis(5));
            }
            pool.run(&|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(hits.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn every_thread_runs_once_per_call() {
        let pool = ThreadPool::new(3);
        let hits = AtomicUsize::new(0);
        for _ in 0..1000 {
            pool.run(&|i| {
                hits.fetch_add(1 << (8 * i), Ordering::Relaxed);
            });
        }
        assert_eq!(
            hits.load(Ordering::Relaxed),
            1000 * (1 + (1 << 8) + (1 << 16))
        );
    }
}
