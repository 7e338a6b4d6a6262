use super::*;
use crate::dequant::dequantize_to_vec;

fn lcg(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn round_trip_error_is_bounded() {
    let x = lcg(7, 256 * 8);
    for &(ty, tol) in &[
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 1e-3),
        (GgmlType::BF16, 8e-3),
        (GgmlType::Q8_0, 1.0 / 127.0),
        (GgmlType::Q4_0, 1.0 / 8.0 + 1e-3),
        (GgmlType::Q4_1, 1.0 / 15.0 + 1e-3),
        (GgmlType::Q5_0, 1.0 / 16.0 + 1e-3),
        (GgmlType::Q5_1, 1.0 / 31.0 + 1e-3),
        (GgmlType::Q2K, 0.4),
        (GgmlType::Q3K, 0.25),
        (GgmlType::Q4K, 0.1),
        (GgmlType::Q5K, 0.05),
        (GgmlType::Q6K, 1.0 / 32.0 + 1e-2),
    ] {
        let q = quantize_to_vec(ty, &x).unwrap();
        assert_eq!(q.len() as u64, ty.bytes_for(x.len() as u64).unwrap());
        let y = dequantize_to_vec(ty, &q).unwrap();
        let worst = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!("{ty}: max error {worst}");
        assert!(worst <= tol, "{ty}: max error {worst} > {tol}");
    }
}

#[test]
fn parallel_equals_serial_and_lengths_are_checked() {
    let x = lcg(9, 256 * 700 + 256 * 3);
    for &ty in SUPPORTED {
        let a = quantize_to_vec(ty, &x).unwrap();
        let b = quantize_par(ty, &x, 3).unwrap();
        assert_eq!(a, b, "{ty}");
    }
    assert_eq!(
        quantize_to_vec(GgmlType::Q4_0, &x[..33]),
        Err(QuantError::Length {
            ty: GgmlType::Q4_0,
            elements: 33
        })
    );
    assert!(matches!(
        quantize_to_vec(GgmlType::IQ4XS, &x[..256]),
        Err(QuantError::Unsupported(_))
    ));
}
