//! Several invocations at once in one worker process, as on Lambda Managed Instances
//! (`AWS_LAMBDA_MAX_CONCURRENCY` > 1): through the library's handler, against the real API on
//! both stores.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Harness, ShellWorkflow};
use futures_util::future::join_all;
use ironflow_lambda::{InvocationSummary, LambdaWorker, Outcome};
use ironflow_store::entities::{LogFilter, RunStatus};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(60);
/// Lines each run of [`chatty`] prints.
const LINES: usize = 30;

/// Prints [`LINES`] numbered lines, a few at a time, and counts its execution in `ran`.
fn chatty(h: &Harness) -> ShellWorkflow {
    ShellWorkflow::one(
        "chatty",
        &format!(
            "echo x >> '{}'; for i in $(seq 1 {LINES}); do echo line-$i; \
             [ $((i % 10)) -eq 0 ] && sleep 0.02; done; true",
            h.path("ran").display()
        ),
    )
}

/// Waits until `go` exists, after telling it started (a file per run in `started`).
fn waits(h: &Harness) -> ShellWorkflow {
    ShellWorkflow::one(
        "waits",
        &format!(
            "mkdir -p '{started}'; touch '{started}'/$$; while [ ! -e '{go}' ]; do sleep 0.02; done",
            started = h.path("started").display(),
            go = h.path("go").display()
        ),
    )
}

/// Starts a detached grandchild (its own session) that outlives its shell, its pid written to
/// `pid`, then waits until `go` exists.
fn holds(h: &Harness) -> ShellWorkflow {
    ShellWorkflow::one(
        "holds",
        &format!(
            "setsid sleep 600 > /dev/null 2>&1 & echo $! > '{pid}'; while [ ! -e '{go}' ]; do sleep 0.02; done",
            pid = h.path("pid").display(),
            go = h.path("go").display()
        ),
    )
}

/// The pid `holds` wrote, once it has.
async fn grandchild(h: &Harness) -> i32 {
    let pid = h.path("pid");
    common::wait_until("the grandchild started", LONG, || async {
        std::fs::read_to_string(&pid).is_ok_and(|p| p.trim().parse::<i32>().is_ok())
    })
    .await;
    std::fs::read_to_string(&pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn started(h: &Harness) -> usize {
    std::fs::read_dir(h.path("started")).map_or(0, |d| d.count())
}

async fn invoke_all(h: &Harness, worker: &LambdaWorker, n: usize) -> Vec<InvocationSummary> {
    join_all((0..n).map(|_| h.invoke(worker, LONG))).await
}

/// Every line a run printed, as the API has them.
async fn log_lines(h: &Harness, run: Uuid) -> Vec<String> {
    let filter = LogFilter {
        step_id: None,
        stream: None,
    };
    let logs = h.api.store().get_logs(run, filter, None, 10_000).await;
    logs.unwrap().into_iter().map(|l| l.line).collect()
}

async fn invocations_overlap_up_to_m(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(waits(&h))
        .concurrent_invocations(3)
        .max_runs_per_invocation(1)
        .build()
        .unwrap();
    let runs = [
        h.create("waits", 0).await,
        h.create("waits", 0).await,
        h.create("waits", 0).await,
    ];
    let (h, worker) = (Arc::new(h), Arc::new(worker));
    let invocations = tokio::spawn({
        let (h, worker) = (h.clone(), worker.clone());
        async move { invoke_all(&h, &worker, 3).await }
    });
    // Three runs of three invocations execute at once: none waits for another's end.
    common::wait_until("three runs started at once", LONG, || async {
        started(&h) == 3
    })
    .await;
    assert_eq!(worker.invocations_in_flight(), 3);
    std::fs::write(h.path("go"), "").unwrap();
    let summaries = invocations.await.unwrap();
    let claimed: HashSet<Uuid> = summaries
        .iter()
        .flat_map(|s| s.runs.iter().map(|r| r.run_id))
        .collect();
    assert_eq!(claimed, runs.into_iter().collect(), "{summaries:?}");
    for s in &summaries {
        assert_eq!(s.claimed, 1, "{s:?}");
        assert_eq!(s.count(Outcome::Completed), 1, "{s:?}");
    }
    for run in runs {
        assert_eq!(h.status(run).await, RunStatus::Completed);
    }
}

async fn each_invocation_owns_its_runs_and_their_logs(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(chatty(&h))
        .concurrent_invocations(4)
        .concurrency(2)
        .max_runs_per_invocation(3)
        .build()
        .unwrap();
    let mut runs = Vec::new();
    for _ in 0..12 {
        runs.push(h.create("chatty", 0).await);
    }
    let mut summaries = invoke_all(&h, &worker, 4).await;
    // What is left after four full batches (none, unless an invocation found the API empty
    // before the others' claims): drained by more invocations.
    while summaries.iter().map(|s| s.claimed).sum::<usize>() < runs.len() {
        let more = invoke_all(&h, &worker, 1).await;
        assert!(more[0].claimed > 0, "{more:?}");
        summaries.extend(more);
    }

    // No run executed twice, and each invocation's summary holds its own runs only.
    assert_eq!(common::executions(&h.path("ran")), runs.len());
    let mut seen = HashSet::new();
    for s in &summaries {
        for r in &s.runs {
            assert!(seen.insert(r.run_id), "run {} in two summaries", r.run_id);
            assert_eq!(r.outcome, Outcome::Completed, "{s:?}");
        }
        assert!(s.errors.is_empty(), "{s:?}");
    }
    assert_eq!(seen, runs.iter().copied().collect());

    // Logs reach the right run, complete and in order, pushed by the invocation that ran it
    // before it returned: each invocation sent exactly its own runs' lines.
    for s in &summaries {
        let mut own = 0;
        for r in &s.runs {
            let lines = log_lines(&h, r.run_id).await;
            let printed: Vec<&str> = lines
                .iter()
                .map(String::as_str)
                .filter(|l| l.starts_with("line-"))
                .collect();
            let expected: Vec<String> = (1..=LINES).map(|i| format!("line-{i}")).collect();
            assert_eq!(printed, expected, "run {}", r.run_id);
            own += lines.len();
        }
        assert_eq!(
            s.logs.sent, own,
            "invocation {}: {:?}",
            s.request_id, s.logs
        );
        assert_eq!(s.logs.dropped, 0);
    }
}

async fn one_invocation_s_end_leaves_another_s_processes_alone(backend: Backend) {
    let h = Harness::start_on(backend).await;
    // A detached grandchild (its own session) that outlives its shell, its pid written down.
    let holds = holds(&h);
    let quick = ShellWorkflow::one("quick", "true");
    let worker = Arc::new(
        h.builder()
            .register(holds)
            .register(quick)
            .concurrent_invocations(2)
            .max_runs_per_invocation(1)
            .build()
            .unwrap(),
    );
    let held = h.create("holds", 0).await;
    let h = Arc::new(h);
    let holding = tokio::spawn({
        let (h, worker) = (h.clone(), worker.clone());
        async move { h.invoke(&worker, LONG).await }
    });
    let grandchild = grandchild(&h).await;
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
    };

    // Another invocation starts, runs its own run and ends while the first one's step runs.
    let quick_run = h.create("quick", 0).await;
    let other = h.invoke(&worker, LONG).await;
    assert_eq!(other.runs.len(), 1, "{other:?}");
    assert_eq!(other.runs[0].run_id, quick_run);
    assert_eq!(other.orphans_killed, 0, "{other:?}");
    assert!(
        alive(grandchild),
        "the other invocation's end killed a process of this one"
    );

    std::fs::write(h.path("go"), "").unwrap();
    let first = holding.await.unwrap();
    assert_eq!(first.runs[0].run_id, held);
    assert_eq!(first.runs[0].outcome, Outcome::Completed, "{first:?}");
    assert!(first.orphans_killed >= 1, "{first:?}");
    assert!(
        !alive(grandchild),
        "the run's own end kills its detached grandchild"
    );
}

async fn a_dropped_invocation_s_detached_processes_end_with_it(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let holds = holds(&h);
    let other = waits(&h);
    let worker = Arc::new(
        h.builder()
            .register(holds)
            .register(other)
            .concurrent_invocations(2)
            .max_runs_per_invocation(1)
            .build()
            .unwrap(),
    );
    let h = Arc::new(h);
    h.create("holds", 0).await;
    let dropped = tokio::spawn({
        let (h, worker) = (h.clone(), worker.clone());
        async move { h.invoke(&worker, LONG).await }
    });
    let grandchild = grandchild(&h).await;
    // Another invocation in flight: the process is not idle, no sweep comes.
    h.create("waits", 0).await;
    let running = tokio::spawn({
        let (h, worker) = (h.clone(), worker.clone());
        async move { h.invoke(&worker, LONG).await }
    });
    common::wait_until("the other run started", LONG, || async { started(&h) == 1 }).await;

    // As lambda_runtime drops a handler's future after a panic.
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |stat| stat.contains(") Z "))
    };
    common::wait_until("the dropped run's grandchild is killed", LONG, || async {
        gone(grandchild)
    })
    .await;
    assert!(
        !running.is_finished(),
        "killed while the other invocation runs"
    );
    std::fs::write(h.path("go"), "").unwrap();
    let other = running.await.unwrap();
    assert_eq!(other.runs[0].outcome, Outcome::Completed, "{other:?}");
}

/// Blocks its thread for 8 s (synchronous code in the handler), then ends.
struct Blocking;

impl ironflow_engine::handler::WorkflowHandler for Blocking {
    fn name(&self) -> &str {
        "blocking"
    }
    fn execute<'a>(
        &'a self,
        _: &'a mut ironflow_engine::context::WorkflowContext,
    ) -> ironflow_engine::handler::HandlerFuture<'a> {
        Box::pin(async move {
            std::thread::sleep(Duration::from_secs(8));
            Ok(())
        })
    }
}

async fn a_run_whose_stuck_execution_holds_it_here_is_released_not_waited_on(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(Blocking)
        .concurrent_invocations(2)
        .max_runs_per_invocation(1)
        .build()
        .unwrap();
    let run = h.create("blocking", 0).await;
    // Handed back at its cutoff, its code still blocking a thread here.
    let first = h.invoke(&worker, Duration::from_secs(3)).await;
    assert!(first.runs[0].stuck, "{first:?}");
    assert_eq!(worker.stuck_executions(), 1);
    // The next invocation of this process claims it again: it goes back at once.
    let next = h.invoke(&worker, LONG).await;
    assert_eq!(next.runs.len(), 1, "{next:?}");
    assert_eq!(next.runs[0].outcome, Outcome::Released, "{next:?}");
    assert_eq!(next.stop_reason.as_str(), "retiring");
    assert!(next.time_left_ms > 50_000, "not waited on: {next:?}");
    assert_eq!(h.status(run).await, RunStatus::Pending);
}

on_both_stores!(
    a_run_whose_stuck_execution_holds_it_here_is_released_not_waited_on,
    a_dropped_invocation_s_detached_processes_end_with_it,
    invocations_overlap_up_to_m,
    each_invocation_owns_its_runs_and_their_logs,
    one_invocation_s_end_leaves_another_s_processes_alone,
);
