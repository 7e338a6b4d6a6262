//! The decode step (forward + sampling) allocates nothing: a counting global
//! allocator watches every thread while decode runs.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{engine, fixtures};
use kiln_core::{EngineOptions, Sampler, SamplerParams};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_step_allocates_nothing() {
    // gemma3: sliding-window layers release KV blocks during decode.
    let path = fixtures().join("tiny/gemma3/gguf/gemma3-f32.gguf");
    let opts = EngineOptions {
        ctx: 64,
        max_seqs: 2,
        block_size: 4,
        max_chunk: 8,
    };
    let mut e = engine(&path, opts, 2);
    let mut sampler = Sampler::new(
        SamplerParams {
            repeat_penalty: 1.1,
            seed: 3,
            ..Default::default()
        },
        e.vocab_size(),
    );
    let mut history: Vec<u32> = Vec::with_capacity(64);
    history.extend_from_slice(&[5, 9, 17, 33, 65, 129, 200, 300, 7, 8]);
    let mut tok = {
        let l = e.prefill(0, &history).unwrap();
        sampler.sample(l, &history)
    };
    e.prefill(1, &[4, 5, 6]).unwrap();
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..40 {
        history.push(tok);
        let l = e.decode(0, tok).unwrap();
        tok = sampler.sample(l, &history);
    }
    // Two sequences in one step.
    for _ in 0..5 {
        let l = e.decode_batch(&[(0, tok), (1, 7)]).unwrap();
        tok = sampler.sample(&mut l[..384], &history);
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "the decode loop allocated"
    );
    assert_eq!(e.seq_len(0), 10 + 45);
}
