//! The EMF metrics document, written before the handler's answer becomes the response.

use std::pin::Pin;
use std::task::{Context, Poll};

use lambda_runtime::LambdaEvent;
use lambda_runtime::tower::{Layer, Service};
use metrics_cloudwatch_embedded::Collector;

/// Writes the EMF document of everything recorded during an invocation to stdout once the
/// handler has answered, before the runtime posts the answer: Lambda may freeze the process
/// right after the response, and CloudWatch Logs turns the document into metrics. Without a
/// collector (none installed) it does nothing.
#[derive(Clone, Copy)]
pub struct MetricsLayer {
    collector: Option<&'static Collector>,
}

impl MetricsLayer {
    /// The layer for `collector` (from [`crate::metrics::install`]).
    pub fn new(collector: Option<&'static Collector>) -> Self {
        Self { collector }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            collector: self.collector,
        }
    }
}

/// The service of [`MetricsLayer`].
#[derive(Clone)]
pub struct MetricsService<S> {
    inner: S,
    collector: Option<&'static Collector>,
}

impl<S, T> Service<LambdaEvent<T>> for MetricsService<S>
where
    S: Service<LambdaEvent<T>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, event: LambdaEvent<T>) -> Self::Future {
        let answered = self.inner.call(event);
        let collector = self.collector;
        Box::pin(async move {
            let answer = answered.await;
            if let Some(collector) = collector {
                crate::metrics::flush(collector, std::io::stdout().lock());
            }
            answer
        })
    }
}
