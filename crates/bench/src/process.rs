//! The deployable binary as a process: cold start, stripped size, peak RSS.
//!
//! The release `ironflow-lambda` binary (built as deployed) is started against the stand-in
//! for AWS's Lambda Runtime API on loopback ([`crate::runtime_api`]): its first
//! `GET /2018-06-01/runtime/invocation/next` ends the cold start; one event hands it a batch.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ironflow_local_api::{LocalApi, new_run};
use tokio::time::Instant;
use uuid::Uuid;

use crate::BenchError;
use crate::runtime_api::{Dispatcher, Endpoint};

/// The one event of [`batch_memory`]: a direct invocation.
const BATCH_EVENT: &str = "{}";

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
        // Never opened: no event, the function waits in its first poll.
        let stub = Dispatcher::with_event(1, 0, Duration::from_secs(60), "bench-cold", BATCH_EVENT);
        let endpoint = Endpoint::start(stub.clone(), 0).await?;
        let mut cmd = function_command(
            binary,
            endpoint.addr,
            "http://127.0.0.1:9",
            "bench-token",
            concurrency,
        );
        let start = Instant::now();
        let mut child = cmd.spawn()?;
        let ready = stub.polled(0, 1, Duration::from_secs(10)).await;
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
    // Events until the answers report the 8 runs' end: one, when the batch completes.
    let stub = Dispatcher::with_event(1, 8, Duration::from_secs(60), "bench-rss", BATCH_EVENT);
    let endpoint = Endpoint::start(stub.clone(), 0).await?;
    stub.open();
    let mut child =
        function_command(binary, endpoint.addr, &api.url(), &token, concurrency).spawn()?;
    let answered = stub.answered(1, Duration::from_secs(60)).await;
    let polled = stub.polled(0, 2, Duration::from_secs(10)).await;
    let peak = child.id().and_then(|pid| status_kib(pid, "VmHWM"));
    let _ = child.kill().await;
    polled?;
    let summary = answered?
        .last_summary
        .ok_or_else(|| BenchError::msg("the function answered no summary"))?;
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

/// What a child process's output lines are tallied into ([`read_lines`]).
pub trait LineTally: Default + Send + 'static {
    /// One line of the process's output, from its stderr when `stderr`.
    fn line(&mut self, line: &str, stderr: bool);
}

/// Tally a process's stdout and stderr lines into a `T` until both close.
pub fn read_lines<T: LineTally>(
    out: Option<tokio::process::ChildStdout>,
    err: Option<tokio::process::ChildStderr>,
) -> tokio::task::JoinHandle<T> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    tokio::spawn(async move {
        let mut tally = T::default();
        let mut out = out.map(|o| BufReader::new(o).lines());
        let mut err = err.map(|e| BufReader::new(e).lines());
        while out.is_some() || err.is_some() {
            tokio::select! {
                line = async { out.as_mut()?.next_line().await.ok().flatten() }, if out.is_some() => {
                    match line {
                        Some(l) => tally.line(&l, false),
                        None => out = None,
                    }
                }
                line = async { err.as_mut()?.next_line().await.ok().flatten() }, if err.is_some() => {
                    match line {
                        Some(l) => tally.line(&l, true),
                        None => err = None,
                    }
                }
            }
        }
        tally
    })
}
