//! Ids of queued sampled steps copied back into page-locked host memory, so
//! the copy runs in stream order without the host waiting for it: the host
//! queues the next step first and waits only on the older step's event.

use std::collections::VecDeque;

use cudarc::driver::result as dr;
use cudarc::driver::sys;

use crate::gpu::{CuResult, CudaError, Gpu};

/// Steps that may be queued at once.
pub(crate) const SLOTS: usize = 2;

pub(crate) struct PinnedIds {
    host: [*mut u32; SLOTS],
    events: [sys::CUevent; SLOTS],
    cap: usize,
    /// (slot, ids) of the queued steps, oldest first.
    queued: VecDeque<(usize, usize)>,
    next: usize,
}

fn err(what: &str, e: dr::DriverError) -> CudaError {
    CudaError(format!("CUDA {what}: {e:?}"))
}

impl PinnedIds {
    /// Room for `cap` ids per step. The context must be current.
    pub(crate) fn new(cap: usize) -> CuResult<PinnedIds> {
        let mut p = PinnedIds {
            host: [std::ptr::null_mut(); SLOTS],
            events: [std::ptr::null_mut(); SLOTS],
            cap,
            queued: VecDeque::with_capacity(SLOTS),
            next: 0,
        };
        for i in 0..SLOTS {
            // SAFETY: a fresh page-locked allocation, freed in Drop.
            p.host[i] = unsafe { dr::malloc_host(cap.max(1) * 4, 0) }
                .map_err(|e| err("page-locked allocation", e))? as *mut u32;
            p.events[i] = dr::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| err("event", e))?;
        }
        Ok(p)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.queued.len() == SLOTS
    }

    /// Queues the copy of `k` ids from device memory `src` after the work
    /// already on `gpu`'s stream.
    pub(crate) fn push(&mut self, gpu: &Gpu, src: u64, k: usize) -> CuResult<()> {
        if self.is_full() || k > self.cap {
            return Err(CudaError(format!(
                "{} sampled steps already queued (or {k} ids > {})",
                self.queued.len(),
                self.cap
            )));
        }
        let slot = self.next;
        // SAFETY: host[slot] holds cap >= k u32; it is not read until the
        // event recorded after the copy has completed.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.host[slot], k);
            dr::memcpy_dtoh_async(dst, src, gpu.stream).map_err(|e| err("download", e))?;
            dr::event::record(self.events[slot], gpu.stream).map_err(|e| err("event", e))?;
        }
        self.queued.push_back((slot, k));
        self.next = (slot + 1) % SLOTS;
        Ok(())
    }

    /// Waits for the oldest queued copy and returns its ids in `ids`.
    pub(crate) fn pop(&mut self, ids: &mut [u32]) -> CuResult<()> {
        let (slot, k) = self
            .queued
            .pop_front()
            .ok_or_else(|| CudaError("no sampled step is queued".into()))?;
        // SAFETY: a live event; after it, host[slot] holds k ids.
        unsafe {
            dr::event::synchronize(self.events[slot]).map_err(|e| err("event wait", e))?;
            let src = std::slice::from_raw_parts(self.host[slot], k);
            let n = k.min(ids.len());
            ids[..n].copy_from_slice(&src[..n]);
        }
        Ok(())
    }
}

impl Drop for PinnedIds {
    fn drop(&mut self) {
        for i in 0..SLOTS {
            // SAFETY: allocated in new (the owner binds the context first).
            unsafe {
                if !self.events[i].is_null() {
                    let _ = dr::event::destroy(self.events[i]);
                }
                if !self.host[i].is_null() {
                    let _ = dr::free_host(self.host[i] as *mut std::ffi::c_void);
                }
            }
        }
    }
}
