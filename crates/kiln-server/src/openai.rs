//! OpenAI request bodies, parsed by hand from JSON so that every wrong field
//! is a 400 that names the parameter (`param`) and what was expected.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// One prompt of a completions request, or the messages of a chat.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Endpoint {
    #[default]
    Chat,
    Completions,
}

/// A parsed generation request (chat or completions).
#[derive(Debug, Clone, Default)]
pub struct GenRequest {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    /// Chat: the normalized messages (content flattened to strings).
    pub messages: Option<Value>,
    pub tools: Option<Value>,
    /// Extra chat-template variables (`chat_template_kwargs`).
    pub template_kwargs: Option<Map<String, Value>>,
    /// Completions: one or more prompts.
    pub prompts: Vec<PromptInput>,
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(k)`: return logprobs with the `k` most likely alternatives.
    pub logprobs: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    pub echo: bool,
    /// Extension (as in vLLM): each choice also lists its token ids.
    pub return_token_ids: bool,
}

/// Most choices per request.
pub const MAX_N: usize = 16;
/// Most alternatives per token for logprobs.
pub const MAX_TOP_LOGPROBS: usize = 20;

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(param: &str, expected: &str, v: &Value) -> ApiError {
    ApiError::invalid(
        param,
        format!(
            "Invalid type for '{param}': expected {expected}, but got {}.",
            type_name(v)
        ),
    )
}

struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    /// The value, with JSON null read as absent.
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn f32_in(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let x = v.as_f64().ok_or_else(|| wrong(k, "a number", v))?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::invalid(
                k,
                format!("'{k}' must be between {lo} and {hi}, got {x}."),
            ));
        }
        Ok(Some(x as f32))
    }

    fn uint(&self, k: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        // Accept integral floats (2.0) as some clients send them.
        let x = match (v.as_u64(), v.as_i64(), v.as_f64()) {
            (Some(x), _, _) => x,
            (None, Some(i), _) => {
                return Err(ApiError::invalid(
                    k,
                    format!("'{k}' must be at least {min}, got {i}."),
                ))
            }
            (None, None, Some(f)) if f.fract() == 0.0 && (0.0..1.8e19).contains(&f) => f as u64,
            _ => return Err(wrong(k, "an integer", v)),
        };
        if x < min || x > max {
            return Err(ApiError::invalid(
                k,
                format!("'{k}' must be between {min} and {max}, got {x}."),
            ));
        }
        Ok(Some(x))
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(k, "a boolean", v)),
        }
    }
}

fn token_id(param: &str, v: &Value) -> Result<u32, ApiError> {
    v.as_u64()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| wrong(param, "token ids (non-negative integers)", v))
}

fn parse_stop(f: &Fields) -> Result<Vec<String>, ApiError> {
    let stops = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(wrong("stop", "a string or an array of strings", v)),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong("stop", "a string or an array of strings", v)),
    };
    if stops.len() > 16 {
        return Err(ApiError::invalid(
            "stop",
            format!("at most 16 stop sequences, got {}.", stops.len()),
        ));
    }
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

fn parse_logit_bias(f: &Fields) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = f.get("logit_bias") else {
        return Ok(Vec::new());
    };
    let Value::Object(m) = v else {
        return Err(wrong("logit_bias", "an object of token id to bias", v));
    };
    m.iter()
        .map(|(k, b)| {
            let id: u32 = k.parse().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("Invalid key in 'logit_bias': '{k}' is not a token id."),
                )
            })?;
            let x = b
                .as_f64()
                .ok_or_else(|| wrong("logit_bias", "numbers as values", b))?;
            if !(-100.0..=100.0).contains(&x) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("Invalid value for 'logit_bias' key {k}: {x} is not in [-100, 100]."),
                ));
            }
            Ok((id, x as f32))
        })
        .collect()
}

/// Message `content` as a template sees it: a string (text parts joined).
fn flatten_content(i: usize, v: &Value) -> Result<Value, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Value::Null | Value::String(_) => Ok(v.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str);
                match (kind, p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some(k), _) if k != "text" => {
                        return Err(ApiError::invalid(
                            &param,
                            format!("content parts of type '{k}' are not supported (text only)."),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &param,
                            "each content part must be {\"type\": \"text\", \"text\": string}.",
                        ))
                    }
                }
            }
            Ok(Value::String(text))
        }
        _ => Err(wrong(&param, "a string or an array of content parts", v)),
    }
}

fn parse_messages(f: &Fields) -> Result<Value, ApiError> {
    let Some(v) = f.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "Missing required parameter: 'messages'.",
        ));
    };
    let Value::Array(a) = v else {
        return Err(wrong("messages", "an array", v));
    };
    if a.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must contain at least one message.",
        ));
    }
    let mut out = Vec::with_capacity(a.len());
    for (i, m) in a.iter().enumerate() {
        let Value::Object(o) = m else {
            return Err(wrong(&format!("messages[{i}]"), "an object", m));
        };
        match o.get("role") {
            Some(Value::String(r))
                if matches!(
                    r.as_str(),
                    "system" | "developer" | "user" | "assistant" | "tool" | "function"
                ) => {}
            Some(Value::String(r)) => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!(
                        "Invalid value '{r}': expected one of system, developer, user, assistant, tool."
                    ),
                ))
            }
            Some(v) => return Err(wrong(&format!("messages[{i}].role"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("Missing required parameter: 'messages[{i}].role'."),
                ))
            }
        }
        let mut o = o.clone();
        if let Some(c) = o.get("content") {
            let c = flatten_content(i, c)?;
            o.insert("content".into(), c);
        }
        out.push(Value::Object(o));
    }
    Ok(Value::Array(out))
}

fn parse_prompts(f: &Fields) -> Result<Vec<PromptInput>, ApiError> {
    let Some(v) = f.get("prompt") else {
        return Err(ApiError::invalid(
            "prompt",
            "Missing required parameter: 'prompt'.",
        ));
    };
    let expected = "a string, an array of strings, or token ids";
    let prompts = match v {
        Value::String(s) => vec![PromptInput::Text(s.clone())],
        Value::Array(a) if a.is_empty() => {
            return Err(ApiError::invalid("prompt", "'prompt' must not be empty."))
        }
        Value::Array(a) => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|x| match x {
                    Value::String(s) => Ok(PromptInput::Text(s.clone())),
                    _ => Err(wrong("prompt", expected, x)),
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![PromptInput::Ids(
                a.iter()
                    .map(|x| token_id("prompt", x))
                    .collect::<Result<_, _>>()?,
            )],
            Value::Array(_) => a
                .iter()
                .map(|x| match x {
                    Value::Array(ids) if !ids.is_empty() => Ok(PromptInput::Ids(
                        ids.iter()
                            .map(|t| token_id("prompt", t))
                            .collect::<Result<_, _>>()?,
                    )),
                    _ => Err(wrong("prompt", "non-empty arrays of token ids", x)),
                })
                .collect::<Result<_, _>>()?,
            x => return Err(wrong("prompt", expected, x)),
        },
        _ => return Err(wrong("prompt", expected, v)),
    };
    Ok(prompts)
}

/// Parses a `POST /v1/chat/completions` or `/v1/completions` body.
pub fn parse_request(body: &Value, endpoint: Endpoint) -> Result<GenRequest, ApiError> {
    let Value::Object(map) = body else {
        return Err(ApiError::bad_request(format!(
            "The request body must be a JSON object, got {}.",
            type_name(body)
        )));
    };
    let f = Fields(map);
    let model = match f.get("model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(wrong("model", "a string", v)),
    };
    let mut r = GenRequest {
        model,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        n: 1,
        ..Default::default()
    };
    match endpoint {
        Endpoint::Chat => {
            r.messages = Some(parse_messages(&f)?);
            r.tools = match f.get("tools") {
                None => None,
                Some(t @ Value::Array(_)) => Some(t.clone()),
                Some(v) => return Err(wrong("tools", "an array", v)),
            };
            r.template_kwargs = match f.get("chat_template_kwargs") {
                None => None,
                Some(Value::Object(o)) => Some(o.clone()),
                Some(v) => return Err(wrong("chat_template_kwargs", "an object", v)),
            };
            let want = f.bool("logprobs")?.unwrap_or(false);
            let top = f.uint("top_logprobs", 0, MAX_TOP_LOGPROBS as u64)?;
            if top.is_some() && !want {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "'top_logprobs' requires 'logprobs' to be true.",
                ));
            }
            r.logprobs = want.then_some(top.unwrap_or(0) as usize);
            // max_completion_tokens is the newer name; it wins.
            r.max_tokens = f
                .uint("max_completion_tokens", 1, u32::MAX as u64)?
                .or(f.uint("max_tokens", 1, u32::MAX as u64)?)
                .map(|x| x as usize);
        }
        Endpoint::Completions => {
            r.endpoint = Endpoint::Completions;
            r.prompts = parse_prompts(&f)?;
            r.logprobs = f
                .uint("logprobs", 0, MAX_TOP_LOGPROBS as u64)?
                .map(|x| x as usize);
            r.max_tokens = f
                .uint("max_tokens", 1, u32::MAX as u64)?
                .map(|x| x as usize);
            r.echo = f.bool("echo")?.unwrap_or(false);
            if r.echo {
                return Err(ApiError::invalid("echo", "'echo' is not supported."));
            }
            if f.get("suffix").is_some() {
                return Err(ApiError::invalid("suffix", "'suffix' is not supported."));
            }
            if let Some(b) = f.uint("best_of", 1, MAX_N as u64)? {
                if b != 1 {
                    return Err(ApiError::invalid(
                        "best_of",
                        "'best_of' other than 1 is not supported.",
                    ));
                }
            }
        }
    }
    if let Some(t) = f.f32_in("temperature", 0.0, 2.0)? {
        r.temperature = t;
    }
    if let Some(p) = f.f32_in("top_p", 0.0, 1.0)? {
        if p <= 0.0 {
            return Err(ApiError::invalid(
                "top_p",
                "'top_p' must be greater than 0.",
            ));
        }
        r.top_p = p;
    }
    // top_k: -1 or 0 mean off (vLLM and llama.cpp spellings).
    if let Some(v) = f.get("top_k") {
        match v.as_i64() {
            Some(k) if k <= 0 => r.top_k = 0,
            _ => r.top_k = f.uint("top_k", 1, u32::MAX as u64)?.unwrap_or(0) as usize,
        }
    }
    if let Some(p) = f.f32_in("min_p", 0.0, 1.0)? {
        r.min_p = p;
    }
    if let Some(v) = f.get("seed") {
        r.seed = Some(match (v.as_u64(), v.as_i64()) {
            (Some(x), _) => x,
            (None, Some(i)) => i as u64,
            _ => return Err(wrong("seed", "an integer", v)),
        });
    }
    r.stop = parse_stop(&f)?;
    r.presence_penalty = f.f32_in("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    r.frequency_penalty = f.f32_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    r.repetition_penalty = f.f32_in("repetition_penalty", 0.01, 10.0)?.unwrap_or(1.0);
    r.logit_bias = parse_logit_bias(&f)?;
    r.n = f.uint("n", 1, MAX_N as u64)?.unwrap_or(1) as usize;
    r.stream = f.bool("stream")?.unwrap_or(false);
    match f.get("stream_options") {
        None => {}
        Some(Value::Object(o)) => {
            if !r.stream {
                return Err(ApiError::invalid(
                    "stream_options",
                    "'stream_options' is only allowed when 'stream' is true.",
                ));
            }
            r.include_usage = match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => return Err(wrong("stream_options.include_usage", "a boolean", v)),
            };
        }
        Some(v) => return Err(wrong("stream_options", "an object", v)),
    }
    r.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    r.return_token_ids = f.bool("return_token_ids")?.unwrap_or(false);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(v: Value) -> Result<GenRequest, ApiError> {
        parse_request(&v, Endpoint::Chat)
    }

    #[test]
    fn defaults_and_fields() {
        let r = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5, "temperature": 0, "stop": "x", "seed": 3, "n": 2,
            "logprobs": true, "top_logprobs": 2, "logit_bias": {"7": -100},
            "stream": true, "stream_options": {"include_usage": true}}),
        )
        .unwrap();
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!(r.temperature, 0.0);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert_eq!(r.seed, Some(3));
        assert_eq!(r.n, 2);
        assert_eq!(r.logprobs, Some(2));
        assert_eq!(r.logit_bias, vec![(7, -100.0)]);
        assert!(r.stream && r.include_usage);
        let r = chat(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})).unwrap();
        assert_eq!(r.messages.unwrap()[0]["content"], json!("ab"));
        assert_eq!(r.top_p, 1.0);
    }

    #[test]
    fn wrong_types_name_the_param() {
        for (body, param) in [
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user"}], "max_tokens": "5"}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user"}], "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user"}], "max_tokens": -1}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user"}], "temperature": 3}),
                "temperature",
            ),
            (json!({"messages": [{"role": "user"}], "stop": 5}), "stop"),
            (json!({"messages": [{"role": "user"}], "n": 100}), "n"),
            (
                json!({"messages": [{"role": "user"}], "logit_bias": {"x": 1}}),
                "logit_bias",
            ),
            (
                json!({"messages": [{"role": "user"}], "stream": "yes"}),
                "stream",
            ),
            (json!({"messages": [{"role": "user"}], "model": 5}), "model"),
        ] {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
            assert_eq!(e.status.as_u16(), 400);
        }
        assert!(chat(json!([1, 2])).is_err());
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| parse_request(&json!({"prompt": v}), Endpoint::Completions);
        assert_eq!(p(json!("a")).unwrap().prompts.len(), 1);
        assert_eq!(p(json!(["a", "b"])).unwrap().prompts.len(), 2);
        assert_eq!(
            p(json!([1, 2])).unwrap().prompts,
            vec![PromptInput::Ids(vec![1, 2])]
        );
        assert_eq!(p(json!([[1], [2, 3]])).unwrap().prompts.len(), 2);
        assert!(p(json!([1, "a"])).is_err());
        assert!(p(json!([-1])).is_err());
        assert!(p(json!({})).is_err());
        assert!(p(json!([])).is_err());
    }
}
