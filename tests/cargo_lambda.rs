//! End to end under cargo-lambda: the deployable function (`src/bin/ironflow-lambda.rs`) runs
//! under `cargo lambda watch`, talks to the real ironflow API (`LocalApi`, started in this test)
//! and to moto's SQS (`IRONFLOW_TEST_MOTO_ENDPOINT`), and every sample in `events/` is sent with
//! `cargo lambda invoke --data-file`.
//!
//! Needs `./scripts/test`: it installs cargo-lambda into `.venv` (`IRONFLOW_TEST_CARGO_LAMBDA`)
//! and starts moto. Every process the test starts is stopped when it ends, pass or fail.
//!
//! The function runs with N = 2 and 10 s invocations (`cargo lambda watch` sends a deadline in
//! 1970: `IRONFLOW_EMULATED_INVOCATION_SECS` gives each invocation its length), so the
//! `multi-step` workflow (three 5 s steps) is handed back and finished through wake-ups.
//!
//! Several invocations at once in one process (Lambda Managed Instances,
//! `AWS_LAMBDA_MAX_CONCURRENCY` = M > 1): `cargo lambda watch --concurrency N` (cargo-lambda
//! 1.9.2) cannot show it, as it starts up to N function processes and sets
//! `AWS_LAMBDA_MAX_CONCURRENCY=1` on each, over any `--env-var`. Its `--only-lambda-apis` mode
//! serves the Runtime API without starting the function, and hands each concurrent `/next` poll
//! its own invocation: the test starts the one function process itself, with M = 2.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use ironflow_lambda::orphans;
use ironflow_local_api::{LocalApi, new_run};
use ironflow_model_server::{Match, ModelServer, Reply, Script};
use ironflow_store::entities::RunStatus;
use ironflow_store::store::Store;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};
use uuid::Uuid;

const TOKEN: &str = "cargo-lambda-e2e-token";
const FUNCTION: &str = "ironflow-lambda";
/// Generous bounds for a loaded 2-core machine: conditions are polled, never timed.
const INVOKE_TIMEOUT: Duration = Duration::from_secs(180);
const BUILD_TIMEOUT: Duration = Duration::from_secs(1200);

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with ./scripts/test, which installs cargo-lambda into .venv and starts moto's server")
    })
}

/// The variables cargo sets for this test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). Build
/// scripts such as ring's rerun when they change, so a cargo started with them (the build below,
/// the `cargo run` of `cargo lambda watch`) would rebuild those crates, and the next
/// `./scripts/test` again: they are removed from the environment of what this test starts.
fn cargo_test_variables() -> Vec<String> {
    const PREFIXES: [&str; 6] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
    ];
    std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| {
            PREFIXES.iter().any(|p| name.starts_with(p))
                || name == "CARGO_RUSTC_CURRENT_DIR"
                || name == "OUT_DIR"
        })
        .collect()
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `cargo lambda watch` running the function; stopped (with the function and anything else
/// this test started) when dropped.
struct Watch {
    child: Child,
    port: u16,
    log: PathBuf,
    /// The function's binary (`--bin`).
    bin: &'static str,
}

impl Watch {
    /// `cargo lambda watch --bin bin` in `dir` (a crate's directory).
    fn start(cargo_lambda: &str, dir: &Path, bin: &'static str, envs: &[(&str, String)]) -> Self {
        Self::start_with(cargo_lambda, dir, bin, envs, &[])
    }

    /// [`Watch::start`] with more `cargo lambda watch` options (`extra`).
    fn start_with(
        cargo_lambda: &str,
        dir: &Path,
        bin: &'static str,
        envs: &[(&str, String)],
        extra: &[&str],
    ) -> Self {
        let port = free_port();
        let log = manifest_dir().join(format!("target/e2e-cargo-lambda-watch-{port}.log"));
        let out = File::create(&log).unwrap();
        let mut command = Command::new(cargo_lambda);
        command
            .current_dir(dir)
            .args(["lambda", "watch", "--bin", bin, "--ignore-changes"])
            .args(["--invoke-address", "127.0.0.1", "--invoke-port"])
            .arg(port.to_string())
            .args(extra)
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for name in cargo_test_variables() {
            command.env_remove(name);
        }
        for (k, v) in envs {
            command.env(k, v);
        }
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().unwrap();
        Self {
            child,
            port,
            log,
            bin,
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Wait until the invoke port accepts connections.
    async fn ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("cargo lambda watch exited ({status}):\n{}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "cargo lambda watch did not listen on {}:\n{}",
                self.port,
                self.log_tail()
            );
            sleep(Duration::from_millis(200)).await;
        }
    }

    /// `cargo lambda invoke` with `args` (`--data-file F` or `--data-ascii S`).
    async fn invoke(&self, args: &[&str]) -> Invoked {
        let cargo_lambda = required_env("IRONFLOW_TEST_CARGO_LAMBDA");
        let mut command = tokio::process::Command::new(cargo_lambda);
        command
            .current_dir(manifest_dir())
            .args(["lambda", "invoke", self.bin, "--output-format", "json"])
            .args(["--invoke-address", "127.0.0.1", "--invoke-port"])
            .arg(self.port.to_string())
            .args(args)
            .kill_on_drop(true);
        let output = timeout(INVOKE_TIMEOUT, command.output())
            .await
            .unwrap_or_else(|_| panic!("invoke {args:?} timed out:\n{}", self.log_tail()))
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        Invoked {
            ok: output.status.success(),
            json: serde_json::from_str(&stdout).ok(),
            stdout,
            stderr: String::from_utf8_lossy(&output.stderr).to_string(),
        }
    }

    async fn invoke_file(&self, path: &Path) -> Invoked {
        self.invoke(&["--data-file", path.to_str().unwrap()]).await
    }

    async fn invoke_sample(&self, name: &str) -> Invoked {
        self.invoke_file(&manifest_dir().join("events").join(name))
            .await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- cargo lambda watch log (tail) ---\n{}", self.log_tail());
        }
        // The process group this test created for cargo lambda watch.
        if let Some(pgid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::TERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The function runs in a process group of its own: as this process is a subreaper, it
        // is still a descendant, and nothing this test started outlives it.
        orphans::sweep(Duration::from_secs(5));
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

struct Invoked {
    ok: bool,
    json: Option<Value>,
    stdout: String,
    stderr: String,
}

impl Invoked {
    fn response(&self, what: &str) -> &Value {
        assert!(self.ok, "{what} failed: {}\n{}", self.stderr, self.stdout);
        self.json
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: not JSON: {}", self.stdout))
    }

    fn error(&self, what: &str, error_type: &str) {
        assert!(!self.ok, "{what} did not fail: {}", self.stdout);
        assert!(
            self.stderr.contains(error_type),
            "{what}: expected {error_type}: {}",
            self.stderr
        );
    }
}

// --- moto's SQS -------------------------------------------------------------------------------

fn sqs_client(endpoint: &str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// Receive wake-ups until `at_least` have arrived (or 60 s passed); deletes nothing.
async fn receive(sqs: &aws_sdk_sqs::Client, url: &str, at_least: usize) -> Vec<Message> {
    let mut messages: Vec<Message> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while messages.len() < at_least && Instant::now() < deadline {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(300)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        messages.extend(out.messages().iter().cloned());
    }
    messages
}

async fn delete(sqs: &aws_sdk_sqs::Client, url: &str, messages: &[Message]) {
    for m in messages {
        sqs.delete_message()
            .queue_url(url)
            .receipt_handle(m.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
}

/// The SQS event Lambda's event source mapping would build from `messages`, written to a file
/// for `--data-file`.
fn sqs_event_file(messages: &[Message], queue_arn: &str) -> PathBuf {
    let records: Vec<Value> = messages
        .iter()
        .map(|m| {
            json!({
                "messageId": m.message_id(),
                "receiptHandle": m.receipt_handle(),
                "body": m.body(),
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    let path = std::env::temp_dir().join(format!("ironflow-e2e-sqs-{}.json", Uuid::new_v4()));
    std::fs::write(&path, json!({ "Records": records }).to_string()).unwrap();
    path
}

/// `cargo build ARGS` in the workspace, with none of this test's cargo variables.
async fn build(args: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = tokio::process::Command::new(cargo);
    build
        .current_dir(manifest_dir())
        .arg("build")
        .args(args)
        .kill_on_drop(true);
    for name in cargo_test_variables() {
        build.env_remove(name);
    }
    let status = timeout(BUILD_TIMEOUT, build.status())
        .await
        .unwrap_or_else(|_| panic!("cargo build {args:?} timed out"))
        .unwrap();
    assert!(status.success(), "cargo build {args:?} failed");
}

async fn states(store: &std::sync::Arc<dyn Store>, ids: &[Uuid]) -> Vec<RunStatus> {
    let mut out = Vec::new();
    for id in ids {
        out.push(store.get_run(*id).await.unwrap().unwrap().status.state);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_through_cargo_lambda_watch() {
    let cargo_lambda = required_env("IRONFLOW_TEST_CARGO_LAMBDA");
    let moto = required_env("IRONFLOW_TEST_MOTO_ENDPOINT");
    orphans::become_subreaper();

    // The real ironflow API, in this process.
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client(&moto);
    let queue_url = sqs
        .create_queue()
        .queue_name(format!("e2e-wake-{}", Uuid::new_v4().simple()))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let queue_arn = "arn:aws:sqs:us-east-1:123456789012:e2e-wake";

    // Build the function as the root builds it (default features: the test build's library has
    // test-support, so this builds it once more), then run it under cargo lambda watch.
    build(&["--bin", FUNCTION]).await;

    let envs = [
        ("IRONFLOW_API_URL", api.url()),
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_MAX_RUNS_PER_INVOCATION", "2".into()),
        ("IRONFLOW_CONCURRENCY", "2".into()),
        ("IRONFLOW_FUNCTION_TIMEOUT_SECS", "10".into()),
        ("IRONFLOW_EMULATED_INVOCATION_SECS", "10".into()),
        ("IRONFLOW_DEADLINE_MARGIN_MS", "2000".into()),
        ("IRONFLOW_MIN_CLAIM_BUDGET_MS", "500".into()),
        ("IRONFLOW_LEASE_TTL_SECS", "10".into()),
        ("IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", "2".into()),
        ("IRONFLOW_WAKE_QUEUE_URL", queue_url.clone()),
        ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "3".into()),
        ("IRONFLOW_WAKE_DELAY_SECS", "1".into()),
        ("AWS_ENDPOINT_URL", moto.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("RUST_LOG", "info".into()),
    ];
    let mut watch = Watch::start(&cargo_lambda, manifest_dir(), FUNCTION, &envs);
    watch.ready().await;

    let mut quick = Vec::new();
    for _ in 0..6 {
        let run = api.store().create_run(new_run("quick-shell", 0)).await;
        quick.push(run.unwrap().into_run().id);
    }

    // Invalid events: clear errors, nothing claimed.
    for (name, error_type) in [
        ("invalid-max-runs.json", "InvalidEvent"),
        ("invalid-not-an-object.json", "InvalidEvent"),
        ("invalid-s3-notification.json", "InvalidEvent"),
        (
            "invalid-sqs-without-message-id.json",
            "UnreportableSqsRecord",
        ),
    ] {
        watch.invoke_sample(name).await.error(name, error_type);
    }
    watch
        .invoke(&["--data-ascii", "not json"])
        .await
        .error("invalid JSON", "DeserializeError");
    let too_many = watch.invoke_sample("invalid-max-runs.json").await;
    assert!(
        too_many.stderr.contains("from 1 to 2"),
        "{}",
        too_many.stderr
    );
    assert!(
        states(api.store(), &quick)
            .await
            .iter()
            .all(|s| *s == RunStatus::Pending),
        "an invalid event claimed a run"
    );

    // Standard schedule: N = 2 claimed, 4 left → ceil(4 / 2) = 2 wake-ups.
    let invoked = watch.invoke_sample("schedule.json").await;
    let summary = invoked.response("schedule.json");
    assert_eq!(summary["claimed"], 2, "{summary}");
    assert_eq!(summary["outcomes"], json!({"completed": 2}), "{summary}");
    assert_eq!(summary["stop_reason"], "max_runs", "{summary}");
    assert_eq!(
        summary["wake_ups"],
        json!({"trigger": "backlog", "pending_runs": 4, "queued": 0, "sent": 2,
               "delay_secs": 0, "errors": []}),
        "{summary}"
    );

    // Custom constant input {"source": "my-schedule", "max_runs": 2}: one batch of 2; 2 left
    // need 1 wake-up, 2 are queued: none sent.
    let invoked = watch.invoke_sample("schedule-custom-input.json").await;
    let summary = invoked.response("schedule-custom-input.json");
    assert_eq!(summary["claimed"], 2, "{summary}");
    assert_eq!(summary["wake_ups"]["queued"], 2, "{summary}");
    assert_eq!(summary["wake_ups"]["sent"], 0, "{summary}");

    // Direct with overrides, then direct {}: 1 and the last 1.
    let invoked = watch.invoke_sample("direct-overrides.json").await;
    assert_eq!(invoked.response("direct-overrides.json")["claimed"], 1);
    let invoked = watch.invoke_sample("direct-empty.json").await;
    let summary = invoked.response("direct-empty.json");
    assert_eq!(summary["claimed"], 1, "{summary}");
    assert_eq!(summary["stop_reason"], "no_pending_run", "{summary}");
    assert_eq!(summary["wake_ups"]["trigger"], Value::Null, "{summary}");
    assert_eq!(
        states(api.store(), &quick).await,
        vec![RunStatus::Completed; 6]
    );

    // SQS: exact partial batch responses.
    let invoked = watch.invoke_sample("sqs-wake-ups.json").await;
    assert_eq!(
        invoked.response("sqs-wake-ups.json"),
        &json!({"batchItemFailures": []})
    );
    let invoked = watch.invoke_sample("sqs-one-malformed.json").await;
    assert_eq!(
        invoked.response("sqs-one-malformed.json"),
        &json!({"batchItemFailures": [{"itemIdentifier": "5c0ffee0-1111-4a2b-8c3d-000000000002"}]})
    );

    // The schedule's two wake-ups are on the queue; served, they find nothing left.
    let wake_ups = receive(&sqs, &queue_url, 2).await;
    assert_eq!(wake_ups.len(), 2, "wake-ups on the queue");
    for m in &wake_ups {
        let body: Value = serde_json::from_str(m.body().unwrap()).unwrap();
        assert_eq!(body["reason"], "backlog", "{body}");
        assert_eq!(body["pending_runs"], 4, "{body}");
    }
    let file = sqs_event_file(&wake_ups, queue_arn);
    let invoked = watch.invoke_file(&file).await;
    assert_eq!(
        invoked.response("queued wake-ups"),
        &json!({"batchItemFailures": []})
    );
    delete(&sqs, &queue_url, &wake_ups).await;
    let _ = std::fs::remove_file(file);

    // A run longer than one invocation: handed back, then finished by the wake-ups its
    // handbacks send, this test playing the event source mapping.
    let long = api
        .store()
        .create_run(new_run("multi-step", 0))
        .await
        .unwrap()
        .into_run()
        .id;
    let invoked = watch.invoke_sample("direct-empty.json").await;
    let summary = invoked.response("multi-step, first invocation");
    assert_eq!(summary["outcomes"], json!({"handed_back": 1}), "{summary}");
    assert_eq!(summary["wake_ups"]["trigger"], "handed_back", "{summary}");
    assert_eq!(summary["wake_ups"]["sent"], 1, "{summary}");
    assert_eq!(summary["wake_ups"]["delay_secs"], 1, "{summary}");
    let mut hops = 0;
    while states(api.store(), &[long]).await != [RunStatus::Completed] {
        hops += 1;
        assert!(hops <= 5, "multi-step not completed after {hops} wake-ups");
        let wake_ups = receive(&sqs, &queue_url, 1).await;
        assert_eq!(
            wake_ups.len(),
            1,
            "a wake-up after the handback (hop {hops})"
        );
        let body: Value = serde_json::from_str(wake_ups[0].body().unwrap()).unwrap();
        assert_eq!(body["reason"], "handed_back", "{body}");
        let file = sqs_event_file(&wake_ups, queue_arn);
        let invoked = watch.invoke_file(&file).await;
        assert_eq!(
            invoked.response("wake-up after a handback"),
            &json!({"batchItemFailures": []})
        );
        delete(&sqs, &queue_url, &wake_ups).await;
        let _ = std::fs::remove_file(file);
    }
    assert!(hops >= 1, "multi-step finished without a wake-up");
    // The hop that completed the run handed nothing back and left no backlog: no wake-up.
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .unwrap();
    let count = |name: &str| {
        attributes
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::from(name)))
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    assert_eq!(
        (
            count("ApproximateNumberOfMessages"),
            count("ApproximateNumberOfMessagesDelayed"),
            count("ApproximateNumberOfMessagesNotVisible")
        ),
        (0, 0, 0),
        "wake-ups left on the queue"
    );
}

/// The example crate of a team's own workflows (`examples/my-workflows`, README "Run your own
/// workflows"): its binary, which is `ironflow_lambda::run` and its workflows, under `cargo
/// lambda watch` against the real API. Its three-step workflow outlasts one invocation: handed
/// back, and resumed by replay at its next step. Its agent steps reach Bedrock's Converse API
/// through the provider its `main.rs` registers, configured by the environment alone
/// (`AWS_ENDPOINT_URL_BEDROCK_RUNTIME`: the scripted model server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_crate_runs_its_own_workflows_under_cargo_lambda_watch() {
    const EXAMPLE: &str = "my-workflows";
    let cargo_lambda = required_env("IRONFLOW_TEST_CARGO_LAMBDA");
    orphans::become_subreaper();
    let api = LocalApi::start(TOKEN).await.unwrap();
    let outline = Match::any().containing("three-point outline");
    let script = Script::new()
        .strict()
        .always(outline, Reply::text("1. a 2. b 3. c"))
        .always(
            Match::any().containing("article this outline describes"),
            Reply::text("a long draft"),
        )
        .always(
            Match::any().containing("Tighten this article"),
            Reply::text("a short article"),
        );
    let model = ModelServer::start(script).await.unwrap();
    build(&["-p", EXAMPLE]).await;
    let envs = [
        ("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", model.url()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("IRONFLOW_API_URL", api.url()),
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_FUNCTION_TIMEOUT_SECS", "8".into()),
        ("IRONFLOW_EMULATED_INVOCATION_SECS", "8".into()),
        ("IRONFLOW_DEADLINE_MARGIN_MS", "1500".into()),
        ("IRONFLOW_MIN_CLAIM_BUDGET_MS", "500".into()),
        ("IRONFLOW_LEASE_TTL_SECS", "10".into()),
        ("IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", "2".into()),
        ("RUST_LOG", "info".into()),
    ];
    // In the example's directory, as the README says.
    let dir = manifest_dir().join("examples").join(EXAMPLE);
    let mut watch = Watch::start(&cargo_lambda, &dir, EXAMPLE, &envs);
    watch.ready().await;

    let mut greet = new_run("greet", 0);
    greet.payload = json!({"name": "Ada"});
    let greet = api.store().create_run(greet).await.unwrap().into_run().id;
    // Three steps of 3 s: the first 8 s invocation cannot finish them.
    let mut report = new_run("daily-report", 0);
    report.payload = json!({"pause_secs": 3});
    let report = api.store().create_run(report).await.unwrap().into_run().id;
    let mut chain = new_run("prompt-chaining", 1);
    chain.payload = json!({"topic": "lambdas"});
    let chain = api.store().create_run(chain).await.unwrap().into_run().id;

    let mut handed_back = 0;
    for n in 1..=6 {
        if states(api.store(), &[greet, report, chain]).await == [RunStatus::Completed; 3] {
            break;
        }
        let invoked = watch.invoke(&["--data-ascii", "{}"]).await;
        let summary = invoked.response(&format!("invocation {n}"));
        handed_back += summary["outcomes"]["handed_back"].as_u64().unwrap_or(0);
    }
    assert_eq!(
        states(api.store(), &[greet, report, chain]).await,
        [RunStatus::Completed; 3]
    );
    assert!(handed_back >= 1, "daily-report finished in one invocation");
    let chained = api.store().get_run(chain).await.unwrap().unwrap();
    assert_eq!(
        chained.output.as_ref().map(|o| o["final"].clone()),
        Some(json!("a short article")),
        "{chained:?}"
    );
    // One Converse call per step, and one more at most for a call a handback cut.
    let calls = model.calls().total;
    assert!((3..=3 + handed_back).contains(&calls), "{calls} calls");

    let greeted = api.store().list_steps(greet).await.unwrap();
    assert_eq!(greeted.len(), 1);
    assert!(
        format!("{:?}", greeted[0].output).contains("hello, Ada"),
        "{:?}",
        greeted[0].output
    );
    let steps = api.store().list_steps(report).await.unwrap();
    let published = steps
        .iter()
        .find(|s| {
            s.name == "publish" && s.status.state == ironflow_store::entities::StepStatus::Completed
        })
        .expect("publish completed");
    assert!(
        format!("{:?}", published.output).contains("daily total: 8"),
        "total took extract's output from the store: {:?}",
        published.output
    );
    let extracted = steps.iter().filter(|s| s.name == "extract").count();
    assert_eq!(
        extracted, 1,
        "the completed extract step was replayed, not run again"
    );
}

// --- processes ----------------------------------------------------------------------------------

/// Every process's parent: (pid, ppid), from `/proc/<pid>/stat`.
fn process_table() -> Vec<(u32, u32)> {
    let mut table = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // The fields after the command name, which may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1))
            .and_then(|ppid| ppid.parse().ok());
        if let Some(ppid) = ppid {
            table.push((pid, ppid));
        }
    }
    table
}

/// The descendants of `root`, as they are now.
fn descendants(root: u32) -> Vec<u32> {
    let table = process_table();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for &(pid, _) in table.iter().filter(|(_, ppid)| *ppid == parent) {
            found.push(pid);
            parents.push(pid);
        }
    }
    found
}

/// The file name of the program `pid` runs (`/proc/<pid>/exe`; empty once it is gone).
fn program(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().to_string()))
        .map(|name| name.trim_end_matches(" (deleted)").to_string())
        .unwrap_or_default()
}

/// The function's binary, started by this test (not by cargo lambda watch) against the Runtime
/// API of a `cargo lambda watch --only-lambda-apis`; stopped when dropped.
struct Function {
    child: Child,
    log: PathBuf,
}

impl Function {
    /// With the variables cargo lambda watch gives the instances it starts itself (its log
    /// shows them), `envs`, and `AWS_LAMBDA_MAX_CONCURRENCY` = `max_concurrency`.
    fn start(watch: &Watch, envs: &[(&str, String)], max_concurrency: u32) -> Self {
        let log = manifest_dir().join(format!(
            "target/e2e-cargo-lambda-function-{}.log",
            watch.port
        ));
        let out = File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ironflow-lambda"));
        command
            .current_dir(manifest_dir())
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .env("AWS_LAMBDA_FUNCTION_NAME", watch.bin)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "4096")
            .env(
                "AWS_LAMBDA_RUNTIME_API",
                format!("http://127.0.0.1:{}/.rt/{}", watch.port, watch.bin),
            )
            .env("AWS_LAMBDA_MAX_CONCURRENCY", max_concurrency.to_string())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().unwrap();
        Self { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Panics when the function has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the function exited ({status}):\n{}", self.log_tail());
        }
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- function log (tail) ---\n{}", self.log_tail());
        }
        if let Some(pgid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::TERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Lambda Managed Instances under cargo lambda watch: one function process with
/// `AWS_LAMBDA_MAX_CONCURRENCY=2` polls the watch's Runtime API (`--only-lambda-apis`) twice
/// at once, and two `cargo lambda invoke` sent together run in it at the same time: both runs
/// execute in that one process at once (seen in its process tree while both are Running, and
/// in the store, both started before either ended), each run once, and each invocation's
/// response holds its own run, worker id and step logs only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_invocations_in_one_process_under_cargo_lambda_watch() {
    const M: usize = 2;
    const STEPS: [&str; 3] = ["prepare", "build", "publish"];
    let cargo_lambda = required_env("IRONFLOW_TEST_CARGO_LAMBDA");
    orphans::become_subreaper();
    let api = LocalApi::start(TOKEN).await.unwrap();
    // One run per invocation, each of three 5 s steps (`multi-step`), well within the 120 s
    // invocations: they end completed, not handed back.
    let envs = [
        ("IRONFLOW_API_URL", api.url()),
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_MAX_RUNS_PER_INVOCATION", "1".into()),
        ("IRONFLOW_CONCURRENCY", "1".into()),
        ("IRONFLOW_FUNCTION_TIMEOUT_SECS", "120".into()),
        ("IRONFLOW_EMULATED_INVOCATION_SECS", "120".into()),
        ("IRONFLOW_DEADLINE_MARGIN_MS", "2000".into()),
        ("IRONFLOW_MIN_CLAIM_BUDGET_MS", "500".into()),
        ("IRONFLOW_LEASE_TTL_SECS", "10".into()),
        ("IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", "2".into()),
        ("RUST_LOG", "info".into()),
    ];
    let mut watch = Watch::start_with(
        &cargo_lambda,
        manifest_dir(),
        FUNCTION,
        &[("RUST_LOG", "info".to_string())],
        &["--only-lambda-apis"],
    );
    watch.ready().await;
    let mut function = Function::start(&watch, &envs, M as u32);

    let mut runs = Vec::new();
    for _ in 0..M {
        let run = api.store().create_run(new_run("multi-step", 0)).await;
        runs.push(run.unwrap().into_run().id);
    }

    // Both invocations sent at once; until they return, the function's process tree and the
    // runs' states are watched for both runs executing in it together.
    let invocations =
        futures_util::future::join_all((0..M).map(|_| watch.invoke(&["--data-ascii", "{}"])));
    tokio::pin!(invocations);
    let mut together = false;
    let invoked = loop {
        tokio::select! {
            invoked = &mut invocations => break invoked,
            _ = sleep(Duration::from_millis(100)) => {}
        }
        function.assert_running();
        // cargo lambda watch started no function of its own: this one is the only one.
        let theirs: Vec<u32> = descendants(watch.child.id())
            .into_iter()
            .filter(|pid| program(*pid) == FUNCTION)
            .collect();
        assert!(
            theirs.is_empty(),
            "cargo lambda watch started the function: {theirs:?}"
        );
        if !together {
            // A step's `sleep` runs below the function's process while its run executes.
            let steps = descendants(function.pid())
                .into_iter()
                .filter(|pid| program(*pid) == "sleep")
                .count();
            together =
                steps >= M && states(api.store(), &runs).await == vec![RunStatus::Running; M];
        }
    };
    assert!(
        together,
        "the {M} runs never executed at once in the function's process"
    );

    // Each invocation: one run, its own, completed; no run in two of them.
    let mut reported = Vec::new();
    let mut worker_ids = Vec::new();
    for (n, invoked) in invoked.iter().enumerate() {
        let summary = invoked.response(&format!("invocation {n}"));
        assert_eq!(summary["claimed"], 1, "{summary}");
        assert_eq!(summary["outcomes"], json!({"completed": 1}), "{summary}");
        assert_eq!(summary["lease_recoveries"], 0, "{summary}");
        let listed = summary["runs"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{summary}");
        reported.push(
            listed[0]["run_id"]
                .as_str()
                .unwrap()
                .parse::<Uuid>()
                .unwrap(),
        );
        worker_ids.push(summary["worker_id"].as_str().unwrap().to_string());
    }
    let mut sorted = reported.clone();
    sorted.sort();
    let mut expected = runs.clone();
    expected.sort();
    assert_eq!(sorted, expected, "each run in exactly one response");
    worker_ids.sort();
    worker_ids.dedup();
    assert_eq!(
        worker_ids.len(),
        M,
        "one worker id per invocation: {worker_ids:?}"
    );

    // In the store: completed on the first attempt, both started before either ended, every
    // step once, and each run's own step lines, each once.
    let mut started = Vec::new();
    let mut completed = Vec::new();
    for id in &runs {
        let run = api.store().get_run(*id).await.unwrap().unwrap();
        assert_eq!(run.status.state, RunStatus::Completed, "{id}");
        assert_eq!(run.retry_count, 0, "{id}");
        started.push(run.started_at.unwrap());
        completed.push(run.completed_at.unwrap());
        let steps = api.store().list_steps(*id).await.unwrap();
        let mut names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        let mut once = STEPS.to_vec();
        once.sort();
        assert_eq!(names, once, "every step of {id} once");
        let filter = ironflow_store::entities::LogFilter {
            step_id: None,
            stream: None,
        };
        let logs = api
            .store()
            .get_logs(*id, filter, None, 10_000)
            .await
            .unwrap();
        for step in STEPS {
            let line = format!("{step} done");
            let count = logs.iter().filter(|l| l.line.trim() == line).count();
            assert_eq!(count, 1, "{id}: {line:?} {count} times in its logs");
        }
    }
    let last_start = started.iter().max().unwrap();
    let first_end = completed.iter().min().unwrap();
    assert!(
        last_start < first_end,
        "the runs did not overlap: started {started:?}, completed {completed:?}"
    );
    function.assert_running();
}
