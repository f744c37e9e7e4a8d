//! The secrets among the settings (the worker token, the webhook secret) as newtypes that never
//! print themselves, and the variables an operator sets them with.

use std::fmt;

use super::table;

/// The environment variable naming the secret that holds the worker token: the secret's ARN
/// (`arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-SUFFIX`). Its `SecretString` is the token.
pub const WORKER_TOKEN_SECRET_ARN_VAR: &str = table::WORKER_TOKEN_SECRET_ARN.variable;
/// The environment variable holding the worker token itself.
pub const WORKER_TOKEN_VAR: &str = table::WORKER_TOKEN.variable;
/// The API's worker token. Its `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerToken(String);

impl WorkerToken {
    /// Wrap a token; from now on it is redacted from every log line the crate writes.
    pub fn new(token: impl Into<String>) -> Self {
        let token = token.into();
        crate::logging::redact(&token);
        Self(token)
    }

    /// The token itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for WorkerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkerToken(***)")
    }
}

impl fmt::Display for WorkerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The variable naming the Secrets Manager secret that holds the Anthropic API key
/// ([`crate::AnthropicSecretProvider`]).
pub const ANTHROPIC_API_KEY_SECRET_ARN_VAR: &str = table::ANTHROPIC_API_KEY_SECRET_ARN.variable;

/// The variable holding the webhook receiver's secret itself.
pub const WEBHOOK_SECRET_VAR: &str = table::WEBHOOK_SECRET.variable;
/// The variable naming the Secrets Manager secret that holds it.
pub const WEBHOOK_SECRET_ARN_VAR: &str = table::WEBHOOK_SECRET_ARN.variable;
/// The shortest webhook secret accepted: 32 characters (it may travel in the URL).
pub const MIN_WEBHOOK_SECRET_LEN: usize = 32;

/// The secret the ironflow API's webhook proves itself with (`docs/push.md`): the key of
/// its `X-Signature-256` HMAC, or the token in the URL it is configured with. Its `Debug` and
/// `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(String);

impl WebhookSecret {
    /// Wrap a secret; from now on it is redacted from every log line
    pub fn new(secret: impl Into<String>) -> Self {
        let secret = secret.into();
        crate::logging::redact(&secret);
        Self(secret)
    }

    /// The secret itself, for the receiver's checks only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it can serve: at least [`MIN_WEBHOOK_SECRET_LEN`] visible ASCII characters
    /// (no spaces: it may travel in a URL).
    pub fn is_usable(&self) -> bool {
        self.0.len() >= MIN_WEBHOOK_SECRET_LEN && self.0.chars().all(|c| c.is_ascii_graphic())
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

impl fmt::Display for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}
