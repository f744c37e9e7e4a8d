//! A scripted stand-in for Amazon Bedrock's Converse API and Anthropic's Messages API: it
//! speaks their wire formats, and the real SDK clients talk to it. It replaces a paid,
//! non-deterministic external model in ironflow-lambda's tests, local runner and benchmark.
//!
//! - Converse: `POST /model/{modelId}/converse`, as aws-sdk-bedrockruntime sends it (point
//!   the client at [`ModelServer::url`]: `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` or the config's
//!   `endpoint_url`; any credentials, the request is not verified).
//! - Messages: `POST /v1/messages`, as ironflow-core's `AnthropicApiAdapter` sends it
//!   (`with_base_url(server.url())`); the `x-api-key` is recorded and can be refused.
//!
//! Answers come from a [`Script`]: rules per model id, API, text of the last user message
//! and/or system prompt, each a queue of [`Reply`]s given in order (text, tool use,
//! structured output, throttling, 5xx, access denied, a cut connection; any of them slow),
//! then standing replies ([`Script::always`]), then a default answer (or, with
//! [`Script::strict`], a validation error); a model id can be declared unknown and a key
//! refused. The script can grow while the server runs. Every call is counted ([`Calls`])
//! and every request kept ([`Request`]), for tests to assert on and wait for
//! ([`ModelServer::wait_until`]).
//!
//! It checks what a client can get wrong as the services do (roles, content blocks, tool
//! calls paired with their results, a forced tool that exists, the Messages API's required
//! fields and headers) and answers with the service's validation error; it does not verify
//! signatures, stream Converse (`converse-stream`) or model anything beyond the script.
//! What it guarantees and cannot cover: the repository's `docs/model-server.md`.
//!
//! It serves on the caller's Tokio runtime ([`ModelServer::start`]) or on a thread of its
//! own ([`ModelServer::start_on_own_thread`]), and stops when dropped.
//!
//! ```no_run
//! # async fn example() -> Result<(), ironflow_model_server::StartError> {
//! use ironflow_model_server::{Match, ModelServer, Reply, Script};
//!
//! let script = Script::new()
//!     .on(Match::model("us.anthropic.claude-3-5-haiku-20241022-v1:0"), [
//!         Reply::throttle(),
//!         Reply::tool_use("lookup", serde_json::json!({ "id": 7 })),
//!         Reply::text("done"),
//!     ])
//!     .unknown_model("anthropic.no-such-model");
//! let server = ModelServer::start(script).await?;
//! // Point aws-sdk-bedrockruntime's `endpoint_url` (or AWS_ENDPOINT_URL_BEDROCK_RUNTIME) at it.
//! let endpoint = server.url();
//! # let _ = endpoint;
//! assert_eq!(server.calls().total, 0);
//! # Ok(()) }
//! ```

mod converse;
mod messages;
mod record;
mod script;
mod server;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use record::{Calls, Outcome, Request, Route, TokenCount};
pub use script::{Match, Reply, ReplyKind, Rule, Script, ToolCall, Usage};

use server::Shared;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Binding `127.0.0.1:0` or reading the bound address failed.
    #[error("the model server could not bind 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    /// [`ModelServer::start_on_own_thread`]: its thread or Tokio runtime could not start.
    #[error("the model server's own thread or runtime could not start: {0}")]
    Thread(#[source] std::io::Error),
}

/// How the server is stopped on drop.
#[derive(Debug)]
enum Stop {
    /// Served on the caller's runtime: abort the accept loop.
    Task(JoinHandle<std::convert::Infallible>),
    /// Served on its own thread: tell it to stop.
    Thread(Option<oneshot::Sender<()>>),
}

/// A running scripted model server on `127.0.0.1` (an ephemeral port), serving both APIs.
/// It stops when dropped: it accepts no more connections and ends the open ones.
#[derive(Debug)]
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Stop,
}

impl ModelServer {
    /// Bind `127.0.0.1:0` and serve `script` on the current Tokio runtime (its tasks live on
    /// that runtime, so it must outlive the server's use).
    ///
    /// # Errors
    ///
    /// [`StartError::Bind`] when the socket cannot be bound.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime with I/O enabled (as `tokio::spawn` does); use
    /// [`ModelServer::start_on_own_thread`] there.
    pub async fn start(script: Script) -> Result<Self, StartError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(StartError::Bind)?;
        let addr = listener.local_addr().map_err(StartError::Bind)?;
        let shared = Arc::new(Shared::new(script));
        let task = tokio::spawn(server::serve(listener, shared.clone()));
        Ok(Self {
            addr,
            shared,
            stop: Stop::Task(task),
        })
    }

    /// Bind `127.0.0.1:0` and serve `script` on a thread of its own with its own
    /// single-threaded Tokio runtime: callable outside a runtime, and the server outlives
    /// the caller's runtimes (several `#[tokio::test]` runtimes, a blocking main). Dropping
    /// it stops the thread's runtime, which ends the open connections.
    ///
    /// # Errors
    ///
    /// [`StartError::Bind`] when the socket cannot be bound, [`StartError::Thread`] when
    /// the thread or its runtime cannot start.
    pub fn start_on_own_thread(script: Script) -> Result<Self, StartError> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(StartError::Bind)?;
        listener.set_nonblocking(true).map_err(StartError::Bind)?;
        let addr = listener.local_addr().map_err(StartError::Bind)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StartError::Thread)?;
        let shared = Arc::new(Shared::new(script));
        let served = shared.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("model-server-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    // From a bound std listener in non-blocking mode: fails only without a
                    // reactor, which `enable_all` gives.
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = server::serve(listener, served) => {}
                        _ = stopped => {}
                    }
                });
            })
            .map_err(StartError::Thread)?;
        Ok(Self {
            addr,
            shared,
            stop: Stop::Thread(Some(stop)),
        })
    }

    /// The base URL, `http://127.0.0.1:PORT` (no trailing slash): Converse's endpoint URL and
    /// the Messages API's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The call counts so far (a copy).
    pub fn calls(&self) -> Calls {
        self.shared.state().calls.clone()
    }

    /// Every request received so far, in arrival order (a copy).
    pub fn requests(&self) -> Vec<Request> {
        self.shared.state().requests.clone()
    }

    /// Every request received so far, in arrival order, and forget them (the counts stay):
    /// a long run (the benchmark) keeps its memory flat, a test reads one phase at a time.
    pub fn take_requests(&self) -> Vec<Request> {
        std::mem::take(&mut self.shared.state().requests)
    }

    /// The requests received so far for this model id, in arrival order.
    pub fn requests_for(&self, model_id: &str) -> Vec<Request> {
        self.shared
            .state()
            .requests
            .iter()
            .filter(|r| r.model == model_id)
            .cloned()
            .collect()
    }

    /// Wait until at least `total` calls have arrived (counted on arrival, before their
    /// answer). Unbounded: wrap it in a timeout.
    pub async fn wait_for_calls(&self, total: u64) {
        let mut receiver = self.shared.total.subscribe();
        // The sender lives in `self`: the wait cannot fail while `self` is borrowed.
        let _ = receiver.wait_for(|seen| *seen >= total).await;
    }

    /// Wait until `condition` holds for the call counts (checked now and at each arrival),
    /// e.g. `|calls| calls.model(JUDGE) >= 2`. Unbounded: wrap it in a timeout.
    pub async fn wait_until(&self, condition: impl Fn(&Calls) -> bool) {
        let mut receiver = self.shared.total.subscribe();
        loop {
            // Marked seen before the check: an arrival after it wakes the wait below.
            receiver.borrow_and_update();
            if condition(&self.shared.state().calls) {
                return;
            }
            // The sender lives in `self`: `changed` cannot fail while `self` is borrowed.
            if receiver.changed().await.is_err() {
                return;
            }
        }
    }

    /// Add a rule while running, after the existing ones (see [`Script::on`]).
    pub fn push(&self, when: Match, replies: impl IntoIterator<Item = Reply>) {
        self.shared.state().script.push(when, replies);
    }

    /// Add a standing reply while running, after the existing ones (see [`Script::always`]).
    pub fn push_always(&self, when: Match, reply: Reply) {
        self.shared.state().script.always.push((when, reply));
    }

    /// Replace the default reply (see [`Script::default_reply`]).
    pub fn set_default_reply(&self, reply: Reply) {
        self.shared.state().script.default = reply;
    }

    /// Replace the latency of every answer (see [`Script::latency`]).
    pub fn set_latency(&self, latency: Duration) {
        self.shared.state().script.latency = latency;
    }

    /// Declare a model id unknown from now on (see [`Script::unknown_model`]).
    pub fn add_unknown_model(&self, model_id: impl Into<String>) {
        self.shared
            .state()
            .script
            .unknown_models
            .insert(model_id.into());
    }

    /// Refuse this Messages API key from now on (see [`Script::refuse_key`]).
    pub fn refuse_key(&self, api_key: impl Into<String>) {
        self.shared
            .state()
            .script
            .refused_keys
            .insert(api_key.into());
    }

    /// Accept this Messages API key again.
    pub fn accept_key(&self, api_key: &str) {
        self.shared.state().script.refused_keys.remove(api_key);
    }

    /// The rules with replies left, in order (a copy): what the script still has to say.
    pub fn pending(&self) -> Vec<Rule> {
        self.shared
            .state()
            .script
            .rules
            .iter()
            .filter(|r| !r.replies.is_empty())
            .cloned()
            .collect()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        // Aborting the accept loop drops its listener and its set of connection tasks,
        // which aborts them. The own thread stops serving, and its runtime is dropped with
        // its tasks when the thread ends.
        match &mut self.stop {
            Stop::Task(task) => task.abort(),
            Stop::Thread(stop) => {
                if let Some(stop) = stop.take() {
                    // Err: the thread already ended.
                    let _ = stop.send(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_can_be_shared_between_threads() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<ModelServer>();
        shared::<Script>();
        shared::<Request>();
    }
}
