//! Ending the process after the response while an execution is stuck (a layer for
//! `lambda_runtime::Runtime::layer`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{Error, LambdaInvocation};
use tracing::error;

use crate::worker::LambdaWorker;

/// Ends the process once an invocation's response has been posted while an execution of the
/// worker is still stuck in workflow code that blocks its thread (`docs/faults.md#blocking-steps`): Lambda
/// freezes the process after the response and thaws it for the next event, when the stuck step
/// would carry on with a run another worker may own by then. The next event cold-starts a new
/// process instead. For on-demand Lambda (one invocation per process); not for a process that
/// serves several invocations at once.
pub struct ExitWhenStuckLayer {
    worker: Arc<LambdaWorker>,
}

impl ExitWhenStuckLayer {
    /// The layer for `worker`'s invocations.
    pub fn new(worker: Arc<LambdaWorker>) -> Self {
        Self { worker }
    }
}

impl<S> Layer<S> for ExitWhenStuckLayer {
    type Service = ExitWhenStuck<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ExitWhenStuck {
            inner,
            worker: self.worker.clone(),
        }
    }
}

/// The service of [`ExitWhenStuckLayer`].
pub struct ExitWhenStuck<S> {
    inner: S,
    worker: Arc<LambdaWorker>,
}

impl<S> Service<LambdaInvocation> for ExitWhenStuck<S>
where
    S: Service<LambdaInvocation, Response = (), Error = Error>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, invocation: LambdaInvocation) -> Self::Future {
        let answered = self.inner.call(invocation);
        let worker = self.worker.clone();
        Box::pin(async move {
            let result = answered.await;
            let stuck = worker.stuck_executions();
            if stuck > 0 {
                error!(
                    stuck,
                    "ending the process after the response: an execution is still blocked in \
                     workflow code and must not carry on when Lambda thaws this instance (its \
                     run was handed back or abandoned); the next event starts a new one"
                );
                std::process::exit(0);
            }
            result
        })
    }
}
