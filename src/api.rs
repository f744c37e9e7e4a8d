//! Our own client for the internal API routes `ApiRunStore` does not cover (or keeps private
//! in the reference worker): log pushing, the artifact sink, the pending-run count that sizes
//! wake-ups, and the probe that explains a refused claim.
//!
//! One [`ApiClient`] is built per cold start, beside `ApiRunStore`, from the same
//! `IRONFLOW_API_URL` and worker token.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

pub mod artifacts;
pub mod diagnose;
pub mod logs;
pub mod pending;

use std::sync::Arc;
use std::time::Duration;

use crate::credentials::Credentials;

/// Timeout of one JSON call of ours (log push), 10 s; artifact transfers have none (bulk).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client could not be built (TLS backend initialisation).
#[derive(Debug, thiserror::Error)]
#[error("could not build the API HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

/// Base URL, worker token and a pooled HTTP client (rustls with aws-lc, the Mozilla roots of
/// `webpki-roots`). Each request carries the current token of [`Credentials`].
#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base_url: String,
    credentials: Arc<Credentials>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("base_url", &self.base_url)
            .field("token", &self.credentials.token())
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// A client for the API at `base_url` (trailing `/` ignored). Installs rustls' aws-lc
    /// provider as the process's default crypto provider if none is installed yet: the provider
    /// the AWS SDKs and ironflow-core use already, so that no second rustls crypto library
    /// (ring) is linked.
    ///
    /// # Errors
    ///
    /// [`ClientError`] when the TLS backend cannot be initialised.
    pub fn new(base_url: &str, credentials: Arc<Credentials>) -> Result<Self, ClientError> {
        // Err: a default is installed already (a second client, or the embedding program's
        // choice), which reqwest then uses.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
            credentials,
        })
    }

    /// The underlying HTTP client, without the token (for the heartbeat).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `<base>/api/v1/internal<path>`.
    pub(crate) fn internal(&self, path: &str) -> String {
        format!("{}/api/v1/internal{path}", self.base_url)
    }

    /// A request to `url` carrying the worker token.
    pub(crate) fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .bearer_auth(self.credentials.token().expose())
    }
}
