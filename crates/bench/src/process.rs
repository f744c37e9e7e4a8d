//! The deployable binary as a process: cold start, stripped size, peak RSS.
//!
//! The release `ironflow-lambda` binary (built as deployed) is started
//! against a stand-in for AWS's Lambda Runtime API on loopback. The Runtime API is AWS's
//! protocol, not ironflow's, and no implementation of it ships in a registry package, so this
//! hand-written stub is the legitimate peer here: it serves
//! `GET /2018-06-01/runtime/invocation/next` (recording when it arrives), and takes
//! `POST .../invocation/{id}/response`, `.../error` and `/runtime/init/error`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ironflow_local_api::{LocalApi, new_run};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use crate::BenchError;

/// One event the stub hands out on the next `GET .../invocation/next`.
struct Event {
    request_id: String,
    deadline_ms: u64,
    body: String,
}

#[derive(Default)]
struct StubState {
    /// When each `GET .../invocation/next` arrived.
    polls: Mutex<Vec<Instant>>,
    /// The event to serve on the next poll; later polls hang.
    event: Mutex<Option<Event>>,
    /// Bodies posted to `.../response` (Ok) or to an error route (Err).
    results: Mutex<Vec<Result<String, String>>>,
    changed: Notify,
}

/// A stand-in for the Lambda Runtime API (see the module docs). Stops when dropped.
struct RuntimeStub {
    addr: std::net::SocketAddr,
    state: Arc<StubState>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for RuntimeStub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl RuntimeStub {
    async fn start(event: Option<Event>) -> Result<Self, BenchError> {
        let state = Arc::new(StubState::default());
        *lock(&state.event) = event;
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(|State(s): State<Arc<StubState>>, body: Bytes| async move {
                    record(&s, Ok(String::from_utf8_lossy(&body).into_owned()))
                }),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post(|State(s): State<Arc<StubState>>, body: Bytes| async move {
                    record(&s, Err(String::from_utf8_lossy(&body).into_owned()))
                }),
            )
            .route(
                "/2018-06-01/runtime/init/error",
                post(|State(s): State<Arc<StubState>>, body: Bytes| async move {
                    record(&s, Err(String::from_utf8_lossy(&body).into_owned()))
                }),
            )
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            state,
            server,
        })
    }

    /// Wait until the `n`-th poll has arrived; returns when it did.
    async fn poll(&self, n: usize, limit: Duration) -> Result<Instant, BenchError> {
        let end = Instant::now() + limit;
        loop {
            let notified = self.state.changed.notified();
            if let Some(at) = lock(&self.state.polls).get(n - 1) {
                return Ok(*at);
            }
            if let Some(Err(e)) = lock(&self.state.results).first() {
                return Err(BenchError::msg(format!("the function reported: {e}")));
            }
            if timeout(end.saturating_duration_since(Instant::now()), notified)
                .await
                .is_err()
            {
                return Err(BenchError::msg(format!(
                    "the function did not poll the Runtime API ({n} time(s)) within {limit:?}"
                )));
            }
        }
    }

    /// Wait for the first posted result.
    async fn result(&self, limit: Duration) -> Result<String, BenchError> {
        let end = Instant::now() + limit;
        loop {
            let notified = self.state.changed.notified();
            match lock(&self.state.results).first() {
                Some(Ok(body)) => return Ok(body.clone()),
                Some(Err(e)) => return Err(BenchError::msg(format!("the function failed: {e}"))),
                None => {}
            }
            if timeout(end.saturating_duration_since(Instant::now()), notified)
                .await
                .is_err()
            {
                return Err(BenchError::msg("the function did not respond in time"));
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn record(s: &StubState, result: Result<String, String>) -> StatusCode {
    lock(&s.results).push(result);
    s.changed.notify_waiters();
    StatusCode::ACCEPTED
}

async fn next(State(s): State<Arc<StubState>>) -> Response {
    let at = Instant::now();
    lock(&s.polls).push(at);
    s.changed.notify_waiters();
    let event = lock(&s.event).take();
    let Some(event) = event else {
        // No event: the function waits here, as a warm function between invocations does.
        std::future::pending::<()>().await;
        return StatusCode::NO_CONTENT.into_response();
    };
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
    (StatusCode::OK, headers, event.body).into_response()
}

/// The command that builds the deployable function the bench measures.
pub const BUILD_FUNCTION: &str = "cargo build --release --bin ironflow-lambda";

/// The release `ironflow-lambda` binary beside this one, as [`BUILD_FUNCTION`] builds it. Not
/// built from here: a cargo started by this process (itself started by `cargo run`) sees
/// another environment, and build scripts that watch it would rebuild the AWS SDK crates at
/// every run, here and in the next build from the shell.
pub fn function_beside_bench() -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| BenchError::msg("the bench binary has no parent directory"))?;
    let binary = dir.join("ironflow-lambda");
    if !binary.exists() {
        return Err(BenchError::msg(format!(
            "{} is missing: build it first with `{BUILD_FUNCTION}` (or pass --function PATH)",
            binary.display()
        )));
    }
    Ok(binary)
}

/// The environment of a function process: what Lambda sets (runtime API, function, region,
/// credentials: dummy ones, nothing here calls AWS), and ours.
pub(crate) fn function_command(
    binary: &Path,
    runtime: std::net::SocketAddr,
    api_url: &str,
    token: &str,
    concurrency: usize,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(binary);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", runtime.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "ironflow-lambda-bench")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("AWS_SESSION_TOKEN", "bench")
        .env("IRONFLOW_API_URL", api_url)
        .env("IRONFLOW_WORKER_TOKEN", token)
        .env("IRONFLOW_MAX_RUNS_PER_INVOCATION", "8")
        .env("IRONFLOW_CONCURRENCY", concurrency.to_string())
        .env("IRONFLOW_FUNCTION_TIMEOUT_SECS", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Cold starts, in ms: from just before `spawn` to the first `GET .../invocation/next`.
pub async fn cold_starts(
    binary: &Path,
    count: usize,
    concurrency: usize,
) -> Result<(Vec<f64>, u64), BenchError> {
    let mut times = Vec::with_capacity(count);
    let mut rss_kib = 0;
    for _ in 0..count {
        let stub = RuntimeStub::start(None).await?;
        let mut cmd = function_command(
            binary,
            stub.addr,
            "http://127.0.0.1:9",
            "bench-token",
            concurrency,
        );
        let start = Instant::now();
        let mut child = cmd.spawn()?;
        let ready = stub.poll(1, Duration::from_secs(10)).await;
        if let Some(pid) = child.id() {
            rss_kib = rss_kib.max(status_kib(pid, "VmHWM").unwrap_or(0));
        }
        let _ = child.kill().await;
        times.push(crate::latency::ms(ready? - start));
    }
    Ok((times, rss_kib))
}

/// Peak RSS of the function process during one invocation of 8 runs.
#[derive(Debug, Clone)]
pub struct BatchMemory {
    /// `VmHWM` of the function process after the invocation, in KiB.
    pub peak_rss_kib: u64,
    /// The invocation's response (its summary).
    pub summary: serde_json::Value,
}

/// Start the function, hand it one event while 8 `quick-shell` runs are pending (one `echo`
/// step each: the simplest workflow the deployable binary registers), and read its peak RSS
/// once it has responded and polls for the next event.
pub async fn batch_memory(binary: &Path, concurrency: usize) -> Result<BatchMemory, BenchError> {
    let token = Uuid::new_v4().to_string();
    let api = LocalApi::start(&token).await?;
    for _ in 0..8 {
        api.store().create_run(new_run("quick-shell", 0)).await?;
    }
    let stub = RuntimeStub::start(Some(Event {
        request_id: "bench-rss".into(),
        deadline_ms: crate::epoch_ms() + 60_000,
        body: "{}".into(),
    }))
    .await?;
    let mut child = function_command(binary, stub.addr, &api.url(), &token, concurrency).spawn()?;
    let body = stub.result(Duration::from_secs(60)).await;
    let polled = stub.poll(2, Duration::from_secs(10)).await;
    let peak = child.id().and_then(|pid| status_kib(pid, "VmHWM"));
    let _ = child.kill().await;
    polled?;
    let summary: serde_json::Value = serde_json::from_str(&body?)?;
    let completed = summary["outcomes"]["completed"].as_u64().unwrap_or(0);
    if completed != 8 {
        return Err(BenchError::msg(format!(
            "the batch did not complete 8 runs: {summary}"
        )));
    }
    Ok(BatchMemory {
        peak_rss_kib: peak.ok_or_else(|| BenchError::msg("could not read VmHWM"))?,
        summary,
    })
}

/// A `kB` field of `/proc/<pid>/status`.
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The binary's size in bytes (the release profile strips it: `strip = true`).
pub fn size(binary: &Path) -> Result<u64, BenchError> {
    Ok(std::fs::metadata(binary)?.len())
}
