//! The agent runs of the default mode: three of the example crate's AI patterns
//! (`examples/my-workflows`, docs/agents.md) on the Bedrock provider, whose AWS SDK client talks
//! to the scripted model server (`crates/model-server`) in this process instead of Amazon
//! Bedrock: a prompt chain, a human review that this runner approves itself once the run waits
//! for it (through the API's route, as a reviewer would), and a structured answer whose first
//! try fails its schema and is asked again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use ironflow_lambda::BedrockProvider;
use ironflow_model_server::{Match, ModelServer, Reply, Script};
use ironflow_store::entities::RunStatus;
use ironflow_store::store::Store;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long the scripted model takes to answer each call.
const LATENCY: Duration = Duration::from_millis(200);

/// How often the reviewer looks for a run waiting for its approval.
const REVIEW_EVERY: Duration = Duration::from_millis(100);

/// The workflow whose runs this runner approves.
pub const REVIEWED: &str = "human-review";

/// The agent runs to create: (workflow, input).
pub fn runs() -> Vec<(&'static str, Value)> {
    vec![
        (
            "prompt-chaining",
            json!({"topic": "durable steps on Lambda"}),
        ),
        (
            REVIEWED,
            json!({"document": "Invoice from ACME: 19.99 USD, due 2026-12-31."}),
        ),
        (
            "structured-output",
            json!({"message": "Ada here: my router has been down since this morning."}),
        ),
    ]
}

/// The model's script: an answer for each step of the three runs, the first ticket invalid
/// (priority 9 of at most 5).
fn script() -> Script {
    let ticket = |priority: u8| {
        Reply::structured(json!({
            "customer": "Ada", "product": "router", "priority": priority,
            "summary": "The router is down."
        }))
    };
    let answers = [
        (
            "three-point outline",
            Reply::text("1. steps 2. replay 3. handbacks"),
        ),
        (
            "article this outline describes",
            Reply::text("Each step is stored; a resumed run replays it."),
        ),
        (
            "Tighten this article",
            Reply::text("Stored steps are replayed."),
        ),
        (
            "Extract the vendor",
            Reply::structured(json!({"vendor": "ACME", "total_cents": 1999, "due": "2026-12-31"})),
        ),
        (
            "note to accounting",
            Reply::text("Pay ACME 19.99 USD by 2026-12-31."),
        ),
        ("support ticket", ticket(4)),
    ];
    let mut script = Script::new()
        .strict()
        .latency(LATENCY)
        .on(Match::any().containing("support ticket"), [ticket(9)]);
    for (needle, reply) in answers {
        script = script.always(Match::any().containing(needle), reply);
    }
    script
}

/// The model server, and a Bedrock provider whose client talks to it.
///
/// # Errors
///
/// The server could not bind 127.0.0.1.
pub async fn start() -> Result<(ModelServer, BedrockProvider), Box<dyn std::error::Error>> {
    let server = ModelServer::start(script()).await?;
    let aws = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(server.url())
        // The server checks no signature; the SDK signs with something.
        .credentials_provider(aws_credential_types::Credentials::new(
            "local",
            "local",
            None,
            None,
            "ironflow-lambda-local",
        ))
        .load()
        .await;
    println!(
        "agent steps call the scripted model server at {} (Bedrock's Converse API, the AWS SDK's own client)",
        server.url()
    );
    Ok((server, BedrockProvider::new(&aws)))
}

/// Approve each run of `reviewed` once it waits for its approval, through the API's route
/// (`POST /api/v1/runs/{id}/approve`), until all are approved; prints each approval.
pub async fn review(api_url: String, bearer: String, store: Arc<dyn Store>, reviewed: Vec<Uuid>) {
    let client = reqwest::Client::new();
    let mut left: BTreeSet<Uuid> = reviewed.into_iter().collect();
    while !left.is_empty() {
        for id in left.clone() {
            let waiting = matches!(
                store.get_run(id).await,
                Ok(Some(run)) if run.status.state == RunStatus::AwaitingApproval
            );
            if !waiting {
                continue;
            }
            let answer = client
                .post(format!("{api_url}/api/v1/runs/{id}/approve"))
                .header("authorization", &bearer)
                .json(&json!({}))
                .send()
                .await;
            match answer {
                Ok(a) if a.status().is_success() => {
                    println!(
                        "approved {REVIEWED} run {id}, waiting for its review with no invocation holding it"
                    );
                    left.remove(&id);
                }
                Ok(a) => println!("the approval of run {id} was answered {}", a.status()),
                Err(e) => println!("the approval of run {id} failed: {e}"),
            }
        }
        tokio::time::sleep(REVIEW_EVERY).await;
    }
}

/// The model server's calls, for the tally.
pub fn print_calls(server: &ModelServer) {
    let calls = server.calls();
    let by_model: Vec<String> = calls
        .by_model
        .iter()
        .map(|(model, n)| format!("{n} to {model}"))
        .collect();
    println!(
        "model calls: {} ({}) for the agent runs' 6 steps, an invalid structured answer asked \
         again, and any call cut by a handback made once more",
        calls.total,
        by_model.join(", ")
    );
}
