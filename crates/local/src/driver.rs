//! The default mode's drive: the worker, the receiver behind the Function URL stand-in and the
//! invocation loop ([`Driver`]: the wake queue served as an SQS event source mapping, schedule
//! ticks as the safety net), and the watch of the runs until every one is terminal.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use ironflow_core::provider::AgentProvider;
use ironflow_lambda::poison::now_ms;
use ironflow_lambda::samples;
use ironflow_lambda::{
    InvocationSummary, LambdaWorker, LambdaWorkerBuilder, Response, settings::WakeSettings,
    wake_ups::LocalWakeQueue, wake_ups::WakeQueue, wake_ups::Waker,
};
use ironflow_local_api::{LocalApi, UrlHandler};
use ironflow_store::store::Store;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use uuid::Uuid;

/// Simulated invocation length: short, so that the multi-step workflow is handed back.
const INVOCATION: Duration = Duration::from_secs(4);
/// Invocations started at most, wake-ups and ticks together.
const MAX_INVOCATIONS: usize = 40;
/// Invocations from the wake queue at once at most, as an event source mapping's maximum
/// concurrency bounds them.
const QUEUE_CONCURRENCY: usize = 3;
/// The schedule's period, the first tick one period after the start: the safety net, not what
/// starts runs (the deployed rule ticks every minute).
const TICK_EVERY: Duration = Duration::from_secs(10);
/// Delay of the wake-ups sent after a handback: 1 s (`IRONFLOW_WAKE_DELAY_SECS`, deployed 5 s
/// by default so that the wake-up finds the sender's instance warm; here there is none to find).
const HANDBACK_WAKE_DELAY: Duration = Duration::from_secs(1);
/// How often the runner reads the runs' states (first claims, the end).
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// Delay before a wake-up its invocation reported as a batch item failure is visible again (as
/// SQS's visibility timeout, shortened).
const RETRY_DELAY_SECS: u64 = 2;

/// The worker of the default mode: the samples and the example's AI patterns on `provider`, the
/// receiver with `secret`, its wake-ups on `queue`, several invocations at once.
pub fn push_worker(
    api_url: &str,
    token: &str,
    secret: &str,
    queue: Arc<LocalWakeQueue>,
    provider: Arc<dyn AgentProvider>,
) -> Result<LambdaWorker, ironflow_lambda::BuildError> {
    let mut wake = WakeSettings::new("local://ironflow-wake");
    wake.handback_delay = HANDBACK_WAKE_DELAY;
    let builder = LambdaWorkerBuilder::new(api_url, token).provider(provider);
    let worker = my_workflows::patterns::register(builder)
        .register(samples::QuickShell)
        .register(samples::MultiStep { step_secs: 1.2 })
        .register(samples::Flaky)
        .register(samples::AlwaysFails)
        .max_runs_per_invocation(4)
        .concurrency(2)
        // One process serving the queue's invocations and a tick at once, as a Managed
        // Instances process does (on-demand Lambda would give each its own environment).
        .concurrent_invocations(QUEUE_CONCURRENCY + 1)
        .function_timeout(INVOCATION)
        .deadline_margin(Duration::from_millis(1000))
        .min_claim_budget(Duration::from_millis(300))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_secs(1))
        .poison_threshold(3)
        .poison_cooldown(Duration::from_secs(60))
        .webhook_secret(secret)
        .wake_ups(Waker::to_queue(queue, wake))
        .build()?;
    println!(
        "wake-ups go to a queue in this process, served as an SQS event source mapping \
         ({QUEUE_CONCURRENCY} invocations at once at most, one worker serving {} at once); a \
         schedule tick every {}s is the safety net",
        QUEUE_CONCURRENCY + 1,
        TICK_EVERY.as_secs()
    );
    Ok(worker)
}

/// Watch the store until every run is terminal, or the invocations ran out (or one failed);
/// then stop the driver and wait for its loops. The claims seen.
pub async fn watch_until_terminal(
    api: &LocalApi,
    runs: &[Uuid],
    driver: &Driver,
    mut drive: tokio::task::JoinHandle<()>,
) -> Result<Claims, Box<dyn std::error::Error>> {
    let mut claims = Claims::default();
    let mut drive_ended = false;
    loop {
        if claims.watch(api.store(), runs).await {
            break;
        }
        tokio::select! {
            ended = &mut drive => {
                drive_ended = true;
                ended?;
                break;
            }
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
    }
    driver.stop();
    if !drive_ended {
        drive.await?;
    }
    claims.watch(api.store(), runs).await;
    Ok(claims)
}

/// The Function URL's function: each request, as Lambda's event, to the handler (the webhook
/// receiver), counted in `posted`.
pub fn url_handler(worker: Arc<OnceLock<Arc<LambdaWorker>>>, posted: Arc<Posted>) -> UrlHandler {
    Arc::new(move |event| {
        let worker = worker.get().cloned();
        let posted = posted.clone();
        Box::pin(async move {
            let Some(worker) = worker else {
                // Before the worker is built (no run exists yet): the API's webhook retries.
                return json!({"statusCode": 503, "body": r#"{"error":"starting"}"#});
            };
            let mut context = Context::default();
            context.request_id = format!("local-url-{}", Uuid::new_v4());
            context.deadline = now_ms() + INVOCATION.as_millis() as u64;
            let answer = match ironflow_lambda::handle(&worker, LambdaEvent::new(event, context))
                .await
            {
                Ok(answer) => answer,
                Err(e) => {
                    json!({"statusCode": 500, "body": json!({"error": e.to_string()}).to_string()})
                }
            };
            posted.count(&answer);
            answer
        })
    })
}

/// The webhook requests the receiver answered.
#[derive(Debug, Default)]
pub struct Posted {
    /// Every request.
    pub events: AtomicUsize,
    /// Those that sent wake-ups (202, `"woke": true`).
    pub woke: AtomicUsize,
    /// Those answered with another status than 2xx.
    pub refused: AtomicUsize,
}

impl Posted {
    fn count(&self, answer: &Value) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let status = answer["statusCode"].as_u64().unwrap_or(0);
        if !(200..300).contains(&status) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        let body: Value = answer["body"]
            .as_str()
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or_default();
        if body["woke"] == true {
            self.woke.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The first claim of each run, read from the API's store.
#[derive(Debug, Default)]
pub struct Claims {
    /// Milliseconds from each run's `created_at` to the first `started_at` seen.
    pub claim_ms: HashMap<Uuid, i64>,
    /// Runs seen terminal and claimed: not read again.
    done: HashSet<Uuid>,
}

impl Claims {
    /// Read the runs: record first claims, and say whether every run is terminal. The in-memory
    /// store sets `started_at` again at each claim: a run's first one is the first seen, read
    /// every [`WATCH_EVERY`] (a run is claimed again only after a handback, seconds later).
    async fn watch(&mut self, store: &Arc<dyn Store>, runs: &[Uuid]) -> bool {
        let mut all = true;
        for id in runs {
            if self.done.contains(id) {
                continue;
            }
            let Ok(Some(run)) = store.get_run(*id).await else {
                all = false;
                continue;
            };
            if let Some(started) = run.started_at {
                self.claim_ms
                    .entry(*id)
                    .or_insert_with(|| (started - run.created_at).num_milliseconds());
            }
            if run.status.state.is_terminal() {
                if run.started_at.is_some() {
                    self.done.insert(*id);
                }
            } else {
                all = false;
            }
        }
        all
    }
}

/// What started an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// An SQS event of wake-ups from the queue, with each one's `reason` (`pushed`,
    /// `handed_back`, `backlog`).
    WakeUps(Vec<String>),
    /// A schedule tick.
    Tick,
}

/// One invocation: its trigger and the runs it claimed.
#[derive(Debug)]
pub struct Invoked {
    pub trigger: Trigger,
    pub claimed: Vec<Uuid>,
}

#[derive(Debug, Default)]
pub struct Record {
    pub invocations: Vec<Invoked>,
    /// The first invocation that failed (the handler's error): the drive stops.
    pub error: Option<String>,
}

/// Drives invocations of the handler: from the wake queue and on schedule ticks.
pub struct Driver {
    worker: Arc<LambdaWorker>,
    queue: Arc<LocalWakeQueue>,
    /// Invocations started.
    started: AtomicUsize,
    record: Mutex<Record>,
    stop: watch::Sender<bool>,
}

impl Driver {
    /// A driver of `worker`'s invocations from `queue`'s wake-ups and on schedule ticks, until
    /// `stop` says stop.
    pub fn new(
        worker: Arc<LambdaWorker>,
        queue: Arc<LocalWakeQueue>,
        stop: watch::Sender<bool>,
    ) -> Arc<Self> {
        Arc::new(Self {
            worker,
            queue,
            started: AtomicUsize::new(0),
            record: Mutex::default(),
            stop,
        })
    }

    pub fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stop both loops: they end once their invocations have.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// The next invocation's number, `None` once [`MAX_INVOCATIONS`] have started.
    fn next_number(&self) -> Option<usize> {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        (n <= MAX_INVOCATIONS).then_some(n)
    }

    /// Both loops, until stopped or out of invocations.
    pub async fn drive(self: Arc<Self>, stopped: watch::Receiver<bool>) {
        tokio::join!(
            self.clone().serve_queue(stopped.clone()),
            self.clone().tick(stopped)
        );
    }

    /// As an SQS event source mapping: take the visible wake-ups (10 at most), invoke the
    /// handler with them as one SQS event, [`QUEUE_CONCURRENCY`] invocations at once at most.
    async fn serve_queue(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(QUEUE_CONCURRENCY));
        let mut running = JoinSet::new();
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            let bodies = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => break,
                bodies = self.queue.receive(far) => bodies,
            };
            let permit = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => None,
                permit = permits.clone().acquire_owned() => permit.ok(),
            };
            let number = permit.as_ref().and_then(|_| self.next_number());
            let (Some(permit), Some(n)) = (permit, number) else {
                // Stopped, or out of invocations: the wake-ups stay on the queue.
                for body in &bodies {
                    self.queue.send(1, body, 0, None).await;
                }
                break;
            };
            let this = self.clone();
            running.spawn(async move {
                this.invoke_queue(n, bodies).await;
                drop(permit);
            });
            while let Some(ended) = running.try_join_next() {
                self.check(ended);
            }
        }
        while let Some(ended) = running.join_next().await {
            self.check(ended);
        }
    }

    fn check(&self, ended: Result<(), tokio::task::JoinError>) {
        if let Err(e) = ended {
            self.fail(format!("an invocation's task failed: {e}"));
        }
    }

    fn fail(&self, error: String) {
        self.record().error.get_or_insert(error);
        self.stop();
    }

    /// A schedule tick every [`TICK_EVERY`], the first one period after the start.
    async fn tick(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let mut every = tokio::time::interval_at(Instant::now() + TICK_EVERY, TICK_EVERY);
        every.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => break,
                _ = every.tick() => {}
            }
            let Some(n) = self.next_number() else { break };
            let tick = json!({
                "version": "0",
                "id": Uuid::new_v4(),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": "000000000000",
                "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "region": "local",
                "resources": ["arn:aws:events:local:000000000000:rule/ironflow-lambda-local"],
                "detail": {}
            });
            if let Some(response) = self.invoke(n, tick, "schedule tick").await {
                self.note(Trigger::Tick, response.summary());
            }
        }
    }

    /// One invocation from the queue; its batch item failures go back on the queue, visible
    /// again after [`RETRY_DELAY_SECS`].
    async fn invoke_queue(&self, n: usize, bodies: Vec<String>) {
        let ids: Vec<String> = (0..bodies.len())
            .map(|i| format!("local-{n}-{i}"))
            .collect();
        let records: Vec<Value> = ids
            .iter()
            .zip(&bodies)
            .map(|(id, body)| {
                json!({
                    "messageId": id,
                    "body": body,
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:local:000000000000:ironflow-wake",
                })
            })
            .collect();
        let reasons: Vec<String> = bodies
            .iter()
            .map(|body| {
                serde_json::from_str::<Value>(body)
                    .ok()
                    .and_then(|b| b["reason"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "?".to_string())
            })
            .collect();
        let label = format!(
            "SQS, {} wake-up{}: {}",
            bodies.len(),
            if bodies.len() == 1 { "" } else { "s" },
            by_reason(reasons.iter())
                .iter()
                .map(|(reason, count)| match count {
                    1 => reason.to_string(),
                    n => format!("{reason} ×{n}"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        let Some(response) = self.invoke(n, json!({ "Records": records }), &label).await else {
            return;
        };
        let failures = response.to_json()["batchItemFailures"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for failure in failures {
            let id = failure["itemIdentifier"].as_str().unwrap_or("");
            if let Some(i) = ids.iter().position(|m| m == id) {
                self.queue.send(1, &bodies[i], RETRY_DELAY_SECS, None).await;
            }
        }
        self.note(Trigger::WakeUps(reasons), response.summary());
    }

    /// Invoke the handler with `payload` under a deadline [`INVOCATION`] away, and print its
    /// summary; `None` (and the drive stops) when the handler fails.
    async fn invoke(&self, n: usize, payload: Value, label: &str) -> Option<Response> {
        let mut context = Context::default();
        context.request_id = format!("local-{n}");
        context.deadline = now_ms() + INVOCATION.as_millis() as u64;
        match ironflow_lambda::handle_response(&self.worker, LambdaEvent::new(payload, context))
            .await
        {
            Ok(response) => {
                match response.summary() {
                    Some(summary) => println!(
                        "invocation {n} ({label}): {}",
                        serde_json::to_value(summary).unwrap_or_default()
                    ),
                    None => println!(
                        "invocation {n} ({label}): no batch ran: {}",
                        response.to_json()
                    ),
                }
                Some(response)
            }
            Err(e) => {
                println!("invocation {n} ({label}): failed: {e}");
                self.fail(e.to_string());
                None
            }
        }
    }

    fn note(&self, trigger: Trigger, summary: Option<&InvocationSummary>) {
        let claimed = summary.map_or_else(Vec::new, |s| s.runs.iter().map(|r| r.run_id).collect());
        self.record().invocations.push(Invoked { trigger, claimed });
    }
}

/// Each reason and how many times it occurs, by name.
pub fn by_reason<'a>(reasons: impl Iterator<Item = &'a String>) -> BTreeMap<&'a str, usize> {
    let mut counts = BTreeMap::new();
    for reason in reasons {
        *counts.entry(reason.as_str()).or_default() += 1;
    }
    counts
}
