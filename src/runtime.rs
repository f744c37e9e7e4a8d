//! The execution runtime: workflow code runs apart from the invocation's supervision.
//!
//! A step may block the thread it runs on: synchronous I/O, a CPU-bound loop,
//! `std::thread::sleep` in a handler. On one shared runtime that stops every lease refresh,
//! the cutoff and deadline watches and the response with it. So the engine executes runs on a
//! runtime of its own, owned by the worker, with one worker thread more than runs may execute
//! at once in the process ([`threads_for`]: M × C, M invocations of C runs each): blocked
//! runs still leave a thread to drive the others' requests. The invocation's claim loop, lease refreshers, watches, handbacks and response
//! stay on the runtime the handler is called on (the Lambda runtime loop's), with an HTTP
//! client of their own ([`crate::calls`]).
//!
//! What cannot be guaranteed: a step that never yields cannot be cancelled. At the cutoff its
//! run is handed back all the same (its store calls are fenced first: nothing it sends later
//! reaches the API), the summary names it (`stuck`), and its thread goes on until the step
//! returns ([`StuckExecutions`]). The deployable function ends its process once the response is
//! out ([`crate::layers`]), so that the step cannot carry on when Lambda thaws the instance for
//! its next event.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::io;
use std::sync::Mutex;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::AbortHandle;
use tokio_util::task::AbortOnDropHandle;
use uuid::Uuid;

/// Worker threads of the execution runtime for `runs` executing at once in the process: one
/// more.
pub fn threads_for(runs: usize) -> usize {
    runs.saturating_add(1)
}

/// The runtime the engine executes runs on. Shuts down in the background when dropped (also
/// from inside another runtime, as in tests), aborting what still runs there.
pub struct ExecutionRuntime {
    runtime: Option<Runtime>,
    handle: Handle,
}

impl ExecutionRuntime {
    /// A multi-thread runtime with `threads` worker threads named `ironflow-exec`.
    ///
    /// # Errors
    ///
    /// The I/O error of the runtime's creation (no thread could be spawned).
    pub fn new(threads: usize) -> io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("ironflow-exec")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok(Self {
            runtime: Some(runtime),
            handle,
        })
    }

    /// Run `future` on the execution runtime; dropping the handle aborts it.
    pub fn spawn<F>(&self, future: F) -> AbortOnDropHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        AbortOnDropHandle::new(self.handle.spawn(future))
    }
}

impl Drop for ExecutionRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Executions that were aborted but had not ended after the stop grace: workflow code blocks
/// their thread. Each is counted until that code yields and the task ends; while it has not, its
/// run is held by it in this process (the engine's per-run lock), and executing it again here
/// would only wait.
#[derive(Debug, Default)]
pub struct StuckExecutions {
    tasks: Mutex<Vec<(Uuid, AbortHandle)>>,
}

impl StuckExecutions {
    /// Count the aborted task of `handle`, which executed `run_id`, until it ends.
    pub fn add(&self, run_id: Uuid, handle: AbortHandle) {
        self.lock().push((run_id, handle));
    }

    /// Executions still stuck now.
    pub fn count(&self) -> usize {
        let mut tasks = self.lock();
        tasks.retain(|(_, t)| !t.is_finished());
        tasks.len()
    }

    /// Whether an execution of `run_id` is still stuck here.
    pub fn holds(&self, run_id: Uuid) -> bool {
        let mut tasks = self.lock();
        tasks.retain(|(_, t)| !t.is_finished());
        tasks.iter().any(|(id, _)| *id == run_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Uuid, AbortHandle)>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_blocked_execution_thread_does_not_stop_the_caller_s_runtime() {
        let runtime = ExecutionRuntime::new(threads_for(1)).unwrap();
        let blocked = runtime.spawn(async {
            std::thread::sleep(Duration::from_millis(300));
            1
        });
        let other = runtime.spawn(async { 2 });
        // The caller's (current-thread) runtime keeps its timers while a thread blocks.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(other.await.unwrap(), 2, "the spare thread ran it");
        assert_eq!(blocked.await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_stuck_execution_is_counted_until_it_yields() {
        let runtime = ExecutionRuntime::new(2).unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (started, has_started) = tokio::sync::oneshot::channel::<()>();
        let task = runtime.spawn(async move {
            // Blocks its thread until told, then yields.
            let _ = started.send(());
            let _ = wait.recv();
            tokio::task::yield_now().await;
        });
        // Abort only once the task runs: aborted before its first poll, it would never block.
        has_started.await.unwrap();
        task.abort();
        let stuck = StuckExecutions::default();
        let run = Uuid::new_v4();
        stuck.add(run, task.abort_handle());
        drop(task);
        assert_eq!(stuck.count(), 1);
        assert!(stuck.holds(run) && !stuck.holds(Uuid::nil()));
        go.send(()).unwrap();
        while stuck.count() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!stuck.holds(run), "no longer once it yielded");
    }
}
