//! Routes and handlers: `/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/health`, `/metrics`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_core::SamplerParams;
use kiln_core::StopStrings;
use kiln_tokenizer::{ChatRequest, StreamDecoder, Tokenizer};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::{parse_request, Endpoint, GenRequest, PromptInput};
use crate::scheduler::{Finish, Scheduler, SeqEvent, SeqRequest, SubmitError, TokenLogprob};

/// Everything the handlers share.
pub struct AppState {
    pub sched: Scheduler,
    pub tok: Arc<Tokenizer>,
    pub metrics: Arc<Metrics>,
    /// The name `/v1/models` lists; requests may use it or an alias.
    pub model_id: String,
    pub aliases: Vec<String>,
    pub created: u64,
    pub max_body_bytes: usize,
    pub next_id: AtomicU64,
}

impl AppState {
    fn ctx(&self) -> usize {
        self.sched.info.ctx
    }

    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if m == self.model_id || self.aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => {
                let mut names = vec![self.model_id.clone()];
                names.extend(self.aliases.iter().cloned());
                Err(ApiError::model_not_found(m, &names.join(", ")))
            }
        }
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_one))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "Unknown route.",
    )
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.sched.is_closing() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok", "backend": st.sched.info.backend})).into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

fn model_card(st: &AppState, id: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": st.created,
        "owned_by": "kiln",
        "max_model_len": st.ctx(),
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let mut data = vec![model_card(&st, &st.model_id)];
    data.extend(st.aliases.iter().map(|a| model_card(&st, a)));
    Json(json!({"object": "list", "data": data}))
}

async fn model_one(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match st.check_model(Some(&id)) {
        Ok(()) => Json(model_card(&st, &id)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    st.metrics.requests_chat.inc();
    respond(&st, handle(&st, body, Endpoint::Chat).await)
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    st.metrics.requests_completions.inc();
    respond(&st, handle(&st, body, Endpoint::Completions).await)
}

fn respond(st: &AppState, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            if e.status.is_server_error() {
                st.metrics.errors_5xx.inc();
            } else {
                st.metrics.errors_4xx.inc();
            }
            e.into_response()
        }
    }
}

fn body_json(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Value, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "invalid_request_error",
                format!("The request body is larger than the limit of {limit} bytes."),
            )
            .with_code("request_too_large")
        } else {
            ApiError::new(status, "invalid_request_error", e.body_text())
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "We could not parse the JSON body of your request: {e}. \
             (The body must be valid JSON; see https://platform.openai.com/docs/api-reference)"
        ))
    })
}

/// One tokenized prompt and its budget.
struct Prepared {
    ids: Arc<[u32]>,
    max_tokens: usize,
}

fn prepare(st: &AppState, r: &GenRequest) -> Result<Vec<Prepared>, ApiError> {
    let tok = &*st.tok;
    let vocab = st.sched.info.vocab;
    let ctx = st.ctx();
    let prompts: Vec<Vec<u32>> = match r.endpoint {
        Endpoint::Chat => {
            let messages = r.messages.as_ref().ok_or_else(|| {
                ApiError::invalid("messages", "Missing required parameter: 'messages'.")
            })?;
            let req = ChatRequest {
                messages,
                tools: r.tools.as_ref(),
                add_generation_prompt: true,
                extra: r.template_kwargs.as_ref(),
            };
            let text = tok.render_chat_request(&req).map_err(|e| {
                ApiError::invalid("messages", format!("The chat template failed: {e}"))
            })?;
            let ids = tok
                .encode_chat_prompt(&text)
                .map_err(|e| ApiError::invalid("messages", format!("Tokenization failed: {e}")))?;
            vec![ids]
        }
        Endpoint::Completions => r
            .prompts
            .iter()
            .map(|p| match p {
                PromptInput::Text(t) => tok
                    .encode(t, true, true)
                    .map_err(|e| ApiError::invalid("prompt", format!("Tokenization failed: {e}"))),
                PromptInput::Ids(ids) => match ids.iter().find(|&&t| t as usize >= vocab) {
                    Some(t) => Err(ApiError::invalid(
                        "prompt",
                        format!("Token id {t} is outside the vocabulary (size {vocab})."),
                    )),
                    None => Ok(ids.clone()),
                },
            })
            .collect::<Result<_, _>>()?,
    };
    let param = if r.endpoint == Endpoint::Chat {
        "messages"
    } else {
        "prompt"
    };
    prompts
        .into_iter()
        .map(|ids| {
            if ids.is_empty() {
                return Err(ApiError::invalid(param, "The prompt is empty (0 tokens)."));
            }
            if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(
                    param,
                    format!("Token id {t} is outside the model's vocabulary (size {vocab})."),
                ));
            }
            if ids.len() >= ctx {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "This model's maximum context length is {ctx} tokens. However, your \
                         prompt is {} tokens, which leaves no room for a completion. \
                         Please reduce the length of the prompt.",
                        ids.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            let room = ctx - ids.len();
            Ok(Prepared {
                max_tokens: r.max_tokens.map_or(room, |m| m.min(room)),
                ids: ids.into(),
            })
        })
        .collect()
}

static SEED_COUNTER: AtomicU64 = AtomicU64::new(0);

fn random_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let c = SEED_COUNTER.fetch_add(1, Ordering::Relaxed);
    t ^ c.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn sampler_params(r: &GenRequest, choice: usize, base_seed: u64) -> SamplerParams {
    SamplerParams {
        temperature: r.temperature,
        top_k: r.top_k,
        top_p: r.top_p,
        min_p: r.min_p,
        repeat_penalty: r.repetition_penalty,
        repeat_last_n: 64,
        presence_penalty: r.presence_penalty,
        frequency_penalty: r.frequency_penalty,
        logit_bias: r.logit_bias.clone(),
        seed: base_seed.wrapping_add(choice as u64),
    }
}

async fn handle(
    st: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let v = body_json(body, st.max_body_bytes)?;
    let r = parse_request(&v, endpoint)?;
    st.check_model(r.model.as_deref())?;
    if st.sched.is_closing() {
        return Err(shutting_down());
    }
    let prepared = prepare(st, &r)?;
    let n_choices = prepared.len() * r.n;
    let (tx, rx) = mpsc::unbounded_channel();
    let base_seed = r.seed.unwrap_or_else(random_seed);
    let mut seqs = Vec::with_capacity(n_choices);
    let mut cancels = Vec::with_capacity(n_choices);
    for (pi, p) in prepared.iter().enumerate() {
        for j in 0..r.n {
            let index = pi * r.n + j;
            let cancel = Arc::new(AtomicBool::new(false));
            cancels.push(Arc::clone(&cancel));
            seqs.push(SeqRequest {
                index,
                prompt: Arc::clone(&p.ids),
                params: sampler_params(&r, index, base_seed),
                max_tokens: p.max_tokens,
                ignore_eos: r.ignore_eos,
                logprobs: r.logprobs,
                cancel,
                tx: tx.clone(),
                arrived,
            });
        }
    }
    drop(tx);
    st.sched.submit(seqs).map_err(|e| match e {
        SubmitError::QueueFull { limit } => {
            st.metrics.rejected_queue_full.inc();
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "server_overloaded",
                format!(
                    "The server is busy: the queue holds {limit} waiting sequences at most \
                     and is full. Retry later."
                ),
            )
            .with_code("queue_full")
        }
        SubmitError::ShuttingDown => shutting_down(),
    })?;
    let prompt_tokens: usize = prepared.iter().map(|p| p.ids.len()).sum();
    let gen = Gen {
        st: Arc::clone(st),
        id: st.new_id(if endpoint == Endpoint::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: r.model.clone().unwrap_or_else(|| st.model_id.clone()),
        chat: endpoint == Endpoint::Chat,
        logprobs: r.logprobs.is_some(),
        stop: r.stop.clone(),
        include_usage: r.include_usage,
        prompt_tokens,
        n_per_prompt: r.n,
        cancels,
        token_ids: r.return_token_ids,
    };
    if r.stream {
        Ok(gen.stream(rx))
    } else {
        gen.collect(rx).await
    }
}

fn shutting_down() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "The server is shutting down and accepts no new requests.",
    )
    .with_code("shutting_down")
}

/// A request in flight: what the response needs besides the events.
struct Gen {
    st: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    chat: bool,
    logprobs: bool,
    stop: Vec<String>,
    include_usage: bool,
    prompt_tokens: usize,
    n_per_prompt: usize,
    cancels: Vec<Arc<AtomicBool>>,
    token_ids: bool,
}

/// Per-choice decoding state.
struct Choice<'t> {
    dec: StreamDecoder<'t>,
    stops: StopStrings,
    text: String,
    tokens: usize,
    cached: usize,
    finish: Option<&'static str>,
    error: Option<String>,
    lp: Vec<LpEntry>,
    ids: Vec<u32>,
}

struct LpEntry {
    text: String,
    logprob: f32,
    top: Vec<(String, f32)>,
}

/// What one event changed in one choice.
#[derive(Default)]
struct Delta {
    index: usize,
    text: String,
    lp: Vec<LpEntry>,
    finish: Option<&'static str>,
    error: Option<String>,
    ids: Vec<u32>,
}

impl Gen {
    fn choices<'t>(&self, tok: &'t Tokenizer) -> Vec<Choice<'t>> {
        (0..self.cancels.len())
            .map(|_| Choice {
                dec: tok.stream_decoder(true),
                stops: StopStrings::new(self.stop.iter().cloned()),
                text: String::new(),
                tokens: 0,
                cached: 0,
                finish: None,
                error: None,
                lp: Vec::new(),
                ids: Vec::new(),
            })
            .collect()
    }

    /// Applies one engine event; `None` when it changes nothing visible.
    fn apply(&self, tok: &Tokenizer, choices: &mut [Choice<'_>], ev: SeqEvent) -> Option<Delta> {
        let idx = match &ev {
            SeqEvent::Token { index, .. }
            | SeqEvent::Done { index, .. }
            | SeqEvent::Error { index, .. } => *index,
        };
        let c = choices.get_mut(idx)?;
        if c.finish.is_some() {
            return None;
        }
        let mut d = Delta {
            index: idx,
            ..Default::default()
        };
        match ev {
            SeqEvent::Token { id, logprob, .. } => {
                c.tokens += 1;
                if self.token_ids {
                    d.ids.push(id);
                    c.ids.push(id);
                }
                if let Some(lp) = logprob {
                    d.lp.push(lp_entry(tok, id, &lp));
                }
                if let Ok(Some(piece)) = c.dec.step(id) {
                    if c.stops.push(&piece, &mut d.text) {
                        d.finish = Some("stop");
                        if let Some(flag) = self.cancels.get(idx) {
                            flag.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
            SeqEvent::Done {
                finish,
                cached_tokens,
                ..
            } => {
                c.cached = cached_tokens;
                let mut hit = false;
                if let Ok(Some(piece)) = c.dec.finish() {
                    hit = c.stops.push(&piece, &mut d.text);
                }
                if !hit {
                    c.stops.flush(&mut d.text);
                }
                d.finish = Some(match finish {
                    Finish::Length if !hit => "length",
                    _ => "stop",
                });
            }
            SeqEvent::Error { message, .. } => {
                d.finish = Some("error");
                d.error = Some(message);
            }
        }
        c.text.push_str(&d.text);
        if self.logprobs {
            c.lp.extend(d.lp.iter().map(|e| LpEntry {
                text: e.text.clone(),
                logprob: e.logprob,
                top: e.top.clone(),
            }));
        }
        c.finish = d.finish;
        c.error.clone_from(&d.error);
        Some(d)
    }

    fn usage(&self, choices: &[Choice<'_>]) -> Value {
        let completion: usize = choices.iter().map(|c| c.tokens).sum();
        // Prompt-level numbers come from each prompt's first choice.
        let cached: usize = choices
            .iter()
            .step_by(self.n_per_prompt.max(1))
            .map(|c| c.cached)
            .sum();
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn lp_json(&self, entries: &[LpEntry]) -> Value {
        if self.chat {
            let bytes = |s: &str| s.bytes().collect::<Vec<u8>>();
            json!({"content": entries.iter().map(|e| json!({
                "token": e.text,
                "logprob": e.logprob,
                "bytes": bytes(&e.text),
                "top_logprobs": e.top.iter().map(|(t, l)| json!({
                    "token": t, "logprob": l, "bytes": bytes(t)
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>()})
        } else {
            json!({
                "tokens": entries.iter().map(|e| &e.text).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                "top_logprobs": entries.iter().map(|e| {
                    e.top.iter().map(|(t, l)| (t.clone(), json!(l))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": Value::Null,
            })
        }
    }

    async fn collect(
        self,
        mut rx: mpsc::UnboundedReceiver<SeqEvent>,
    ) -> Result<Response, ApiError> {
        let tok = Arc::clone(&self.st.tok);
        let mut choices = self.choices(&tok);
        let mut left = choices.len();
        // A client that hangs up before the answer: hyper drops this future
        // (it sees the connection close), and with it `rx`; the engine sees
        // that and cancels the request's sequences, freeing their KV.
        while left > 0 {
            let Some(ev) = rx.recv().await else {
                return Err(ApiError::internal("the engine stopped"));
            };
            if let Some(d) = self.apply(&tok, &mut choices, ev) {
                if d.finish.is_some() {
                    left -= 1;
                }
            }
        }
        if let Some(e) = choices.iter().find_map(|c| c.error.clone()) {
            return Err(if e.contains("shutting down") {
                shutting_down()
            } else {
                ApiError::internal(e)
            });
        }
        let list: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let lp = if self.logprobs {
                    self.lp_json(&c.lp)
                } else {
                    Value::Null
                };
                let mut v = if self.chat {
                    json!({
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": lp,
                        "finish_reason": c.finish,
                    })
                } else {
                    json!({
                        "index": i,
                        "text": c.text,
                        "logprobs": lp,
                        "finish_reason": c.finish,
                    })
                };
                if self.token_ids {
                    v["token_ids"] = json!(c.ids);
                }
                v
            })
            .collect();
        let body = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "kiln",
            "choices": list,
            "usage": self.usage(&choices),
        });
        Ok(Json(body).into_response())
    }

    fn chunk(&self, d: Option<&Delta>, role: Option<usize>, usage: Option<Value>) -> Value {
        let choices = match (d, role) {
            (_, Some(i)) => vec![json!({
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": Value::Null,
                "finish_reason": Value::Null,
            })],
            (Some(d), None) => {
                let lp = if self.logprobs && !d.lp.is_empty() {
                    self.lp_json(&d.lp)
                } else {
                    Value::Null
                };
                let finish = d.finish.map_or(Value::Null, |f| json!(f));
                let mut c = if self.chat {
                    let delta = if d.text.is_empty() {
                        json!({})
                    } else {
                        json!({"content": d.text})
                    };
                    json!({"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": finish})
                } else {
                    json!({"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": finish})
                };
                if self.token_ids {
                    c["token_ids"] = json!(d.ids);
                }
                vec![c]
            }
            (None, None) => Vec::new(),
        };
        let mut v = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "kiln",
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }

    fn stream(self, mut rx: mpsc::UnboundedReceiver<SeqEvent>) -> Response {
        let (etx, erx) = mpsc::channel::<Result<Event, Infallible>>(64);
        tokio::spawn(async move {
            let tok = Arc::clone(&self.st.tok);
            let mut choices = self.choices(&tok);
            let data = |v: Value| Ok(Event::default().data(v.to_string()));
            if self.chat {
                for i in 0..choices.len() {
                    if etx
                        .send(data(self.chunk(None, Some(i), None)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            let mut left = choices.len();
            while left > 0 {
                // A reader that went away ends the task, which drops `rx`:
                // the engine sees it and frees the sequences' KV.
                let ev = tokio::select! {
                    ev = rx.recv() => ev,
                    _ = etx.closed() => return,
                };
                let Some(ev) = ev else {
                    let e = ApiError::internal("the engine stopped");
                    let _ = etx.send(data(e.to_json())).await;
                    return;
                };
                let Some(d) = self.apply(&tok, &mut choices, ev) else {
                    continue;
                };
                if d.finish.is_some() {
                    left -= 1;
                }
                let msg = if let Some(err) = &d.error {
                    let e = if err.contains("shutting down") {
                        shutting_down()
                    } else {
                        ApiError::internal(err.clone())
                    };
                    e.to_json()
                } else if d.text.is_empty()
                    && d.finish.is_none()
                    && d.lp.is_empty()
                    && d.ids.is_empty()
                {
                    continue;
                } else {
                    self.chunk(Some(&d), None, None)
                };
                if etx.send(data(msg)).await.is_err() {
                    return;
                }
            }
            if self.include_usage {
                let u = self.usage(&choices);
                if etx
                    .send(data(self.chunk(None, None, Some(u))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let _ = etx.send(Ok(Event::default().data("[DONE]"))).await;
        });
        Sse::new(ReceiverStream::new(erx)).into_response()
    }
}

fn lp_entry(tok: &Tokenizer, id: u32, lp: &TokenLogprob) -> LpEntry {
    let text = |i: u32| tok.decode(&[i], false).unwrap_or_default();
    LpEntry {
        text: text(id),
        logprob: lp.logprob,
        top: lp.top.iter().map(|&(i, l)| (text(i), l)).collect(),
    }
}
