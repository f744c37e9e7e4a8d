//! Faults the worker meets in production: a bad environment at cold start, a stale pooled
//! connection after a long freeze, an unreachable API.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Harness, ShellWorkflow};
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_lambda::Outcome;
use ironflow_lambda::report::StopReason;
use ironflow_store::entities::RunStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BIN: &str = env!("CARGO_BIN_EXE_ironflow-lambda");
const SECRET: &str = "tok-SECRET-do-not-log-4242";

fn cold_start(env: &[(&str, &str)]) -> (bool, String) {
    let (ok, stdout, stderr) = cold_start_apart(env);
    (ok, format!("{stdout}{stderr}"))
}

/// The function binary run with only `env` (and PATH): success, stdout, stderr.
fn cold_start_apart(env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("run the function binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every line of `stdout` is a JSON object (a CloudWatch log line); returns them.
fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn help_says_what_the_binary_is_and_points_to_the_local_runner() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("environment variables"), "{stdout}");
    assert!(stdout.contains("ironflow-lambda-local"), "{stdout}");
}

#[test]
fn a_cold_start_error_is_one_json_line_and_no_aws_lookup_without_an_aws_service() {
    // No AWS_REGION and no AWS service configured: no instance-metadata lookup, no warning.
    let (ok, stdout, stderr) = cold_start_apart(&[
        ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
        ("IRONFLOW_WORKER_TOKEN", SECRET),
    ]);
    assert!(!ok);
    assert_eq!(stderr, "", "the error is not printed twice");
    let lines = json_lines(&stdout);
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["level"], "ERROR");
    assert!(
        lines[0]["error"]
            .as_str()
            .unwrap()
            .contains("AWS_LAMBDA_RUNTIME_API is not set"),
        "{stdout}"
    );
    assert!(!stdout.contains("IMDS"), "{stdout}");
}

#[tokio::test]
async fn an_unreachable_lambda_runtime_api_is_named_with_its_cause() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (ok, stdout, stderr) = cold_start_apart(&[
        ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
        ("IRONFLOW_WORKER_TOKEN", SECRET),
        ("AWS_LAMBDA_RUNTIME_API", closed.as_str()),
        ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        ("AWS_LAMBDA_FUNCTION_VERSION", "1"),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
    ]);
    assert!(!ok);
    assert_eq!(stderr, "", "the error is not printed twice");
    let lines = json_lines(&stdout);
    let error = lines
        .iter()
        .find(|l| l["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no error line: {stdout}"));
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("AWS_LAMBDA_RUNTIME_API"),
        "{error}"
    );
    assert_eq!(error["runtime_api"], closed.as_str());
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("tcp connect error"),
        "the cause, not only \"client error (Connect)\": {error}"
    );
    assert!(!stdout.contains(SECRET));
}

#[test]
fn outside_lambda_the_cold_start_stops_with_an_error_not_a_panic() {
    // A valid environment, but no Lambda Runtime API (lambda_runtime itself would panic).
    let (ok, output) = cold_start(&[
        ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
        ("IRONFLOW_WORKER_TOKEN", SECRET),
        ("AWS_REGION", "us-east-1"),
    ]);
    assert!(!ok, "the cold start must fail: {output}");
    assert!(
        output.contains("AWS_LAMBDA_RUNTIME_API is not set"),
        "{output}"
    );
    assert!(!output.contains("panicked"), "a panic: {output}");
    assert!(!output.contains(SECRET), "the token leaked: {output}");
}

#[test]
fn an_incomplete_lambda_runtime_environment_is_named_not_a_panic() {
    // The Runtime API is set, but not the variables lambda_runtime reads with a panic.
    let (ok, output) = cold_start(&[
        ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
        ("IRONFLOW_WORKER_TOKEN", SECRET),
        ("AWS_REGION", "us-east-1"),
        ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9"),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "lots"),
    ]);
    assert!(!ok, "the cold start must fail: {output}");
    for expected in [
        "AWS_LAMBDA_FUNCTION_NAME (not set)",
        "AWS_LAMBDA_FUNCTION_VERSION (not set)",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE (expected a whole number of MB, found \\\"lots\\\")",
    ] {
        assert!(output.contains(expected), "{expected}: {output}");
    }
    assert!(!output.contains("panicked"), "a panic: {output}");
    assert!(!output.contains(SECRET), "the token leaked: {output}");
}

#[test]
fn a_variable_that_is_not_utf8_fails_the_cold_start_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    // Read as unset, this poison table name would silently become the in-memory table.
    let out = Command::new(BIN)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("IRONFLOW_API_URL", "http://127.0.0.1:9")
        .env("IRONFLOW_WORKER_TOKEN", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env(
            "IRONFLOW_POISON_TABLE",
            std::ffi::OsStr::from_bytes(b"ironflow-\xff-poison"),
        )
        .output()
        .expect("run the function binary");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the cold start must fail: {output}");
    assert!(
        output.contains("IRONFLOW_POISON_TABLE") && output.contains("UTF-8"),
        "{output}"
    );
    assert!(!output.contains(SECRET), "the token leaked: {output}");
}

#[test]
fn a_misspelt_variable_fails_the_cold_start_naming_the_one_meant() {
    // Ignored, the table would silently be the in-memory one.
    let (ok, output) = cold_start(&[
        ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
        ("IRONFLOW_WORKER_TOKEN", SECRET),
        ("IRONFLOW_POISON_TABEL", "ironflow-poison"),
    ]);
    assert!(!ok, "the cold start must fail: {output}");
    assert!(
        output.contains("IRONFLOW_POISON_TABEL") && output.contains("IRONFLOW_POISON_TABLE"),
        "{output}"
    );
    assert!(!output.contains(SECRET), "the token leaked: {output}");
}

#[test]
fn a_misspelt_variable_does_not_hide_the_other_variables_problems() {
    let (ok, output) = cold_start(&[
        ("IRONFLOW_API_URL", "http://127.0.0.1:0"),
        ("IRONFLOW_WORKER_TOKEN", SECRET),
        ("IRONFLOW_POISN_TABLE", "ironflow-poison"),
        ("IRONFLOW_CONCURRENCY", "-1"),
    ]);
    assert!(!ok, "the cold start must fail: {output}");
    assert!(
        output.contains("3 environment variables are wrong"),
        "{output}"
    );
    for named in [
        "IRONFLOW_POISN_TABLE",
        "IRONFLOW_API_URL",
        "IRONFLOW_CONCURRENCY",
    ] {
        assert!(output.contains(named), "{named} not named in: {output}");
    }
    assert!(!output.contains(SECRET), "the token leaked: {output}");
}

#[test]
fn several_bad_variables_are_all_named_in_one_cold_start() {
    let (ok, output) = cold_start(&[
        ("IRONFLOW_WORKER_TOKEN", SECRET),
        ("IRONFLOW_CONCURRENCY", "two"),
        ("IRONFLOW_POISON_MODE", "explode"),
    ]);
    assert!(!ok, "the cold start must fail: {output}");
    assert!(
        output.contains("3 environment variables are wrong"),
        "{output}"
    );
    for variable in [
        "IRONFLOW_API_URL",
        "IRONFLOW_CONCURRENCY",
        "IRONFLOW_POISON_MODE",
    ] {
        assert!(
            output.contains(variable),
            "{variable} not named in: {output}"
        );
    }
    assert!(!output.contains(SECRET), "the token leaked: {output}");
}

#[test]
fn a_bad_environment_stops_the_cold_start_with_the_variable_named() {
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, &str, &str); 4] = [
        (
            &[("IRONFLOW_WORKER_TOKEN", SECRET)],
            "IRONFLOW_API_URL",
            "base URL",
        ),
        (
            &[("IRONFLOW_API_URL", "http://127.0.0.1:9")],
            "IRONFLOW_WORKER_TOKEN",
            "worker token",
        ),
        (
            &[
                ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
                ("IRONFLOW_WORKER_TOKEN", SECRET),
                ("IRONFLOW_MAX_RUNS_PER_INVOCATION", "eight"),
            ],
            "IRONFLOW_MAX_RUNS_PER_INVOCATION",
            "a whole number greater than 0",
        ),
        (
            &[
                ("IRONFLOW_API_URL", "http://127.0.0.1:9"),
                ("IRONFLOW_WORKER_TOKEN", SECRET),
                ("IRONFLOW_FUNCTION_TIMEOUT_SECS", "5"),
                ("IRONFLOW_DEADLINE_MARGIN_MS", "5000"),
            ],
            "IRONFLOW_DEADLINE_MARGIN_MS",
            "not below the function timeout",
        ),
    ];
    for (env, variable, expected) in cases {
        let (ok, output) = cold_start(env);
        assert!(!ok, "the cold start must fail for {variable}");
        assert!(
            output.contains(variable),
            "{variable} not named in: {output}"
        );
        assert!(output.contains(expected), "{expected:?} not in: {output}");
        assert!(!output.contains("panicked"), "a panic: {output}");
        assert!(!output.contains(SECRET), "the token leaked: {output}");
    }
}

/// FAULT INJECTION, not a stand-in for the API: a TCP proxy in front of the real API that can
/// make every connection open so far fail like one a NAT gateway dropped during a freeze (the
/// next request on it is answered with a TCP reset).
struct DroppingProxy {
    addr: SocketAddr,
    generation: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
}

impl DroppingProxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let generation = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let (gen_, acc) = (generation.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                acc.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(pump(
                    client,
                    upstream,
                    gen_.load(Ordering::SeqCst),
                    gen_.clone(),
                ));
            }
        });
        Self {
            addr,
            generation,
            accepted,
        }
    }

    /// Every connection accepted so far resets on its next request.
    fn drop_existing_connections(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

async fn pump(client: TcpStream, upstream: SocketAddr, born: u64, generation: Arc<AtomicU64>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        client_write
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match client_read.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if generation.load(Ordering::SeqCst) != born {
            back.abort();
            if let Ok(write_half) = back.await {
                let client = client_read.reunite(write_half).expect("same stream");
                #[allow(deprecated)] // a reset is the point here
                let _ = client.set_linger(Some(Duration::ZERO));
                drop(client); // RST
            }
            return;
        }
        if server_write.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn the_first_claim_after_a_freeze_survives_a_dropped_pooled_connection() {
    let h = Harness::start().await;
    let upstream: SocketAddr = h.api.url().trim_start_matches("http://").parse().unwrap();
    let proxy = DroppingProxy::start(upstream).await;
    let quick = ShellWorkflow {
        name: "quick",
        steps: vec![("echo", "echo hi".into())],
    };
    let worker = LambdaWorkerBuilder::new(&format!("http://{}", proxy.addr), h.api.token())
        .provider(Arc::new(
            ironflow_core::providers::claude::ClaudeCodeProvider::new(),
        ))
        .register(quick)
        .deadline_margin(Duration::from_millis(500))
        .idle_probe_after(Duration::ZERO)
        .concurrency(4)
        .build()
        .unwrap();

    // A warm invocation of concurrent runs leaves several connections in the client's pool.
    for _ in 0..4 {
        h.create("quick", 0).await;
    }
    let warm = h.invoke(&worker, Duration::from_secs(30)).await;
    assert_eq!(warm.count(Outcome::Completed), 4);
    let connections_before = proxy.accepted.load(Ordering::SeqCst);

    // The freeze: the pooled connection is dropped under the client's feet.
    proxy.drop_existing_connections();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(h.create("quick", 0).await);
    }
    let thawed = h.invoke(&worker, Duration::from_secs(30)).await;

    assert!(thawed.errors.is_empty(), "{thawed:?}");
    assert_eq!(thawed.count(Outcome::Completed), 4, "{thawed:?}");
    for id in ids {
        assert_eq!(h.status(id).await, RunStatus::Completed);
    }
    assert!(
        proxy.accepted.load(Ordering::SeqCst) > connections_before,
        "the retry went out on a fresh connection"
    );
}

#[tokio::test]
async fn an_unreachable_api_stops_the_batch_with_the_error_in_the_summary() {
    let h = Harness::start().await;
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let worker = LambdaWorkerBuilder::new(&format!("http://{closed}"), "some-token")
        .provider(Arc::new(
            ironflow_core::providers::claude::ClaudeCodeProvider::new(),
        ))
        .deadline_margin(Duration::from_millis(500))
        .build()
        .unwrap();

    let summary = h.invoke(&worker, Duration::from_secs(30)).await;

    assert_eq!(summary.claimed, 0);
    assert_eq!(summary.stop_reason, StopReason::ClaimError);
    assert!(summary.errors[0].contains("claim failed"), "{summary:?}");
    assert!(!summary.errors[0].contains("some-token"));
}

/// A worker of this harness's API at `api_url` with `token`, every other setting default.
fn worker_at(api_url: &str, token: &str) -> ironflow_lambda::LambdaWorker {
    LambdaWorkerBuilder::new(api_url, token)
        .provider(Arc::new(
            ironflow_core::providers::claude::ClaudeCodeProvider::new(),
        ))
        .register(ShellWorkflow::one("quick", "echo hi"))
        .deadline_margin(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// One invocation of a worker at the API's URL followed by `path`, with `token` (`None`: the
/// API's own), against a pending run: nothing is claimed, the batch stops on a claim error, and
/// the run stays Pending. Returns that error.
async fn refused_claim_error(path: &str, token: Option<&str>) -> String {
    let h = Harness::start().await;
    let id = h.create("quick", 0).await;
    let url = format!("{}{path}", h.api.url());
    let worker = worker_at(&url, token.unwrap_or(h.api.token()));

    let summary = h.invoke(&worker, Duration::from_secs(30)).await;

    assert_eq!(summary.claimed, 0);
    assert_eq!(summary.stop_reason, StopReason::ClaimError);
    assert_eq!(h.status(id).await, RunStatus::Pending, "nothing claimed");
    let error = summary.errors[0].clone();
    assert!(!error.contains(h.api.token()), "{error}");
    error
}

#[tokio::test]
async fn a_wrong_api_path_is_reported_with_the_status_and_the_variable_to_fix() {
    // A common mistake: the API's base URL with its /api/v1 prefix. The API answers the claim
    // 404 with an empty body, which ApiRunStore reports as "worker API error: ".
    let error = refused_claim_error("/api/v1", None).await;
    assert!(error.contains("404"), "{error}");
    assert!(error.contains("IRONFLOW_API_URL"), "{error}");
}

#[tokio::test]
async fn a_refused_worker_token_is_reported_with_the_status_and_the_variable_to_fix() {
    let error = refused_claim_error("", Some(SECRET)).await;
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("IRONFLOW_WORKER_TOKEN"), "{error}");
    assert!(!error.contains(SECRET), "{error}");
}

/// FAULT INJECTION, not a stand-in for the API: a TCP proxy in front of the real API that holds
/// back the answer to every claim (`GET /api/v1/internal/runs/next`) until [`Self::answer`]: the
/// API has taken the run, but the worker does not know yet, as over a slow network.
struct ClaimHoldingProxy {
    addr: SocketAddr,
    claims_seen: Arc<AtomicU64>,
    answer: tokio::sync::watch::Sender<bool>,
}

impl ClaimHoldingProxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let claims_seen = Arc::new(AtomicU64::new(0));
        let (answer, answered) = tokio::sync::watch::channel(false);
        let seen = claims_seen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(hold_claims(
                    client,
                    upstream,
                    seen.clone(),
                    answered.clone(),
                ));
            }
        });
        Self {
            addr,
            claims_seen,
            answer,
        }
    }

    /// Let the held claim answers (and every later one) through.
    fn answer(&self) {
        self.answer.send_replace(true);
    }
}

/// One connection: requests go through at once; once a claim went up, the next bytes coming
/// back (its answer: HTTP/1.1 without pipelining) wait until `answered` turns true.
async fn hold_claims(
    client: TcpStream,
    upstream: SocketAddr,
    claims_seen: Arc<AtomicU64>,
    mut answered: tokio::sync::watch::Receiver<bool>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hold = held.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if hold.swap(false, Ordering::SeqCst) && answered.wait_for(|a| *a).await.is_err() {
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match client_read.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let claim = b"GET /api/v1/internal/runs/next";
        if buf[..n].windows(claim.len()).any(|w| w == claim) {
            claims_seen.fetch_add(1, Ordering::SeqCst);
            held.store(true, Ordering::SeqCst);
        }
        if server_write.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A harness, a worker behind a [`ClaimHoldingProxy`] whose claim window closes
/// `min_claim_budget` before its cutoff (deadline − 500 ms), and one pending run.
async fn behind_claim_holding_proxy(
    min_claim_budget: Duration,
) -> (
    Harness,
    ClaimHoldingProxy,
    ironflow_lambda::LambdaWorker,
    uuid::Uuid,
) {
    let h = Harness::start().await;
    let upstream: SocketAddr = h.api.url().trim_start_matches("http://").parse().unwrap();
    let proxy = ClaimHoldingProxy::start(upstream).await;
    let worker = LambdaWorkerBuilder::new(&format!("http://{}", proxy.addr), h.api.token())
        .provider(Arc::new(
            ironflow_core::providers::claude::ClaudeCodeProvider::new(),
        ))
        .register(ShellWorkflow::one("quick", "echo hi"))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_secs(2))
        .deadline_margin(Duration::from_millis(500))
        .min_claim_budget(min_claim_budget)
        .build()
        .unwrap();
    let id = h.create("quick", 0).await;
    (h, proxy, worker, id)
}

#[tokio::test]
async fn a_claim_answered_after_the_claim_window_closed_releases_its_run() {
    let (h, proxy, worker, id) = behind_claim_holding_proxy(Duration::from_secs(4)).await;
    let deadline_ms = common::deadline_in(Duration::from_secs(8));
    // Claim window end: deadline − margin (500 ms) − min claim budget (4 s).
    let window_end = std::time::UNIX_EPOCH + Duration::from_millis(deadline_ms - 4_500);

    let answer_after_the_window = async {
        common::wait_until(
            "the claim reached the API",
            Duration::from_secs(3),
            || async { proxy.claims_seen.load(Ordering::SeqCst) > 0 },
        )
        .await;
        assert_eq!(
            h.status(id).await,
            RunStatus::Running,
            "the API took the run"
        );
        let closed = window_end + Duration::from_millis(300);
        if let Ok(wait) = closed.duration_since(std::time::SystemTime::now()) {
            tokio::time::sleep(wait).await;
        }
        proxy.answer();
    };
    let (summary, ()) = tokio::join!(
        h.invoke_event(&worker, serde_json::json!({}), deadline_ms),
        answer_after_the_window
    );
    let summary = summary.unwrap();

    assert_eq!(summary.stop_reason, StopReason::Cutoff, "{summary:?}");
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(summary.count(Outcome::Released), 1, "{summary:?}");
    assert_eq!(summary.runs[0].run_id, id);
    assert!(summary.errors.is_empty(), "{summary:?}");
    let run = h.run(id).await;
    assert_eq!(
        run.status.state,
        RunStatus::Pending,
        "released, not left Running"
    );
    assert_eq!(h.steps(id).await.len(), 0, "never executed");
}

#[tokio::test]
async fn a_claim_still_unanswered_at_the_cutoff_is_named_in_the_summary() {
    let (h, proxy, worker, id) = behind_claim_holding_proxy(Duration::from_secs(1)).await;

    let summary = h.invoke(&worker, Duration::from_secs(3)).await;
    proxy.answer();

    assert_eq!(proxy.claims_seen.load(Ordering::SeqCst), 1);
    assert_eq!(summary.stop_reason, StopReason::Cutoff, "{summary:?}");
    assert_eq!(summary.claimed, 0, "{summary:?}");
    assert_eq!(summary.errors.len(), 1, "{summary:?}");
    let error = &summary.errors[0];
    assert!(error.contains("unanswered at the cutoff"), "{error}");
    assert!(error.contains("lease expires (10 s)"), "{error}");
    // What the error warns of: the API took the run, and only the lease's expiry frees it.
    assert_eq!(h.status(id).await, RunStatus::Running);
}
