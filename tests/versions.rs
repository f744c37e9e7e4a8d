//! A new version of a workflow deployed while its runs are handed back between invocations
//! (docs/deploy.md, "Deploying a new version of your workflows"): ironflow-engine checks a resumed
//! run's `handler_version` before replaying anything. An incompatible handler fails the run
//! (`HANDLER_VERSION_MISMATCH`, not retried, a workflow failure); one that lists the old
//! version in `compatible_versions` resumes it by replay.

mod common;

use std::time::Duration;

use common::{Harness, ShellWorkflow, executions};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::Outcome;
use ironflow_local_api::new_run;
use ironflow_store::entities::RunStatus;
use ironflow_store::store::RunStore;
use uuid::Uuid;

/// `report` at a given version: `first` appends to a file, `second` hangs on its first
/// execution only (so that the first invocation hands the run back), `third` appends.
struct Report {
    version: &'static str,
    compatible: &'static [&'static str],
    steps: ShellWorkflow,
}

impl Report {
    fn new(h: &Harness, version: &'static str, compatible: &'static [&'static str]) -> Self {
        let (first, second) = (h.path("first"), h.path("second"));
        let steps = ShellWorkflow {
            name: "report",
            steps: vec![
                ("first", format!("echo x >> '{}'", first.display())),
                (
                    "second",
                    format!(
                        "echo x >> '{s}'; if [ \"$(wc -l < '{s}')\" -eq 1 ]; then sleep 600; fi",
                        s = second.display()
                    ),
                ),
            ],
        };
        Self {
            version,
            compatible,
            steps,
        }
    }
}

impl WorkflowHandler for Report {
    fn name(&self) -> &str {
        "report"
    }

    fn version(&self) -> Option<&str> {
        Some(self.version)
    }

    fn compatible_versions(&self) -> &[&str] {
        self.compatible
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        self.steps.execute(ctx)
    }
}

/// A run of `report` created at handler version 1 (as the API records it), handed back by a
/// worker at version 1 after its first step.
async fn handed_back_at_version_1(h: &Harness) -> Uuid {
    let mut run = new_run("report", 2);
    run.handler_version = Some("1".into());
    let id = h.client.create_run(run).await.unwrap().into_run().id;
    let v1 = h
        .builder()
        .register(Report::new(h, "1", &[]))
        .build()
        .unwrap();
    let first = h.invoke(&v1, Duration::from_secs(4)).await;
    assert_eq!(first.count(Outcome::HandedBack), 1, "{first:?}");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    id
}

#[tokio::test]
async fn an_incompatible_new_version_fails_the_resumed_run_without_replaying_it() {
    let h = Harness::start().await;
    let id = handed_back_at_version_1(&h).await;

    let v2 = h
        .builder()
        .register(Report::new(&h, "2", &[]))
        .build()
        .unwrap();
    let second = h.invoke(&v2, Duration::from_secs(30)).await;

    assert_eq!(second.count(Outcome::Failed), 1, "{second:?}");
    let error = second.runs[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("HANDLER_VERSION_MISMATCH")
            && error.contains("version 1")
            && error.contains("version 2"),
        "{error}"
    );
    let run = h.run(id).await;
    assert_eq!(
        run.status.state,
        RunStatus::Failed,
        "not retried: max_retries does not apply"
    );
    assert_eq!(run.retry_count, 0);
    assert_eq!(
        executions(&h.path("first")),
        1,
        "nothing replayed or executed again"
    );
    assert_eq!(executions(&h.path("second")), 1);
}

#[tokio::test]
async fn a_new_version_listing_the_old_one_resumes_the_run_by_replay() {
    let h = Harness::start().await;
    let id = handed_back_at_version_1(&h).await;

    let v2 = h
        .builder()
        .register(Report::new(&h, "2", &["1"]))
        .build()
        .unwrap();
    let second = h.invoke(&v2, Duration::from_secs(30)).await;

    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(
        executions(&h.path("first")),
        1,
        "the completed step was replayed"
    );
    assert_eq!(
        executions(&h.path("second")),
        2,
        "the interrupted step ran again"
    );
}
