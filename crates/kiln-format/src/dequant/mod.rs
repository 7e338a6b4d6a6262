//! Reference dequantization (being written).
