use super::*;

/// Small deterministic PRNG (xorshift64*), so the sweep needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn supported() -> Vec<GgmlType> {
    GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| is_supported(t))
        .collect()
}

#[test]
fn support_table() {
    // Everything but Q8_1 (see the module docs).
    assert_eq!(supported().len(), GgmlType::ALL.len() - 1);
    assert!(!is_supported(GgmlType::Q8_1));
    assert_eq!(
        dequantize(GgmlType::Q8_1, &[0; 40], &mut [0.0; 32]),
        Err(DequantError::Unsupported(GgmlType::Q8_1))
    );
    assert_eq!(
        dequantize_to_vec(GgmlType::Q8_1, &[]),
        Err(DequantError::Unsupported(GgmlType::Q8_1))
    );
}

#[test]
fn length_errors() {
    for ty in supported() {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let data = vec![0u8; 2 * ts];
        let mut out = vec![0.0f32; 2 * bs + 1];
        // Right sizes work, empty input too.
        assert_eq!(dequantize(ty, &data, &mut out[..2 * bs]), Ok(()), "{ty}");
        assert_eq!(dequantize(ty, &[], &mut []), Ok(()), "{ty}");
        assert_eq!(dequantize_to_vec(ty, &data).map(|v| v.len()), Ok(2 * bs));
        // Output one too long or too short.
        for n in [2 * bs + 1, 2 * bs - 1, bs, 0] {
            assert_eq!(
                dequantize(ty, &data, &mut out[..n]),
                Err(DequantError::Length {
                    ty,
                    bytes: 2 * ts,
                    elements: n
                }),
                "{ty} out {n}"
            );
        }
        // Input not whole blocks (only possible when a block has > 1 byte).
        if ts > 1 {
            for n in [2 * ts - 1, ts + 1, 1] {
                assert!(
                    matches!(
                        dequantize(ty, &data[..n], &mut out[..2 * bs]),
                        Err(DequantError::Length { bytes, .. }) if bytes == n
                    ),
                    "{ty} bytes {n}"
                );
                assert!(matches!(
                    dequantize_to_vec(ty, &data[..n]),
                    Err(DequantError::Length { .. })
                ));
            }
        }
    }
}

#[test]
fn error_messages_name_type_and_numbers() {
    let e = DequantError::Length {
        ty: GgmlType::Q4K,
        bytes: 145,
        elements: 256,
    };
    let msg = e.to_string();
    for part in ["Q4_K", "145", "256", "144"] {
        assert!(msg.contains(part), "{msg}");
    }
    let msg = DequantError::Unsupported(GgmlType::Q8_1).to_string();
    assert!(msg.contains("Q8_1") && msg.contains('9'), "{msg}");
    let _: &dyn std::error::Error = &e;
}

#[test]
fn dequantize_row_picks_the_row() {
    let ty = GgmlType::Q4_0;
    let mut rng = Rng(7);
    let data = rng.bytes(3 * 2 * ty.type_size()); // 3 rows of 64
    let all = dequantize_to_vec(ty, &data).unwrap();
    let mut row = vec![0.0f32; 64];
    for r in 0..3 {
        dequantize_row(ty, &data, 64, r, &mut row).unwrap();
        let want = &all[64 * r..64 * (r + 1)];
        assert!(row
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    assert!(matches!(
        dequantize_row(ty, &data, 64, 3, &mut row),
        Err(DequantError::Length { .. })
    ));
    assert!(dequantize_row(ty, &data, 48, 0, &mut row[..48]).is_err());
    assert!(dequantize_row(ty, &data, 64, usize::MAX, &mut row).is_err());
    assert!(dequantize_row(ty, &data, 64, 0, &mut row[..32]).is_err());
}

/// Random bytes of every length up to three blocks, for every type: decoding
/// never panics, and right-sized calls fill every output.
#[test]
fn no_panic_sweep() {
    let mut rng = Rng(0x6b69_6c6e);
    for ty in GgmlType::ALL {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        for n in 0..=3 * ts + 1 {
            let data = rng.bytes(n);
            let _ = dequantize_to_vec(ty, &data);
            let mut out = vec![f32::from_bits(0x7fa0_0001); n / ts * bs];
            let res = dequantize(ty, &data, &mut out);
            if is_supported(ty) && n % ts == 0 {
                assert_eq!(res, Ok(()));
                // The sentinel (a signalling NaN no decoder produces from a
                // quiet one) must be overwritten everywhere... unless the
                // input carries that exact pattern (F32 only).
                if ty != GgmlType::F32 {
                    assert!(out.iter().all(|v| v.to_bits() != 0x7fa0_0001), "{ty}");
                }
            } else {
                assert!(res.is_err());
            }
            let short = out.len().saturating_sub(1);
            let _ = dequantize(ty, &data, &mut out[..short]);
            let mut row = vec![0.0f32; bs];
            for r in 0..4 {
                let _ = dequantize_row(ty, &data, bs, r, &mut row);
            }
        }
        // Many whole blocks of noise (NaN/inf scales included).
        if is_supported(ty) {
            let data = rng.bytes(64 * ts);
            let v = dequantize_to_vec(ty, &data).unwrap();
            assert_eq!(v.len(), 64 * bs);
        }
    }
}

#[test]
fn f16_conversion_is_exact_and_keeps_nan_payloads() {
    for h in 0..=u16::MAX {
        let got = bytes::f16_to_f32(h);
        let want = half::f16::from_bits(h).to_f32();
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
            // Payload and sign kept, not quieted.
            assert_eq!(
                got.to_bits(),
                (u32::from(h & 0x8000) << 16) | 0x7f80_0000 | (u32::from(h & 0x3ff) << 13)
            );
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}

#[test]
fn simple_values() {
    // Q8_0: d = 0.5, qs = -128..
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
    for (j, q) in b[2..].iter_mut().enumerate() {
        *q = (j as i8 - 16) as u8;
    }
    let v = dequantize_to_vec(GgmlType::Q8_0, &b).unwrap();
    assert_eq!(v[0], -8.0);
    assert_eq!(v[31], 7.5);
    // BF16 1.0 and F64 / I64 rounding.
    assert_eq!(
        dequantize_to_vec(GgmlType::BF16, &[0x80, 0x3f]).unwrap(),
        [1.0]
    );
    let v = dequantize_to_vec(GgmlType::I64, &(16_777_217i64).to_le_bytes()).unwrap();
    assert_eq!(v, [16_777_216.0]);
    let v = dequantize_to_vec(GgmlType::F64, &1.5f64.to_le_bytes()).unwrap();
    assert_eq!(v, [1.5]);
    // MXFP4 with e = 128 (scale 2^1): nibble 7 is e2m1 6.0 -> 12.0; nibble
    // 0xF is -6.0 -> -12.0.
    let mut b = [0x7fu8; 17];
    b[0] = 128;
    let v = dequantize_to_vec(GgmlType::MXFP4, &b).unwrap();
    assert_eq!(v[..16], [-12.0; 16]);
    assert_eq!(v[16..], [12.0; 16]);
}
