//! DynamoDB calls of the poison-pill table (`src/poison/dynamodb/`) against moto's server.
//!
//! moto: `IRONFLOW_TEST_MOTO_ENDPOINT` if set, else `.venv/bin/moto_server` (installed by
//! `./scripts/test`) started by [`Moto::find_or_start`] before the bench makes itself a child
//! subreaper, so that our invocations' orphan sweep cannot kill it. Without either, the report
//! says so instead of a number.
//!
//! Two drains by our invocations with the table in use (fail mode, the default), counted with
//! the table's own per-operation counter (`DynamoPoisonTable::calls`, retries included):
//! the success path (runs of two samples, all completing), and the failure path (runs of a
//! workflow whose step exits 1, under a threshold high enough that none is blocked).
//! Targets (issue 7): at most 1 read per distinct workflow per invocation, 0 writes on the
//! success path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_lambda::poison::PoisonPolicy;
use ironflow_lambda::poison::dynamodb::{DynamoPoisonTable, PARTITION_KEY};
use ironflow_local_api::{LocalApi, new_run};
use uuid::Uuid;

use crate::BenchError;
use crate::drain::{DrainSettings, invoke};
use crate::workload::{NoOp, ThreeStepShell, Workload};

/// moto's server for the measurement: found in the environment, or started (and killed on drop).
pub struct Moto {
    pub endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        kill_started_server();
    }
}

/// The pid of the moto server this bench started (0: none), for [`kill_started_server`].
static STARTED: AtomicI32 = AtomicI32::new(0);

/// Kill the moto server this bench started, if any: on drop, and from the signal handler that
/// stops the bench (`std::process::exit` runs no destructor).
pub fn kill_started_server() {
    let pid = STARTED.swap(0, Ordering::SeqCst);
    if pid > 0
        && let Some(pid) = rustix::process::Pid::from_raw(pid)
    {
        // Gone already: nothing to stop.
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

impl Moto {
    /// `IRONFLOW_TEST_MOTO_ENDPOINT`, or `.venv/bin/moto_server` on a free loopback port,
    /// detached (`setsid` in a shell that exits: the server is re-parented away from the bench).
    /// Call before [`ironflow_lambda::orphans::become_subreaper`]. `Err` says why there is none.
    pub async fn find_or_start() -> Result<Self, String> {
        if let Ok(endpoint) = std::env::var("IRONFLOW_TEST_MOTO_ENDPOINT") {
            return Ok(Self { endpoint });
        }
        let server = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server");
        if !server.exists() {
            return Err(format!(
                "not measured: no moto server ({} is missing: run ./scripts/test once, which \
                 installs it, or set IRONFLOW_TEST_MOTO_ENDPOINT)",
                server.display()
            ));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("not measured: no free port for moto: {e}"))?
            .port();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid '{}' -H 127.0.0.1 -p {port} >/dev/null 2>&1 </dev/null & echo $!",
                server.display()
            ))
            .output()
            .map_err(|e| format!("not measured: could not start moto: {e}"))?;
        if let Ok(pid) = String::from_utf8_lossy(&out.stdout).trim().parse::<i32>() {
            STARTED.store(pid, Ordering::SeqCst);
        }
        let moto = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let probe = format!("{}/moto-api/data.json", moto.endpoint);
        for _ in 0..300 {
            if let Ok(r) = reqwest::get(&probe).await
                && r.status().is_success()
            {
                return Ok(moto);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("not measured: moto's server did not start within 30 s".into())
    }
}

/// One phase's counts.
#[derive(Debug, Clone)]
pub struct Phase {
    pub what: String,
    pub runs: usize,
    pub invocations: usize,
    /// Distinct workflows claimed per invocation, on average.
    pub workflows_per_invocation: f64,
    /// DynamoDB requests per operation, over the phase.
    pub calls: BTreeMap<String, u64>,
}

impl Phase {
    /// GetItem, BatchGetItem, Query, Scan.
    pub fn reads(&self) -> u64 {
        self.sum(&["GetItem", "BatchGetItem", "Query", "Scan"])
    }

    /// PutItem, UpdateItem, DeleteItem, BatchWriteItem.
    pub fn writes(&self) -> u64 {
        self.sum(&["PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"])
    }

    fn sum(&self, ops: &[&str]) -> u64 {
        ops.iter().filter_map(|op| self.calls.get(*op)).sum()
    }
}

/// DynamoDB calls of the poison-pill table.
#[derive(Debug, Clone)]
pub enum DynamoDb {
    /// Not measured, and why.
    NotMeasured(String),
    /// Measured against moto's server: the success path, then the failure path.
    Measured(Vec<Phase>),
}

/// A workflow whose one step exits 1.
struct Fails;

const FAILS: &str = "bench-fails";

impl WorkflowHandler for Fails {
    fn name(&self) -> &str {
        FAILS
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("fail", ShellConfig::new("exit 1")).await?;
            Ok(())
        })
    }
}

/// Measure the table's calls (see the module docs): `runs` successful runs (half no-op, half
/// three-step shell, interleaved) and `runs / 4` failing runs, at the drain's N and C.
pub async fn measure(
    moto: &Result<Moto, String>,
    s: &DrainSettings,
    runs: usize,
) -> Result<DynamoDb, BenchError> {
    let moto = match moto {
        Ok(moto) => moto,
        Err(why) => return Ok(DynamoDb::NotMeasured(why.clone())),
    };
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(&moto.endpoint)
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .build();
    let table = create_table(&config).await?;
    let token = Uuid::new_v4().to_string();
    let api = LocalApi::start(&token).await?;
    // High enough that no failure blocks the workflow: the failure path is each failure's cost.
    let policy = PoisonPolicy {
        threshold: 1000,
        cooldown: Duration::from_secs(300),
    };
    let dynamo = DynamoPoisonTable::connect_with(config, &table, "bench", policy)
        .await
        .map_err(|e| BenchError::msg(format!("DynamoDB table on moto: {e}")))?;
    let worker = Arc::new(
        LambdaWorkerBuilder::new(&api.url(), &token)
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .register(NoOp)
            .register(ThreeStepShell)
            .register(Fails)
            .concurrency(s.concurrency)
            .max_runs_per_invocation(s.max_runs)
            .function_timeout(s.invocation)
            .poison_threshold(policy.threshold)
            .poison_cooldown(policy.cooldown)
            .poison_table(Arc::new(dynamo.clone()))
            .build()?,
    );

    let mut phases = Vec::new();
    let success: Vec<&str> = (0..runs).map(|i| Workload::ALL[i % 2].name()).collect();
    let failure = vec![FAILS; (runs / 4).max(1)];
    for (what, workflows) in [
        (
            "success path: no-op and three-step shell runs, interleaved",
            success,
        ),
        ("failure path: runs whose step exits 1", failure),
    ] {
        for w in &workflows {
            api.store().create_run(new_run(w, 0)).await?;
        }
        let before = dynamo.calls().snapshot();
        let (mut invocations, mut done, mut distinct) = (0, 0, 0);
        while done < workflows.len() {
            invocations += 1;
            let summary = invoke(&worker, invocations, s.invocation).await?;
            if summary.claimed == 0 {
                return Err(BenchError::msg(format!(
                    "DynamoDB phase: an invocation claimed nothing: {:?}",
                    summary.errors
                )));
            }
            done += summary.claimed;
            distinct += summary
                .runs
                .iter()
                .map(|r| r.workflow.as_str())
                .collect::<BTreeSet<_>>()
                .len();
        }
        let after = dynamo.calls().snapshot();
        let calls = after
            .into_iter()
            .map(|(op, n)| {
                let n = n - before.get(&op).copied().unwrap_or(0);
                (op, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        phases.push(Phase {
            what: what.to_string(),
            runs: workflows.len(),
            invocations,
            workflows_per_invocation: distinct as f64 / invocations as f64,
            calls,
        });
    }
    Ok(DynamoDb::Measured(phases))
}

/// A table with the schema of `src/poison/dynamodb/` (`pk` S, on demand).
async fn create_table(config: &aws_sdk_dynamodb::Config) -> Result<String, BenchError> {
    let name = format!("bench-poison-{}", Uuid::new_v4().simple());
    let schema = |e: aws_sdk_dynamodb::error::BuildError| BenchError::msg(format!("schema: {e}"));
    let attribute = AttributeDefinition::builder()
        .attribute_name(PARTITION_KEY)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(schema)?;
    let key = KeySchemaElement::builder()
        .attribute_name(PARTITION_KEY)
        .key_type(KeyType::Hash)
        .build()
        .map_err(schema)?;
    Client::from_conf(config.clone())
        .create_table()
        .table_name(&name)
        .attribute_definitions(attribute)
        .key_schema(key)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .map_err(|e| {
            BenchError::msg(format!(
                "creating the DynamoDB table on moto: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            ))
        })?;
    Ok(name)
}
