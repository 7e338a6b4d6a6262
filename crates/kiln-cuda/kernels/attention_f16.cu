// The attention kernels for an f16 K/V cache (attention.cu; `_h`).
ATTENTION_KERNELS(_h, u16)
