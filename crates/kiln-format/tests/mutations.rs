//! Bad input as a test class: thousands of truncated and mutated versions of
//! the fixture files go through the readers, and every one must end in a
//! clean `Err` (or, where the mutation left a valid file, in a model whose
//! every tensor can be read and dequantized) — never a panic, and never an
//! allocation out of proportion to the file's size.
//!
//! Mutations: truncation at every byte of the GGUF header and at every
//! tensor's end, bit flips, and every header count/length field overwritten
//! with hostile values (0, 2^60, u64::MAX, just past the file end …). For
//! safetensors folders: truncations, header bit flips, hostile header
//! lengths, a shard missing from the index, and broken config.json fields.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_format::gguf::Gguf;
use kiln_format::{dequant, Model, TensorType};

/// Tracks live and peak heap bytes, so the test can show that no mutation
/// makes the reader allocate by an unchecked number from the file.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The counters are global: the two tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures")
}

/// Small deterministic PRNG (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[derive(Default)]
struct Tally {
    cases: usize,
    errs: usize,
    oks: usize,
    failures: Vec<String>,
}

impl Tally {
    /// Prints the counts (quoted in the issue notes) and fails on any failure
    /// or on too few cases (a test that ran nothing proves nothing).
    fn finish(&self, what: &str, min_cases: usize) {
        eprintln!(
            "{what} mutations: {} cases, {} clean errors, {} still-valid files (all exercised), {} failures",
            self.cases,
            self.errs,
            self.oks,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "failures:\n{}",
            self.failures.join("\n")
        );
        assert!(self.cases > min_cases, "only {} cases ran", self.cases);
    }

    fn fail(&mut self, msg: String) {
        if self.failures.len() < 20 {
            self.failures.push(msg);
        }
    }
}

/// A model that did open must be usable: every tensor's bytes readable and,
/// for ggml types, dequantizable.
fn exercise(m: &Model) -> Result<(), String> {
    for t in m.tensors() {
        let data = m.data(t);
        if data.len() as u64 != t.n_bytes {
            return Err(format!(
                "tensor {} returned {} bytes, not {}",
                t.name,
                data.len(),
                t.n_bytes
            ));
        }
        if let TensorType::Ggml(ty) = t.ty {
            if dequant::is_supported(ty) {
                dequant::dequantize_to_vec(ty, data).map_err(|e| format!("{}: {e}", t.name))?;
            }
        }
    }
    Ok(())
}

/// Parses one GGUF image; `must_fail` cases have to return `Err`.
fn check_gguf(t: &mut Tally, label: &str, bytes: Vec<u8>, must_fail: bool) {
    t.cases += 1;
    let len = bytes.len();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let g = Gguf::from_bytes(label, bytes).map_err(|e| e.to_string())?;
        if g.architecture().is_ok_and(|a| {
            a.starts_with("llama") || a == "gpt2" || a == "qwen2" || a == "qwen3" || a == "gemma3"
        }) && !g.tensors().is_empty()
        {
            let m = Model::from_gguf(g).map_err(|e| e.to_string())?;
            exercise(&m).map_err(|e| format!("opened but unusable: {e}"))?;
        }
        Ok(())
    }));
    // The file is held in memory (len); dequantizing a tensor needs 4 bytes
    // per value at most ~8x its size. Anything beyond that came from a count.
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    if peak > 40 * len + (1 << 20) {
        t.fail(format!(
            "{label}: allocated {peak} bytes for a {len}-byte file"
        ));
    }
    match outcome {
        Err(_) => t.fail(format!("{label}: PANIC")),
        Ok(Err(e)) if e.contains("opened but unusable") => t.fail(format!("{label}: {e}")),
        Ok(Err(_)) => t.errs += 1,
        Ok(Ok(())) if must_fail => t.fail(format!("{label}: accepted but must fail")),
        Ok(Ok(())) => t.oks += 1,
    }
}

/// Byte offsets of every header field in a GGUF, found by walking it (the
/// test's own independent walker, so boundaries do not depend on the reader).
struct Layout_ {
    /// (offset, width) of each u64 count/length field.
    u64_fields: Vec<usize>,
    /// (offset) of each u32 type/ndims field.
    u32_fields: Vec<usize>,
    header_end: usize,
}

fn walk(b: &[u8]) -> Layout_ {
    let rd64 = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap()) as usize;
    let rd32 = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap()) as usize;
    let mut l = Layout_ {
        u64_fields: vec![8, 16],
        u32_fields: vec![4],
        header_end: 0,
    };
    let n_t = rd64(8);
    let n_kv = rd64(16);
    let mut p = 24;
    fn value(
        p: &mut usize,
        ty: usize,
        l: &mut Layout_,
        rd64: &dyn Fn(usize) -> usize,
        rd32: &dyn Fn(usize) -> usize,
    ) {
        match ty {
            0 | 1 | 7 => *p += 1,
            2 | 3 => *p += 2,
            4..=6 => *p += 4,
            10..=12 => *p += 8,
            8 => {
                l.u64_fields.push(*p);
                *p += 8 + rd64(*p);
            }
            9 => {
                l.u32_fields.push(*p);
                let et = rd32(*p);
                l.u64_fields.push(*p + 4);
                let n = rd64(*p + 4);
                *p += 12;
                for _ in 0..n {
                    value(p, et, l, rd64, rd32);
                }
            }
            _ => unreachable!(),
        }
    }
    for _ in 0..n_kv {
        l.u64_fields.push(p);
        p += 8 + rd64(p);
        l.u32_fields.push(p);
        let ty = rd32(p);
        p += 4;
        value(&mut p, ty, &mut l, &rd64, &rd32);
    }
    for _ in 0..n_t {
        l.u64_fields.push(p);
        p += 8 + rd64(p);
        l.u32_fields.push(p);
        let nd = rd32(p);
        p += 4;
        for _ in 0..nd {
            l.u64_fields.push(p);
            p += 8;
        }
        l.u32_fields.push(p);
        p += 4;
        l.u64_fields.push(p);
        p += 8;
    }
    l.header_end = p;
    l
}

#[test]
fn gguf_mutations_end_in_clean_errors() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = fixtures();
    let files = [
        "tiny/llama/gguf/llama-q4_0.gguf",
        "tiny/qwen3/gguf/qwen3-q8_0.gguf",
        "tiny/gemma3/gguf/gemma3-q5_0.gguf",
        "tiny/gpt2/gguf/gpt2-f16.gguf",
        "tiny/qwen2/gguf/qwen2-q4_1.gguf",
        "tiny/llama_kq/gguf/llama_kq-q4_k_m.gguf",
        "tokenizer/llamacpp/ggml-vocab-bert-bge.gguf",
    ];
    let mut t = Tally::default();
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    for f in files {
        let path = root.join(f);
        let orig = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let good = Gguf::from_bytes(f, orig.clone()).unwrap_or_else(|e| panic!("{e}"));
        let data_end = good
            .tensors()
            .iter()
            .map(|ti| (good.data_start + ti.offset + ti.n_bytes) as usize)
            .max()
            .unwrap_or(good.data_start as usize)
            .max(walk(&orig).header_end);
        let lay = walk(&orig);
        drop(good);

        // 1. Truncation at every header field boundary (each field's first
        //    and last byte), 400 random header points, and every tensor's
        //    start and end.
        let mut cuts: Vec<usize> = (0..400).map(|_| rng.below(lay.header_end + 1)).collect();
        for &p in &lay.u64_fields {
            cuts.extend([p, p + 1, p + 7, p + 8]);
        }
        for &p in &lay.u32_fields {
            cuts.extend([p, p + 3, p + 4]);
        }
        cuts.push(lay.header_end);
        // A vocabulary header has 100k+ fields: keep a sample of them.
        if cuts.len() > 6000 {
            let keep: Vec<usize> = (0..6000).map(|_| cuts[rng.below(cuts.len())]).collect();
            cuts = keep;
        }
        let g = Gguf::from_bytes(f, orig.clone()).unwrap_or_else(|e| panic!("{e}"));
        for ti in g.tensors() {
            let s = (g.data_start + ti.offset) as usize;
            let e = s + ti.n_bytes as usize;
            cuts.extend([s, s + 1, e - 1, e]);
        }
        drop(g);
        for cut in cuts {
            if cut >= orig.len() {
                continue;
            }
            check_gguf(
                &mut t,
                &format!("{f} cut@{cut}"),
                orig[..cut].to_vec(),
                cut < data_end,
            );
        }

        // 2. Hostile values in every count/length field.
        let hostile: [u64; 7] = [
            0,
            1,
            1 << 60,
            u64::MAX,
            u64::MAX - 7,
            orig.len() as u64,
            orig.len() as u64 + 1,
        ];
        let sample = |fields: &[usize], rng: &mut Rng| -> Vec<usize> {
            if fields.len() <= 300 {
                fields.to_vec()
            } else {
                // Always the first 100 (counts, first keys), then a sample.
                let mut v = fields[..100].to_vec();
                v.extend((0..200).map(|_| fields[rng.below(fields.len())]));
                v
            }
        };
        for pos in sample(&lay.u64_fields, &mut rng) {
            for h in hostile {
                let mut b = orig.clone();
                b[pos..pos + 8].copy_from_slice(&h.to_le_bytes());
                check_gguf(&mut t, &format!("{f} u64@{pos}={h}"), b, false);
            }
        }
        for pos in sample(&lay.u32_fields, &mut rng) {
            for h in [0u32, 5, 13, 40, 1000, u32::MAX] {
                let mut b = orig.clone();
                b[pos..pos + 4].copy_from_slice(&h.to_le_bytes());
                check_gguf(&mut t, &format!("{f} u32@{pos}={h}"), b, false);
            }
        }

        // 3. Random bit flips, mostly in the header where they matter.
        for i in 0..300 {
            let mut b = orig.clone();
            let span = if i % 4 == 3 { b.len() } else { lay.header_end };
            for _ in 0..1 + rng.below(3) {
                let pos = rng.below(span);
                b[pos] ^= 1 << rng.below(8);
            }
            check_gguf(&mut t, &format!("{f} flip#{i}"), b, false);
        }

        // 4. Wrong magic, versions 1, 4 and big-endian, invalid UTF-8 in the first key.
        for (label, patch) in [
            ("magic", (0usize, b"GGUX".to_vec())),
            ("v1", (4, 1u32.to_le_bytes().to_vec())),
            ("v4", (4, 4u32.to_le_bytes().to_vec())),
            ("big-endian", (4, 3u32.to_be_bytes().to_vec())),
            ("utf8", (32, vec![0xff, 0xfe])),
        ] {
            let mut b = orig.clone();
            b[patch.0..patch.0 + patch.1.len()].copy_from_slice(&patch.1);
            check_gguf(&mut t, &format!("{f} {label}"), b, true);
        }
    }
    t.finish("GGUF", 3000);
}

/// Copies an HF folder into a fresh temp dir so files can be mutated.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("kiln-mut-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check_dir(t: &mut Tally, label: &str, dir: &Path, must_fail: bool) {
    t.cases += 1;
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let m = Model::open(dir).map_err(|e| e.to_string())?;
        exercise(&m).map_err(|e| format!("opened but unusable: {e}"))
    }));
    match outcome {
        Err(_) => t.fail(format!("{label}: PANIC")),
        Ok(Err(e)) if e.contains("opened but unusable") => t.fail(format!("{label}: {e}")),
        Ok(Err(_)) => t.errs += 1,
        Ok(Ok(())) if must_fail => t.fail(format!("{label}: accepted but must fail")),
        Ok(Ok(())) => t.oks += 1,
    }
}

#[test]
fn safetensors_mutations_end_in_clean_errors() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Tally::default();
    let mut rng = Rng(0xfeed_0042);
    for name in ["qwen2", "gpt2", "bert"] {
        let src = fixtures().join("tiny").join(name).join("hf");
        let tmp = TempDir::new(name);
        let dir = &tmp.0;
        let config = std::fs::read_to_string(src.join("config.json")).unwrap();
        let weights = std::fs::read(src.join("model.safetensors")).unwrap();
        let write = |cfg: &str, w: &[u8]| {
            std::fs::write(dir.join("config.json"), cfg).unwrap();
            std::fs::write(dir.join("model.safetensors"), w).unwrap();
        };
        write(&config, &weights);
        if let Err(e) = Model::open(dir) {
            panic!("{name}: the unmodified folder must open: {e}");
        }

        let header_len = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize + 8;
        // Truncations: every 97th byte of the header, its end, and random points.
        let mut cuts: Vec<usize> = (0..header_len).step_by(97).collect();
        cuts.extend([
            0,
            7,
            8,
            header_len - 1,
            header_len,
            header_len + 1,
            weights.len() - 1,
        ]);
        cuts.extend((0..60).map(|_| rng.below(weights.len())));
        for cut in cuts {
            write(&config, &weights[..cut]);
            check_dir(&mut t, &format!("{name} cut@{cut}"), dir, true);
        }
        // Hostile header lengths.
        for h in [
            0u64,
            1,
            1 << 60,
            u64::MAX,
            weights.len() as u64,
            header_len as u64 - 9,
        ] {
            let mut w = weights.clone();
            w[..8].copy_from_slice(&h.to_le_bytes());
            write(&config, &w);
            check_dir(&mut t, &format!("{name} header_len={h}"), dir, true);
        }
        // Bit flips in the JSON header.
        for i in 0..150 {
            let mut w = weights.clone();
            let pos = 8 + rng.below(header_len - 8);
            w[pos] ^= 1 << rng.below(8);
            write(&config, &w);
            check_dir(&mut t, &format!("{name} flip#{i}"), dir, false);
        }
        // config.json: each numeric field zeroed, negated, made a string, removed.
        let cfg: serde_json::Value = serde_json::from_str(&config).unwrap();
        let obj = cfg.as_object().unwrap();
        for (k, v) in obj {
            if !v.is_number() {
                continue;
            }
            for bad in [
                serde_json::json!(0),
                serde_json::json!(-3),
                serde_json::json!("x"),
                serde_json::Value::Null,
            ] {
                let mut c = obj.clone();
                c.insert(k.clone(), bad.clone());
                write(&serde_json::to_string(&c).unwrap(), &weights);
                check_dir(&mut t, &format!("{name} config {k}={bad}"), dir, false);
            }
            let mut c = obj.clone();
            c.remove(k);
            write(&serde_json::to_string(&c).unwrap(), &weights);
            check_dir(&mut t, &format!("{name} config -{k}"), dir, false);
        }
        // A hidden size that disagrees with the tensors must fail.
        let mut c = obj.clone();
        let hk = if name == "gpt2" {
            "n_embd"
        } else {
            "hidden_size"
        };
        c.insert(hk.into(), serde_json::json!(48));
        write(&serde_json::to_string(&c).unwrap(), &weights);
        check_dir(&mut t, &format!("{name} hidden 48"), dir, true);
        write("{not json", &weights);
        check_dir(&mut t, &format!("{name} config not json"), dir, true);
        std::fs::remove_file(dir.join("config.json")).unwrap();
        check_dir(&mut t, &format!("{name} no config"), dir, true);

        // Sharded: an index that names a missing shard, or a tensor not in its shard.
        write(&config, &weights);
        std::fs::rename(
            dir.join("model.safetensors"),
            dir.join("model-00001-of-00002.safetensors"),
        )
        .unwrap();
        let st = safetensors::SafeTensors::deserialize(&weights).unwrap();
        let mut map = serde_json::Map::new();
        for n in st.names() {
            map.insert(n.to_string(), "model-00001-of-00002.safetensors".into());
        }
        let idx = |m: &serde_json::Map<String, serde_json::Value>| {
            serde_json::json!({"metadata": {}, "weight_map": m}).to_string()
        };
        std::fs::write(dir.join("model.safetensors.index.json"), idx(&map)).unwrap();
        check_dir(&mut t, &format!("{name} sharded ok"), dir, false);
        let mut m2 = map.clone();
        m2.insert(
            "extra.weight".into(),
            "model-00002-of-00002.safetensors".into(),
        );
        std::fs::write(dir.join("model.safetensors.index.json"), idx(&m2)).unwrap();
        check_dir(&mut t, &format!("{name} missing shard"), dir, true);
        let mut m3 = map.clone();
        m3.insert(
            "not.in.file".into(),
            "model-00001-of-00002.safetensors".into(),
        );
        std::fs::write(dir.join("model.safetensors.index.json"), idx(&m3)).unwrap();
        check_dir(
            &mut t,
            &format!("{name} tensor missing from shard"),
            dir,
            true,
        );
        let mut m4 = map.clone();
        m4.insert("x".into(), "../../etc/passwd".into());
        std::fs::write(dir.join("model.safetensors.index.json"), idx(&m4)).unwrap();
        check_dir(&mut t, &format!("{name} index escapes folder"), dir, true);
    }
    // Paths that are not models at all.
    let tmp = TempDir::new("misc");
    check_dir(&mut t, "missing path", &tmp.0.join("nope"), true);
    check_dir(&mut t, "empty dir", &tmp.0, true);
    std::fs::write(tmp.0.join("x.gguf"), b"GG").unwrap();
    check_dir(&mut t, "2-byte file", &tmp.0.join("x.gguf"), true);

    t.finish("safetensors", 500);
}
