//! The paged KV cache's bookkeeping: a pool of fixed-size blocks per layer
//! group, and per sequence a block table per group.
//!
//! Layers that attend the same positions share a group: all global layers
//! form one, all sliding-window layers (of one window size) another. A block
//! of a group holds `block_size` positions of K and V for every layer of the
//! group. A sliding group releases the blocks that fall out of its window,
//! so its pool is sized from the window, not the context.
//!
//! This module only hands out block ids; the backend owns the storage they
//! index (`[block][layer in group][position in block][kv_dim]`).

use crate::arch::ArchDescriptor;
use crate::error::{EngineError, Result};

/// A released (or never allocated) block in a table.
pub const NO_BLOCK: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq)]
pub struct KvGroup {
    /// Layers (model indices) whose K/V the group's blocks hold.
    pub layers: Vec<usize>,
    /// Positions a query sees (including its own); `None`: all.
    pub window: Option<usize>,
    /// Blocks in the pool.
    pub n_blocks: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KvLayout {
    pub block_size: usize,
    /// K (and V) floats per position per layer.
    pub kv_dim: usize,
    /// Sequences that can be live at once.
    pub max_seqs: usize,
    /// Positions per sequence (the context size).
    pub max_ctx: usize,
    pub groups: Vec<KvGroup>,
    /// Per model layer: (group, index of the layer within the group).
    pub layer_slot: Vec<(usize, usize)>,
}

impl KvLayout {
    /// A pool that always fits `max_seqs` sequences of `max_ctx` positions
    /// each, fed in chunks of at most `max_chunk` tokens.
    pub fn plan(
        desc: &ArchDescriptor,
        max_ctx: usize,
        max_seqs: usize,
        block_size: usize,
        max_chunk: usize,
    ) -> Self {
        let block_size = block_size.max(1);
        let max_ctx = max_ctx.max(1);
        let mut groups: Vec<KvGroup> = Vec::new();
        let mut layer_slot = Vec::with_capacity(desc.n_layers);
        for (i, l) in desc.layers.iter().enumerate() {
            let g = match groups.iter().position(|g| g.window == l.window) {
                Some(g) => g,
                None => {
                    let full = max_ctx.div_ceil(block_size);
                    let per_seq = match l.window {
                        // live positions: window - 1 old ones plus a chunk.
                        Some(w) => (w.saturating_sub(1) + max_chunk.max(1))
                            .div_ceil(block_size)
                            .saturating_add(1)
                            .min(full),
                        None => full,
                    };
                    groups.push(KvGroup {
                        layers: Vec::new(),
                        window: l.window,
                        n_blocks: per_seq * max_seqs.max(1),
                    });
                    groups.len() - 1
                }
            };
            layer_slot.push((g, groups[g].layers.len()));
            groups[g].layers.push(i);
        }
        KvLayout {
            block_size,
            kv_dim: desc.kv_dim(),
            max_seqs: max_seqs.max(1),
            max_ctx,
            groups,
            layer_slot,
        }
    }

    /// f32 elements of K (or of V) per block of `group`.
    pub fn block_elems(&self, group: usize) -> usize {
        self.groups[group].layers.len() * self.block_size * self.kv_dim
    }

    /// KV blocks in the pool, all groups together.
    pub fn total_blocks(&self) -> usize {
        self.groups.iter().map(|g| g.n_blocks).sum()
    }

    /// Bytes of K and V storage for the whole pool (f32).
    pub fn total_bytes(&self) -> usize {
        (0..self.groups.len())
            .map(|g| self.groups[g].n_blocks * self.block_elems(g) * 2 * 4)
            .sum()
    }
}

/// How K or V is stored in a backend's KV cache: f32 (the default) or f16
/// (half the memory and half the bytes attention reads; values rounded to
/// nearest even when stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
}

impl KvType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            other => Err(format!(
                "KV cache type '{other}' is not supported (f32 or f16)"
            )),
        }
    }
}

/// Element types of the KV cache (default: f32 for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// f16 for both K and V.
    pub const F16: KvTypes = KvTypes {
        k: KvType::F16,
        v: KvType::F16,
    };

    /// Bytes of K and V storage for `layout` with these types.
    pub fn total_bytes(&self, layout: &KvLayout) -> usize {
        // `KvLayout::total_bytes` counts f32 for both.
        layout.total_bytes() / 8 * (self.k.size() + self.v.size())
    }
}

#[derive(Debug, Clone)]
struct SeqKv {
    active: bool,
    /// Positions written (and committed) so far.
    len: usize,
    /// Per group: block id per logical block (`NO_BLOCK` once released).
    tables: Vec<Vec<u32>>,
}

/// Block tables of every sequence slot and the free lists of the pool.
#[derive(Debug, Clone)]
pub struct KvTables {
    layout: KvLayout,
    free: Vec<Vec<u32>>,
    seqs: Vec<SeqKv>,
}

impl KvTables {
    pub fn new(layout: KvLayout) -> Self {
        let free = layout
            .groups
            .iter()
            .map(|g| (0..g.n_blocks as u32).rev().collect())
            .collect();
        let per_seq = layout.max_ctx.div_ceil(layout.block_size);
        let seqs = (0..layout.max_seqs)
            .map(|_| SeqKv {
                active: false,
                len: 0,
                tables: layout
                    .groups
                    .iter()
                    .map(|_| Vec::with_capacity(per_seq))
                    .collect(),
            })
            .collect();
        KvTables { layout, free, seqs }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn seq(&self, slot: usize) -> Result<&SeqKv> {
        self.seqs.get(slot).ok_or_else(|| {
            EngineError::Input(format!(
                "sequence slot {slot} does not exist (the cache has {} slots)",
                self.seqs.len()
            ))
        })
    }

    /// Positions in the cache of sequence `slot` (0 for unknown slots).
    pub fn len(&self, slot: usize) -> usize {
        self.seqs.get(slot).map_or(0, |s| s.len)
    }

    pub fn is_active(&self, slot: usize) -> bool {
        self.seqs.get(slot).is_some_and(|s| s.active)
    }

    /// A slot with no live sequence.
    pub fn free_slot(&self) -> Option<usize> {
        self.seqs.iter().position(|s| !s.active)
    }

    /// Block table of `slot` in `group` (hot path: no checks beyond bounds).
    #[inline]
    pub fn table(&self, slot: usize, group: usize) -> &[u32] {
        self.seqs
            .get(slot)
            .and_then(|s| s.tables.get(group))
            .map_or(&[], |t| t.as_slice())
    }

    /// Free blocks left in `group`.
    pub fn free_blocks(&self, group: usize) -> usize {
        self.free.get(group).map_or(0, Vec::len)
    }

    /// Makes sure positions `[len, new_len)` of `slot` have blocks in every
    /// group, activating the slot. Allocates nothing on the heap.
    pub fn reserve(&mut self, slot: usize, new_len: usize) -> Result<()> {
        self.seq(slot)?;
        if new_len > self.layout.max_ctx {
            return Err(EngineError::Input(format!(
                "sequence {slot} needs {new_len} positions, the context holds {}",
                self.layout.max_ctx
            )));
        }
        let bs = self.layout.block_size;
        let need = new_len.div_ceil(bs);
        let s = &mut self.seqs[slot];
        s.active = true;
        for (g, table) in s.tables.iter_mut().enumerate() {
            while table.len() < need {
                let b = self.free[g].pop().ok_or(EngineError::KvFull {
                    group: g,
                    blocks: self.layout.groups[g].n_blocks,
                })?;
                table.push(b);
            }
        }
        Ok(())
    }

    /// Records that positions `< new_len` are written, and releases the
    /// blocks of windowed groups no later query can see.
    pub fn commit(&mut self, slot: usize, new_len: usize) {
        let bs = self.layout.block_size;
        let Some(s) = self.seqs.get_mut(slot) else {
            return;
        };
        s.len = new_len;
        for (g, table) in s.tables.iter_mut().enumerate() {
            let Some(w) = self.layout.groups[g].window else {
                continue;
            };
            // The next query (position new_len) sees keys >= earliest.
            let earliest = (new_len + 1).saturating_sub(w);
            let dead = (earliest / bs).min(table.len());
            for b in table[..dead].iter_mut().rev() {
                if *b == NO_BLOCK {
                    break;
                }
                self.free[g].push(*b);
                *b = NO_BLOCK;
            }
        }
    }

    /// Whether [`truncate`](Self::truncate)`(slot, new_len)` would succeed:
    /// every windowed group still holds the keys a query at `new_len` sees.
    pub fn can_truncate(&self, slot: usize, new_len: usize) -> bool {
        let Some(s) = self.seqs.get(slot) else {
            return false;
        };
        if new_len >= s.len || new_len == 0 {
            return true;
        }
        let bs = self.layout.block_size;
        s.tables.iter().enumerate().all(|(g, table)| {
            self.layout.groups[g].window.is_none_or(|w| {
                let earliest = (new_len + 1).saturating_sub(w);
                !table[earliest / bs..new_len.div_ceil(bs)].contains(&NO_BLOCK)
            })
        })
    }

    /// Forgets positions `>= new_len` of `slot` (their blocks return to the
    /// pool), so the sequence can continue differently from there: a chat
    /// turn whose history re-tokenizes differently, a shared prefix.
    /// Returns false, changing nothing, when a windowed group has already
    /// released keys the next query at `new_len` would need; the caller then
    /// starts the sequence over.
    pub fn truncate(&mut self, slot: usize, new_len: usize) -> bool {
        if !self.can_truncate(slot, new_len) {
            return false;
        }
        if new_len >= self.len(slot) {
            return true;
        }
        if new_len == 0 {
            self.clear(slot);
            return true;
        }
        let bs = self.layout.block_size;
        let keep = new_len.div_ceil(bs);
        let s = &mut self.seqs[slot];
        for (g, table) in s.tables.iter_mut().enumerate() {
            while table.len() > keep {
                if let Some(b) = table.pop().filter(|&b| b != NO_BLOCK) {
                    self.free[g].push(b);
                }
            }
        }
        s.len = new_len;
        true
    }

    /// Drops the sequence in `slot`, returning its blocks to the pool.
    pub fn clear(&mut self, slot: usize) {
        let Some(s) = self.seqs.get_mut(slot) else {
            return;
        };
        for (g, table) in s.tables.iter_mut().enumerate() {
            for &b in table.iter() {
                if b != NO_BLOCK {
                    self.free[g].push(b);
                }
            }
            table.clear();
        }
        s.len = 0;
        s.active = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(windows: &[Option<usize>]) -> ArchDescriptor {
        ArchDescriptor::test_tiny(windows, 64)
    }

    #[test]
    fn groups_and_sizes() {
        let d = desc(&[Some(6), Some(6), None, Some(6)]);
        let l = KvLayout::plan(&d, 64, 2, 4, 8);
        assert_eq!(l.groups.len(), 2);
        assert_eq!(l.groups[0].layers, vec![0, 1, 3]);
        assert_eq!(l.groups[1].layers, vec![2]);
        assert_eq!(l.layer_slot[3], (0, 2));
        assert_eq!(l.groups[1].n_blocks, 2 * 16);
        // (5 + 8) / 4 -> 4, + 1
        assert_eq!(l.groups[0].n_blocks, 2 * 5);
    }

    #[test]
    fn window_releases_blocks() {
        let d = desc(&[Some(6), None]);
        let mut t = KvTables::new(KvLayout::plan(&d, 64, 1, 4, 1));
        let total = t.free_blocks(0);
        for n in 1..=40 {
            t.reserve(0, n).unwrap();
            t.commit(0, n);
            // the next query at position n needs keys n-5..n
            let table = t.table(0, 0);
            for p in (n + 1).saturating_sub(6)..n {
                assert_ne!(table[p / 4], NO_BLOCK, "n={n} p={p}");
            }
            assert!(total - t.free_blocks(0) <= 3);
        }
        assert_eq!(t.table(0, 1).len(), 10);
        t.clear(0);
        assert_eq!(t.free_blocks(0), total);
        assert_eq!(t.free_blocks(1), 16);
    }

    #[test]
    fn truncate_frees_the_tail_and_respects_windows() {
        // Global layer only: the tail's blocks return to the pool.
        let mut t = KvTables::new(KvLayout::plan(&desc(&[None]), 64, 1, 4, 1));
        let free = t.free_blocks(0);
        t.reserve(0, 20).unwrap();
        t.commit(0, 20);
        assert!(t.truncate(0, 9));
        assert_eq!((t.len(0), t.table(0, 0).len()), (9, 3));
        assert_eq!(t.free_blocks(0), free - 3);
        t.reserve(0, 12).unwrap();
        t.commit(0, 12);
        assert!(t.truncate(0, 0));
        assert_eq!(t.free_blocks(0), free);

        // Window 6, block 4: after 20 tokens keys < 12 are gone, so a query
        // at position 17 (keys 12..) is fine but one at 15 (keys 10..) is not.
        let mut t = KvTables::new(KvLayout::plan(&desc(&[Some(6), None]), 64, 1, 4, 1));
        for n in 1..=20 {
            t.reserve(0, n).unwrap();
            t.commit(0, n);
        }
        assert!(!t.truncate(0, 15));
        assert_eq!(t.len(0), 20, "a refused truncation changes nothing");
        assert!(t.truncate(0, 17));
        assert_eq!(t.len(0), 17);
        assert!(t.truncate(0, 30), "growing is a no-op");
        assert_eq!(t.len(0), 17);
    }

    #[test]
    fn full_pool_and_context_are_errors() {
        let d = desc(&[None]);
        let mut t = KvTables::new(KvLayout::plan(&d, 8, 1, 4, 8));
        assert!(t.reserve(0, 9).is_err());
        t.reserve(0, 8).unwrap();
        assert!(t.reserve(1, 1).is_err());
    }
}
