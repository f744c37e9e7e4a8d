//! Layers around the Lambda function: what happens after the handler answers and after the
//! response is out. [`crate::run`] composes them; a program running its own Lambda runtime loop
//! can too.
//!
//! - `MetricsLayer` (around the handler): the invocation's EMF metrics document goes to stdout
//!   before the handler's answer is handed to the runtime, which posts it as the response (the
//!   process may be frozen right after).
//! - `ExitWhenStuckLayer` (around the runtime's invocation service): after the response has
//!   been posted, ends the process while an execution is still blocked in workflow code, once
//!   no other invocation is in flight in it.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

mod metrics;
mod stuck;

pub(crate) use metrics::MetricsLayer;
pub(crate) use stuck::ExitWhenStuckLayer;
