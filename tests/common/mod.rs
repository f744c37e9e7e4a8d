//! Test harness: the real ironflow API (its router over the in-memory store, or over PostgreSQL
//! with a database of its own per test) on 127.0.0.1, a worker builder with test-sized settings,
//! and invocations driven through the Lambda handler.
#![allow(dead_code)]

pub mod fault_proxy;
pub mod moto;
pub mod webhook;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::orphans;
use ironflow_lambda::{InvocationSummary, Outcome};
use ironflow_lambda::{LambdaWorker, LambdaWorkerBuilder};
pub use ironflow_local_api::Backend;
use ironflow_local_api::{LocalApi, new_run};
use ironflow_store::entities::{NewStep, Run, RunStatus, Step, StepKind, StepStatus, StepUpdate};
use ironflow_store::store::RunStore;
use ironflow_worker::ApiRunStore;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::Value;
use uuid::Uuid;

/// The API, a client of its internal routes, and a scratch directory for side effects.
pub struct Harness {
    pub api: LocalApi,
    pub client: ApiRunStore,
    pub dir: tempfile::TempDir,
}

impl Harness {
    /// The API over the in-memory store.
    pub async fn start() -> Self {
        Self::start_on(Backend::Memory).await
    }

    /// The API over `backend`'s store.
    pub async fn start_on(backend: Backend) -> Self {
        orphans::become_subreaper();
        let token = format!("test-token-{}", Uuid::new_v4());
        let api = LocalApi::start_on(&token, &backend)
            .await
            .unwrap_or_else(|e| panic!("start the API on {}: {e}", backend.describe()));
        let client = ApiRunStore::new(&api.url(), &token);
        Self {
            api,
            client,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// A builder with test-sized settings: 200 ms lease refreshes, a 500 ms margin, throttled
    /// runs woken without spread (tests/cost.rs sets one).
    pub fn builder(&self) -> LambdaWorkerBuilder {
        LambdaWorkerBuilder::new(&self.api.url(), self.api.token())
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .lease_ttl(Duration::from_secs(10))
            .lease_refresh_interval(Duration::from_millis(200))
            .deadline_margin(Duration::from_millis(500))
            .min_claim_budget(Duration::from_millis(200))
            .capacity_spread(Duration::ZERO, Duration::ZERO)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Create a run of `workflow` through `POST /api/v1/internal/runs`.
    pub async fn create(&self, workflow: &str, max_retries: u32) -> Uuid {
        self.client
            .create_run(new_run(workflow, max_retries))
            .await
            .expect("create run")
            .into_run()
            .id
    }

    pub async fn run(&self, id: Uuid) -> Run {
        self.api
            .store()
            .get_run(id)
            .await
            .expect("get run")
            .expect("run exists")
    }

    pub async fn status(&self, id: Uuid) -> RunStatus {
        self.run(id).await.status.state
    }

    /// The run's steps in execution order.
    pub async fn steps(&self, id: Uuid) -> Vec<Step> {
        let mut steps = self.api.store().list_steps(id).await.expect("list steps");
        steps.sort_by_key(|s| (s.created_at, s.position));
        steps
    }

    /// Approve run `id`'s open gate as an operator does (`POST /api/v1/runs/{id}/approve`,
    /// signed in as a new admin), asserting the API accepted it.
    pub async fn approve(&self, id: Uuid) {
        let answer = reqwest::Client::new()
            .post(format!("{}/api/v1/runs/{id}/approve", self.api.url()))
            .header("authorization", self.api.admin_bearer().await.unwrap())
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        assert!(
            status.is_success(),
            "{status}: {}",
            answer.text().await.unwrap()
        );
    }

    /// One invocation through the Lambda handler, with `time_left` until its deadline.
    pub async fn invoke(&self, worker: &LambdaWorker, time_left: Duration) -> InvocationSummary {
        self.invoke_event(worker, serde_json::json!({}), deadline_in(time_left))
            .await
            .expect("invocation accepted")
    }

    /// One invocation of `event` with `deadline_ms` as `Context.deadline`.
    pub async fn invoke_event(
        &self,
        worker: &LambdaWorker,
        event: Value,
        deadline_ms: u64,
    ) -> Result<InvocationSummary, ironflow_lambda::TriggerError> {
        let mut context = Context::default();
        context.request_id = format!("req-{}", Uuid::new_v4());
        context.deadline = deadline_ms;
        ironflow_lambda::handle_summary(worker, LambdaEvent::new(event, context)).await
    }
}

/// `Context.deadline` for an invocation with `left` to go.
pub fn deadline_in(left: Duration) -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now + left).as_millis() as u64
}

/// A new Pending run of `workflow` (no retries) in `api`'s store: its id.
pub async fn create_run(api: &LocalApi, workflow: &str) -> Uuid {
    api.store()
        .create_run(new_run(workflow, 0))
        .await
        .unwrap()
        .into_run()
        .id
}

/// The state of run `run` in `api`'s store (panics if it does not exist).
pub async fn state_of(api: &LocalApi, run: Uuid) -> RunStatus {
    api.store()
        .get_run(run)
        .await
        .unwrap()
        .unwrap()
        .status
        .state
}

/// Start a step of run `run_id` through `store` (position 0, a shell step, now `Running`): what
/// an invocation that dies mid-step leaves behind.
pub async fn start_step(store: &impl RunStore, run_id: Uuid) {
    let step = store
        .create_step(NewStep {
            run_id,
            trace_id: Uuid::new_v4(),
            name: "step".into(),
            kind: StepKind::Shell,
            position: 0,
            input: None,
            is_error_handler: false,
        })
        .await
        .unwrap();
    let running = StepUpdate {
        status: Some(StepStatus::Running),
        started_at: Some(chrono::Utc::now()),
        ..StepUpdate::default()
    };
    store.update_step(step.id, running).await.unwrap();
}

/// Poll `condition` every 20 ms until it holds; panic with `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The outcomes of run `id`'s reports in `summary`, one per claim, sorted (a run claimed twice
/// by one invocation has two, in the order they ended).
pub fn outcomes_of(summary: &InvocationSummary, id: Uuid) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = summary
        .runs
        .iter()
        .filter(|r| r.run_id == id)
        .map(|r| r.outcome)
        .collect();
    outcomes.sort();
    outcomes
}

/// Lines in a side-effect file (0 if it does not exist): how many times a step really ran.
pub fn executions(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// A workflow of shell steps run in order.
#[derive(Clone)]
pub struct ShellWorkflow {
    pub name: &'static str,
    pub steps: Vec<(&'static str, String)>,
}

impl ShellWorkflow {
    /// A workflow of one shell step `step` running `cmd`.
    pub fn one(name: &'static str, cmd: &str) -> Self {
        Self {
            name,
            steps: vec![("step", cmd.to_string())],
        }
    }
}

impl WorkflowHandler for ShellWorkflow {
    fn name(&self) -> &str {
        self.name
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            for (step, cmd) in &self.steps {
                ctx.shell(step, ShellConfig::new(cmd)).await?;
            }
            Ok(())
        })
    }
}

/// The variable naming the PostgreSQL server the tests create their databases on
/// (`postgres://postgres@127.0.0.1:PORT`, set by `./scripts/test`).
pub const POSTGRES_VAR: &str = "IRONFLOW_TEST_POSTGRES_URL";

/// A fresh database on the test PostgreSQL server ([`POSTGRES_VAR`]).
pub async fn postgres() -> Backend {
    let server = std::env::var(POSTGRES_VAR).unwrap_or_else(|_| {
        panic!(
            "{POSTGRES_VAR} is not set: run the tests with ./scripts/test, which starts a \
             PostgreSQL server (scripts/pg-test-server.sh)"
        )
    });
    Backend::fresh_postgres(&server)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Each `async fn name(backend: Backend)` listed, as two tests: `memory::name` on the
/// in-memory store and `postgres::name` on a PostgreSQL database of its own.
#[macro_export]
macro_rules! on_both_stores {
    ($($test:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::common::Backend::Memory).await
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::common::postgres().await).await
                }
            )+
        }
    };
}

/// The EMF documents a metrics collector flushed: one JSON document per line.
pub struct Emf {
    /// The flushed text, for failure messages.
    pub text: String,
    documents: Vec<serde_json::Value>,
}

impl Emf {
    /// Flush `collector` and parse what it wrote.
    pub fn flush(collector: &metrics_cloudwatch_embedded::Collector) -> Self {
        let mut out = Vec::new();
        ironflow_lambda::metrics::flush(collector, &mut out);
        let text = String::from_utf8(out).expect("UTF-8 metrics");
        let documents = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON document per line"))
            .collect();
        Self { text, documents }
    }

    /// The first document carrying metric `name`.
    pub fn find(&self, name: &str) -> &serde_json::Value {
        self.documents
            .iter()
            .find(|d| d.get(name).is_some())
            .unwrap_or_else(|| panic!("{name} missing from {}", self.text))
    }
}
