// The attention kernels for an f32 K/V cache (attention.cu).
ATTENTION_KERNELS(, float)
