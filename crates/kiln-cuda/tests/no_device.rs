//! Checks that run without a GPU (CI has none).

use kiln_cuda::gpu::{
    cached_cubins_in, compile_cubin_opts, kernel_modules, kernel_source, nvrtc_version,
};

/// The kernel modules compile with NVRTC when the library is present (it
/// can be installed without a GPU: PyPI `nvidia-cuda-nvrtc`), as a cold
/// start compiles them (in parallel, stored in the cache), and a second
/// start finds every one in the cache; skipped without NVRTC.
/// `KILN_NVRTC_VERBOSE=1` also prints ptxas's report over all the sources.
#[test]
fn kernels_compile_with_nvrtc() {
    let Some(v) = nvrtc_version() else {
        eprintln!("skipped: libnvrtc not found");
        return;
    };
    let arch = "sm_90";
    if std::env::var_os("KILN_NVRTC_VERBOSE").is_some() {
        let (_, log) = compile_cubin_opts(&kernel_source(), arch, &["--ptxas-options=-v"])
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{log}");
    }
    let dir = std::env::temp_dir().join(format!("kiln-nvrtc-test-{}", std::process::id()));
    let t = std::time::Instant::now();
    let (cubins, how, _) =
        cached_cubins_in(arch, Some(dir.clone())).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "NVRTC {}.{} {arch}: {how}, {} bytes, {} ms",
        v.0,
        v.1,
        cubins.iter().map(|m| m.1.len()).sum::<usize>(),
        t.elapsed().as_millis()
    );
    assert_eq!(cubins.len(), kernel_modules().len());
    assert!(cubins.iter().all(|c| c.1.len() > 1000));
    let (again, how, _) =
        cached_cubins_in(arch, Some(dir.clone())).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(how, "cache");
    assert_eq!(again, cubins);
}

/// The prelude that starts every kernel module defines no kernel, every
/// other source is in a module, and a source in several modules only
/// defines (no kernel instantiated at a line's start), so each kernel is
/// compiled once.
#[test]
fn sources_fill_the_modules_once() {
    use kiln_cuda::gpu::{MODULES, PRELUDE, SOURCES};
    let src = |n: &str| SOURCES.iter().find(|f| f.0 == n).map(|f| f.1);
    for name in PRELUDE {
        let text = src(name).unwrap_or_else(|| panic!("{name} is not a source"));
        assert!(!text.contains("__global__"), "{name} defines a kernel");
    }
    for (name, text) in SOURCES {
        let uses = MODULES.iter().filter(|m| m.1.contains(&name)).count();
        if PRELUDE.contains(&name) {
            assert_eq!(uses, 0, "{name} is in the prelude and a module");
            continue;
        }
        assert!(uses >= 1, "{name} is in no module");
        if uses > 1 {
            let instantiates = text.lines().any(|l| {
                l.starts_with("extern \"C\"")
                    || (l.starts_with(|c: char| c.is_ascii_uppercase())
                        && l.contains('(')
                        && !l.starts_with("#"))
            });
            assert!(
                !instantiates,
                "{name} is in {uses} modules and defines kernels"
            );
        }
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
