//! Checks that run without a GPU (CI has none).

use kiln_cuda::gpu::{compile_cubin_opts, kernel_source, nvrtc_version};

/// The kernels compile with NVRTC when the library is present (it can be
/// installed without a GPU: PyPI `nvidia-cuda-nvrtc`); skipped otherwise.
#[test]
fn kernels_compile_with_nvrtc() {
    let Some(v) = nvrtc_version() else {
        eprintln!("skipped: libnvrtc not found");
        return;
    };
    {
        let arch = "sm_90";
        let t = std::time::Instant::now();
        let verbose = std::env::var_os("KILN_NVRTC_VERBOSE").is_some();
        let extra: &[&str] = if verbose {
            &["--ptxas-options=-v"]
        } else {
            &[]
        };
        let (cubin, log) =
            compile_cubin_opts(&kernel_source(), arch, extra).unwrap_or_else(|e| panic!("{e}"));
        if verbose {
            eprintln!("{log}");
        }
        eprintln!(
            "NVRTC {}.{} {arch}: {} bytes in {} ms",
            v.0,
            v.1,
            cubin.len(),
            t.elapsed().as_millis()
        );
        assert!(cubin.len() > 1000);
    }
}

/// Without a driver (or without a GPU), opening the backend is a clean
/// error that points at the CPU backend.
#[test]
fn missing_device_is_an_error() {
    match kiln_cuda::Gpu::new(0) {
        Ok(g) => eprintln!("a GPU is present: {}", g.info.name),
        Err(e) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(msg.contains("--device cpu"), "{msg}");
        }
    }
}
