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
/// Never while another invocation is in flight in the process (Lambda Managed Instances): the
/// worker retires at once (`src/admission.rs`: an event that arrives meanwhile claims nothing
/// and is answered with an error, for Lambda to retry elsewhere), the stuck step goes on, fenced
/// (nothing it sends reaches the API), and the last invocation in flight to answer ends the
/// process. A webhook request in flight counts as one ([`crate::webhook`] requests take no
/// batch slot, but hold the process until answered), so none is cut off unanswered.
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
            // No invocation is admitted from now on; the last one in flight ends the process.
            let in_flight = worker.admission.retire();
            if in_flight == 0 {
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
                in_flight,
                "an execution is still blocked in workflow code (its run was handed back or \
                 abandoned, its calls fenced): the process admits no more invocations and ends \
                 once the {in_flight} in flight have answered"
            );
            result
        })
    }
}
