//! A stand-in for AWS's Lambda Runtime API, the one every function process of the bench
//! polls: the managed-instances drains ([`crate::managed`]) and the deployable binary's cold
//! start and peak RSS ([`crate::process`]). One endpoint per function process (each execution
//! environment has its own `AWS_LAMBDA_RUNTIME_API`), and one [`Dispatcher`] behind them all
//! that hands out invocation events, a stream of them, to the concurrent
//! `GET /2018-06-01/runtime/invocation/next` long-polls of every process, and tallies the
//! answers (`POST .../invocation/{id}/response` or `.../error`, `/runtime/init/error`).
//!
//! A hand-written stub: the Runtime API is AWS's protocol, not ironflow's, and no package ships
//! an implementation of it. The events are direct invocations (by default `{"reason": ...}`:
//! one batch of the configured N; [`Dispatcher::with_event`] sets another body), each with a
//! deadline [`Dispatcher::new`]'s `deadline` away.
//!
//! When to serve: no event before [`Dispatcher::open`] (so that every process's poll loops are
//! waiting when the drain starts); then one event per poll, at once, so that each process keeps
//! as many invocations outstanding as it polls for; none once an answer says the backlog is
//! empty (an invocation claimed nothing) while other invocations are still out (their runs are
//! the drain's tail: more events would only be empty claims, in a tight loop); again when an
//! answer returns runs to the API (handed back, released, lease lost), or when no invocation is
//! out and the drain is not over; never after the drain is over, when the answers have reported
//! the end of every run. A poll that gets no event waits, as a warm function does between
//! invocations. The fleet section's backlog is kept full ([`Dispatcher::steady`]): every poll
//! is served until the end, an empty claim included, the process that made it after a pause (the
//! reference worker's own pause after an empty poll).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::{Instant, timeout};

use crate::BenchError;

/// Outcomes (`InvocationSummary.runs[].outcome`) that put a run back to Pending for a later
/// invocation: the run has not ended.
const RETURNED: [&str; 3] = ["handed_back", "released", "lease_lost"];

/// Errors kept word for word (the rest are counted).
const KEPT_ERRORS: usize = 5;

/// One process's invocations, as the stub saw them.
#[derive(Debug, Clone, Default)]
pub struct Slots {
    /// `GET .../next` received, in all.
    pub polls: usize,
    /// Polls received before the drain opened: the poll loops the process runs at once.
    pub loops_at_start: usize,
    /// Invocations served and not answered yet.
    pub in_flight: usize,
    /// The most invocations out at once.
    pub max_in_flight: usize,
    /// Invocations out, integrated over the drain (invocation-seconds).
    busy: f64,
    /// When `in_flight` last changed (or the drain opened).
    since: Option<Instant>,
    /// Invocations answered.
    pub invocations: usize,
    /// When the first `GET .../next` arrived.
    first_poll: Option<Instant>,
    /// Not served before then: an invocation of it claimed nothing ([`Dispatcher::steady`]).
    paused_until: Option<Instant>,
}

impl Slots {
    /// The mean number of invocations out over a drain of `wall`.
    pub fn mean_in_flight(&self, wall: Duration) -> f64 {
        self.busy / wall.as_secs_f64().max(1e-9)
    }

    /// `in_flight` becomes `in_flight + delta` at `now`; counted into `busy` until `end`.
    fn change(&mut self, delta: isize, now: Instant, end: Option<Instant>) {
        if let Some(since) = self.since {
            let until = end.map_or(now, |end| end.min(now));
            self.busy +=
                self.in_flight as f64 * until.saturating_duration_since(since).as_secs_f64();
            self.since = Some(until.max(since));
        }
        self.in_flight = self.in_flight.saturating_add_signed(delta);
        self.max_in_flight = self.max_in_flight.max(self.in_flight);
    }
}

/// What the answers said, over every process.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Invocations answered (responses and errors).
    pub invocations: usize,
    /// Invocations that claimed nothing.
    pub empty: usize,
    /// Runs claimed.
    pub claimed: usize,
    /// Runs per outcome.
    pub outcomes: BTreeMap<String, usize>,
    /// Invocation errors (`.../error`, `/runtime/init/error`) and the summaries' batch
    /// errors and API faults, counted.
    pub errors: usize,
    /// The first [`KEPT_ERRORS`] of them.
    pub first_errors: Vec<String>,
    /// The last summary answered, as posted.
    pub last_summary: Option<serde_json::Value>,
}

impl Tally {
    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_errors.len() < KEPT_ERRORS {
            self.first_errors.push(e.chars().take(400).collect());
        }
    }
}

struct Ledger {
    opened: Option<Instant>,
    done: Option<Instant>,
    /// K: the runs whose end the answers must report.
    target: usize,
    finished: usize,
    backlog_empty: bool,
    /// The backlog is kept full ([`Dispatcher::steady`]): an empty claim is contention, not
    /// the drain's tail, and does not stop the serving; `Some`: the pause of a process after
    /// an invocation of it claimed nothing.
    steady: Option<Duration>,
    served: usize,
    processes: Vec<Slots>,
    tally: Tally,
}

impl Ledger {
    fn may_serve(&self) -> bool {
        let out: usize = self.processes.iter().map(|p| p.in_flight).sum();
        self.opened.is_some() && self.done.is_none() && (!self.backlog_empty || out == 0)
    }
}

/// Hands out the events of one drain to every process and tallies the answers.
pub struct Dispatcher {
    state: Mutex<Ledger>,
    changed: Notify,
    deadline: Duration,
    /// The events' request ids start with it.
    label: &'static str,
    /// The events' body.
    body: &'static str,
}

/// The body of a managed-instances drain's events.
const MANAGED_EVENT: &str = r#"{"reason": "bench: managed-instances drain"}"#;

/// One event, as served.
struct Event {
    request_id: String,
    deadline_ms: u64,
}

impl Dispatcher {
    /// For `processes` processes draining `target` runs, each event's deadline `deadline` away.
    pub fn new(processes: usize, target: usize, deadline: Duration) -> Arc<Self> {
        Self::with_event(processes, target, deadline, "managed", MANAGED_EVENT)
    }

    /// As [`Dispatcher::new`], the events' request ids `{label}-{process}-{n}` and their body
    /// `body`.
    pub fn with_event(
        processes: usize,
        target: usize,
        deadline: Duration,
        label: &'static str,
        body: &'static str,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(Ledger {
                opened: None,
                done: None,
                target,
                finished: 0,
                backlog_empty: false,
                steady: None,
                served: 0,
                processes: vec![Slots::default(); processes],
                tally: Tally::default(),
            }),
            changed: Notify::new(),
            deadline,
            label,
            body,
        })
    }

    /// For `processes` processes whose backlog is kept full (the fleet section's steady
    /// state): an event for every poll until [`Dispatcher::finish`], an invocation that claimed
    /// nothing included (the backlog may be empty for a moment: the feeder tops it up), but
    /// the process that made it is served again only `pause` after its answer, as the
    /// reference worker polls again only after a pause. Served at once instead, invocations
    /// that find nothing loop on the claim route and load the API and its database that the
    /// feeder needs to top the backlog up.
    pub fn steady(
        processes: usize,
        deadline: Duration,
        pause: Duration,
        label: &'static str,
        body: &'static str,
    ) -> Arc<Self> {
        let d = Self::with_event(processes, usize::MAX, deadline, label, body);
        d.lock().steady = Some(pause);
        d
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wait until every process polls, then until each has `loops` polls waiting or `settle`
    /// has passed since (a process that polls fewer times runs fewer loops). `alive` is called
    /// between waits, to stop at a process that exited. Returns each process's polls.
    pub async fn ready(
        &self,
        loops: usize,
        settle: Duration,
        limit: Duration,
        alive: &mut (dyn FnMut() -> Result<(), BenchError> + Send),
    ) -> Result<Vec<usize>, BenchError> {
        let polls = |s: &Ledger| s.processes.iter().map(|p| p.polls).collect::<Vec<_>>();
        let all_polled = |s: &Ledger| s.processes.iter().all(|p| p.polls >= 1);
        let all_loops = |s: &Ledger| s.processes.iter().all(|p| p.polls >= loops);
        self.wait(limit, alive, &|s| all_polled(s))
            .await
            .map_err(|e| BenchError::msg(format!("not every function process polled: {e}")))?;
        // Fewer loops than asked for is a finding, not a failure: the timeout is expected then.
        let _ = self.wait(settle, alive, &|s| all_loops(s)).await;
        alive()?;
        Ok(polls(&self.lock()))
    }

    /// Wait until process `p` has polled `n` times (`GET .../next`), or the function reported
    /// an error; returns when its first poll arrived.
    pub async fn polled(&self, p: usize, n: usize, limit: Duration) -> Result<Instant, BenchError> {
        let mut ok = || Ok(());
        let polled = |s: &Ledger| s.processes[p].polls >= n || s.tally.errors > 0;
        // Timed out or not, the ledger says what happened.
        let _ = self.wait(limit, &mut ok, &polled).await;
        let s = self.lock();
        match (s.processes[p].first_poll, s.tally.first_errors.first()) {
            (Some(first), _) if s.processes[p].polls >= n => Ok(first),
            (_, Some(e)) => Err(BenchError::msg(format!("the function reported: {e}"))),
            _ => Err(BenchError::msg(format!(
                "the function did not poll the Runtime API ({n} time(s)) within {limit:?}"
            ))),
        }
    }

    /// Wait until `n` invocations are answered; the tally then. A function that reported an
    /// error (init error, invocation error) fails it.
    pub async fn answered(&self, n: usize, limit: Duration) -> Result<Tally, BenchError> {
        let mut ok = || Ok(());
        let answered = |s: &Ledger| s.tally.invocations >= n || s.tally.errors > 0;
        self.wait(limit, &mut ok, &answered)
            .await
            .map_err(|_| BenchError::msg("the function did not respond in time"))?;
        let tally = self.lock().tally.clone();
        match tally.first_errors.first() {
            Some(e) => Err(BenchError::msg(format!("the function failed: {e}"))),
            None => Ok(tally),
        }
    }

    /// Start serving events; the drain's clock starts (returned).
    pub fn open(&self) -> Instant {
        let mut s = self.lock();
        let now = Instant::now();
        s.opened = Some(now);
        for p in &mut s.processes {
            p.loops_at_start = p.polls;
            p.since = Some(now);
        }
        drop(s);
        self.changed.notify_waiters();
        now
    }

    /// Wait until the answers have reported the end of every run; returns when the last did.
    pub async fn done(
        &self,
        limit: Duration,
        alive: &mut (dyn FnMut() -> Result<(), BenchError> + Send),
    ) -> Result<Instant, BenchError> {
        self.wait(limit, alive, &|s| s.done.is_some())
            .await
            .map_err(|e| {
                let s = self.lock();
                BenchError::msg(format!(
                    "the drain did not end: {e} ({} of {} runs ended; errors: {:?})",
                    s.finished, s.target, s.tally.first_errors
                ))
            })?;
        self.lock()
            .done
            .ok_or_else(|| BenchError::msg("the drain ended without an end time"))
    }

    /// Wait for `ready` (checked at each change, and `alive` every second), at most `limit`.
    async fn wait(
        &self,
        limit: Duration,
        alive: &mut (dyn FnMut() -> Result<(), BenchError> + Send),
        ready: &(dyn Fn(&Ledger) -> bool + Sync),
    ) -> Result<(), BenchError> {
        let end = Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            if ready(&self.lock()) {
                return Ok(());
            }
            alive()?;
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BenchError::msg(format!("not within {limit:?}")));
            }
            let _ = timeout(left.min(Duration::from_secs(1)), notified).await;
        }
    }

    /// What each process's invocations did, and what the answers said.
    pub fn finish(&self) -> (Vec<Slots>, Tally) {
        let s = self.lock();
        let end = s.done.unwrap_or_else(Instant::now);
        let mut processes = s.processes.clone();
        for p in &mut processes {
            p.change(0, end, Some(end));
        }
        (processes, s.tally.clone())
    }

    /// The event for the next poll of process `p`, once there is one.
    async fn next(&self, p: usize) -> Event {
        {
            let mut s = self.lock();
            let process = &mut s.processes[p];
            process.polls += 1;
            process.first_poll.get_or_insert_with(Instant::now);
        }
        self.changed.notify_waiters();
        loop {
            let notified = self.changed.notified();
            let paused = {
                let mut s = self.lock();
                let now = Instant::now();
                let paused = s.processes[p].paused_until.filter(|&until| until > now);
                if paused.is_none() && s.may_serve() {
                    s.served += 1;
                    let n = s.served;
                    let end = s.done;
                    s.processes[p].change(1, now, end);
                    return Event {
                        request_id: format!("{}-{p}-{n}", self.label),
                        deadline_ms: ironflow_lambda::poison::now_ms()
                            + self.deadline.as_millis() as u64,
                    };
                }
                paused
            };
            match paused {
                Some(until) => {
                    let _ = tokio::time::timeout_at(until, notified).await;
                }
                None => notified.await,
            }
        }
    }

    /// Process `p` answered an invocation: its summary (`Ok`) or an error.
    fn answer(&self, p: usize, answer: Result<&[u8], String>) {
        let mut s = self.lock();
        let now = Instant::now();
        let end = s.done;
        s.processes[p].change(-1, now, end);
        s.processes[p].invocations += 1;
        s.tally.invocations += 1;
        match answer.and_then(|body| {
            serde_json::from_slice::<serde_json::Value>(body)
                .map_err(|e| format!("a response that is not a summary ({e})"))
        }) {
            Ok(summary) => {
                if let Some(pause) = s.steady
                    && summary["claimed"].as_u64() == Some(0)
                {
                    s.processes[p].paused_until = Some(now + pause);
                }
                tally_summary(&mut s, &summary);
                s.tally.last_summary = Some(summary);
            }
            Err(e) => s.tally.error(e),
        }
        if s.finished >= s.target && s.done.is_none() {
            s.done = Some(now);
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// The function reported an init error.
    fn init_error(&self, body: &[u8]) {
        self.lock()
            .tally
            .error(format!("init error: {}", String::from_utf8_lossy(body)));
        self.changed.notify_waiters();
    }
}

/// Count one invocation's summary into the state.
fn tally_summary(s: &mut Ledger, summary: &serde_json::Value) {
    let claimed = summary["claimed"].as_u64().unwrap_or(0) as usize;
    s.tally.claimed += claimed;
    if claimed == 0 {
        s.tally.empty += 1;
        s.backlog_empty = s.steady.is_none();
    }
    let mut returned = 0;
    for run in summary["runs"].as_array().into_iter().flatten() {
        let outcome = run["outcome"].as_str().unwrap_or("unknown").to_string();
        if RETURNED.contains(&outcome.as_str()) {
            returned += 1;
        } else {
            s.finished += 1;
        }
        *s.tally.outcomes.entry(outcome).or_default() += 1;
    }
    if returned > 0 {
        s.backlog_empty = false;
    }
    for e in summary["errors"].as_array().into_iter().flatten() {
        s.tally.error(format!("batch error: {e}"));
    }
    for e in summary["api_errors"].as_array().into_iter().flatten() {
        s.tally.error(format!("API fault: {e}"));
    }
}

/// The Runtime API endpoint of one process. Stops when dropped.
pub struct Endpoint {
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type Shared = (Arc<Dispatcher>, usize);

impl Endpoint {
    /// The endpoint of process `p`, on a free loopback port.
    pub async fn start(dispatcher: Arc<Dispatcher>, p: usize) -> Result<Self, BenchError> {
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(|State((d, p)): State<Shared>, body: Bytes| async move {
                    d.answer(p, Ok(&body));
                    StatusCode::ACCEPTED
                }),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post(|State((d, p)): State<Shared>, body: Bytes| async move {
                    let e = format!("invocation error: {}", String::from_utf8_lossy(&body));
                    d.answer(p, Err(e));
                    StatusCode::ACCEPTED
                }),
            )
            .route(
                "/2018-06-01/runtime/init/error",
                post(|State((d, _)): State<Shared>, body: Bytes| async move {
                    d.init_error(&body);
                    StatusCode::ACCEPTED
                }),
            )
            .with_state((dispatcher, p));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, server })
    }
}

async fn next(State((d, p)): State<Shared>) -> Response {
    let event = d.next(p).await;
    let body = d.body;
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    };
    put("lambda-runtime-aws-request-id", &event.request_id);
    put("lambda-runtime-deadline-ms", &event.deadline_ms.to_string());
    put(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:us-east-1:000000000000:function:ironflow-lambda-bench",
    );
    put(
        "lambda-runtime-trace-id",
        "Root=1-00000000-000000000000000000000000",
    );
    put("content-type", "application/json");
    (StatusCode::OK, headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(claimed: usize, outcomes: &[&str]) -> Vec<u8> {
        let runs: Vec<_> = outcomes
            .iter()
            .map(|o| serde_json::json!({ "outcome": o }))
            .collect();
        serde_json::json!({ "claimed": claimed, "runs": runs, "errors": [], "api_errors": [] })
            .to_string()
            .into_bytes()
    }

    #[tokio::test]
    async fn serves_until_the_backlog_is_empty_then_only_when_nothing_is_out_and_never_after_the_end()
     {
        let d = Dispatcher::new(1, 3, Duration::from_secs(60));
        let mut ok = || Ok(());
        let first = tokio::spawn({
            let d = d.clone();
            async move { d.next(0).await.request_id }
        });
        d.ready(1, Duration::ZERO, Duration::from_secs(5), &mut ok)
            .await
            .unwrap();
        assert!(!first.is_finished(), "no event before the drain opens");
        d.open();
        assert_eq!(first.await.unwrap(), "managed-0-1");
        let second = d.next(0).await;
        assert_eq!(second.request_id, "managed-0-2");
        // The first claimed two runs, one handed back; the second claims nothing.
        d.answer(0, Ok(&summary(0, &[])));
        assert!(d.lock().backlog_empty);
        let third = tokio::spawn({
            let d = d.clone();
            async move { d.next(0).await.request_id }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !third.is_finished(),
            "backlog empty, an invocation out: no event"
        );
        d.answer(0, Ok(&summary(2, &["completed", "handed_back"])));
        assert_eq!(third.await.unwrap(), "managed-0-3", "a run came back");
        d.answer(0, Ok(&summary(2, &["completed", "failed"])));
        let end = d.done(Duration::from_secs(1), &mut ok).await.unwrap();
        assert!(!d.lock().may_serve(), "nothing after the end");
        let (slots, tally) = d.finish();
        assert_eq!(slots[0].max_in_flight, 2);
        assert_eq!(slots[0].invocations, 3);
        assert_eq!(slots[0].loops_at_start, 1);
        assert_eq!((tally.invocations, tally.empty, tally.claimed), (3, 1, 4));
        assert_eq!(tally.outcomes["completed"], 2);
        assert!(end <= Instant::now());
    }

    #[tokio::test]
    async fn a_steady_backlog_is_served_after_an_empty_claim_once_the_process_paused() {
        let pause = Duration::from_millis(300);
        let d = Dispatcher::steady(2, Duration::from_secs(60), pause, "fleet", "{}");
        d.open();
        let _first = d.next(0).await;
        let _second = d.next(0).await;
        // The first claimed nothing, the second is still out.
        d.answer(0, Ok(&summary(0, &[])));
        let answered = Instant::now();
        assert!(
            d.lock().may_serve(),
            "an empty claim does not stop a steady backlog"
        );
        // Another process is served at once; this one after its pause.
        assert_eq!(d.next(1).await.request_id, "fleet-1-3");
        assert_eq!(d.next(0).await.request_id, "fleet-0-4");
        assert!(answered.elapsed() >= pause, "{:?}", answered.elapsed());
        // A claim that took a run pauses nothing.
        let before = d.lock().processes[0].paused_until;
        d.answer(0, Ok(&summary(1, &["completed"])));
        assert_eq!(d.lock().processes[0].paused_until, before);
        assert_eq!(d.next(0).await.request_id, "fleet-0-5");
        assert_eq!(d.finish().1.empty, 1);
    }

    #[tokio::test]
    async fn an_error_answer_is_counted_and_kept() {
        let d = Dispatcher::new(1, 1, Duration::from_secs(60));
        d.open();
        let _ = d.next(0).await;
        d.answer(0, Err("invocation error: boom".into()));
        d.answer(0, Ok(b"not json"));
        let (_, tally) = d.finish();
        assert_eq!(tally.errors, 2);
        assert_eq!(tally.first_errors[0], "invocation error: boom");
    }

    #[tokio::test]
    async fn one_event_for_a_batch_and_none_for_a_cold_start() {
        // A cold start: never opened, the first poll is timed and waits.
        let cold = Dispatcher::with_event(1, 0, Duration::from_secs(60), "cold", "{}");
        let poll = tokio::spawn({
            let cold = cold.clone();
            async move { cold.next(0).await.request_id }
        });
        let first = cold.polled(0, 1, Duration::from_secs(5)).await.unwrap();
        assert!(first <= Instant::now());
        assert!(!poll.is_finished(), "no event for a cold start");
        poll.abort();
        // A batch: one event; its summary answered, kept; the next poll gets nothing.
        let batch = Dispatcher::with_event(1, 2, Duration::from_secs(60), "rss", "{}");
        batch.open();
        assert_eq!(batch.next(0).await.request_id, "rss-0-1");
        batch.answer(0, Ok(&summary(2, &["completed", "completed"])));
        let tally = batch.answered(1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(tally.last_summary.unwrap()["claimed"], 2);
        assert!(!batch.lock().may_serve(), "one event only");
        // An init error fails both waits, with the function's words.
        let failed = Dispatcher::with_event(1, 1, Duration::from_secs(60), "x", "{}");
        failed.init_error(b"no handler");
        let e = failed
            .polled(0, 1, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no handler"), "{e}");
        let e = failed
            .answered(1, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no handler"), "{e}");
    }
}
