//! The fleets of the pickup rows: the embedded API and what claims its runs (our worker behind
//! its triggers, or the reference worker), and the count of what they did ([`Tally`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::{
    InvocationSummary, LambdaWorker, LambdaWorkerBuilder, Response, settings::WakeSettings,
    wake_ups::LocalWakeQueue, wake_ups::WakeQueue, wake_ups::Waker,
};
use ironflow_local_api::{Backend, FunctionUrl, LocalApi, UrlHandler, Webhook, new_run};
use ironflow_store::entities::RunStatus;
use ironflow_store::store::{RunStore, Store};
use ironflow_worker::WorkerBuilder;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval_at, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{Kind, PickupSettings, Setup, workflows};
use crate::BenchError;

/// The schedule's period: `rate(1 minute)`, as deployed.
pub const TICK: Duration = Duration::from_secs(60);
/// Time from an invocation's start to its deadline.
const INVOCATION: Duration = Duration::from_secs(60);
/// The receiver's secret (the API signs its events with it).
const SECRET: &str = "the-pickup-bench-webhook-secret-of-32-chars-or-more";
/// Invocations one push fleet's worker serves at once: a webhook request comes while a batch
/// runs, as Lambda would start another environment for it (a schedule's worker serves one).
const AT_ONCE: usize = 4;
/// N of the schedule-alone fleets: one tick claims every run waiting (deployed, N = 8 and the
/// wake queue's backlog wake-ups do it in a few invocations; this setup has no queue).
pub const SCHEDULE_MAX_RUNS: usize = 64;
/// Longest the invocations still running at the end are waited for.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// Errors kept per fleet (the rest are counted).
const ERRORS_KEPT: usize = 10;
/// The claim route, counted at the API.
const CLAIM_ROUTE: &str = "GET /api/v1/internal/runs/next";

/// What a fleet's triggers did.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Function URL invocations: one per event the API's webhook posted.
    pub url_invocations: usize,
    /// Those whose answer said the fleet was woken.
    pub url_woke: usize,
    /// Invocations with an SQS event (a batch of wake-ups).
    pub sqs_invocations: usize,
    /// Those that claimed no run.
    pub sqs_empty: usize,
    /// Schedule ticks.
    pub ticks: usize,
    /// Those that claimed no run.
    pub ticks_empty: usize,
    /// Wake-up messages sent, per reason (`pushed`, `due`, `backlog`, `handed_back`).
    pub wake_ups: BTreeMap<String, usize>,
    /// Claim requests the API received.
    pub claims: u64,
    /// The trigger of the invocation that last claimed each run.
    pub claimed_by: HashMap<Uuid, String>,
    /// What went wrong (the first [`ERRORS_KEPT`]), and how many errors in all.
    pub errors: Vec<String>,
    pub error_count: usize,
}

impl Tally {
    /// Add `other`'s counts to these.
    pub fn merge(&mut self, other: Tally) {
        self.url_invocations += other.url_invocations;
        self.url_woke += other.url_woke;
        self.sqs_invocations += other.sqs_invocations;
        self.sqs_empty += other.sqs_empty;
        self.ticks += other.ticks;
        self.ticks_empty += other.ticks_empty;
        for (reason, n) in other.wake_ups {
            *self.wake_ups.entry(reason).or_default() += n;
        }
        self.claims += other.claims;
        self.claimed_by.extend(other.claimed_by);
        self.error_count += other.error_count;
        let room = ERRORS_KEPT.saturating_sub(self.errors.len());
        self.errors.extend(other.errors.into_iter().take(room));
    }

    /// Invocations of ours in all.
    pub fn invocations(&self) -> usize {
        self.url_invocations + self.sqs_invocations + self.ticks
    }

    fn error(&mut self, e: String) {
        self.error_count += 1;
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push(e);
        }
    }

    fn wake_ups_sent(&mut self, reason: &str, n: usize) {
        if n > 0 {
            *self.wake_ups.entry(reason.to_string()).or_default() += n;
        }
    }

    /// A batch's summary, its invocation started by `trigger`.
    fn batch(&mut self, trigger: &str, summary: &InvocationSummary) {
        for run in &summary.runs {
            self.claimed_by.insert(run.run_id, trigger.to_string());
        }
        if let Some(w) = &summary.wake_ups {
            if let Some(t) = w.trigger {
                self.wake_ups_sent(t.as_str(), w.sent);
            }
            let timers = w.timers.iter().map(|t| t.sent).sum();
            self.wake_ups_sent("due", timers);
            for e in &w.errors {
                self.error(format!("wake-ups: {e}"));
            }
        }
        for e in &summary.errors {
            self.error(format!("batch: {e}"));
        }
    }
}

type Shared = Arc<Mutex<Tally>>;

fn lock(tally: &Shared) -> MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fleet: the API, and our triggers' loops or the reference worker.
pub struct Fleet {
    api: LocalApi,
    tally: Shared,
    stop: CancellationToken,
    tasks: TaskTracker,
    reference: Option<JoinHandle<Result<(), ironflow_worker::WorkerError>>>,
    front: Option<FunctionUrl>,
    /// Claims counted before the measured runs.
    claims_before: u64,
}

impl Fleet {
    /// Start `setup`'s fleet for `kind`'s runs; its first tick (if it ticks) `phase` from now.
    pub async fn start(
        kind: Kind,
        setup: Setup,
        token: &str,
        s: &PickupSettings,
        phase: Duration,
    ) -> Result<Self, BenchError> {
        let tally: Shared = Arc::default();
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        let loops = Loops {
            tally: tally.clone(),
            stop: stop.clone(),
            tasks: tasks.clone(),
        };
        let (api, front, reference) = match setup {
            Setup::Push => {
                let (api, front) = start_push(kind, token, s, phase, &loops).await?;
                (api, Some(front), None)
            }
            Setup::Schedule => {
                let api = LocalApi::start(token).await?;
                let worker = ours(kind, &api, token, s)
                    .max_runs_per_invocation(SCHEDULE_MAX_RUNS)
                    .concurrent_invocations(1)
                    .build()?;
                loops.spawn_ticks(Arc::new(worker), phase);
                (api, None, None)
            }
            Setup::Reference => {
                let api = LocalApi::start(token).await?;
                let builder = WorkerBuilder::new(&api.url(), token)
                    .provider(Arc::new(ClaudeCodeProvider::new()));
                let worker = workflows::register_reference(kind, builder)
                    .concurrency(s.concurrency)
                    .build()?;
                // `Worker::run` returns only on a signal: aborted at the end.
                let task = tokio::spawn(async move { worker.run().await });
                (api, None, Some(task))
            }
        };
        let claims_before = claims(&api);
        Ok(Self {
            api,
            tally,
            stop,
            tasks,
            reference,
            front,
            claims_before,
        })
    }

    pub fn api_url(&self) -> String {
        self.api.url()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        self.api.store()
    }

    /// The diagnostic row's start: a run sleeping [`workflows::LONG_NAP_SECS`], claimed through
    /// the push path, whose batch books its timer wake-up; then the counts start afresh.
    pub async fn park_long_sleeper(&self, token: &str) -> Result<(), BenchError> {
        let creator = ironflow_worker::ApiRunStore::new(&self.api.url(), token);
        let run = creator
            .create_run(new_run(workflows::long_nap(), 0))
            .await?;
        let id = run.into_run().id;
        let limit = Instant::now() + Duration::from_secs(30);
        loop {
            let sleeping = self
                .store()
                .get_run(id)
                .await?
                .is_some_and(|r| r.status.state == RunStatus::Sleeping);
            if sleeping && lock(&self.tally).wake_ups.contains_key("due") {
                break;
            }
            if Instant::now() > limit {
                return Err(BenchError::msg(
                    "the long sleeper's timer wake-up was not booked within 30 s",
                ));
            }
            sleep(Duration::from_millis(50)).await;
        }
        *lock(&self.tally) = Tally::default();
        Ok(())
    }

    /// Stop the triggers (waiting for the invocations in flight) or the reference worker; the
    /// API and the counts.
    pub async fn stop(self) -> (LocalApi, Tally) {
        self.stop.cancel();
        self.tasks.close();
        let finished = timeout(STOP_LIMIT, self.tasks.wait()).await.is_ok();
        if let Some(task) = self.reference {
            task.abort();
            let _ = task.await;
        }
        drop(self.front);
        let mut tally = std::mem::take(&mut *lock(&self.tally));
        if !finished {
            tally.error("invocations still running at the end".into());
        }
        tally.claims = claims(&self.api).saturating_sub(self.claims_before);
        (self.api, tally)
    }
}

/// Claim requests the API has received.
fn claims(api: &LocalApi) -> u64 {
    api.requests_by_route()
        .get(CLAIM_ROUTE)
        .copied()
        .unwrap_or(0)
}

/// Our builder for `kind`'s runs against `api`.
fn ours(kind: Kind, api: &LocalApi, token: &str, s: &PickupSettings) -> LambdaWorkerBuilder {
    let builder = LambdaWorkerBuilder::new(&api.url(), token)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .concurrency(s.concurrency)
        .max_runs_per_invocation(s.max_runs)
        .concurrent_invocations(AT_ONCE)
        .function_timeout(INVOCATION);
    workflows::register_ours(kind, builder)
}

/// The push fleet: the Function URL stand-in first (the API's webhook needs its URL), the API,
/// our worker with its receiver and a wake queue in the process, and the queue's consumer.
async fn start_push(
    kind: Kind,
    token: &str,
    s: &PickupSettings,
    phase: Duration,
    loops: &Loops,
) -> Result<(LocalApi, FunctionUrl), BenchError> {
    let cell: Arc<OnceLock<Arc<LambdaWorker>>> = Arc::default();
    let front = FunctionUrl::start(url_handler(cell.clone(), loops.tally.clone())).await?;
    let webhook = Webhook {
        url: front.url(),
        signing_secret: Some(SECRET.to_string()),
    };
    let api = LocalApi::start_with_webhook(token, &Backend::Memory, webhook).await?;
    let queue = Arc::new(LocalWakeQueue::new());
    let waker = Waker::to_queue(
        queue.clone() as Arc<dyn WakeQueue>,
        WakeSettings::new("local"),
    );
    let worker = ours(kind, &api, token, s)
        .webhook_secret(SECRET)
        .wake_ups(waker)
        .build()?;
    let worker = Arc::new(worker);
    // Set before any run exists: no event reaches the receiver earlier.
    let _ = cell.set(worker.clone());
    loops.spawn_consumer(queue, worker.clone());
    if kind == Kind::BehindTimer {
        loops.spawn_ticks(worker, phase);
    }
    Ok((api, front))
}

/// The Function URL's function: the receiver, each answer counted.
fn url_handler(cell: Arc<OnceLock<Arc<LambdaWorker>>>, tally: Shared) -> UrlHandler {
    Arc::new(move |request| {
        let worker = cell.get().cloned();
        let tally = tally.clone();
        Box::pin(async move {
            let Some(worker) = worker else {
                return json!({"statusCode": 503, "body": "{}"});
            };
            let answer = ironflow_lambda::handle_response(&worker, event(request)).await;
            let mut t = lock(&tally);
            t.url_invocations += 1;
            match answer {
                Ok(Response::Webhook(answer)) => {
                    if answer.body["woke"] == json!(true) {
                        t.url_woke += 1;
                    }
                    let sent = answer.body["wake_ups"]["sent"].as_u64().unwrap_or(0);
                    t.wake_ups_sent("pushed", usize::try_from(sent).unwrap_or(0));
                    if answer.status >= 300 {
                        t.error(format!(
                            "webhook answered {}: {}",
                            answer.status, answer.body
                        ));
                    }
                    Response::Webhook(answer).to_json()
                }
                Ok(other) => {
                    t.error("a Function URL request was not answered as one".into());
                    other.to_json()
                }
                Err(e) => {
                    t.error(format!("webhook: {e}"));
                    json!({"statusCode": 500, "body": e.to_string()})
                }
            }
        })
    })
}

/// An event for the handler with a fresh request id and a deadline [`INVOCATION`] away.
fn event(payload: Value) -> LambdaEvent<Value> {
    let mut context = Context::default();
    context.request_id = Uuid::new_v4().to_string();
    context.deadline = ironflow_lambda::poison::now_ms() + INVOCATION.as_millis() as u64;
    LambdaEvent::new(payload, context)
}

/// What the trigger loops of one fleet share.
struct Loops {
    tally: Shared,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Loops {
    /// Lambda's event source mapping, as far as this needs it: each batch of visible wake-ups
    /// (up to 10) becomes one SQS event, in an invocation of its own.
    fn spawn_consumer(&self, queue: Arc<LocalWakeQueue>, worker: Arc<LambdaWorker>) {
        let (tally, stop, tasks) = (self.tally.clone(), self.stop.clone(), self.tasks.clone());
        self.tasks.spawn(async move {
            loop {
                let far = Instant::now() + Duration::from_secs(3600);
                let bodies = tokio::select! {
                    () = stop.cancelled() => return,
                    bodies = queue.receive(far) => bodies,
                };
                if bodies.is_empty() {
                    continue;
                }
                let (worker, tally) = (worker.clone(), tally.clone());
                tasks.spawn(async move { sqs_invocation(&worker, bodies, &tally).await });
            }
        });
    }

    /// A schedule tick every [`TICK`], the first `phase` from now, each in an invocation of
    /// its own.
    fn spawn_ticks(&self, worker: Arc<LambdaWorker>, phase: Duration) {
        let (tally, stop, tasks) = (self.tally.clone(), self.stop.clone(), self.tasks.clone());
        self.tasks.spawn(async move {
            let mut every = interval_at(Instant::now() + phase, TICK);
            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                let (worker, tally) = (worker.clone(), tally.clone());
                tasks.spawn(async move { tick(&worker, &tally).await });
            }
        });
    }
}

/// One invocation with the wake-ups `bodies` as an SQS event.
async fn sqs_invocation(worker: &LambdaWorker, bodies: Vec<String>, tally: &Shared) {
    let mut reasons: Vec<String> = bodies
        .iter()
        .map(|b| {
            serde_json::from_str::<Value>(b)
                .ok()
                .and_then(|v| v["reason"].as_str().map(str::to_string))
                .unwrap_or_else(|| "unknown".into())
        })
        .collect();
    reasons.sort();
    reasons.dedup();
    let trigger = reasons.join("+");
    let records: Vec<Value> = bodies
        .iter()
        .map(|body| json!({"messageId": Uuid::new_v4().to_string(), "body": body, "eventSource": "aws:sqs"}))
        .collect();
    let response =
        ironflow_lambda::handle_response(worker, event(json!({"Records": records}))).await;
    let mut t = lock(tally);
    t.sqs_invocations += 1;
    match response {
        Ok(response) => {
            let failures = response.to_json()["batchItemFailures"]
                .as_array()
                .map_or(0, Vec::len);
            if failures > 0 {
                t.error(format!(
                    "{failures} wake-ups reported as batch item failures"
                ));
            }
            match response.summary() {
                Some(summary) => {
                    if summary.claimed == 0 {
                        t.sqs_empty += 1;
                    }
                    t.batch(&trigger, summary);
                }
                None => t.error("an SQS event ran no batch".into()),
            }
        }
        Err(e) => t.error(format!("SQS invocation: {e}")),
    }
}

/// One schedule tick's invocation, as EventBridge sends it.
async fn tick(worker: &LambdaWorker, tally: &Shared) {
    let payload = json!({
        "version": "0",
        "id": Uuid::new_v4(),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "local",
        "resources": ["arn:aws:events:local:000000000000:rule/pickup-bench"],
        "detail": {}
    });
    let response = ironflow_lambda::handle_response(worker, event(payload)).await;
    let mut t = lock(tally);
    t.ticks += 1;
    match response.as_ref().map(Response::summary) {
        Ok(Some(summary)) => {
            if summary.claimed == 0 {
                t.ticks_empty += 1;
            }
            t.batch("tick", summary);
        }
        Ok(None) => t.error("a tick ran no batch".into()),
        Err(e) => t.error(format!("tick: {e}")),
    }
}
