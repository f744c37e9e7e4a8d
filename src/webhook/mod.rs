//! The webhook receiver: the ironflow API's outbound webhook (`WEBHOOK_URL`), reached through a
//! Lambda Function URL, wakes the fleet when a run is or will be Pending (docs/push.md).
//!
//! One request, in numbered steps (`receive`), answered within milliseconds and never by
//! running a batch inside the HTTP request (the batch runs in the wake-up's own invocation):
//! 1. the receiver is on (a secret is configured), else 503 naming the variable;
//! 2. a `POST`, else 405;
//! 3. the body is at most [`MAX_BODY_BYTES`], else 413 (decoded from base64 when Lambda
//!    encoded it; undecodable: 400);
//! 4. the sender proves itself ([`auth`], with the secret's current or previous version,
//!    `keys`), else 401;
//! 5. the body is an event (`notice`), else 400;
//! 6. the event is fresh: its `at` within the replay window of now (`replay`), else 401;
//! 7. an event that means no Pending run of a registered workflow is answered 202 and ignored;
//! 8. a body already taken within the window is answered 202 and not taken again;
//! 9. the wake-ups the backlog needs beyond what is queued go to the wake queue
//!    (`src/wake/`: a burst of events costs the wake-ups its backlog needs, not one per
//!    event; one decision at a time per process, and across environments through the
//!    DynamoDB poison-pill table's wake-up mark, `src/wake/fleet.rs`; the backlog counted with
//!    what a claim would ask for, blocked workflows left out in defer mode), 202, and the body
//!    is recorded as taken; 503 when some were needed and none surely reached the queue, for
//!    the API's webhook to retry (not recorded: the retry is served).
//!
//! A 401 says only that the request is not authenticated; why goes to the log. Every answer is
//! logged with its status and reason, never with the secret, the signature, the token or the
//! body's payload (only the event's type and workflow name).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

pub mod auth;
pub(crate) mod keys;
pub(crate) mod notice;
pub(crate) mod replay;
pub(crate) mod replay_table;

use std::sync::Arc;

use aws_lambda_events::event::lambda_function_urls::{
    LambdaFunctionUrlRequest, LambdaFunctionUrlResponse,
};
use base64::Engine as _;
use ironflow_store::entities::WorkerCapabilities;
use serde_json::json;
use tokio::time::{Instant, timeout_at};
use tracing::{error, info, warn};

use self::keys::{Keys, Presented};
use self::notice::{Notice, Verdict};
use self::replay::{BodyDigest, Seen};
use self::replay_table::ReplayTable;
use crate::api::ApiClient;
use crate::poison::PoisonTable;
use crate::poison::gate::PoisonGate;
use crate::poison::seen::SeenCounters;
use crate::report::WakeTrigger;
use crate::secrets::WebhookSecretSource;
use crate::settings::{Settings, WebhookSecret};
use crate::wake::fleet::FleetMark;
use crate::wake::{self, Need, Waker};

/// The largest event body accepted: 64 KiB (ironflow's events are well under 2 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The body of every 401: it says only that the request is not authenticated.
pub const NOT_AUTHENTICATED: &str = "not authenticated";

/// The answer to one webhook request: its HTTP status and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: serde_json::Value,
}

impl Answer {
    fn new(status: u16, body: serde_json::Value) -> Self {
        Self { status, body }
    }

    fn refused(status: u16, reason: &str) -> Self {
        warn!(status, reason, "webhook request refused");
        Self::new(status, json!({ "error": reason }))
    }

    /// A 401: `reason` (which never holds a secret) goes to the log only.
    fn unauthenticated(reason: &str) -> Self {
        warn!(status = 401, reason, "webhook request refused");
        Self::new(401, json!({ "error": NOT_AUTHENTICATED }))
    }

    /// The Function URL response (`statusCode`, JSON `body`).
    pub fn to_response(&self) -> LambdaFunctionUrlResponse {
        let mut response = LambdaFunctionUrlResponse::default();
        response.status_code = i64::from(self.status);
        response.headers.insert(
            aws_lambda_events::http::header::CONTENT_TYPE,
            aws_lambda_events::http::HeaderValue::from_static("application/json"),
        );
        response.body = Some(self.body.to_string());
        response
    }
}

/// The receiver's state, built once per cold start: the secret's versions (`None`: the
/// receiver is off) and the bodies taken (this process's, and the fleet's when the poison-pill
/// table is in DynamoDB).
#[derive(Debug)]
pub(crate) struct Receiver {
    keys: Option<Keys>,
    seen: Seen,
    table: Option<ReplayTable>,
}

impl Receiver {
    /// The receiver for `secret` (the current version), with the previous version and the
    /// secret they came from when read from Secrets Manager, recording the bodies taken in
    /// `table` too when given.
    pub(crate) fn new(
        secret: Option<WebhookSecret>,
        source: Option<(WebhookSecretSource, Option<WebhookSecret>)>,
        table: Option<ReplayTable>,
    ) -> Self {
        let keys = secret.map(|current| match source {
            Some((source, previous)) => Keys::new(current, previous, Some(source)),
            None => Keys::new(current, None, None),
        });
        Self {
            keys,
            seen: Seen::default(),
            table,
        }
    }

    /// Whether `taken`'s body was taken already, here or (with the table) anywhere in the fleet.
    async fn already_taken(&self, taken: &Taken, until: Instant) -> bool {
        let now_ms = now_ms();
        if self.seen.contains(&taken.digest, now_ms) {
            return true;
        }
        let Some(table) = &self.table else {
            return false;
        };
        let found = table.contains(&taken.digest, now_ms, until).await;
        if found {
            self.seen.record(taken.digest, taken.fresh_until_ms, now_ms);
        }
        found
    }

    /// Record `taken`'s body as taken, here and (with the table) for the fleet.
    async fn record(&self, taken: &Taken, until: Instant) {
        let now_ms = now_ms();
        self.seen.record(taken.digest, taken.fresh_until_ms, now_ms);
        if let Some(table) = &self.table {
            table
                .record(&taken.digest, taken.fresh_until_ms, now_ms, until)
                .await;
        }
    }
}

/// Milliseconds since the Unix epoch, now ([`crate::deadline::now_ms`]), as the replay window
/// counts them.
fn now_ms() -> i64 {
    i64::try_from(crate::deadline::now_ms()).unwrap_or(i64::MAX)
}

/// The invocation a webhook request came in.
#[derive(Debug, Clone, Copy)]
pub struct Invocation<'a> {
    /// Lambda's request id, written into the wake-ups (`sent_by`).
    pub request_id: &'a str,
    /// The invocation's X-Ray trace header (`Context.xray_trace_id`), sent with the wake-ups
    /// as `X-Amzn-Trace-Id`, as a batch's are.
    pub trace_id: Option<&'a str>,
    /// The end of the request's time: every call is bounded by it.
    pub until: Instant,
}

/// A fresh event, to be taken once.
struct Taken {
    digest: BodyDigest,
    /// When the window refuses it anyway (epoch ms): the end of its record.
    fresh_until_ms: i64,
}

/// What answering a request reads of the worker built at the cold start, lent for one request
/// by the handler: the receiver's own state, and what a wake-up decision shares with the
/// invocations (the wake queue, the poison-pill table and its counters, the API client).
pub(crate) struct WorkerView<'a> {
    /// The secrets and the events taken.
    pub receiver: &'a Receiver,
    /// The replay window, the poison-pill policy, the runs an invocation claims at most.
    pub settings: &'a Settings,
    /// The workflows this deployment registers, and its tags.
    pub capabilities: &'a WorkerCapabilities,
    /// The wake queue; `None`: no wake-up can be sent (503).
    pub wake: Option<&'a Waker>,
    /// Held by one wake-up decision at a time in the process (step 9).
    pub push_turn: &'a tokio::sync::Mutex<()>,
    /// The poison-pill table (blocked workflows are left out of the backlog in defer mode).
    pub poison_table: &'a Arc<dyn PoisonTable>,
    /// The counters read from the table, shared with the invocations.
    pub poison_seen: &'a Arc<SeenCounters>,
    /// The fleet's wake-up mark across environments, if configured.
    pub fleet: Option<&'a FleetMark>,
    /// The API (the backlog's count).
    pub api: &'a ApiClient,
}

/// Answer one webhook request (see the module docs), every call bounded by `invocation.until`.
pub(crate) async fn receive(
    worker: WorkerView<'_>,
    request: &LambdaFunctionUrlRequest,
    invocation: Invocation<'_>,
) -> Answer {
    // 1. On: a secret is configured.
    let Some(keys) = worker.receiver.keys.as_ref() else {
        error!(
            "a webhook request came, and the receiver is off: set IRONFLOW_WEBHOOK_SECRET_ARN \
             (or IRONFLOW_WEBHOOK_SECRET)"
        );
        return Answer::refused(
            503,
            "the webhook receiver is off: IRONFLOW_WEBHOOK_SECRET_ARN is not set",
        );
    };
    // 2. A POST.
    let method = request.request_context.http.method.as_deref().unwrap_or("");
    if !method.eq_ignore_ascii_case("POST") {
        return Answer::refused(405, "only POST is accepted");
    }
    // 3. A body of a sane size.
    let body = match body_of(request) {
        Ok(body) => body,
        Err(answer) => return answer,
    };
    // 4. The sender.
    let presented = Presented {
        signature: header(request, auth::SIGNATURE_HEADER),
        token: request
            .query_string_parameters
            .get(auth::TOKEN_PARAMETER)
            .map(String::as_str),
        body: &body,
    };
    let proof = match keys.check(presented, invocation.until).await {
        Ok(proof) => proof,
        Err(refusal) => return Answer::unauthenticated(&refusal.to_string()),
    };
    // 5. An event.
    let Ok(notice) = Notice::parse(&body) else {
        return Answer::refused(
            400,
            "the body is not a JSON event with a string \"type\" (and an RFC 3339 \"at\")",
        );
    };
    // 6. Fresh.
    let window = worker.settings.webhook_replay_window;
    let taken = match replay::fresh_until(notice.at, chrono::Utc::now(), window) {
        Ok(fresh_until_ms) => Taken {
            digest: replay::digest(&body),
            fresh_until_ms,
        },
        Err(stale) => return Answer::unauthenticated(&stale.to_string()),
    };
    // 7. Work for this deployment.
    let registered = worker.capabilities.workflows.as_deref();
    let workflow = notice.workflow_name.as_deref().unwrap_or("");
    if let Verdict::Ignore(reason) = notice.verdict(registered) {
        info!(event = %notice.kind, workflow, ?proof, reason, "webhook event ignored");
        return Answer::new(202, json!({ "woke": false, "ignored": reason }));
    }
    // 8. and 9. Not taken yet, then the wake-ups.
    wake_fleet(&worker, &notice, &taken, invocation).await
}

/// Steps 8 and 9: a body not taken yet, and the wake-ups the backlog needs, through the wake
/// queue.
async fn wake_fleet(
    worker: &WorkerView<'_>,
    notice: &Notice,
    taken: &Taken,
    invocation: Invocation<'_>,
) -> Answer {
    let workflow = notice.workflow_name.as_deref().unwrap_or("");
    // The builder refuses a secret without a wake queue.
    let Some(waker) = worker.wake else {
        return Answer::refused(503, "no wake queue (IRONFLOW_WAKE_QUEUE_URL)");
    };
    // The turn and the reads before the send end early enough to leave the send its time.
    let reads_until = wake::reads_end(invocation.until);
    // One wake-up decision at a time in this process: events arriving together (the API's
    // publisher posts each in a task of its own) each see what the one before queued. One that
    // waits past its time is answered at once: the decision under way counts its run too (the
    // API published the event after the run was created).
    let Ok(_turn) = timeout_at(reads_until, worker.push_turn.lock()).await else {
        info!(event = %notice.kind, workflow, "webhook event: coalesced with the wake-ups being decided");
        return Answer::new(202, json!({ "woke": false, "coalesced": true }));
    };
    // Under the turn: a replay arriving with its original waits for the original's record.
    if worker.receiver.already_taken(taken, reads_until).await {
        info!(event = %notice.kind, workflow, "webhook event already taken (a replay, or a re-send of an answered one): ignored");
        return Answer::new(202, json!({ "woke": false, "duplicate": true }));
    }
    // The backlog a claim could take: in defer mode, the poison-pill table's blocked
    // workflows are left out, as the claim leaves them out (their runs wake nobody).
    let mut gate = PoisonGate::new(
        worker.poison_table.clone(),
        worker.settings.poison,
        worker.settings.poison_mode,
        reads_until,
        invocation.request_id,
    )
    .sharing(worker.poison_seen.clone());
    let capabilities = gate.capabilities_for_claim(worker.capabilities).await;
    let need = Need {
        trigger: WakeTrigger::Pushed,
        capabilities: &capabilities,
        runs_per_invocation: worker.settings.max_runs_per_invocation,
        fleet: worker.fleet,
    };
    let (report, delivery) = wake::for_push(
        waker,
        worker.api,
        need,
        invocation.request_id,
        invocation.trace_id,
        (reads_until, invocation.until),
    )
    .await;
    info!(event = %notice.kind, workflow, sent = report.sent, pending_runs = report.pending_runs,
        queued = report.queued, "webhook event: wake-ups");
    // Taken once its wake-ups reached the queue, or none was needed.
    if delivery.needed == 0 || report.sent > 0 {
        worker.receiver.record(taken, invocation.until).await;
    }
    // 503 (the API's webhook retries) only when wake-ups were needed and none surely reached
    // the queue: not when none was needed, nor when the send's answer came too late.
    let status = if delivery.needed > 0 && report.sent == 0 && !delivery.unknown {
        503
    } else {
        202
    };
    Answer::new(
        status,
        json!({ "woke": report.sent > 0, "wake_ups": report }),
    )
}

/// The request's raw body, decoded and bounded (step 3).
fn body_of(request: &LambdaFunctionUrlRequest) -> Result<Vec<u8>, Answer> {
    let raw = request.body.as_deref().unwrap_or("");
    // Base64 is 4/3 the size of what it encodes: refuse before decoding anything too large.
    let encoded_limit = MAX_BODY_BYTES.div_ceil(3).saturating_mul(4);
    let too_large = || Answer::refused(413, "the body is larger than 64 KiB");
    if raw.len() > encoded_limit.max(MAX_BODY_BYTES) {
        return Err(too_large());
    }
    let body = if request.is_base64_encoded {
        base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map_err(|_| Answer::refused(400, "the body is not valid base64"))?
    } else {
        raw.as_bytes().to_vec()
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(too_large());
    }
    Ok(body)
}

/// A request header's value, if present; one that is not visible ASCII is read as empty, not
/// as absent (a signature that cannot be read is malformed, and a request that sends one is
/// judged by it, never by its token).
fn header<'a>(request: &'a LambdaFunctionUrlRequest, name: &str) -> Option<&'a str> {
    request
        .headers
        .get(name)
        .map(|v| v.to_str().unwrap_or_default())
}
