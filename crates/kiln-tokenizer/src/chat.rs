//! Chat templates: Hugging Face Jinja templates rendered with `minijinja`.
//!
//! The environment mirrors the one `transformers` uses for
//! `apply_chat_template`: `trim_blocks` and `lstrip_blocks` on, a single
//! trailing newline of the template dropped, loop controls (`break`,
//! `continue`) enabled, and these Python-compatible extras:
//!
//! * `raise_exception(msg)` — fails rendering with `msg` (the error names the
//!   template);
//! * `strftime_now(fmt)` — the current time (UTC) formatted with a strftime
//!   subset (`%Y %y %m %d %e %H %I %M %S %p %B %b %A %a %j %%`);
//! * `tojson` — Python's `json.dumps` output (`", "`/`": "` separators,
//!   non-ASCII kept, `indent`, `separators`, `sort_keys`, `ensure_ascii`), not
//!   minijinja's HTML-safe compact form;
//! * Python string/dict/list methods (`.strip()`, `.startswith()`, `.split()`,
//!   `.items()`, `.get()`, …) from `minijinja-contrib`'s `pycompat`, with
//!   `.title()` following Python's rule.
//!
//! As in transformers 5, message keys whose value is `null` are removed before
//! rendering (`"content": null` is seen as an undefined `content`).
//!
//! Variables passed to the template: `messages`, `tools` (none unless given),
//! `documents` (none), `add_generation_prompt`, `bos_token`, `eos_token`,
//! `unk_token`, `pad_token` (empty strings when the model has none), plus any
//! extra variables of the [`ChatRequest`].
//!
//! When a model has no template, [`ChatTemplate::chatml`] is used: the
//! `<|im_start|>role\ncontent<|im_end|>\n` format (transformers' historical
//! default). It is only ever used for models without a template, and
//! [`TemplateOrigin::ChatMlFallback`] says so.

use std::fmt;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::error::{Error, Result};

/// Where a chat template came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum TemplateOrigin {
    /// GGUF `tokenizer.chat_template`.
    Gguf,
    /// `tokenizer_config.json` → `chat_template`.
    TokenizerConfig,
    /// `chat_template.jinja` in the model folder.
    ChatTemplateJinja,
    /// `chat_template.json` in the model folder.
    ChatTemplateJson,
    /// Given by the caller.
    Custom,
    /// The model has no template; ChatML is used.
    ChatMlFallback,
}

impl fmt::Display for TemplateOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TemplateOrigin::Gguf => "GGUF tokenizer.chat_template",
            TemplateOrigin::TokenizerConfig => "tokenizer_config.json",
            TemplateOrigin::ChatTemplateJinja => "chat_template.jinja",
            TemplateOrigin::ChatTemplateJson => "chat_template.json",
            TemplateOrigin::Custom => "custom",
            TemplateOrigin::ChatMlFallback => "none in model; ChatML fallback",
        })
    }
}

/// The ChatML template used when a model has none.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ (message['content'] if message['content'] is string else '') ~ '<|im_end|>' ~ '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// What to render: OpenAI-style `messages` (a JSON array of objects with
/// `role`, `content`, optional `tool_calls`, `tool_call_id`, `name`), optional
/// `tools`, and extra template variables (e.g. `enable_thinking`).
#[derive(Clone, Copy, Debug)]
pub struct ChatRequest<'a> {
    pub messages: &'a serde_json::Value,
    pub tools: Option<&'a serde_json::Value>,
    pub add_generation_prompt: bool,
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl<'a> ChatRequest<'a> {
    pub fn new(messages: &'a serde_json::Value, add_generation_prompt: bool) -> Self {
        Self {
            messages,
            tools: None,
            add_generation_prompt,
            extra: None,
        }
    }
}

/// Accept either a bare array of messages or an object with a `messages`
/// array (as in an OpenAI request body); check every message has a role.
pub fn messages_from_json(v: &serde_json::Value) -> Result<&serde_json::Value> {
    let msgs = match v {
        serde_json::Value::Array(_) => v,
        serde_json::Value::Object(o) => o
            .get("messages")
            .ok_or_else(|| Error::Request("an object without a \"messages\" array".into()))?,
        _ => {
            return Err(Error::Request(
                "expected an array of messages or {\"messages\": [...]}".into(),
            ))
        }
    };
    let arr = msgs
        .as_array()
        .ok_or_else(|| Error::Request("\"messages\" is not an array".into()))?;
    for (i, m) in arr.iter().enumerate() {
        let role = m.get("role").and_then(|r| r.as_str());
        if role.is_none() {
            return Err(Error::Request(format!(
                "message {i} has no string \"role\""
            )));
        }
    }
    Ok(msgs)
}

/// A compiled chat template plus the special-token strings it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: TemplateOrigin,
    /// Names the file the template came from, for error messages.
    location: String,
    bos_token: String,
    eos_token: String,
    unk_token: String,
    pad_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("location", &self.location)
            .field("len", &self.source.len())
            .finish()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compile `source`. `location` names where it came from (used in errors).
    pub fn new(
        source: impl Into<String>,
        origin: TemplateOrigin,
        location: impl fmt::Display,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self> {
        let source = source.into();
        let location = location.to_string();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(py_methods);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| Error::template(format!("{location} ({origin})"), describe(&e)))?;
        Ok(Self {
            env,
            source,
            origin,
            location,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            unk_token: String::new(),
            pad_token: String::new(),
        })
    }

    /// The ChatML fallback template.
    pub fn chatml(bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::new(
            CHATML_TEMPLATE,
            TemplateOrigin::ChatMlFallback,
            "built-in ChatML",
            bos_token,
            eos_token,
        )
    }

    pub(crate) fn set_unk_pad(&mut self, unk: &str, pad: &str) {
        self.unk_token = unk.to_string();
        self.pad_token = pad.to_string();
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Render `messages` (see [`ChatRequest`]).
    pub fn render_messages(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render(&ChatRequest::new(messages, add_generation_prompt))
    }

    /// Render a request. Errors (a `raise_exception` call, a type error in the
    /// template, a message that is not an object) name the template and the
    /// problem; there is no silent fallback.
    pub fn render(&self, req: &ChatRequest<'_>) -> Result<String> {
        let msgs = messages_from_json(req.messages)?;
        // Like transformers (5.x): keys whose value is null are dropped, so a
        // template sees `content: null` as an undefined `content`.
        let msgs: Vec<serde_json::Value> = msgs
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| match m {
                        serde_json::Value::Object(o) => serde_json::Value::Object(
                            o.iter()
                                .filter(|(_, v)| !v.is_null())
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect(),
                        ),
                        other => other.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut ctx: Vec<(String, Value)> = Vec::new();
        if let Some(extra) = req.extra {
            for (k, v) in extra {
                ctx.push((k.clone(), Value::from_serialize(v)));
            }
        }
        ctx.push(("messages".into(), Value::from_serialize(&msgs)));
        ctx.push((
            "tools".into(),
            match req.tools {
                Some(t) => Value::from_serialize(t),
                None => Value::from(()),
            },
        ));
        if !ctx.iter().any(|(k, _)| k == "documents") {
            ctx.push(("documents".into(), Value::from(())));
        }
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(req.add_generation_prompt),
        ));
        ctx.push(("bos_token".into(), Value::from(self.bos_token.as_str())));
        ctx.push(("eos_token".into(), Value::from(self.eos_token.as_str())));
        ctx.push(("unk_token".into(), Value::from(self.unk_token.as_str())));
        ctx.push(("pad_token".into(), Value::from(self.pad_token.as_str())));
        let ctx: Value = ctx
            .into_iter()
            .collect::<std::collections::BTreeMap<String, Value>>()
            .into();
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::template(self.where_(), describe(&e)))?;
        tmpl.render(ctx)
            .map_err(|e| Error::template(self.where_(), describe(&e)))
    }

    fn where_(&self) -> String {
        format!("{} ({})", self.location, self.origin)
    }
}

/// One line: the error, where in the template, and its causes.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

/// Python methods on values (`.strip()`, `.items()`, …): minijinja-contrib's
/// pycompat, with `str.title()` following Python's cased-character rule.
fn py_methods(
    state: &minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if method == "title" && args.is_empty() {
        if let Some(s) = value.as_str() {
            return Ok(Value::from(py_title(s)));
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.title()`: a cased character after an uncased one starts a word.
fn py_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        let cased = c.is_uppercase() || c.is_lowercase();
        if cased {
            if prev_cased {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
        } else {
            out.push(c);
        }
        prev_cased = cased;
    }
    out
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}

fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime_utc(&fmt, secs)
}

/// Format a Unix time (UTC) with a strftime subset.
pub fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, (sod % 3600) / 60, sod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7); // 1970-01-01 was a Thursday (index 3 from Monday)
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday as usize]),
            Some('a') => out.push_str(&DAYS[wday as usize][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`.
fn tojson(
    value: Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent_v: Option<Value> = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<String> = match indent_v {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => match v.as_str() {
                Some(s) => Some(s.to_string()),
                None => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    ))
                }
            },
        },
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let seps: Option<Value> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match seps {
        Some(s) if !s.is_none() && !s.is_undefined() => {
            let a: Vec<Value> = s.try_iter()?.collect();
            if a.len() != 2 {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair",
                ));
            }
            (a[0].to_string(), a[1].to_string())
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    kwargs.assert_all_used()?;
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    py_json(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn py_json(
    v: &Value,
    o: &JsonOpts,
    level: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&py_float(f));
            }
        }
        ValueKind::String => py_str(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(o, level + 1, out);
                py_json(it, o, level + 1, out)?;
            }
            newline(o, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if o.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(o, level + 1, out);
                let ks = match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or_default().to_string(),
                    ValueKind::None | ValueKind::Undefined => "null".to_string(),
                    ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_string(),
                    _ => k.to_string(),
                };
                py_str(&ks, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                let val = v.get_item(k)?;
                py_json(&val, o, level + 1, out)?;
            }
            newline(o, level, out);
            out.push('}');
        }
        _ => py_str(&v.to_string(), o.ensure_ascii, out),
    }
    Ok(())
}

fn newline(o: &JsonOpts, level: usize, out: &mut String) {
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn py_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", u));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (as `json.dumps` prints floats).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Shortest round-trip digits in scientific form, e.g. "1.5e-7".
    let sci = format!("{f:e}");
    let (mant, exp) = match sci.split_once('e') {
        Some((m, e)) => (m.to_string(), e.parse::<i32>().unwrap_or(0)),
        None => return sci,
    };
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if (-4..16).contains(&exp) {
        // Fixed notation.
        let n = digits.len() as i32;
        let s = if exp >= 0 {
            if n > exp + 1 {
                format!(
                    "{}.{}",
                    &digits[..(exp + 1) as usize],
                    &digits[(exp + 1) as usize..]
                )
            } else {
                format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
            }
        } else {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        format!(
            "{sign}{m}e{}{:02}",
            if exp < 0 { "-" } else { "+" },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(-2.5), "-2.5");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
        assert_eq!(py_float(123456.789), "123456.789");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(1e15), "1000000000000000.0");
    }

    #[test]
    fn strftime_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            strftime_utc("%d %B %Y, %A %a %b %j %I%p %%", t),
            "29 February 2024, Thursday Thu Feb 060 01PM %"
        );
    }

    #[test]
    fn chatml_compiles() {
        let t = ChatTemplate::chatml("", "").unwrap();
        let m = serde_json::json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            t.render_messages(&m, true).ok().as_deref(),
            Some("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        );
    }
}
