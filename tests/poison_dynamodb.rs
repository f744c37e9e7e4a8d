//! The DynamoDB poison-pill table against moto's server (a real DynamoDB-protocol server),
//! through the real SDK, and end to end with real runs on the real ironflow API.
//!
//! Needs `IRONFLOW_TEST_MOTO_ENDPOINT` (set by `./scripts/test`, which starts moto). Each test
//! creates its own table with a unique name. The fail-open test starts (and kills) a second
//! moto server of its own.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{AttributeValue, BillingMode, TimeToLiveSpecification};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::Outcome;
use ironflow_lambda::poison::dynamodb::{
    CONSECUTIVE_FAILURES, DynamoPoisonTable, DynamoSetupError, FAILURE_IDS, LAST_FAILURE_ID,
    LAST_FAILURE_MS, LEASE_RECOVERIES_SEEN, PARTITION_KEY, TTL_ATTRIBUTE, TTL_SLACK, run_key,
    workflow_key,
};
use ironflow_lambda::poison::{
    CLOCK_SKEW_ALLOWANCE, PoisonMode, PoisonPolicy, PoisonTable, now_ms,
};
use ironflow_lambda::samples;
use ironflow_lambda::settings::Settings;
use ironflow_lambda::{BuildError, LambdaWorker, LambdaWorkerBuilder};
use ironflow_lambda::{InvocationSummary, report::StopReason};
use ironflow_local_api::{LocalApi, new_run};
use ironflow_store::entities::{LeaseRequest, RunStatus, StepStatus};
use ironflow_store::store::RunStore;
use ironflow_worker::ApiRunStore;
use uuid::Uuid;

use common::moto::{create_table_keyed, dynamodb_config, moto_endpoint, unique_table};
use common::start_step;

// --- helpers (local to this file) ---------------------------------------------------------

/// Create a table with the schema of `src/poison/dynamodb/` (pk S, on demand, TTL).
async fn create_table(endpoint: &str) -> String {
    let name = unique_table();
    create_table_keyed(endpoint, &name, PARTITION_KEY).await;
    Client::from_conf(dynamodb_config(endpoint))
        .update_time_to_live()
        .table_name(&name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(TTL_ATTRIBUTE)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    name
}

fn policy(threshold: u32, cooldown: Duration) -> PoisonPolicy {
    PoisonPolicy {
        threshold,
        cooldown,
    }
}

/// A fresh table instance, as one Lambda instance would build it at cold start.
async fn connect(endpoint: &str, table: &str, ns: &str, p: PoisonPolicy) -> DynamoPoisonTable {
    DynamoPoisonTable::connect_with(dynamodb_config(endpoint), table, ns, p)
        .await
        .unwrap()
}

async fn raw_item(
    endpoint: &str,
    table: &str,
    key: &str,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    Client::from_conf(dynamodb_config(endpoint))
        .get_item()
        .table_name(table)
        .key(PARTITION_KEY, AttributeValue::S(key.to_string()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .cloned()
}

fn num(item: &std::collections::HashMap<String, AttributeValue>, attr: &str) -> u64 {
    item[attr].as_n().unwrap().parse().unwrap()
}

/// A worker on the embedded API with `quick-shell` and `always-fails` and the given table.
fn worker(
    api: &LocalApi,
    table: Arc<dyn PoisonTable>,
    p: PoisonPolicy,
    mode: PoisonMode,
) -> LambdaWorker {
    LambdaWorkerBuilder::new(&api.url(), api.token())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .register(samples::AlwaysFails)
        .max_runs_per_invocation(8)
        .concurrency(2)
        .function_timeout(Duration::from_secs(120))
        .deadline_margin(Duration::from_secs(5))
        .min_claim_budget(Duration::from_millis(500))
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(5))
        .poison_threshold(p.threshold)
        .poison_cooldown(p.cooldown)
        .poison_mode(mode)
        .poison_table(table)
        .build()
        .unwrap()
}

async fn invoke(worker: &LambdaWorker, n: usize) -> InvocationSummary {
    let mut context = lambda_runtime::Context::default();
    context.request_id = format!("test-{n}");
    context.deadline = u64::try_from(
        (std::time::SystemTime::now() + Duration::from_secs(100))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let event = lambda_runtime::LambdaEvent::new(serde_json::json!({}), context);
    ironflow_lambda::handle_summary(worker, event)
        .await
        .unwrap()
}

async fn create_runs(api: &LocalApi, workflow: &str, count: usize, max_retries: u32) -> Vec<Uuid> {
    let client = ApiRunStore::new(&api.url(), api.token());
    let mut ids = Vec::new();
    for _ in 0..count {
        ids.push(
            client
                .create_run(new_run(workflow, max_retries))
                .await
                .unwrap()
                .into_run()
                .id,
        );
    }
    ids
}

async fn state(api: &LocalApi, id: Uuid) -> RunStatus {
    api.store().get_run(id).await.unwrap().unwrap().status.state
}

fn outcomes_of(summary: &InvocationSummary, workflow: &str) -> Vec<Outcome> {
    summary
        .runs
        .iter()
        .filter(|r| r.workflow == workflow)
        .map(|r| r.outcome)
        .collect()
}

/// Poll `check` every 100 ms until it holds, failing after `limit`.
async fn wait_for<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// --- the table alone ----------------------------------------------------------------------

#[tokio::test]
async fn counts_from_nothing_in_one_write_each() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(3, Duration::from_secs(60));
    let t = connect(&ep, &name, "fn-a", p).await;
    let now = now_ms();

    assert_eq!(t.counter("deploy", now).await.unwrap(), None);
    let before = t.calls().snapshot();
    let c1 = t.record_failure("deploy", "run-1/0", now).await.unwrap();
    let c2 = t
        .record_failure("deploy", "run-2/0", now + 1)
        .await
        .unwrap();
    assert_eq!(
        (c1.consecutive_failures, c2.consecutive_failures),
        (1, 2),
        "first failure with no item counts 1, the next 2"
    );
    assert_eq!(c2.last_failure_ms, now + 1);
    let after = t.calls().snapshot();
    assert_eq!(
        after.get("UpdateItem").copied().unwrap_or(0)
            - before.get("UpdateItem").copied().unwrap_or(0),
        2,
        "one UpdateItem per failure: {after:?}"
    );
    assert_eq!(
        after.len(),
        3,
        "only DescribeTable, GetItem and UpdateItem: {after:?}"
    );

    let read = t.counter("deploy", now + 2).await.unwrap().unwrap();
    assert_eq!(read, c2);
    assert_eq!(t.counter("other", now).await.unwrap(), None);

    // The item as the SAM template and the TTL expect it.
    let item = raw_item(&ep, &name, &workflow_key("fn-a", "deploy"))
        .await
        .unwrap();
    assert_eq!(item[PARTITION_KEY].as_s().unwrap(), "fn-a#workflow#deploy");
    assert_eq!(num(&item, CONSECUTIVE_FAILURES), 2);
    assert_eq!(num(&item, LAST_FAILURE_MS), now + 1);
    assert_eq!(item[LAST_FAILURE_ID].as_s().unwrap(), "run-2/0");
    let expected_ttl = (now + 1 + 60_000 + TTL_SLACK.as_millis() as u64).div_ceil(1000);
    assert_eq!(num(&item, TTL_ATTRIBUTE), expected_ttl, "epoch seconds");
    let mut ids = item[FAILURE_IDS].as_ss().unwrap().clone();
    ids.sort();
    assert_eq!(ids, vec!["run-1/0".to_string(), "run-2/0".to_string()]);
}

#[tokio::test]
async fn threshold_blocks_until_the_cooldown_has_passed() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(3, Duration::from_secs(60));
    let t = connect(&ep, &name, "ns", p).await;
    let t0 = now_ms();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let c = t.record_failure("wf", id, t0).await.unwrap();
        assert_eq!(c.consecutive_failures, i as u32 + 1);
        assert_eq!(
            p.is_blocked(&c, t0),
            i == 2,
            "blocked only at the threshold"
        );
    }
    let during = t.counter("wf", t0 + 59_999).await.unwrap().unwrap();
    assert!(p.is_blocked(&during, t0 + 59_999));
    assert_eq!(t.counter("wf", t0 + 60_000).await.unwrap(), None);
}

#[tokio::test]
async fn expired_but_not_deleted_item_counts_as_absent_and_restarts_at_one() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(2, Duration::from_secs(60));
    let t = connect(&ep, &name, "ns", p).await;
    let t0 = now_ms();
    t.record_failure("wf", "a", t0).await.unwrap();
    t.record_failure("wf", "b", t0).await.unwrap();
    let later = t0 + 61_000;

    // The TTL has not deleted it (and moto never does): the item is there, but expired.
    let key = workflow_key("ns", "wf");
    assert!(raw_item(&ep, &name, &key).await.is_some());
    assert_eq!(t.counter("wf", later).await.unwrap(), None);
    assert!(t.counters(&["wf".into()], later).await.unwrap().is_empty());

    let c = t.record_failure("wf", "c", later).await.unwrap();
    assert_eq!(c.consecutive_failures, 1, "a new streak");
    let item = raw_item(&ep, &name, &key).await.unwrap();
    assert_eq!(item[FAILURE_IDS].as_ss().unwrap(), &vec!["c".to_string()]);
    assert_eq!(num(&item, LAST_FAILURE_MS), later);
    let c = t.record_failure("wf", "d", later).await.unwrap();
    assert_eq!(c.consecutive_failures, 2);
}

#[tokio::test]
async fn a_retried_failure_write_never_counts_twice() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let t = connect(&ep, &name, "ns", policy(5, Duration::from_secs(60))).await;
    let now = now_ms();
    t.record_failure("wf", "run-1/0", now).await.unwrap();
    t.record_failure("wf", "run-2/0", now).await.unwrap();
    // The first write again, as after a lost response, with another failure in between.
    let again = t.record_failure("wf", "run-1/0", now + 5).await.unwrap();
    assert_eq!(again.consecutive_failures, 2);
    assert_eq!(again.last_failure_ms, now, "returned unchanged");
    let c = t.record_failure("wf", "run-3/0", now + 6).await.unwrap();
    assert_eq!(c.consecutive_failures, 3);
}

/// A streak at u32::MAX (a stored count the code never reaches, but accepts) stays a working
/// counter: the next failures' writes are read back saturated, not as a malformed item.
#[tokio::test]
async fn a_counter_at_u32_max_saturates_instead_of_turning_malformed() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(3, Duration::from_secs(60));
    let t = connect(&ep, &name, "ns", p).await;
    let now = now_ms();
    let key = workflow_key("ns", "wf");
    Client::from_conf(dynamodb_config(&ep))
        .put_item()
        .table_name(&name)
        .item(PARTITION_KEY, AttributeValue::S(key.clone()))
        .item(
            CONSECUTIVE_FAILURES,
            AttributeValue::N(u32::MAX.to_string()),
        )
        .item(LAST_FAILURE_MS, AttributeValue::N(now.to_string()))
        .item(FAILURE_IDS, AttributeValue::Ss(vec!["old/0".into()]))
        .send()
        .await
        .unwrap();
    for id in ["a/0", "b/0"] {
        let c = t.record_failure("wf", id, now + 1).await.unwrap();
        assert_eq!(c.consecutive_failures, u32::MAX, "{id}");
    }
    let c = t.counter("wf", now + 2).await.unwrap().unwrap();
    assert_eq!(c.consecutive_failures, u32::MAX);
    assert!(p.is_blocked(&c, now + 2), "still blocks its workflow");
    let item = raw_item(&ep, &name, &key).await.unwrap();
    assert_eq!(num(&item, CONSECUTIVE_FAILURES), u64::from(u32::MAX) + 2);
}

/// Put a workflow item as another writer (a skewed host, a bad write) would leave it.
async fn put_counter(ep: &str, table: &str, key: &str, failures: u32, last_failure_ms: u64) {
    Client::from_conf(dynamodb_config(ep))
        .put_item()
        .table_name(table)
        .item(PARTITION_KEY, AttributeValue::S(key.to_string()))
        .item(
            CONSECUTIVE_FAILURES,
            AttributeValue::N(failures.to_string()),
        )
        .item(
            LAST_FAILURE_MS,
            AttributeValue::N(last_failure_ms.to_string()),
        )
        .item(FAILURE_IDS, AttributeValue::Ss(vec!["old/0".into()]))
        .send()
        .await
        .unwrap();
}

/// A counter dated beyond the clock-skew allowance (a day ahead) counts as absent for reads and
/// batch reads, with one warning naming the item, and the next failure restarts it at 1, dated
/// by the writer's clock; one within the allowance counts, and blocks no longer than the
/// cooldown plus the allowance.
#[tokio::test]
async fn a_counter_dated_in_the_future_never_blocks_longer_than_the_cooldown_plus_the_allowance() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("ironflow_lambda=warn")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // This (current-thread) test's own subscriber: the table is polled on this thread only.
    let _guard = tracing::subscriber::set_default(subscriber);

    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(3, Duration::from_secs(300));
    let t = connect(&ep, &name, "ns", p).await;
    let key = workflow_key("ns", "wf");
    let now = now_ms();
    put_counter(&ep, &name, &key, 3, now + 86_400_000).await;
    assert_eq!(t.counter("wf", now).await.unwrap(), None);
    // Deleted: read as absent, no success would reset it, and it would block once the
    // clocks caught up with its date.
    assert!(raw_item(&ep, &name, &key).await.is_none(), "healed");
    put_counter(&ep, &name, &key, 3, now + 86_400_000).await;
    assert!(t.counters(&["wf".into()], now).await.unwrap().is_empty());
    assert!(raw_item(&ep, &name, &key).await.is_none(), "healed");
    let warnings: Vec<String> = logs
        .text()
        .lines()
        .filter(|l| l.contains("dated in the future"))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "logged once: {warnings:?}");
    assert!(
        warnings[0].contains(&key) && warnings[0].contains(&name),
        "{warnings:?}"
    );

    let c = t.record_failure("wf", "a/0", now).await.unwrap();
    assert_eq!(
        (c.consecutive_failures, c.last_failure_ms),
        (1, now),
        "restarted"
    );
    let item = raw_item(&ep, &name, &key).await.unwrap();
    assert_eq!(item[FAILURE_IDS].as_ss().unwrap(), &vec!["a/0".to_string()]);
    let c = t.record_failure("wf", "b/0", now).await.unwrap();
    assert_eq!(c.consecutive_failures, 2, "then counts on");

    // Within the allowance: a live counter, blocking until its date + the cooldown.
    let ahead = now + CLOCK_SKEW_ALLOWANCE.as_millis() as u64;
    put_counter(&ep, &name, &key, 3, ahead).await;
    let c = t.counter("wf", now).await.unwrap().unwrap();
    assert!(p.is_blocked(&c, now));
    let end = ahead + 300_000;
    assert!(t.counter("wf", end).await.unwrap().is_none());
    let c = t.record_failure("wf", "c/0", now).await.unwrap();
    assert_eq!(c.consecutive_failures, 4, "a live streak goes on");
}

#[tokio::test]
async fn reset_on_success_deletes_the_item() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let t = connect(&ep, &name, "ns", policy(2, Duration::from_secs(60))).await;
    let now = now_ms();
    t.record_failure("wf", "a", now).await.unwrap();
    t.record_failure("wf", "b", now).await.unwrap();
    t.reset("wf").await.unwrap();
    assert_eq!(t.counter("wf", now).await.unwrap(), None);
    assert!(
        raw_item(&ep, &name, &workflow_key("ns", "wf"))
            .await
            .is_none()
    );
    let c = t.record_failure("wf", "a", now).await.unwrap();
    assert_eq!(
        c.consecutive_failures, 1,
        "counting starts afresh after a success"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_failing_concurrently_give_the_exact_total() {
    moto_endpoint();
    let moto = OwnMoto::start_serial().await;
    let ep = moto.endpoint.clone();
    let name = create_table(&ep).await;
    let p = policy(3, Duration::from_secs(60));
    // Two separate instances (two clients, two connection pools), like two Lambda environments.
    let a = Arc::new(connect(&ep, &name, "ns", p).await);
    let b = Arc::new(connect(&ep, &name, "ns", p).await);
    let per_instance = 20;
    let now = now_ms();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..per_instance {
        for (label, t) in [("a", a.clone()), ("b", b.clone())] {
            tasks.spawn(async move {
                t.record_failure("wf", &format!("{label}-{i}/0"), now)
                    .await
                    .unwrap()
                    .consecutive_failures
            });
        }
    }
    let mut returned = Vec::new();
    while let Some(r) = tasks.join_next().await {
        returned.push(r.unwrap());
    }
    returned.sort_unstable();
    let total = 2 * per_instance as u32;
    assert_eq!(
        returned,
        (1..=total).collect::<Vec<_>>(),
        "every write saw its own new count"
    );
    assert_eq!(
        a.counter("wf", now)
            .await
            .unwrap()
            .unwrap()
            .consecutive_failures,
        total
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_failures_on_an_expired_item_restart_it_once() {
    moto_endpoint();
    let moto = OwnMoto::start_serial().await;
    let ep = moto.endpoint.clone();
    let name = create_table(&ep).await;
    let p = policy(3, Duration::from_secs(60));
    let a = Arc::new(connect(&ep, &name, "ns", p).await);
    let b = Arc::new(connect(&ep, &name, "ns", p).await);
    let t0 = now_ms();
    for id in ["old-1", "old-2", "old-3", "old-4"] {
        a.record_failure("wf", id, t0).await.unwrap();
    }
    let later = t0 + 120_000;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..5 {
        for (label, t) in [("a", a.clone()), ("b", b.clone())] {
            tasks.spawn(async move {
                t.record_failure("wf", &format!("{label}-{i}/0"), later)
                    .await
                    .unwrap()
                    .consecutive_failures
            });
        }
    }
    let mut returned = Vec::new();
    while let Some(r) = tasks.join_next().await {
        returned.push(r.unwrap());
    }
    returned.sort_unstable();
    assert_eq!(
        returned,
        (1..=10).collect::<Vec<u32>>(),
        "one restart, nine increments"
    );
}

#[tokio::test]
async fn a_new_instance_sees_counters_written_by_another() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(2, Duration::from_secs(60));
    let first = connect(&ep, &name, "fn-a", p).await;
    let now = now_ms();
    first.record_failure("wf", "a", now).await.unwrap();
    first.record_failure("wf", "b", now).await.unwrap();
    drop(first);

    let cold = connect(&ep, &name, "fn-a", p).await;
    let c = cold.counter("wf", now).await.unwrap().unwrap();
    assert_eq!(c.consecutive_failures, 2);
    assert!(p.is_blocked(&c, now));
    // Another function (namespace) sharing the table does not see them.
    let other = connect(&ep, &name, "fn-b", p).await;
    assert_eq!(other.counter("wf", now).await.unwrap(), None);
}

#[tokio::test]
async fn lease_recoveries_are_observed_once_per_increase_across_instances() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let p = policy(2, Duration::from_secs(60));
    let a = connect(&ep, &name, "ns", p).await;
    let b = connect(&ep, &name, "ns", p).await;
    let run = Uuid::new_v4();
    let now = now_ms();
    assert!(a.observe_lease_recoveries(run, 1, now).await.unwrap());
    assert!(!b.observe_lease_recoveries(run, 1, now).await.unwrap());
    assert!(!a.observe_lease_recoveries(run, 1, now).await.unwrap());
    assert!(b.observe_lease_recoveries(run, 2, now).await.unwrap());
    assert!(!a.observe_lease_recoveries(run, 1, now).await.unwrap());
    let item = raw_item(&ep, &name, &run_key("ns", run)).await.unwrap();
    assert_eq!(num(&item, LEASE_RECOVERIES_SEEN), 2);
    let ttl = num(&item, TTL_ATTRIBUTE);
    assert!(
        ttl > now / 1000 + 6 * 24 * 3600,
        "run items expire after days: {ttl}"
    );
}

#[tokio::test]
async fn a_missing_table_or_a_wrong_schema_is_a_clear_startup_error() {
    let ep = moto_endpoint();
    let missing = unique_table();
    let err = DynamoPoisonTable::connect_with(
        dynamodb_config(&ep),
        &missing,
        "ns",
        policy(3, Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, DynamoSetupError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&missing), "{err}");

    let wrong = unique_table();
    create_table_keyed(&ep, &wrong, "id").await;
    let err = DynamoPoisonTable::connect_with(
        dynamodb_config(&ep),
        &wrong,
        "ns",
        policy(3, Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, DynamoSetupError::WrongSchema { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&wrong) && err.to_string().contains("id HASH S"),
        "{err}"
    );
}

/// The cold start of the deployable function: settings from the environment, then
/// `connect_poison_table`. A plain test (no runtime yet) so that the environment is set
/// before any other thread exists.
#[test]
fn cold_start_from_the_environment_connects_the_table_or_names_the_missing_one() {
    let ep = moto_endpoint();
    // SAFETY: no other thread exists yet in this test process (nextest runs one test per
    // process), so nothing reads the environment concurrently.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL_DYNAMODB", &ep);
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let existing = create_table(&ep).await;
        let missing = unique_table();
        let vars = |table: &str| {
            let table = table.to_string();
            move |name: &str| match name {
                "IRONFLOW_API_URL" => Some("http://127.0.0.1:1".to_string()),
                "IRONFLOW_WORKER_TOKEN" => Some("t".to_string()),
                "IRONFLOW_POISON_TABLE" => Some(table.clone()),
                "AWS_LAMBDA_FUNCTION_NAME" => Some("my-function".to_string()),
                _ => None,
            }
        };
        let err =
            LambdaWorkerBuilder::from_settings(Settings::from_lookup(vars(&missing)).unwrap())
                .provider(Arc::new(ClaudeCodeProvider::new()))
                .connect_poison_table()
                .await
                .err()
                .unwrap();
        assert!(matches!(
            err,
            BuildError::PoisonTable(DynamoSetupError::NotFound { .. })
        ));
        assert!(err.to_string().contains(&missing), "{err}");

        let settings = Settings::from_lookup(vars(&existing)).unwrap();
        assert_eq!(settings.poison_namespace, "my-function");
        let worker = LambdaWorkerBuilder::from_settings(settings)
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .register(samples::QuickShell)
            .connect_poison_table()
            .await
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(worker.poison_mode(), PoisonMode::Fail);
    });
}

/// The deployed cold start loads the AWS configuration once (`from_env_and_secrets`) and
/// connects the table with it. Here that configuration points at moto and the environment does
/// not, so a missing table is moto's answer (not found), not an unreachable AWS endpoint.
#[tokio::test]
async fn the_table_is_connected_with_the_configuration_the_cold_start_loaded() {
    let ep = moto_endpoint();
    let existing = create_table(&ep).await;
    let missing = unique_table();
    let aws = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(&ep)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .load()
        .await;
    let vars = |table: &str| {
        let table = table.to_string();
        move |name: &str| match name {
            "IRONFLOW_API_URL" => Some("http://127.0.0.1:1".to_string()),
            "IRONFLOW_WORKER_TOKEN" => Some("t".to_string()),
            "IRONFLOW_POISON_TABLE" => Some(table.clone()),
            _ => None,
        }
    };
    let err = LambdaWorkerBuilder::from_lookup_and_secrets(vars(&missing), &aws)
        .await
        .unwrap()
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .connect_poison_table()
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            BuildError::PoisonTable(DynamoSetupError::NotFound { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&missing), "{err}");

    let worker = LambdaWorkerBuilder::from_lookup_and_secrets(vars(&existing), &aws)
        .await
        .unwrap()
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .connect_poison_table()
        .await
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(worker.poison_mode(), PoisonMode::Fail);
}

/// A stand-in for DynamoDB that answers every request with `status` and the error `code` in
/// DynamoDB's JSON error shape (fault injection: the real SDK client talks to it), counting the
/// requests. Returns its endpoint and the count.
async fn failing_dynamodb(status: u16, code: &'static str) -> (String, Arc<Mutex<usize>>) {
    let seen = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move || {
        let counted = Arc::clone(&counted);
        async move {
            *counted.lock().unwrap() += 1;
            (
                axum::http::StatusCode::from_u16(status).unwrap(),
                [("content-type", "application/x-amz-json-1.0")],
                format!(
                    r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"injected"}}"#
                ),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, seen)
}

/// A stand-in for DynamoDB that answers every request late (fault injection: the real SDK
/// client talks to it): after `delay` with an empty JSON object, as DynamoDB answers a
/// `GetItem` that found nothing, or never (`None`: it accepts the request and hangs). Returns
/// its endpoint and the requests it received.
async fn slow_dynamodb(delay: Option<Duration>) -> (String, Arc<Mutex<usize>>) {
    let seen = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move || {
        let counted = Arc::clone(&counted);
        async move {
            *counted.lock().unwrap() += 1;
            match delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
            (
                axum::http::StatusCode::OK,
                [("content-type", "application/x-amz-json-1.0")],
                "{}",
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, seen)
}

/// The hostile review h4's D6: a DynamoDB that hangs cost each gate call the SDK's 5 s
/// operation timeout, three calls per invocation (15 s); one that answers in 1.9 s (under the
/// SDK's 2 s attempt timeout) was never cut, 1.9 s per call. Now the first call waits
/// `CALL_BUDGET` (1 s) at most and opens the gate's breaker: one request per invocation,
/// every run executes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_or_slow_table_costs_an_invocation_one_call_budget() {
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(3, Duration::from_secs(300));
    for (n, delay) in [(1, None), (2, Some(Duration::from_millis(1900)))] {
        let (endpoint, seen) = slow_dynamodb(delay).await;
        let t = Arc::new(DynamoPoisonTable::new(
            dynamodb_config(&endpoint),
            "poison",
            "fn",
            p,
        ));
        let w = worker(&api, t, p, PoisonMode::Fail);
        create_runs(&api, "quick-shell", 3, 0).await;
        create_runs(&api, "always-fails", 1, 0).await;
        let start = std::time::Instant::now();
        let s = invoke(&w, n).await;
        let took = start.elapsed();
        println!("{delay:?}: the invocation took {took:?}");
        assert_eq!(
            outcomes_of(&s, "quick-shell"),
            vec![Outcome::Completed; 3],
            "{delay:?}: {s:?}"
        );
        assert_eq!(outcomes_of(&s, "always-fails"), vec![Outcome::Failed]);
        assert_eq!(
            *seen.lock().unwrap(),
            1,
            "{delay:?}: one request, then none"
        );
        assert_eq!(s.poison_table_errors, 1, "{delay:?}");
        assert!(took < Duration::from_secs(5), "{delay:?}: {took:?}");
    }
}

/// The cold start's `connect_poison_table` against a DynamoDB at `endpoint` (a stand-in).
async fn cold_start_through(endpoint: &str) -> Result<LambdaWorkerBuilder, BuildError> {
    let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .load()
        .await;
    let vars = |name: &str| match name {
        "IRONFLOW_API_URL" => Some("http://127.0.0.1:1".to_string()),
        "IRONFLOW_WORKER_TOKEN" => Some("t".to_string()),
        "IRONFLOW_POISON_TABLE" => Some("poison".to_string()),
        _ => None,
    };
    LambdaWorkerBuilder::from_lookup_and_secrets(vars, &aws)
        .await
        .unwrap()
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .connect_poison_table()
        .await
}

/// A passing fault at cold start (throttled, a 5xx, no answer) does not stop the worker: it
/// starts with the table unchecked, each call failing open while the fault lasts, and a table
/// that does not answer holds the cold start about 2 s, not the SDK's 5 s. A refusal (access
/// denied) still fails the cold start, naming the table.
#[tokio::test]
async fn a_passing_fault_of_describe_table_starts_the_worker_unchecked_and_a_refusal_does_not() {
    for (status, code, starts) in [
        (500, "InternalServerError", true),
        (400, "ThrottlingException", true),
        (503, "ServiceUnavailable", true),
        (400, "AccessDeniedException", false),
    ] {
        let (endpoint, seen) = failing_dynamodb(status, code).await;
        let connected = cold_start_through(&endpoint).await;
        assert!(*seen.lock().unwrap() >= 1, "{code}: DescribeTable was sent");
        match connected {
            Ok(builder) => {
                assert!(starts, "{code}: a refusal must fail the cold start");
                assert_eq!(builder.build().unwrap().poison_mode(), PoisonMode::Fail);
            }
            Err(err) => {
                assert!(
                    !starts,
                    "{code}: a passing fault stopped the cold start: {err}"
                );
                assert!(
                    matches!(
                        err,
                        BuildError::PoisonTable(DynamoSetupError::Describe { .. })
                    ),
                    "{err}"
                );
                assert!(err.to_string().contains("poison"), "{err}");
                assert!(err.to_string().contains(code), "{err}");
            }
        }
    }
    let (hanging, seen) = slow_dynamodb(None).await;
    let start = std::time::Instant::now();
    let builder = cold_start_through(&hanging).await.unwrap();
    let waited = start.elapsed();
    assert!(*seen.lock().unwrap() >= 1, "DescribeTable was sent");
    // The check's own bound is 2 s; the SDK's operation timeout (5 s) no longer applies.
    assert!(waited < Duration::from_millis(4500), "{waited:?}");
    assert_eq!(builder.build().unwrap().poison_mode(), PoisonMode::Fail);
}

#[tokio::test]
async fn the_local_table_script_creates_the_schema_the_code_expects() {
    let ep = moto_endpoint();
    let name = unique_table();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("infra/create-local-table.sh");
    let out = Command::new(&script).arg(&ep).arg(&name).output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // DescribeTable's key-schema check passes...
    let t = connect(&ep, &name, "ns", policy(3, Duration::from_secs(60))).await;
    let c = t.record_failure("wf", "a", now_ms()).await.unwrap();
    assert_eq!(c.consecutive_failures, 1);
    // ...and the TTL is on the attribute the code writes.
    let ttl = t
        .client()
        .describe_time_to_live()
        .table_name(&name)
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.attribute_name(), Some(TTL_ATTRIBUTE));
    let desc = t
        .client()
        .describe_table()
        .table_name(&name)
        .send()
        .await
        .unwrap();
    let billing = desc
        .table()
        .unwrap()
        .billing_mode_summary()
        .unwrap()
        .billing_mode();
    assert_eq!(billing, Some(&BillingMode::PayPerRequest));
    // Running it again keeps the table.
    let again = Command::new(&script).arg(&ep).arg(&name).output().unwrap();
    assert!(again.status.success());
}

// --- end to end: real runs on the real ironflow API ---------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_mode_blocks_across_cold_starts_and_counts_calls() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(2, Duration::from_secs(300));

    // Instance 1: two failures of always-fails, three successes of quick-shell.
    let t1 = Arc::new(connect(&ep, &name, "fn", p).await);
    let w1 = worker(&api, t1.clone(), p, PoisonMode::Fail);
    create_runs(&api, "always-fails", 2, 0).await;
    create_runs(&api, "quick-shell", 3, 0).await;
    let before = t1.calls().snapshot();
    let s = invoke(&w1, 1).await;
    assert_eq!(s.count(Outcome::Failed), 2, "{s:?}");
    assert_eq!(s.count(Outcome::Completed), 3, "{s:?}");
    assert_eq!(s.poison_table_errors, 0);
    let after = t1.calls().snapshot();
    let delta = |op: &str| after.get(op).unwrap_or(&0) - before.get(op).unwrap_or(&0);
    // At most one read per distinct workflow; one write per failure; no write on a success
    // of a workflow without a counter.
    assert!(delta("GetItem") <= 2, "{after:?}");
    assert_eq!(delta("UpdateItem"), 2, "{after:?}");
    assert_eq!(delta("DeleteItem"), 0, "{after:?}");

    // Instance 2, a cold start: sees the counter and fails the runs without executing them.
    let t2 = Arc::new(connect(&ep, &name, "fn", p).await);
    let w2 = worker(&api, t2.clone(), p, PoisonMode::Fail);
    let blocked = create_runs(&api, "always-fails", 2, 0).await;
    let ok = create_runs(&api, "quick-shell", 1, 0).await;
    let s = invoke(&w2, 2).await;
    assert_eq!(
        outcomes_of(&s, "always-fails"),
        vec![Outcome::PoisonBlocked; 2],
        "{s:?}"
    );
    assert_eq!(outcomes_of(&s, "quick-shell"), vec![Outcome::Completed]);
    for id in &blocked {
        let run = api.store().get_run(*id).await.unwrap().unwrap();
        assert_eq!(run.status.state, RunStatus::Failed);
        assert!(run.error.unwrap().contains("poison pill"));
    }
    assert_eq!(state(&api, ok[0]).await, RunStatus::Completed);
    let calls = t2.calls().snapshot();
    assert_eq!(
        calls.get("GetItem"),
        Some(&2),
        "one read per workflow: {calls:?}"
    );
    assert_eq!(
        calls.get("UpdateItem"),
        None,
        "blocked runs are not counted: {calls:?}"
    );
}

/// The hostile review h4's D3: a healthy workflow's counter dated a day ahead, at the
/// threshold, with a 300 s cooldown blocked it for a day (fail mode failed its run). Now its
/// runs execute in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_workflow_s_counter_dated_a_day_ahead_blocks_none_of_its_runs() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(3, Duration::from_secs(300));
    let t = Arc::new(connect(&ep, &name, "fn", p).await);
    for (n, mode) in [(1, PoisonMode::Fail), (2, PoisonMode::Defer)] {
        let key = workflow_key("fn", "quick-shell");
        put_counter(&ep, &name, &key, 3, now_ms() + 86_400_000).await;
        let w = worker(&api, t.clone(), p, mode);
        let ids = create_runs(&api, "quick-shell", 1, 0).await;
        let s = invoke(&w, n).await;
        assert_eq!(
            outcomes_of(&s, "quick-shell"),
            vec![Outcome::Completed],
            "{mode:?}: {s:?}"
        );
        assert_eq!(state(&api, ids[0]).await, RunStatus::Completed, "{mode:?}");
        assert_eq!(s.poison_table_errors, 0, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defer_mode_leaves_runs_pending_until_the_cooldown_ends() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    // Phase 1 and 2: a cooldown far longer than the test, so "still blocked" does not depend
    // on how fast this machine is.
    let long = policy(2, Duration::from_secs(3600));
    let t = Arc::new(connect(&ep, &name, "fn", long).await);
    let w = worker(&api, t.clone(), long, PoisonMode::Defer);
    assert_eq!(w.poison_mode(), PoisonMode::Defer);

    create_runs(&api, "always-fails", 2, 0).await;
    let s = invoke(&w, 1).await;
    assert_eq!(outcomes_of(&s, "always-fails"), vec![Outcome::Failed; 2]);
    let calls = t.calls().snapshot();
    assert_eq!(
        calls.get("BatchGetItem"),
        Some(&1),
        "one batch read: {calls:?}"
    );
    assert_eq!(calls.get("GetItem"), None, "{calls:?}");

    // Blocked now: its runs stay Pending (never claimed), the others run.
    let deferred = create_runs(&api, "always-fails", 2, 0).await;
    let ok = create_runs(&api, "quick-shell", 2, 0).await;
    for n in 2..4 {
        let s = invoke(&w, n).await;
        assert!(outcomes_of(&s, "always-fails").is_empty(), "{s:?}");
        assert_eq!(s.stop_reason, StopReason::NoPendingRun, "{s:?}");
        for id in &deferred {
            let run = api.store().get_run(*id).await.unwrap().unwrap();
            assert_eq!(run.status.state, RunStatus::Pending);
            assert_eq!(run.worker_id, None, "never claimed");
        }
    }
    for id in &ok {
        assert_eq!(state(&api, *id).await, RunStatus::Completed);
    }

    // Fail mode, for contrast, on the same counter: the runs are claimed and failed.
    let wf = worker(&api, t.clone(), long, PoisonMode::Fail);
    let failed = create_runs(&api, "always-fails", 1, 0).await;
    let s = invoke(&wf, 4).await;
    let outcomes = outcomes_of(&s, "always-fails");
    assert!(
        !outcomes.is_empty() && outcomes.iter().all(|o| *o == Outcome::PoisonBlocked),
        "{s:?}"
    );
    assert_eq!(state(&api, failed[0]).await, RunStatus::Failed);
    // (fail mode also failed the deferred ones it claimed; make fresh ones for phase 3)
    let deferred = create_runs(&api, "always-fails", 2, 0).await;

    // Phase 3: a function with a 3 s cooldown reading the same counter claims the runs once
    // the cooldown has passed since the last failure, and not before.
    let short = policy(2, Duration::from_secs(3));
    let ts = Arc::new(connect(&ep, &name, "fn", short).await);
    let last_failure = t
        .counter("always-fails", now_ms())
        .await
        .unwrap()
        .unwrap()
        .last_failure_ms;
    let blocked_until = last_failure + 3_000;
    let w = worker(&api, ts, short, PoisonMode::Defer);
    let mut n = 10;
    let (w, api, deferred) = (&w, &api, &deferred);
    wait_for(
        Duration::from_secs(60),
        "the deferred runs to be claimed after the cooldown",
        move || {
            n += 1;
            async move {
                let s = invoke(w, n).await;
                if !outcomes_of(&s, "always-fails").is_empty() {
                    // The counter was read (and found expired) before this point.
                    assert!(
                        now_ms() >= blocked_until,
                        "claimed before the cooldown ended: {s:?}"
                    );
                }
                let mut all_done = true;
                for id in deferred {
                    all_done &= state(api, *id).await == RunStatus::Failed;
                }
                all_done
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_recovered_from_a_dead_invocation_counts_as_a_failure() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(1, Duration::from_secs(300));
    let t = Arc::new(connect(&ep, &name, "fn", p).await);
    let w = worker(&api, t.clone(), p, PoisonMode::Fail);

    // A healthy run with lease_recoveries == 0 costs no lease-recovery call.
    create_runs(&api, "quick-shell", 1, 0).await;
    let s = invoke(&w, 1).await;
    assert_eq!(s.count(Outcome::Completed), 1);
    assert_eq!(t.calls().get("UpdateItem"), 0);

    // An invocation claims a run and dies: nobody refreshes or hands back its 1 s lease.
    let victim = create_runs(&api, "quick-shell", 1, 3).await[0];
    kill_holding_invocation(&api, victim).await;

    // The next invocation counts the death as a failure: with threshold 1 the workflow is
    // blocked and the run is failed instead of executed.
    let s = invoke(&w, 2).await;
    assert_eq!(
        outcomes_of(&s, "quick-shell"),
        vec![Outcome::PoisonBlocked],
        "{s:?}"
    );
    let item = raw_item(&ep, &name, &workflow_key("fn", "quick-shell"))
        .await
        .unwrap();
    assert_eq!(num(&item, CONSECUTIVE_FAILURES), 1);
    assert_eq!(
        item[LAST_FAILURE_ID].as_s().unwrap(),
        &format!("lease-recovery/{}", s.worker_id),
        "a step that names no holder: one failure per claiming invocation"
    );
    let seen = raw_item(&ep, &name, &run_key("fn", victim)).await.unwrap();
    assert_eq!(num(&seen, LEASE_RECOVERIES_SEEN), 1);

    // Another instance claiming the same run with the same lease_recoveries does not count
    // it again.
    let other = connect(&ep, &name, "fn", p).await;
    assert!(
        !other
            .observe_lease_recoveries(victim, 1, now_ms())
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_of_one_dead_invocation_count_once_whoever_recovers_them() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(1, Duration::from_secs(300));
    let t = Arc::new(connect(&ep, &name, "fn", p).await);

    // A real invocation holds two runs, each in a 60 s step, under a 2 s lease, and dies
    // (lambda_runtime drops the handler's future; a timeout or out-of-memory kill leaves the
    // same: no refresh, no handback).
    let victims = create_runs(&api, "multi-step", 2, 3).await;
    let dying = LambdaWorkerBuilder::new(&api.url(), api.token())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::MultiStep { step_secs: 60.0 })
        .max_runs_per_invocation(2)
        .concurrency(2)
        .function_timeout(Duration::from_secs(120))
        .deadline_margin(Duration::from_secs(5))
        .lease_ttl(Duration::from_secs(2))
        .lease_refresh_interval(Duration::from_millis(500))
        .poison_threshold(p.threshold)
        .poison_cooldown(p.cooldown)
        .poison_table(t.clone())
        .build()
        .unwrap();
    let dying = Arc::new(dying);
    let held = tokio::spawn({
        let dying = dying.clone();
        async move { invoke(&dying, 1).await }
    });
    let store = api.store().clone();
    common::wait_until("both runs to start a step", Duration::from_secs(60), || {
        let (store, victims) = (store.clone(), victims.clone());
        async move {
            let mut started = 0;
            for id in victims {
                let steps = store.list_steps(id).await.unwrap();
                started += usize::from(steps.iter().any(|s| s.status.state == StepStatus::Running));
            }
            started == 2
        }
    })
    .await;
    held.abort();
    assert!(held.await.unwrap_err().is_cancelled());
    common::wait_until(
        "the reaper to requeue both runs",
        Duration::from_secs(30),
        || {
            let (store, victims) = (store.clone(), victims.clone());
            async move {
                store.reap_expired_leases(10).await.unwrap();
                let mut requeued = true;
                for id in victims {
                    let run = store.get_run(id).await.unwrap().unwrap();
                    requeued &= run.status.state == RunStatus::Pending && run.lease_recoveries == 1;
                }
                requeued
            }
        },
    )
    .await;

    // Two invocations recover one run each: one death, counted once (threshold 1: both runs
    // are failed as poison-blocked, and the counter stays at 1).
    let recovering = LambdaWorkerBuilder::new(&api.url(), api.token())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::MultiStep { step_secs: 0.0 })
        .max_runs_per_invocation(1)
        .function_timeout(Duration::from_secs(120))
        .deadline_margin(Duration::from_secs(5))
        .poison_threshold(p.threshold)
        .poison_cooldown(p.cooldown)
        .poison_table(t.clone())
        .build()
        .unwrap();
    for n in [2, 3] {
        let s = invoke(&recovering, n).await;
        assert_eq!(
            outcomes_of(&s, "multi-step"),
            vec![Outcome::PoisonBlocked],
            "{s:?}"
        );
    }
    let item = raw_item(&ep, &name, &workflow_key("fn", "multi-step"))
        .await
        .unwrap();
    assert_eq!(num(&item, CONSECUTIVE_FAILURES), 1, "one death: {item:?}");
    let id = item[LAST_FAILURE_ID].as_s().unwrap();
    assert!(
        id.starts_with("lease-recovery/lambda-test-1-"),
        "counted under the dead invocation's worker id, which its steps name: {id}"
    );
}

/// Make `victim` look like the run of an invocation that died executing it: claim it under a
/// 1 s lease that nobody refreshes, start a step, then let the API's reaper (its tick, called
/// directly) requeue it. (A holder that started no step, a lost claim, is no death.)
async fn kill_holding_invocation(api: &LocalApi, victim: Uuid) {
    let dead = ApiRunStore::new(&api.url(), api.token());
    let claimed = dead
        .pick_next_pending_for(
            Some(LeaseRequest {
                worker_id: "lambda-dead-invocation".into(),
                ttl: Duration::from_secs(1),
            }),
            None,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, victim);
    start_step(&dead, victim).await;
    let store = api.store().clone();
    wait_for(
        Duration::from_secs(30),
        "the reaper to requeue the run",
        || {
            let store = store.clone();
            async move {
                store.reap_expired_leases(10).await.unwrap();
                let run = store.get_run(victim).await.unwrap().unwrap();
                run.status.state == RunStatus::Pending && run.lease_recoveries == 1
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_defer_mode_a_run_whose_recovery_blocks_its_workflow_goes_back_to_pending() {
    let ep = moto_endpoint();
    let name = create_table(&ep).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(1, Duration::from_secs(3600));
    let t = Arc::new(connect(&ep, &name, "fn", p).await);
    let w = worker(&api, t.clone(), p, PoisonMode::Defer);

    let victim = create_runs(&api, "always-fails", 1, 3).await[0];
    kill_holding_invocation(&api, victim).await;

    // Not blocked when the invocation reads the counters, so the run is claimed; its lease
    // recovery then blocks the workflow (threshold 1): defer mode writes it back to Pending.
    let s = invoke(&w, 1).await;
    assert_eq!(
        outcomes_of(&s, "always-fails"),
        vec![Outcome::PoisonBlocked],
        "{s:?}"
    );
    let error = s.runs[0].error.as_deref().unwrap();
    assert!(error.contains("written back to Pending"), "{error}");
    let run = api.store().get_run(victim).await.unwrap().unwrap();
    assert_eq!(run.status.state, RunStatus::Pending);
    assert_eq!(run.retry_count, 0, "not failed, not retried");

    // The next invocations leave it alone until the cooldown ends.
    let s = invoke(&w, 2).await;
    assert!(s.runs.is_empty(), "{s:?}");
    assert_eq!(s.stop_reason, StopReason::NoPendingRun);
    assert_eq!(state(&api, victim).await, RunStatus::Pending);
}

// --- fail open ----------------------------------------------------------------------------

/// A moto server of this test's own, detached from the test process (so that the invocation's
/// orphan sweep does not kill it), killed by pid when dropped.
struct OwnMoto {
    pid: i32,
    endpoint: String,
    script: Option<PathBuf>,
    /// The server's output, kept only if the test fails.
    log: PathBuf,
}

/// moto's own server application (what `moto_server` runs), served one request at a time.
const SERIAL_MOTO: &str = "import sys\n\
from werkzeug.serving import run_simple\n\
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app\n\
run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False, request_handler=MotoRequestHandler)\n";

impl OwnMoto {
    /// `.venv/bin/moto_server -H 127.0.0.1 -p <free port>`, as `./scripts/test` starts it.
    async fn start() -> Self {
        Self::spawn(|venv, port| format!("'{venv}/bin/moto_server' -H 127.0.0.1 -p {port}")).await
    }

    /// The same server application, but handling one request at a time.
    ///
    /// DynamoDB applies the writes to one item one after another, so a conditional
    /// `UpdateItem` is atomic. moto's threaded server does not lock its tables: two concurrent
    /// `UpdateItem`s on one item can both pass their condition and lose an increment
    /// (observed: 36 instead of 40 with 40 concurrent failures). The concurrency tests run
    /// against this serial server, which gives DynamoDB's per-request atomicity while the
    /// clients still race (every interleaving of requests remains possible).
    async fn start_serial() -> Self {
        let script =
            std::env::temp_dir().join(format!("ironflow-serial-moto-{}.py", Uuid::new_v4()));
        std::fs::write(&script, SERIAL_MOTO).unwrap();
        let path = script.clone();
        let mut me = Self::spawn(move |venv, port| {
            format!("'{venv}/bin/python' '{}' {port}", path.display())
        })
        .await;
        me.script = Some(script);
        me
    }

    async fn spawn(command: impl FnOnce(&str, u16) -> String) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv");
        assert!(
            venv.join("bin/moto_server").exists(),
            "{}/bin/moto_server is missing: run ./scripts/test, which installs it",
            venv.display()
        );
        let log = std::env::temp_dir().join(format!("ironflow-moto-{port}.log"));
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid {} >'{}' 2>&1 </dev/null & echo $!",
                command(&venv.display().to_string(), port),
                log.display()
            ))
            .output()
            .unwrap();
        let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let me = Self {
            pid,
            endpoint: format!("http://127.0.0.1:{port}"),
            script: None,
            log,
        };
        let url = format!("{}/moto-api/data.json", me.endpoint);
        wait_for(
            Duration::from_secs(60),
            "the test's own moto server",
            || {
                let url = url.clone();
                async move { http_get_ok(&url).await }
            },
        )
        .await;
        me
    }

    fn kill(&self) {
        // The server this test started.
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for OwnMoto {
    fn drop(&mut self) {
        self.kill();
        if let Some(script) = &self.script {
            let _ = std::fs::remove_file(script);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// A plain HTTP GET over a TCP socket: whether the server answers 200.
async fn http_get_ok(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut s) = tokio::net::TcpStream::connect(host).await else {
        return false;
    };
    let req = format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf).await, Ok(n) if n >= 12 && buf[..n].starts_with(b"HTTP/1.") && &buf[9..12] == b"200")
}

/// Log lines, captured for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_fails_open_when_the_server_stops_mid_test() {
    let logs = Captured::default();
    let writer = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("ironflow_lambda=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init();

    moto_endpoint();
    let moto = OwnMoto::start().await;
    let name = create_table(&moto.endpoint).await;
    let api = LocalApi::start(&Uuid::new_v4().to_string()).await.unwrap();
    let p = policy(1, Duration::from_secs(300));
    let t = Arc::new(connect(&moto.endpoint, &name, "fn", p).await);
    // always-fails is blocked in the table (threshold 1)...
    t.record_failure("always-fails", "earlier/0", now_ms())
        .await
        .unwrap();
    let w = worker(&api, t.clone(), p, PoisonMode::Fail);

    // ...then the table goes away.
    moto.kill();
    wait_for(Duration::from_secs(30), "the server to stop", || {
        let url = format!("{}/moto-api/data.json", moto.endpoint);
        async move { !http_get_ok(&url).await }
    })
    .await;

    let err = t.counter("always-fails", now_ms()).await.unwrap_err();
    assert!(err.to_string().contains(&name), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("connect"),
        "the AWS error and its source chain: {err}"
    );

    create_runs(&api, "always-fails", 1, 0).await;
    create_runs(&api, "quick-shell", 2, 0).await;
    let s = invoke(&w, 1).await;
    // Every run executed: the blocked workflow too, since the check failed open.
    assert_eq!(
        outcomes_of(&s, "always-fails"),
        vec![Outcome::Failed],
        "{s:?}"
    );
    assert_eq!(
        outcomes_of(&s, "quick-shell"),
        vec![Outcome::Completed; 2],
        "{s:?}"
    );
    assert!(s.poison_table_errors >= 1, "{s:?}");
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("poison-pill table call failed"))
        .unwrap_or_else(|| panic!("no error log:\n{text}"));
    assert!(line.contains(&name), "the log names the table: {line}");
    assert!(line.contains("ERROR"), "{line}");

    // Defer mode fails open too: the batch read fails, every registered workflow is claimed.
    let w = worker(&api, t.clone(), p, PoisonMode::Defer);
    create_runs(&api, "always-fails", 1, 0).await;
    let s = invoke(&w, 2).await;
    assert_eq!(
        outcomes_of(&s, "always-fails"),
        vec![Outcome::Failed],
        "{s:?}"
    );
    assert!(s.poison_table_errors >= 1);
    let seen: HashSet<&str> = s.runs.iter().map(|r| r.workflow.as_str()).collect();
    assert!(seen.contains("always-fails"));
}
