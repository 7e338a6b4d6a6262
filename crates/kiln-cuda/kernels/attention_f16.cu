// The attention kernels for an f16 K/V cache (attention.cu; `_h`).
ATTENTION_KERNELS(_h, u16)
// The tensor-core walk reads f16 pairs as the cache holds them: f16 only.
ATTENTION_TC(_h, u16)
