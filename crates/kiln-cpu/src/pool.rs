//! A small persistent thread pool: `run(f)` calls `f(i)` once on each of
//! `n` threads (the caller is thread 0) and returns when all are done.
//! Dispatch takes a mutex and two condition variables; nothing allocates.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

type JobRef = *const (dyn Fn(usize) + Sync + 'static);

#[derive(Clone, Copy)]
struct Job(JobRef);
// SAFETY: the pointee is `Sync` and outlives every use (see `run`).
unsafe impl Send for Job {}

struct State {
    job: Option<Job>,
    generation: u64,
    pending: usize,
    quit: bool,
}

struct Shared {
    state: Mutex<State>,
    go: Condvar,
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// `n` threads in all (at least 1), the caller's included.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                generation: 0,
                pending: 0,
                quit: false,
            }),
            go: Condvar::new(),
            done: Condvar::new(),
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
            shared,
            handles,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n
    }

    /// Calls `f(i)` for `i` in `0..n_threads()`, in parallel; returns when
    /// all calls have returned. A panic in any call is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n == 1 {
            f(0);
            return;
        }
        // SAFETY: the lifetime is erased only while workers may call `f`:
        // this function does not return before `pending` is back to 0, and
        // clears the job before that.
        let job = Job(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), JobRef>(
                f as *const (dyn Fn(usize) + Sync),
            )
        });
        {
            let mut st = self.shared.lock();
            st.job = Some(job);
            st.generation = st.generation.wrapping_add(1);
            st.pending = self.n - 1;
        }
        self.shared.go.notify_all();
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        {
            let mut st = self.shared.lock();
            while st.pending > 0 {
                st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.job = None;
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
    }
}

fn worker(i: usize, s: &Shared) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = s.lock();
            while st.generation == seen && !st.quit {
                st = s.go.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.quit {
                return;
            }
            seen = st.generation;
            st.job
        };
        if let Some(Job(f)) = job {
            // SAFETY: see `ThreadPool::run`.
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(i) }));
        }
        let mut st = s.lock();
        st.pending -= 1;
        if st.pending == 0 {
            s.done.notify_one();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.lock().quit = true;
        self.shared.go.notify_all();
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
    use std::sync::atomic::{AtomicUsize, Ordering};

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
