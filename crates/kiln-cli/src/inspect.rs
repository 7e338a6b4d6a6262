//! `kiln inspect PATH`: what a model file or folder holds, as tables or JSON.

use std::collections::BTreeMap;

use kiln_format::gguf::{Array, Value};
use kiln_format::{Model, ModelTensor};
use serde_json::{json, Value as Json};

use crate::CliResult;

/// `writeln!` into a String (cannot fail).
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model folder.
    pub path: std::path::PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print every metadata key (long arrays are still summarised).
    #[arg(long)]
    pub all_metadata: bool,
}

pub fn run(args: Args) -> CliResult {
    let model = match Model::open(&args.path) {
        Ok(m) => m,
        // Still describe a valid file that is not a runnable model (a
        // vocab-only GGUF, a bare .safetensors of reference arrays).
        Err(e) => match raw::open(&args.path) {
            Some(raw) => {
                let reason = e.to_string();
                let out = if args.json {
                    serde_json::to_string_pretty(&raw.to_json(&reason))? + "\n"
                } else {
                    raw.render(&reason)
                };
                crate::write_stdout(&out)?;
                return Ok(());
            }
            None => return Err(e.into()),
        },
    };
    let report = Report::new(&model);
    if args.json {
        crate::write_stdout(&(serde_json::to_string_pretty(&report.to_json(&model))? + "\n"))?;
    } else {
        crate::write_stdout(&report.render(&model, args.all_metadata))?;
    }
    Ok(())
}

/// Files that parse but are not models kiln can run.
mod raw {
    use std::path::Path;

    use kiln_format::gguf::Gguf;
    use serde_json::{json, Value as Json};

    pub struct Raw {
        format: String,
        metadata: Vec<(String, String, Json)>,
        /// (name, type, shape row-major, bytes)
        tensors: Vec<(String, String, Vec<u64>, u64)>,
    }

    pub fn open(path: &Path) -> Option<Raw> {
        if let Ok(g) = Gguf::open(path) {
            return Some(Raw {
                format: format!("GGUF v{}", g.version),
                metadata: g
                    .metadata()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string(), super::value_json(v)))
                    .collect(),
                tensors: g
                    .tensors()
                    .iter()
                    .map(|t| (t.name.clone(), t.ty.to_string(), t.shape(), t.n_bytes))
                    .collect(),
            });
        }
        let bytes = std::fs::read(path).ok()?;
        let st = safetensors::SafeTensors::deserialize(&bytes).ok()?;
        let mut tensors: Vec<_> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let shape = v.shape().iter().map(|&d| d as u64).collect();
                (n, format!("{:?}", v.dtype()), shape, v.data().len() as u64)
            })
            .collect();
        tensors.sort();
        Some(Raw {
            format: "safetensors file".into(),
            metadata: Vec::new(),
            tensors,
        })
    }

    impl Raw {
        pub fn render(&self, reason: &str) -> String {
            let mut out = format!(
                "format:        {}\nmodel:         not runnable by kiln: {reason}\n",
                self.format
            );
            if !self.metadata.is_empty() {
                out += &format!("\nmetadata ({} keys):\n", self.metadata.len());
                for (k, shown, _) in &self.metadata {
                    out += &format!("  {k:<44} {shown}\n");
                }
            }
            out += &format!("\ntensors ({}):\n", self.tensors.len());
            for (n, ty, shape, bytes) in &self.tensors {
                out += &format!(
                    "  {n:<32} {ty:<9} {:<22} {bytes:>12}\n",
                    format!("{shape:?}")
                );
            }
            let total: u64 = self.tensors.iter().map(|t| t.3).sum();
            out += &format!(
                "\ntotals:\n  {} tensors, {total} bytes\n",
                self.tensors.len()
            );
            out
        }

        pub fn to_json(&self, reason: &str) -> Json {
            let meta: serde_json::Map<String, Json> = self
                .metadata
                .iter()
                .map(|(k, _, j)| (k.clone(), j.clone()))
                .collect();
            let tensors: Vec<Json> = self
                .tensors
                .iter()
                .map(|(n, ty, shape, b)| json!({"name": n, "type": ty, "shape": shape, "bytes": b}))
                .collect();
            json!({
                "format": self.format,
                "architecture": meta.get("general.architecture"),
                "config": null,
                "model_error": reason,
                "metadata": meta,
                "tensors": tensors,
                "totals": {"tensors": self.tensors.len(), "bytes": self.tensors.iter().map(|t| t.3).sum::<u64>()},
            })
        }
    }
}

/// What `inspect` derives beyond the model's own fields.
struct Report {
    tokenizer: Json,
    by_type: BTreeMap<String, (usize, u64, u64)>,
    n_params: u64,
}

impl Report {
    fn new(m: &Model) -> Self {
        let mut by_type: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
        for t in m.tensors() {
            let e = by_type.entry(t.ty.to_string()).or_default();
            e.0 += 1;
            e.1 += t.n_elements();
            e.2 += t.n_bytes;
        }
        Report {
            tokenizer: tokenizer_summary(m),
            n_params: m.tensors().iter().map(ModelTensor::n_elements).sum(),
            by_type,
        }
    }

    fn render(&self, m: &Model, all_metadata: bool) -> String {
        let mut out = String::new();
        let files: Vec<String> = m.files().iter().map(|p| p.display().to_string()).collect();
        w!(out, "path:          {}", m.path.display());
        match &m.gguf {
            Some(g) => w!(
                out,
                "format:        GGUF v{} ({}, alignment {})",
                g.version,
                human_bytes(g.file_size()),
                g.alignment
            ),
            None => w!(
                out,
                "format:        safetensors ({} file(s): {})",
                files.len(),
                files.join(", ")
            ),
        }
        if let Some(q) = m.mlx_quantization {
            w!(
                out,
                "quantization:  MLX {}-bit, group size {}",
                q.bits,
                q.group_size
            );
        }
        let c = &m.config;
        w!(out, "architecture:  {}", c.arch.name());
        if let Some(name) = m.gguf.as_ref().and_then(|g| g.get_str("general.name")) {
            w!(out, "name:          {name}");
        }
        w!(out, "\nconfig:");
        if let Json::Object(map) = serde_json::to_value(c).unwrap_or(Json::Null) {
            for (k, v) in map {
                if k == "layer_sliding" {
                    let n = c.layer_sliding.iter().filter(|&&s| s).count();
                    w!(out, "  {k:<22} {n} of {} layers slide", c.n_layers);
                } else {
                    w!(out, "  {k:<22} {v}");
                }
            }
        }
        w!(out, "\ntokenizer:");
        if let Json::Object(map) = &self.tokenizer {
            for (k, v) in map {
                w!(out, "  {k:<22} {v}");
            }
        }
        if let Some(g) = &m.gguf {
            w!(out, "\nmetadata ({} keys):", g.metadata().len());
            for (k, v) in g.metadata() {
                let skip = !all_metadata
                    && (k.starts_with("tokenizer.ggml.") || k == "tokenizer.chat_template");
                if !skip {
                    w!(out, "  {k:<44} {v}");
                }
            }
            if !all_metadata {
                w!(
                    out,
                    "  (tokenizer keys summarised above; --all-metadata lists them)"
                );
            }
        }
        w!(out, "\ntensors ({}):", m.tensors().len());
        let w = m
            .tensors()
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        w!(
            out,
            "  {:<w$}  {:<9} {:<22} {:>12}",
            "name",
            "type",
            "shape",
            "bytes"
        );
        for t in m.tensors() {
            let mut shape = format!("{:?}", t.shape);
            if t.transposed {
                shape.push_str(" (in,out)");
            }
            w!(
                out,
                "  {:<w$}  {:<9} {:<22} {:>12}",
                t.name,
                t.ty.to_string(),
                shape,
                t.n_bytes
            );
        }
        if !m.unmapped.is_empty() {
            w!(
                out,
                "\nnot used by kiln ({}): {}",
                m.unmapped.len(),
                m.unmapped.join(", ")
            );
        }
        w!(out, "\ntotals:");
        for (ty, (n, el, bytes)) in &self.by_type {
            w!(
                out,
                "  {ty:<9} {n:>5} tensors {el:>14} values {:>12}",
                human_bytes(*bytes)
            );
        }
        w!(
            out,
            "  all       {:>5} tensors {:>14} values {:>12} ({:.2} bits/value)",
            m.tensors().len(),
            self.n_params,
            human_bytes(m.total_bytes()),
            m.total_bytes() as f64 * 8.0 / self.n_params.max(1) as f64
        );
        out
    }

    fn to_json(&self, m: &Model) -> Json {
        let tensors: Vec<Json> = m
            .tensors()
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "source_name": t.source_name,
                    "type": t.ty.to_string(),
                    "shape": t.shape,
                    "transposed": t.transposed,
                    "bytes": t.n_bytes,
                })
            })
            .collect();
        let metadata: Option<serde_json::Map<String, Json>> = m.gguf.as_ref().map(|g| {
            g.metadata()
                .iter()
                .map(|(k, v)| (k.clone(), value_json(v)))
                .collect()
        });
        let by_type: serde_json::Map<String, Json> = self
            .by_type
            .iter()
            .map(|(ty, (n, el, b))| (ty.clone(), json!({"tensors": n, "values": el, "bytes": b})))
            .collect();
        json!({
            "path": m.path,
            "format": m.format.name(),
            "gguf_version": m.gguf.as_ref().map(|g| g.version),
            "files": m.files(),
            "architecture": m.config.arch.name(),
            "config": m.config,
            "mlx_quantization": m.mlx_quantization.map(|q| json!({"bits": q.bits, "group_size": q.group_size})),
            "tokenizer": self.tokenizer,
            "metadata": metadata,
            "tensors": tensors,
            "unmapped_tensors": m.unmapped,
            "totals": {
                "tensors": m.tensors().len(),
                "values": self.n_params,
                "bytes": m.total_bytes(),
                "by_type": by_type,
            },
        })
    }
}

/// Metadata value as JSON; arrays longer than 16 become a summary so a
/// 262k-token vocabulary does not flood the output.
fn value_json(v: &Value) -> Json {
    match v {
        Value::Array(a) if a.len() > 16 => {
            json!({"array_of": a.element_type().name(), "len": a.len()})
        }
        Value::Array(a) => array_json(a),
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        other => other
            .as_int()
            .map(|n| json!(n as i64))
            .unwrap_or(Json::Null),
    }
}

fn array_json(a: &Array) -> Json {
    match a {
        Array::String(v) => json!(v),
        Array::F32(v) => json!(v),
        Array::F64(v) => json!(v),
        Array::Bool(v) => json!(v),
        Array::Array(v) => Json::Array(v.iter().map(array_json).collect()),
        other => other.to_i64_vec().map(|v| json!(v)).unwrap_or(Json::Null),
    }
}

/// The tokenizer as kiln builds it (type, vocabulary, special and stop
/// tokens, chat template), or why it cannot be built.
fn tokenizer_summary(m: &Model) -> Json {
    match kiln_tokenizer::Tokenizer::from_model(m) {
        Ok(t) => serde_json::to_value(t.summary()).unwrap_or(Json::Null),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
