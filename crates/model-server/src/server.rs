//! The HTTP side: the accept loop, and per request the numbered steps of an answer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::converse;
use crate::messages::{self, ErrorType};
use crate::record::{Calls, Outcome, Request, Route};
use crate::script::{ReplyKind, Script, Usage};
use crate::wire::{self, Answer};

/// The largest request body read (Anthropic's limit; Bedrock's is smaller): 32 MiB.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// What the server keeps: the script, what it received, the call counts.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) script: Script,
    pub(crate) requests: Vec<Request>,
    pub(crate) calls: Calls,
    next_tool_id: u64,
}

/// Shared between the server's handle and its tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The total call count, for waiters.
    pub(crate) total: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new(script: Script) -> Self {
        let state = State {
            script,
            requests: Vec::new(),
            calls: Calls::default(),
            next_tool_id: 0,
        };
        Self {
            state: Mutex::new(state),
            total: watch::Sender::new(0),
        }
    }

    /// The state; a poisoned lock (a panic while holding it) is taken over: every update
    /// under it is a single push or increment.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The service error that makes hyper close a connection without an answer.
#[derive(Debug, thiserror::Error)]
#[error("scripted cut: the connection is closed without an answer")]
struct CutConnection;

/// Accept connections until the task is aborted; each connection's task ends with it.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) -> Infallible {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors or similar: wait a little rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request| answer(shared.clone(), request));
                    // A cut ends the connection with an error: nothing to do with it.
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

/// One request, in order: 1. read it; 2. count and record it, and choose its answer (the
/// key, the model, the body's validity, then the script); 3. wait the latency; 4. write
/// the answer, or cut the connection.
async fn answer(
    shared: Arc<Shared>,
    request: hyper::Request<Incoming>,
) -> Result<Response<Full<Bytes>>, CutConnection> {
    let started = Instant::now();
    // 1. Read it.
    let (parts, body) = request.into_parts();
    let route = match (parts.method == Method::POST, parts.uri.path()) {
        (true, messages::PATH) => Some((Route::Messages, None)),
        (true, path) => converse::model_id(path).map(|model| (Route::Converse, Some(model))),
        _ => None,
    };
    let Some((route, path_model)) = route else {
        return Ok(not_found(parts.uri.path()));
    };
    let bytes = Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let headers: BTreeMap<String, String> = parts
        .headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect();
    let model = path_model.unwrap_or_else(|| {
        body.get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    });

    // 2. Count, record, choose.
    let (deferred, delay, seq, usage) = {
        let mut state = shared.state();
        state.calls.count(route, &model);
        let seq = state.calls.total;
        let mut record = Request {
            seq,
            route,
            model,
            headers,
            body,
            outcome: Outcome::Text,
        };
        let (outcome, deferred, delay, usage) = choose(&mut state, &record);
        record.outcome = outcome;
        state.requests.push(record);
        (deferred, delay, seq, usage)
    };
    shared.total.send_modify(|total| *total += 1);
    // Counts the request abandoned if this future is dropped (hyper drops it when the client
    // closes the connection mid-request) before the answer is handed over below.
    let mut ending = Ending {
        shared: &shared,
        usage,
        answered: false,
    };

    // 3. Wait.
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    // 4. Answer.
    ending.answered = true;
    drop(ending);
    match deferred(started.elapsed()) {
        Answer::Cut => Err(CutConnection),
        Answer::Body {
            status,
            headers,
            content_type,
            body,
        } => {
            let mut response = response(status, &headers, content_type, body);
            // Converse's request id, one per request (the Messages API's is in `headers`).
            if route == Route::Converse
                && let Ok(id) = format!("00000000-0000-4000-8000-{seq:012}").parse()
            {
                response.headers_mut().insert("x-amzn-requestid", id);
            }
            Ok(response)
        }
    }
}

/// How a request ended, counted when dropped: answered, or abandoned by its client.
struct Ending<'a> {
    shared: &'a Shared,
    /// The usage its answer reports (zero for an error).
    usage: Usage,
    answered: bool,
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        let (input, output) = (self.usage.input_tokens, self.usage.output_tokens);
        if self.answered {
            state.calls.answered += 1;
            state.calls.answered_tokens.add(input, output);
        } else {
            state.calls.abandoned += 1;
            state.calls.abandoned_tokens.add(input, output);
        }
    }
}

/// No tokens: what an error answer reports.
const NO_USAGE: Usage = Usage {
    input_tokens: 0,
    output_tokens: 0,
};

/// An answer to write once the delay is over: it is given the time elapsed since the
/// request arrived (Converse's `metrics.latencyMs`).
type Deferred = Box<dyn FnOnce(Duration) -> Answer + Send>;

/// The outcome, the answer, the delay before it and the usage it reports (zero for an
/// error), for one recorded request.
fn choose(state: &mut State, request: &Request) -> (Outcome, Deferred, Duration, Usage) {
    let now = |answer: Answer| -> Deferred { Box::new(move |_| answer) };
    let seq = request.seq;
    let script = &state.script;
    if request.route == Route::Messages
        && let Some(refusal) =
            messages::refuse(request.api_key(), |k| script.refused_keys.contains(k), seq)
    {
        return (
            Outcome::Unauthorized,
            now(refusal),
            Duration::ZERO,
            NO_USAGE,
        );
    }
    let invalid = match request.route {
        Route::Converse => converse::validate(&request.body),
        Route::Messages => messages::validate(
            &request.body,
            request.headers.get("anthropic-version").map(String::as_str),
        ),
    };
    // The unknown model first when the body names it; a body that names none is invalid.
    if !request.model.is_empty() && script.unknown_models.contains(&request.model) {
        let answer = match request.route {
            Route::Converse => converse::unknown_model(&request.model),
            Route::Messages => messages::unknown_model(&request.model, seq),
        };
        return (Outcome::UnknownModel, now(answer), Duration::ZERO, NO_USAGE);
    }
    if let Err(message) = invalid {
        let (outcome, answer, delay) = invalid_request(request, message);
        return (outcome, answer, delay, NO_USAGE);
    }
    let system = request.system();
    let last_user = request.last_user_text();
    let Some(reply) =
        state
            .script
            .next_reply(request.route, &request.model, &last_user, system.as_deref())
    else {
        let text: String = last_user.chars().take(200).collect();
        let (outcome, answer, delay) = invalid_request(
            request,
            format!("unscripted request for model {}: {text}", request.model),
        );
        return (outcome, answer, delay, NO_USAGE);
    };
    let delay = state.script.latency.saturating_add(reply.delay);
    let usage = reply
        .usage
        .unwrap_or_else(|| wire::estimate_usage(&request.body, &reply.kind));
    let outcome = outcome_of(&reply.kind);
    // Only a model's answer reports usage; an error or a cut reports none.
    let reported = match reply.kind {
        ReplyKind::Text(_)
        | ReplyKind::Truncated(_)
        | ReplyKind::ToolUse { .. }
        | ReplyKind::Structured(_) => usage,
        _ => NO_USAGE,
    };
    let (body, route, kind) = (request.body.clone(), request.route, reply.kind);
    // Tool ids are numbered now, in arrival order, not in the order the delays end.
    let first_id = state.next_tool_id;
    state.next_tool_id = first_id.saturating_add(match &kind {
        ReplyKind::ToolUse { calls, .. } => calls.len() as u64,
        ReplyKind::Structured(_) => 1,
        _ => 0,
    });
    let deferred: Deferred = Box::new(move |elapsed| {
        let mut id = first_id;
        match route {
            Route::Converse => {
                let latency_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                converse::reply(&kind, &body, usage, latency_ms, &mut id)
            }
            Route::Messages => messages::reply(&kind, &body, usage, seq, &mut id),
        }
    });
    (outcome, deferred, delay, reported)
}

/// The service's validation error with `message`, answered at once.
fn invalid_request(request: &Request, message: String) -> (Outcome, Deferred, Duration) {
    let answer = match request.route {
        Route::Converse => converse::error(converse::ErrorCode::Validation, &message),
        Route::Messages => messages::error(ErrorType::InvalidRequest, &message, request.seq),
    };
    (
        Outcome::Invalid(message),
        Box::new(move |_| answer),
        Duration::ZERO,
    )
}

fn outcome_of(kind: &ReplyKind) -> Outcome {
    match kind {
        ReplyKind::Text(_) => Outcome::Text,
        ReplyKind::Truncated(_) => Outcome::Truncated,
        ReplyKind::ToolUse { .. } => Outcome::ToolUse,
        ReplyKind::Structured(_) => Outcome::Structured,
        ReplyKind::Throttle { .. } => Outcome::Throttled,
        ReplyKind::ServerError => Outcome::ServerError,
        ReplyKind::Unavailable => Outcome::Unavailable,
        ReplyKind::AccessDenied => Outcome::AccessDenied,
        ReplyKind::Cut => Outcome::Cut,
        ReplyKind::Raw { status, .. } => Outcome::Raw(*status),
    }
}

fn response(
    status: u16,
    headers: &[(&'static str, String)],
    content_type: &str,
    body: String,
) -> Response<Full<Bytes>> {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type);
    for (name, value) in headers {
        builder = builder.header(*name, value);
    }
    builder
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| {
            let mut fallback = Response::new(Full::new(Bytes::from_static(
                b"{\"message\":\"unwritable answer\"}",
            )));
            *fallback.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            fallback
        })
}

/// Any other method or path: 404 with the code the service gives an unknown operation.
fn not_found(path: &str) -> Response<Full<Bytes>> {
    let body =
        serde_json::json!({ "message": format!("no scripted route for {path}") }).to_string();
    response(
        404,
        &[("x-amzn-errortype", "UnknownOperationException".into())],
        "application/json",
        body,
    )
}
