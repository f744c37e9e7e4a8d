//! The run timeout when the claim hands out a sub-workflow child (after a wait inside the child
//! ends, the engine resumes the root's chain from it), against the real ironflow API on both of
//! its stores: the root's attempt is what executes and what the timeout reads, its children's
//! steps counted within their `workflow` steps (docs/design.md, "The run timeout across
//! invocations"). Written by reviews of e7567d8 and fa0c86d: the child's steps alone were read
//! then, and what a child claim writes (a timeout, a panic, a handback) went to the child while
//! the engine had moved its lease to the root, until the refresher's next renewal.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::fault_proxy::{Fault, FaultProxy};
use common::{Backend, Harness};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::config::{HumanInputConfig, ShellConfig};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::error::EngineError;
use ironflow_engine::handler::{HandlerFuture, TypedWorkflow, WorkflowHandler};
use ironflow_lambda::{LambdaWorkerBuilder, Outcome};
use ironflow_store::entities::{RunStatus, StepKind, StepStatus, StepUpdate};
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Review {
    ok: bool,
}

/// A child: a step `s` (`s_cmd`), a human input, a step `y`.
struct Reviewed {
    s_cmd: String,
}

impl WorkflowHandler for Reviewed {
    fn name(&self) -> &str {
        "reviewed"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("s", ShellConfig::new(&self.s_cmd)).await?;
            let review: Review = ctx
                .human_input("review", HumanInputConfig::new("Is it fine?"))
                .await?;
            ctx.shell("y", ShellConfig::new(&format!("echo {}", review.ok)))
                .await?;
            Ok(())
        })
    }
}

impl TypedWorkflow for Reviewed {
    type Input = serde_json::Value;
}

/// `a`, the child, `c`.
struct Root {
    a: String,
    c: String,
    child: Reviewed,
}

impl WorkflowHandler for Root {
    fn name(&self) -> &str {
        "root"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("a", ShellConfig::new(&self.a)).await?;
            ctx.workflow(&self.child, json!({})).await?;
            ctx.shell("c", ShellConfig::new(&self.c)).await?;
            Ok(())
        })
    }
}

/// Answer the child's human input as the route does and queue the child.
async fn answer(h: &Harness, child: uuid::Uuid) {
    let review = h
        .steps(child)
        .await
        .into_iter()
        .find(|s| s.name == "review" && s.status.state == StepStatus::AwaitingApproval)
        .expect("the open human input");
    let store = h.api.store();
    store
        .update_step(
            review.id,
            StepUpdate {
                status: Some(StepStatus::Completed),
                output: Some(json!({"ok": true})),
                completed_at: Some(Utc::now()),
                clear_approval_deadline: true,
                ..StepUpdate::default()
            },
        )
        .await
        .unwrap();
    store
        .update_run_status(child, RunStatus::Pending)
        .await
        .unwrap();
}

async fn child_of(h: &Harness, id: uuid::Uuid) -> uuid::Uuid {
    let steps = h.steps(id).await;
    steps
        .iter()
        .filter(|s| s.kind == StepKind::Workflow)
        .find_map(|s| s.output.as_ref()?["child_run_id"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("{steps:?}"))
}

/// The root executes 3 s (`a`), waits on its child's human input, then 3 s (`c`) after the
/// answer: 6 s executed against a 4 s timeout. The second invocation claims the child: its run
/// deadline must count the root's 3 s, and time the run out.
async fn a_child_claim_counts_the_root_s_executed_time(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(Root {
            a: "sleep 3".into(),
            c: "sleep 3".into(),
            child: Reviewed {
                s_cmd: "true".into(),
            },
        })
        .register(Reviewed {
            s_cmd: "true".into(),
        })
        .cutoff_aware_starts(false)
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(15))
        .run_timeout(Duration::from_secs(4))
        .build()
        .unwrap();
    let id = h.create("root", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let child = child_of(&h, id).await;
    answer(&h, child).await;
    let second = h.invoke(&worker, LONG).await;
    assert_eq!(
        second.count(Outcome::TimedOut),
        1,
        "6 s executed against a 4 s timeout: {second:?}"
    );
    // Written to the root, which the execution held: not to the child, which completed.
    let root = h.run(id).await;
    assert_eq!(root.status.state, RunStatus::Failed, "{root:?}");
    assert!(
        root.error
            .as_deref()
            .is_some_and(|e| e.contains("timed out")),
        "{root:?}"
    );
    assert_eq!(h.status(child).await, RunStatus::Completed);
}

/// `a` (`true`), then the reviewed child (its `s`: `true`): how the roots below begin.
async fn a_then_the_child(ctx: &mut WorkflowContext) -> Result<(), EngineError> {
    ctx.shell("a", ShellConfig::new("true")).await?;
    let child = Reviewed {
        s_cmd: "true".into(),
    };
    ctx.workflow(&child, json!({})).await?;
    Ok(())
}

/// `a`, the child, then a panic.
struct RootPanics;

impl WorkflowHandler for RootPanics {
    fn name(&self) -> &str {
        "root-panics"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            a_then_the_child(ctx).await?;
            panic!("after the child");
        })
    }
}

/// A panic after the child, in the invocation that claimed the child (the lease moved to the
/// root, the refresher not renewed since): the failure is the root's.
async fn a_panic_in_a_child_claim_fails_the_root(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(RootPanics)
        .register(Reviewed {
            s_cmd: "true".into(),
        })
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(15))
        .build()
        .unwrap();
    let id = h.create("root-panics", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let child = child_of(&h, id).await;
    answer(&h, child).await;
    let second = h.invoke(&worker, LONG).await;
    assert_eq!(second.count(Outcome::Panicked), 1, "{second:?}");
    let root = h.run(id).await;
    assert_eq!(root.status.state, RunStatus::Failed, "{root:?}");
    assert!(
        root.error
            .as_deref()
            .is_some_and(|e| e.contains("after the child")),
        "{root:?}"
    );
    assert_eq!(h.status(child).await, RunStatus::Completed);
}

/// The cutoff during `c`, in the invocation that claimed the child (the lease moved to the
/// root, the refresher not renewed since): the root is handed back Pending, not left Running
/// under a lease nobody renews, and the next invocation completes it.
async fn a_child_claim_s_cutoff_hands_the_root_back(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let resumed: PathBuf = h.path("resumed");
    let c = format!("test -f '{}' || sleep 30", resumed.display());
    let child = || Reviewed {
        s_cmd: "true".into(),
    };
    let worker = h
        .builder()
        .register(Root {
            a: "true".into(),
            c,
            child: child(),
        })
        .register(child())
        .cutoff_aware_starts(false)
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(15))
        .build()
        .unwrap();
    let id = h.create("root", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let kid = child_of(&h, id).await;
    answer(&h, kid).await;
    let cut = h.invoke(&worker, Duration::from_millis(1500)).await;
    assert_eq!(cut.count(Outcome::HandedBack), 1, "{cut:?}");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    let c_cut = h
        .steps(id)
        .await
        .into_iter()
        .find(|s| s.name == "c")
        .expect("step c");
    assert_eq!(c_cut.status.state, StepStatus::Failed, "{c_cut:?}");
    std::fs::write(&resumed, "").unwrap();
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// The child's step `s` is cut by a handback (1.5 s invocation), the root waits Pending 10 s, is
/// re-entered (the engine interrupts `s` only then), `s` ends at once, the child waits for a
/// human; once answered the child is claimed: the Pending time after the handback must not count
/// (about 1.5 s executed against a 6 s timeout; 11.5 s if `s` read as executing across it).
async fn a_child_claim_does_not_count_the_pending_time_after_a_handback(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let resumed: PathBuf = h.path("resumed");
    let s_cmd = format!("test -f '{}' || sleep 30", resumed.display());
    let worker = h
        .builder()
        .register(Root {
            a: "true".into(),
            c: "true".into(),
            child: Reviewed {
                s_cmd: s_cmd.clone(),
            },
        })
        .register(Reviewed { s_cmd })
        .cutoff_aware_starts(false)
        .run_timeout(Duration::from_secs(6))
        .build()
        .unwrap();
    let id = h.create("root", 0).await;
    let cut = h.invoke(&worker, Duration::from_millis(1500)).await;
    assert_eq!(cut.count(Outcome::HandedBack), 1, "{cut:?}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    std::fs::write(&resumed, "").unwrap();
    let second = h.invoke(&worker, LONG).await;
    assert_eq!(second.count(Outcome::Suspended), 1, "{second:?}");
    let child = child_of(&h, id).await;
    answer(&h, child).await;
    let third = h.invoke(&worker, LONG).await;
    assert_eq!(third.count(Outcome::Completed), 1, "{third:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// `a`, the child, `c`, then code that waits for the file `go`, then `d`.
struct RootWaitsForGo {
    go: PathBuf,
}

impl WorkflowHandler for RootWaitsForGo {
    fn name(&self) -> &str {
        "root-go"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            a_then_the_child(ctx).await?;
            ctx.shell("c", ShellConfig::new("true")).await?;
            while !self.go.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ctx.shell("d", ShellConfig::new("true")).await?;
            Ok(())
        })
    }
}

/// An operator's pause between two steps of the root, in an invocation that claimed the child
/// (after its human input was answered): the engine stops with the root Paused; the pause must
/// be marked as a wait, so that 8 s Paused against a 6 s timeout does not time the run out.
async fn a_pause_in_a_child_claim_is_marked(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let go = h.path("go");
    let worker = h
        .builder()
        .register(RootWaitsForGo { go: go.clone() })
        .register(Reviewed {
            s_cmd: "true".into(),
        })
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(15))
        .run_timeout(Duration::from_secs(6))
        .build()
        .unwrap();
    let id = h.create("root-go", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let child = child_of(&h, id).await;
    answer(&h, child).await;
    let invocation = {
        let (h, worker) = (&h, &worker);
        async move { h.invoke(worker, LONG).await }
    };
    let pause = async {
        common::wait_until("step c completed", LONG, || async {
            h.steps(id)
                .await
                .iter()
                .any(|s| s.name == "c" && s.status.state == StepStatus::Completed)
        })
        .await;
        h.api.pause_run(id).await.unwrap();
        std::fs::write(&go, "").unwrap();
    };
    let (second, ()) = tokio::join!(invocation, pause);
    assert_eq!(second.count(Outcome::Suspended), 1, "{second:?}");
    assert!(
        second.runs[0].error.is_some(),
        "a pause says so (the poison pill neither counts nor resets it): {second:?}"
    );
    assert_eq!(h.status(id).await, RunStatus::Paused);
    let marked = h.steps(id).await.iter().any(|s| {
        s.debug_messages
            .as_ref()
            .is_some_and(|m| m.to_string().contains("ironflow_lambda_handed_back_at"))
    });
    assert!(marked, "the wait's start recorded: {:?}", h.steps(id).await);
    tokio::time::sleep(Duration::from_secs(8)).await;
    h.api.resume_run(id).await.unwrap();
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// A worker of the harness's API reached through `proxy` (as tests/api_faults.rs), its lease
/// renewed only after the invocations below end.
fn through(h: &Harness, proxy: &FaultProxy) -> LambdaWorkerBuilder {
    LambdaWorkerBuilder::new(&proxy.url(), h.api.token())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(15))
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
        .cutoff_aware_starts(false)
}

/// The root's `a` and `c`, around the reviewed child.
fn root(a: &str, c: &str) -> Root {
    Root {
        a: a.into(),
        c: c.into(),
        child: Reviewed {
            s_cmd: "true".into(),
        },
    }
}

/// The child claim's release of its own lease (`resume_chain`, after the root took it) lands
/// and its answer is lost: the read-back must take a Running child with no holder for the
/// release landed, not for a run another worker took (which abandoned the execution and left
/// the root Running under a lease nobody renews). Found by a review of b8e9028.
async fn a_lost_answer_to_the_child_s_release_is_read_back_as_landed(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 41).await;
    let worker = through(&h, &proxy)
        .register(root("true", "true"))
        .register(Reviewed {
            s_cmd: "true".into(),
        })
        .build()
        .unwrap();
    let id = h.create("root", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let child = child_of(&h, id).await;
    answer(&h, child).await;
    // The root's move to Running (with the child's lease) goes through; the release's answer
    // is lost.
    proxy.next("PUT /runs/{id}", Fault::Delay(Duration::ZERO));
    proxy.next("PUT /runs/{id}", Fault::LostAnswer);
    let second = h.invoke(&worker, LONG).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(h.status(child).await, RunStatus::Completed);
}

/// The run deadline fires while the child's release is in flight (the root already took the
/// lease; the API answers the release 1.8 s late): the timeout is the root's, written to the
/// root, and the child is not failed for it. Found by a review of b8e9028.
async fn a_timeout_before_the_release_is_answered_is_the_root_s(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 42).await;
    let worker = through(&h, &proxy)
        .register(root("sleep 2", "true"))
        .register(Reviewed {
            s_cmd: "true".into(),
        })
        .run_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let id = h.create("root", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let child = child_of(&h, id).await;
    answer(&h, child).await;
    proxy.next("PUT /runs/{id}", Fault::Delay(Duration::ZERO));
    proxy.next("PUT /runs/{id}", Fault::Delay(Duration::from_millis(1800)));
    let second = h.invoke(&worker, LONG).await;
    assert_eq!(second.count(Outcome::TimedOut), 1, "{second:?}");
    let r = h.run(id).await;
    assert_eq!(r.status.state, RunStatus::Failed, "{r:?}");
    assert!(
        r.error.as_deref().is_some_and(|e| e.contains("timed out")),
        "{r:?}"
    );
    let c = h.run(child).await;
    assert_ne!(c.status.state, RunStatus::Failed, "{c:?}");
    assert_eq!(c.worker_id, None, "the child's lease released: {c:?}");
}

/// A child that does one quick step.
struct Quick;

impl WorkflowHandler for Quick {
    fn name(&self) -> &str {
        "quick"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("q", ShellConfig::new("true")).await?;
            Ok(())
        })
    }
}

impl TypedWorkflow for Quick {
    type Input = serde_json::Value;
}

/// 16 quick children, then the reviewed child, then 2 s of `c`.
struct Many;

impl WorkflowHandler for Many {
    fn name(&self) -> &str {
        "many"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("a", ShellConfig::new("true")).await?;
            for _ in 0..16 {
                ctx.workflow(&Quick, json!({})).await?;
            }
            ctx.workflow(
                &Reviewed {
                    s_cmd: "true".into(),
                },
                json!({}),
            )
            .await?;
            ctx.shell("c", ShellConfig::new("sleep 2")).await?;
            Ok(())
        })
    }
}

/// 17 children, one more than the reads allow: the one that waited (10 s, against a 6 s
/// timeout), whose `workflow` step lasted longest, must be among those read.
async fn the_child_that_waited_longest_is_read_first(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .run_timeout(Duration::from_secs(6))
        .register(Many)
        .register(Quick)
        .register(Reviewed {
            s_cmd: "true".into(),
        })
        .build()
        .unwrap();
    let id = h.create("many", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let steps = h.steps(id).await;
    let child = steps
        .iter()
        .filter(|s| s.kind == StepKind::Workflow && s.status.state == StepStatus::Running)
        .find_map(|s| s.output.as_ref()?["child_run_id"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("{steps:?}"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    answer(&h, child).await;
    let cut = h.invoke(&worker, Duration::from_millis(1500)).await;
    assert_eq!(cut.count(Outcome::HandedBack), 1, "{cut:?}");
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

on_both_stores!(
    a_child_claim_counts_the_root_s_executed_time,
    a_panic_in_a_child_claim_fails_the_root,
    a_child_claim_s_cutoff_hands_the_root_back,
    a_child_claim_does_not_count_the_pending_time_after_a_handback,
    a_pause_in_a_child_claim_is_marked,
    the_child_that_waited_longest_is_read_first,
    a_lost_answer_to_the_child_s_release_is_read_back_as_landed,
    a_timeout_before_the_release_is_answered_is_the_root_s,
);
