//! Ending the process after the response while an execution is stuck (a layer for
//! `lambda_runtime::Runtime::layer`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{Error, LambdaInvocation};
use tracing::{error, warn};

use crate::worker::LambdaWorker;

/// Ends the process once an invocation's response has been posted while an execution of the
/// worker is still stuck in workflow code that blocks its thread (`docs/faults.md#blocking-steps`): Lambda
/// freezes the process after the response and thaws it for the next event, when the stuck step
/// would carry on with a run another worker may own by then. The next event cold-starts a new
/// process instead.
///
/// Never while another invocation is in flight in the process (Lambda Managed Instances): then
/// the stuck step goes on, fenced (nothing it sends reaches the API), and the last invocation in
/// flight to answer ends the process. Deciding to end it retires the worker in the same step
/// ([`crate::admission`]): an event that arrives meanwhile claims nothing and is answered with
/// an error, for Lambda to retry.
#[derive(Clone)]
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
#[derive(Clone)]
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
            if stuck == 0 {
                return result;
            }
            if worker.admission.retire_if_idle() {
                error!(
                    stuck,
                    "ending the process after the response: an execution is still blocked in \
                     workflow code and must not carry on when Lambda thaws this instance (its \
                     run was handed back or abandoned); the next event starts a new one"
                );
                std::process::exit(0);
            }
            warn!(
                stuck,
                in_flight = worker.invocations_in_flight(),
                "an execution is still blocked in workflow code (its run was handed back or \
                 abandoned, its calls fenced): the process ends once no other invocation is in \
                 flight"
            );
            result
        })
    }
}
