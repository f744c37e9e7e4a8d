//! The real ironflow API, embedded: its router over an in-memory store or a PostgreSQL database
//! ([`Backend`]), served on `127.0.0.1:<free port>`, with its background tasks (reaper,
//! schedule ticker, waker).
//!
//! Used by the local runner (`ironflow-lambda-local`), the tests and the benchmark of
//! ironflow-lambda; the deployable function does not depend on it.

mod backend;
mod delay;
mod function_url;

pub use backend::{Backend, NO_JIT, masked_url};
pub use delay::DelayProxy;
pub use function_url::{FunctionUrl, UrlHandler};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use ironflow_api::routes::{RouterConfig, create_router};
use ironflow_api::state::AppState;
use ironflow_auth::jwt::JwtConfig;
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::engine::{Engine, ExecutionMode};
use ironflow_engine::notify::{Event, WebhookSubscriber};
use ironflow_store::store::Store;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The embedded API could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalApiError {
    /// Its loopback port could not be bound (`port` 0: any free port was asked for).
    #[error(
        "could not start the embedded ironflow API on {}: {source}{}",
        bind_target(*.port),
        bind_hint(.source)
    )]
    Bind {
        /// The port asked for; 0 for any free port.
        port: u16,
        /// Why binding failed (e.g. `AddrInUse`: another process listens there).
        #[source]
        source: std::io::Error,
    },
    /// Its PostgreSQL store could not be reached, created or migrated.
    #[error(
        "the embedded ironflow API could not use the PostgreSQL database {url}: {reason} \
         (expected a reachable server and a URL such as postgres://user:password@host:5432/db)"
    )]
    Database {
        /// The database URL, its password masked ([`masked_url`]).
        url: String,
        /// What failed.
        reason: String,
    },
}

fn bind_target(port: u16) -> String {
    if port == 0 {
        "a free port of 127.0.0.1".to_string()
    } else {
        format!("127.0.0.1:{port}")
    }
}

fn bind_hint(source: &std::io::Error) -> &'static str {
    if source.kind() == std::io::ErrorKind::AddrInUse {
        " (another process listens there: pick another port)"
    } else {
        ""
    }
}

/// Where the embedded API's outbound webhook posts ([`LocalApi::start_with_webhook`]).
#[derive(Debug, Clone)]
pub struct Webhook {
    /// The URL events are posted to (a receiver's, with its `?token=` when it checks one).
    pub url: String,
    /// The HMAC-SHA256 key of the `X-Signature-256` header; `None`: unsigned.
    pub signing_secret: Option<String>,
}

impl Webhook {
    /// The events it posts: those about runs (every type ironflow-lambda's receiver wakes on,
    /// and a few it ignores).
    pub const EVENTS: &'static [&'static str] = &[
        Event::RUN_CREATED,
        Event::RUN_STATUS_CHANGED,
        Event::RUN_FAILED,
        Event::APPROVAL_GRANTED,
        Event::APPROVAL_REJECTED,
        Event::SIGNAL_RECEIVED,
        Event::WORKFLOW_RESUMED,
    ];
}

/// What an API may be started with besides its store.
#[derive(Default)]
struct Extras {
    blob: Option<Arc<dyn ironflow_artifacts::blob_store::BlobStore>>,
    webhook: Option<Webhook>,
}

/// A running embedded API. Stops when dropped.
pub struct LocalApi {
    addr: SocketAddr,
    token: String,
    store: Arc<dyn Store>,
    engine: Arc<Engine>,
    /// The key its sessions are signed with ([`LocalApi::admin_bearer`]).
    jwt: Arc<JwtConfig>,
    requests: Arc<AtomicU64>,
    routes: Arc<Mutex<BTreeMap<String, u64>>>,
    background: CancellationToken,
    server: JoinHandle<()>,
    /// The runtime of its own it was started on ([`LocalApi::start_apart`]), if any.
    runtime: Option<tokio::runtime::Runtime>,
}

impl LocalApi {
    /// Start the API with `worker_token` as its worker token.
    ///
    /// # Errors
    ///
    /// [`LocalApiError`] when no loopback port can be bound.
    pub async fn start(worker_token: &str) -> Result<Self, LocalApiError> {
        Self::start_with(worker_token, &Backend::Memory, Extras::default(), 0).await
    }

    /// Start the API over `backend`'s store.
    ///
    /// # Errors
    ///
    /// [`LocalApiError`] when no loopback port can be bound, or the database cannot be used.
    pub async fn start_on(worker_token: &str, backend: &Backend) -> Result<Self, LocalApiError> {
        Self::start_with(worker_token, backend, Extras::default(), 0).await
    }

    /// Start the API over `backend` on `127.0.0.1:port` (for `ironflow-lambda-local --serve`).
    ///
    /// # Errors
    ///
    /// [`LocalApiError`] when the port cannot be bound (already in use).
    pub async fn start_on_port(
        worker_token: &str,
        backend: &Backend,
        port: u16,
    ) -> Result<Self, LocalApiError> {
        Self::start_with(worker_token, backend, Extras::default(), port).await
    }

    /// Start the API with artifact storage in `dir` (a local blob store), so that steps can
    /// upload their declared outputs.
    ///
    /// # Errors
    ///
    /// [`LocalApiError`] when no loopback port can be bound.
    pub async fn start_with_artifacts(
        worker_token: &str,
        dir: &std::path::Path,
    ) -> Result<Self, LocalApiError> {
        let blob = Arc::new(ironflow_artifacts::local::LocalBlobStore::new(dir));
        let extras = Extras {
            blob: Some(blob),
            ..Extras::default()
        };
        Self::start_with(worker_token, &Backend::Memory, extras, 0).await
    }

    /// Start the API over `backend` with its outbound webhook (`WEBHOOK_URL` of a deployed
    /// API) posting the events that concern runs to `webhook.url`, signed with HMAC-SHA256
    /// (`X-Signature-256`) when `webhook.signing_secret` is set, as ironflow-engine's
    /// `WebhookSubscriber` does.
    ///
    /// # Errors
    ///
    /// [`LocalApiError`] when no loopback port can be bound, or the database cannot be used.
    pub async fn start_with_webhook(
        worker_token: &str,
        backend: &Backend,
        webhook: Webhook,
    ) -> Result<Self, LocalApiError> {
        let extras = Extras {
            webhook: Some(webhook),
            ..Extras::default()
        };
        Self::start_with(worker_token, backend, extras, 0).await
    }

    async fn start_with(
        worker_token: &str,
        backend: &Backend,
        extras: Extras,
        port: u16,
    ) -> Result<Self, LocalApiError> {
        let store = backend.store().await?;
        // Workers execute the runs (this API registers no handler): a run woken by a signal or
        // an approval goes back to Pending for a worker to claim.
        let mut engine = Engine::new(store.clone(), Arc::new(ClaudeCodeProvider::new()))
            .with_execution_mode(ExecutionMode::Workers);
        if let Some(webhook) = &extras.webhook {
            let subscriber = match &webhook.signing_secret {
                Some(secret) => WebhookSubscriber::with_signing_secret(&webhook.url, secret),
                None => WebhookSubscriber::new(&webhook.url),
            };
            engine.subscribe(subscriber, Webhook::EVENTS);
        }
        let engine = Arc::new(engine);
        let jwt = Arc::new(JwtConfig {
            secret: uuid::Uuid::new_v4().to_string(),
            access_token_ttl_secs: 900,
            refresh_token_ttl_secs: 604_800,
            cookie_domain: None,
            cookie_secure: false,
        });
        let (events, _) = broadcast::channel::<Event>(1024);
        let mut state = AppState::new(
            store.clone(),
            engine.clone(),
            jwt.clone(),
            worker_token.to_string(),
            events,
        );
        if let Some(blob) = extras.blob {
            state = state.with_blob_store(blob);
        }
        let background = state.spawn_background_tasks().await;

        let requests = Arc::new(AtomicU64::new(0));
        let routes: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let (counter, per_route) = (requests.clone(), routes.clone());
        let config = RouterConfig {
            rate_limit_auth: None,
            rate_limit_general: None,
            ..RouterConfig::default()
        };
        let app = create_router(state, config).layer(middleware::from_fn(
            move |req: Request, next: Next| {
                let counter = counter.clone();
                let route = format!(
                    "{} {}",
                    req.method(),
                    req.extensions()
                        .get::<MatchedPath>()
                        .map_or("(unmatched)", MatchedPath::as_str)
                );
                *per_route
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(route)
                    .or_default() += 1;
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let response: Response = next.run(req).await;
                    response
                }
            },
        ));
        let bind_error = |source| LocalApiError::Bind { port, source };
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            token: worker_token.to_string(),
            store,
            engine,
            jwt,
            requests,
            routes,
            background,
            server,
            runtime: None,
        })
    }

    /// Start the API on a runtime of its own with `threads` worker threads, as a separate API
    /// server would run: no client of it shares its threads (the benchmark's setting, where
    /// the workers compared must not share the API's runtime).
    ///
    /// # Errors
    ///
    /// [`LocalApiError`] when the runtime cannot start or no loopback port can be bound.
    pub async fn start_apart(
        worker_token: &str,
        backend: &Backend,
        threads: usize,
    ) -> Result<Self, LocalApiError> {
        let failed = |source| LocalApiError::Bind { port: 0, source };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("local-api")
            .enable_all()
            .build()
            .map_err(failed)?;
        let (token, backend) = (worker_token.to_string(), backend.clone());
        let started = runtime
            .spawn(async move { Self::start_with(&token, &backend, Extras::default(), 0).await })
            .await
            .map_err(|e| failed(std::io::Error::other(e)))?;
        let mut api = started?;
        api.runtime = Some(runtime);
        Ok(api)
    }

    /// The API's base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The worker token the API accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The API's own store, to inspect runs and steps directly.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Run one pass of the API's lease reaper now (its own runs every 60 s): runs whose lease
    /// expired go back to Pending with their running steps interrupted, or are failed once
    /// their lease expired more times than their `max_retries`.
    pub async fn reap(&self) {
        ironflow_api::reaper::Reaper::new(self.store.clone(), self.engine.clone())
            .tick()
            .await;
    }

    /// Run the API's lease reaper every `interval` (its own runs every 60 s), until the
    /// returned handle is dropped.
    pub fn start_reaper(
        &self,
        interval: std::time::Duration,
    ) -> tokio_util::task::AbortOnDropHandle<()> {
        let reaper = ironflow_api::reaper::Reaper::new(self.store.clone(), self.engine.clone())
            .interval(interval);
        let stop = self.background.child_token();
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(reaper.run(stop)))
    }

    /// Pause `run_id` as an operator does through the API (`POST /api/v1/runs/{id}/pause`:
    /// ironflow-engine's `pause_run`, which marks its running steps interrupted).
    ///
    /// # Errors
    ///
    /// The engine's, e.g. a run that cannot be paused from its status.
    pub async fn pause_run(
        &self,
        run_id: uuid::Uuid,
    ) -> Result<(), ironflow_engine::error::EngineError> {
        self.engine.pause_run(run_id).await.map(|_| ())
    }

    /// Resume a paused run, as an operator does (`resume_paused_run`: back to the status it
    /// was paused from, `Pending` for a run paused while Running), for tests.
    ///
    /// # Errors
    ///
    /// The engine's, e.g. a run that is not paused.
    pub async fn resume_run(
        &self,
        run_id: uuid::Uuid,
    ) -> Result<(), ironflow_engine::error::EngineError> {
        self.engine.resume_paused_run(run_id).await.map(|_| ())
    }

    /// An `Authorization` header value for the API's public routes (`/api/v1/runs/...`), as an
    /// operator signed in: a new admin user (`admin-<uuid>`) and an access token for it, signed
    /// with the API's session key (valid 15 min). For tests of the routes a human calls
    /// (approvals, human inputs).
    ///
    /// # Errors
    ///
    /// The store's, when the user cannot be created, or the token's, as text.
    pub async fn admin_bearer(&self) -> Result<String, String> {
        let name = format!("admin-{}", uuid::Uuid::new_v4().simple());
        let user = self
            .store
            .create_user(ironflow_store::entities::NewUser {
                email: format!("{name}@example.com"),
                username: name,
                // Never signed in with: the token is minted here.
                password_hash: String::new(),
                is_admin: Some(true),
            })
            .await
            .map_err(|e| e.to_string())?;
        let token = ironflow_auth::jwt::AccessToken::for_user_with_version(
            user.id,
            &user.username,
            true,
            user.token_version,
            &self.jwt,
        )
        .map_err(|e| e.to_string())?;
        Ok(format!("Bearer {}", token.0))
    }

    /// HTTP requests the API has received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// HTTP requests the API has received so far, per route: `"<METHOD> <route template>"`
    /// (e.g. `"POST /api/v1/internal/runs/{id}/lease"`), `"<METHOD> (unmatched)"` for a
    /// path no route serves.
    pub fn requests_by_route(&self) -> BTreeMap<String, u64> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for LocalApi {
    fn drop(&mut self) {
        self.background.cancel();
        self.server.abort();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A [`NewRun`](ironflow_store::entities::NewRun) of `workflow` with an empty payload, created
/// manually, with `max_retries` retries.
pub fn new_run(workflow: &str, max_retries: u32) -> ironflow_store::entities::NewRun {
    ironflow_store::entities::NewRun {
        workflow_name: workflow.to_string(),
        trigger: ironflow_store::entities::TriggerKind::Manual,
        payload: serde_json::json!({}),
        max_retries,
        handler_version: None,
        labels: Default::default(),
        scheduled_at: None,
        created_by: None,
        idempotency_key: None,
        concurrency_key: None,
        concurrency_limits: Vec::new(),
        max_cost_usd: None,
        priority: 0,
        worker_tags: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_busy_port_is_named_in_the_error() {
        let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let Err(err) = LocalApi::start_on_port("token", &Backend::Memory, port).await else {
            panic!("the API started on a port already bound");
        };
        let text = err.to_string();
        assert!(matches!(err, LocalApiError::Bind { port: p, .. } if p == port));
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        assert!(text.contains("another process listens there"), "{text}");
    }

    #[tokio::test]
    async fn an_unreachable_database_is_named_with_its_password_masked_and_the_reason() {
        // A port nothing listens on: bound, then released.
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("postgres://app:s3cr3t@127.0.0.1:{port}/runs");
        let backend = Backend::Postgres { url };
        let Err(err) = LocalApi::start_on("token", &backend).await else {
            panic!("the API started on a database nobody serves");
        };
        let text = err.to_string();
        assert!(matches!(err, LocalApiError::Database { .. }), "{text}");
        assert!(
            text.contains(&format!("postgres://app:****@127.0.0.1:{port}/runs")),
            "{text}"
        );
        assert!(
            text.contains("refused"),
            "the reason, not a pool timeout: {text}"
        );
        assert!(!text.contains("s3cr3t"), "{text}");
    }
}
