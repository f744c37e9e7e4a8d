//! The worker token (and the webhook receiver's secret) from AWS Secrets Manager, read once
//! per cold start.
//!
//! The deployed function gets `IRONFLOW_WORKER_TOKEN_SECRET_ARN` (the template sets it) instead of
//! the token itself: the token never sits in the template, in the function's configuration or in
//! a plain environment variable. [`worker_token_from_lookup`] fetches the secret's `SecretString`
//! with `GetSecretValue` when `IRONFLOW_WORKER_TOKEN` is unset and the ARN is set; a token given
//! in `IRONFLOW_WORKER_TOKEN` (local runs, tests) wins and no AWS call is made.
//!
//! The webhook receiver's secret comes the same way ([`webhook_secret_from_lookup`]):
//! `IRONFLOW_WEBHOOK_SECRET_ARN`, unless `IRONFLOW_WEBHOOK_SECRET` is set.
//!
//! The Anthropic API key comes the same way ([`anthropic_key_from_lookup`]):
//! `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`, read at cold start, and again when the API refuses
//! the key ([`crate::AnthropicSecretProvider`]).
//!
//! Errors name the variable and the secret's ARN, and the AWS error; never the secret's value.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_secretsmanager::config::timeout::TimeoutConfig;
use aws_sdk_secretsmanager::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueError;
use tracing::warn;

use crate::settings::{
    ANTHROPIC_API_KEY_SECRET_ARN_VAR, SECRET_ARN_EXPECTED, WEBHOOK_SECRET_ARN_VAR,
    WEBHOOK_SECRET_VAR, WORKER_TOKEN_SECRET_ARN_VAR, WORKER_TOKEN_VAR, WebhookSecret, WorkerToken,
    is_secret_arn, is_token,
};

/// Bounds of the cold start's `GetSecretValue` (with the SDK's standard retries): a stuck call
/// fails with an error naming the secret well within Lambda's 10 s init phase, instead of
/// running into it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(6);

/// The worker token could not be read from Secrets Manager.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    /// A `*_SECRET_ARN` variable is set to something that is not a Secrets Manager ARN. The
    /// value is never shown: a secret pasted there by mistake would be in the log.
    #[error(
        "environment variable {variable} is invalid: expected {SECRET_ARN_EXPECTED} (not shown: it may be a secret pasted by mistake)"
    )]
    InvalidArn {
        /// The variable's name.
        variable: &'static str,
    },
    /// `GetSecretValue` failed: missing permission, unknown secret, KMS key refused, network.
    #[error("could not read secret {secret_arn} ({variable}): {reason}")]
    Fetch {
        /// The variable that named the secret.
        variable: &'static str,
        /// The secret's ARN.
        secret_arn: String,
        /// The AWS error (code and message), never the secret's value.
        reason: String,
    },
    /// The secret's value cannot serve: it is not what the variable needs (never shown).
    #[error("secret {secret_arn} ({variable}) cannot serve: expected {expected} (not shown)")]
    Unusable {
        /// The variable that named the secret.
        variable: &'static str,
        /// The secret's ARN.
        secret_arn: String,
        /// What its value must be.
        expected: &'static str,
    },
    /// The secret holds binary data, or nothing but whitespace, instead of the token as a string.
    #[error(
        "secret {secret_arn} ({variable}) has no usable SecretString: store the value as the \
         secret's string (aws secretsmanager put-secret-value --secret-string ...)"
    )]
    NotAString {
        /// The variable that named the secret.
        variable: &'static str,
        /// The secret's ARN.
        secret_arn: String,
    },
}

/// The Secrets Manager secret that holds the worker token, with a client to read it: read at
/// cold start, and again when the API refuses the token a warm instance holds (it was rotated,
/// see [`crate::credentials`]).
#[derive(Clone, Debug)]
pub struct TokenSecret {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
}

impl TokenSecret {
    /// The secret's ARN.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// Read the token now (one bounded `GetSecretValue`, see [`fetch_worker_token`]).
    ///
    /// # Errors
    ///
    /// As [`fetch_worker_token`].
    pub async fn read(&self) -> Result<WorkerToken, SecretError> {
        fetch_worker_token(&self.client, &self.arn).await
    }
}

/// An API key read from Secrets Manager. `Debug` shows `***`; made, it is redacted from every log
/// line ([`crate::logging::redact`]).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wrap a key, registering it for redaction.
    pub fn new(key: impl Into<String>) -> Self {
        let key = key.into();
        crate::logging::redact(&key);
        Self(key)
    }

    /// The key itself, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// The keys a key/value Anthropic secret may hold the key under.
const ANTHROPIC_KEYS: &[&str] = &["api_key", "key", "ANTHROPIC_API_KEY"];

/// The Secrets Manager secret that holds the Anthropic API key, with a client to read it: read
/// at cold start, and again when the API refuses the key (it was rotated).
#[derive(Clone, Debug)]
pub struct ApiKeySecret {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
}

impl ApiKeySecret {
    /// The secret `arn`, read with a bounded client of `aws` (as the worker token's).
    ///
    /// # Errors
    ///
    /// [`SecretError::InvalidArn`] when `arn` is not a Secrets Manager ARN.
    pub fn new(aws: &SdkConfig, arn: &str) -> Result<Self, SecretError> {
        let arn = arn.trim();
        if !is_secret_arn(arn) {
            return Err(SecretError::InvalidArn {
                variable: ANTHROPIC_API_KEY_SECRET_ARN_VAR,
            });
        }
        Ok(Self {
            client: bounded_client(aws),
            arn: arn.to_string(),
        })
    }

    /// The secret's ARN.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// Read the key now (one bounded `GetSecretValue`; a key/value secret gives its `api_key`,
    /// `key` or `ANTHROPIC_API_KEY`, or its only value).
    ///
    /// # Errors
    ///
    /// As [`fetch_worker_token`], naming `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`.
    pub async fn read(&self) -> Result<ApiKey, SecretError> {
        let variable = ANTHROPIC_API_KEY_SECRET_ARN_VAR;
        let value = fetch_string(&self.client, variable, &self.arn, ANTHROPIC_KEYS).await?;
        if !is_token(&value) {
            return Err(SecretError::Unusable {
                variable,
                secret_arn: self.arn.clone(),
                expected: "visible ASCII without spaces or line breaks (it is sent as a header)",
            });
        }
        Ok(ApiKey::new(value))
    }
}

/// The Anthropic API key from `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`, read with `lookup` and
/// `aws` as [`worker_token_from_lookup`] does, and the secret it came from; `Ok(None)` without
/// any AWS call when the variable is unset or blank.
///
/// # Errors
///
/// As [`ApiKeySecret::new`] and [`ApiKeySecret::read`].
pub async fn anthropic_key_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
    aws: &SdkConfig,
) -> Result<Option<(ApiKey, ApiKeySecret)>, SecretError> {
    let Some(arn) = lookup(ANTHROPIC_API_KEY_SECRET_ARN_VAR).filter(|v| !v.trim().is_empty())
    else {
        return Ok(None);
    };
    let secret = ApiKeySecret::new(aws, &arn)?;
    let key = secret.read().await?;
    Ok(Some((key, secret)))
}

/// The worker token to use instead of `IRONFLOW_WORKER_TOKEN`, fetched from Secrets Manager,
/// and the secret it came from.
///
/// `lookup` reads variables (the process environment at cold start, a map in tests); `aws` is
/// the shared AWS configuration (region, credentials, endpoint) loaded once per cold start.
///
/// The call is bounded: 1 s to connect, 2 s per attempt, 6 s in all (retries included).
///
/// Returns `Ok(None)` without any AWS call when `IRONFLOW_WORKER_TOKEN` is set (it wins) or
/// when neither variable is set (the settings then report the missing token).
///
/// # Errors
///
/// [`SecretError::InvalidArn`] when `IRONFLOW_WORKER_TOKEN_SECRET_ARN` is not a Secrets
/// Manager ARN, [`SecretError::Fetch`] when `GetSecretValue` fails, and
/// [`SecretError::NotAString`] when the secret has no non-blank `SecretString`.
pub async fn worker_token_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
    aws: &SdkConfig,
) -> Result<Option<(WorkerToken, TokenSecret)>, SecretError> {
    let Some(secret_arn) = arn_to_read(&lookup, WORKER_TOKEN_VAR, WORKER_TOKEN_SECRET_ARN_VAR)?
    else {
        return Ok(None);
    };
    let secret = TokenSecret {
        client: bounded_client(aws),
        arn: secret_arn,
    };
    let token = secret.read().await?;
    Ok(Some((token, secret)))
}

/// Read the worker token from the `SecretString` of the secret `secret_arn` (one
/// `GetSecretValue` call; surrounding whitespace, such as a trailing newline, is dropped).
///
/// # Errors
///
/// [`SecretError::Fetch`] when the call fails, [`SecretError::NotAString`] when the secret
/// has no non-blank `SecretString`, [`SecretError::Unusable`] when its value is not what
/// `IRONFLOW_WORKER_TOKEN` accepts (a space, a line break or a control character inside: every
/// request would fail).
pub async fn fetch_worker_token(
    client: &aws_sdk_secretsmanager::Client,
    secret_arn: &str,
) -> Result<WorkerToken, SecretError> {
    let value = fetch_string(client, WORKER_TOKEN_SECRET_ARN_VAR, secret_arn, TOKEN_KEYS).await?;
    if !is_token(&value) {
        return Err(SecretError::Unusable {
            variable: WORKER_TOKEN_SECRET_ARN_VAR,
            secret_arn: secret_arn.to_string(),
            expected: "visible ASCII without spaces or line breaks (it is sent as a bearer token)",
        });
    }
    Ok(WorkerToken::new(value))
}

/// The keys a key/value webhook secret may hold it under.
const WEBHOOK_KEYS: &[&str] = &["secret", "webhook_secret", WEBHOOK_SECRET_VAR];
/// What the webhook secret's value must be.
const WEBHOOK_EXPECTED: &str = "at least 32 visible ASCII characters without spaces";

/// The webhook secret's versions the receiver accepts: Secrets Manager's `AWSCURRENT` and,
/// during a rotation, `AWSPREVIOUS` (docs/push.md, "Rotating the secret"). `Debug` shows
/// neither.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookVersions {
    /// The `AWSCURRENT` version.
    pub current: WebhookSecret,
    /// The `AWSPREVIOUS` version, when the secret has one that can serve.
    pub previous: Option<WebhookSecret>,
}

/// The Secrets Manager secret that holds the webhook secret, with a client to read it: read at
/// cold start, and again (rate-limited) when a request matches none of the versions held
/// ([`crate::webhook`]): the secret may have been rotated.
#[derive(Clone, Debug)]
pub struct WebhookSecretSource {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
}

impl WebhookSecretSource {
    /// The secret's ARN.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// Read the `AWSCURRENT` and `AWSPREVIOUS` versions now (two bounded `GetSecretValue`
    /// calls). A previous version that does not exist, or cannot serve (too short), is `None`
    /// (the latter logged without its value).
    ///
    /// # Errors
    ///
    /// [`SecretError::Fetch`] when a call fails (the previous version's included: a re-read
    /// keeps the versions held then), [`SecretError::NotAString`] and
    /// [`SecretError::Unusable`] when the current version cannot serve.
    pub async fn read(&self) -> Result<WebhookVersions, SecretError> {
        let current = self.read_current().await?;
        let previous = self.read_previous().await?;
        Ok(self.versions(current, previous))
    }

    /// The `AWSCURRENT` version.
    async fn read_current(&self) -> Result<WebhookSecret, SecretError> {
        let value = fetch_string(
            &self.client,
            WEBHOOK_SECRET_ARN_VAR,
            &self.arn,
            WEBHOOK_KEYS,
        )
        .await?;
        let current = WebhookSecret::new(value);
        if !current.is_usable() {
            return Err(SecretError::Unusable {
                variable: WEBHOOK_SECRET_ARN_VAR,
                secret_arn: self.arn.clone(),
                expected: WEBHOOK_EXPECTED,
            });
        }
        Ok(current)
    }

    /// `current` with `previous` when it can serve (one that cannot is logged, not shown).
    fn versions(&self, current: WebhookSecret, previous: Option<String>) -> WebhookVersions {
        let previous = match previous.map(WebhookSecret::new) {
            Some(p) if !p.is_usable() => {
                tracing::warn!(secret_arn = %self.arn, "the webhook secret's AWSPREVIOUS version cannot serve ({WEBHOOK_EXPECTED}; not shown): only AWSCURRENT is accepted");
                None
            }
            p => p.filter(|p| *p != current),
        };
        WebhookVersions { current, previous }
    }

    /// The `AWSPREVIOUS` version's value, `None` when the secret has none.
    async fn read_previous(&self) -> Result<Option<String>, SecretError> {
        let answer = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .version_stage("AWSPREVIOUS")
            .send()
            .await;
        match answer {
            Ok(output) => Ok(output
                .secret_string()
                .map(|s| token_from_secret_string(s, WEBHOOK_KEYS))
                .filter(|v| !v.is_empty())),
            Err(SdkError::ServiceError(e)) if e.err().is_resource_not_found_exception() => Ok(None),
            Err(err) => Err(SecretError::Fetch {
                variable: WEBHOOK_SECRET_ARN_VAR,
                secret_arn: self.arn.clone(),
                reason: describe(&err),
            }),
        }
    }
}

/// The webhook receiver's secret from `IRONFLOW_WEBHOOK_SECRET_ARN` (its current and previous
/// versions, as [`WebhookSecretSource::read`] reads them, except that a previous version that
/// cannot be read is logged and left out; bounded as for the worker token), read with
/// `lookup` and `aws` as [`worker_token_from_lookup`] does, and the secret they came from.
/// `Ok(None)` without any AWS call when `IRONFLOW_WEBHOOK_SECRET` is set (it wins) or when
/// neither is set (the receiver is off).
///
/// # Errors
///
/// As [`worker_token_from_lookup`], naming `IRONFLOW_WEBHOOK_SECRET_ARN`.
pub async fn webhook_secret_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
    aws: &SdkConfig,
) -> Result<Option<(WebhookVersions, WebhookSecretSource)>, SecretError> {
    let Some(secret_arn) = arn_to_read(&lookup, WEBHOOK_SECRET_VAR, WEBHOOK_SECRET_ARN_VAR)? else {
        return Ok(None);
    };
    let source = WebhookSecretSource {
        client: bounded_client(aws),
        arn: secret_arn,
    };
    // At cold start only the current version is required: a previous one that cannot be read
    // is logged and left out (the receiver then takes the current one only).
    let current = source.read_current().await?;
    let previous = source.read_previous().await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the webhook secret's AWSPREVIOUS version could not be read: only AWSCURRENT is accepted");
        None
    });
    let versions = source.versions(current, previous);
    Ok(Some((versions, source)))
}

/// The ARN in `arn_var` to read a value from, unless `value_var` holds the value itself (it
/// wins) or neither is set (`None`, without any AWS call); blank values count as unset.
///
/// # Errors
///
/// [`SecretError::InvalidArn`], naming `arn_var`, when it is not a Secrets Manager ARN.
fn arn_to_read(
    lookup: &impl Fn(&str) -> Option<String>,
    value_var: &str,
    arn_var: &'static str,
) -> Result<Option<String>, SecretError> {
    let get = |name: &str| {
        lookup(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if get(value_var).is_some() {
        if get(arn_var).is_some() {
            warn!(
                variable = value_var,
                ignored = arn_var,
                "both are set: the value is used, and the secret (and its rotations) ignored; \
                 unset one of them"
            );
        }
        return Ok(None);
    }
    match get(arn_var) {
        Some(arn) if !is_secret_arn(&arn) => Err(SecretError::InvalidArn { variable: arn_var }),
        arn => Ok(arn),
    }
}

/// A Secrets Manager client whose calls are bounded (see the constants).
fn bounded_client(aws: &SdkConfig) -> aws_sdk_secretsmanager::Client {
    let config = aws_sdk_secretsmanager::config::Builder::from(aws)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                .operation_timeout(OPERATION_TIMEOUT)
                .build(),
        )
        .build();
    aws_sdk_secretsmanager::Client::from_conf(config)
}

/// The keys a key/value worker-token secret may hold it under.
const TOKEN_KEYS: &[&str] = &["token", "worker_token", WORKER_TOKEN_VAR];

/// The value in the `SecretString` of `secret_arn` (named by `variable`), as
/// [`token_from_secret_string`] reads it with `keys`.
async fn fetch_string(
    client: &aws_sdk_secretsmanager::Client,
    variable: &'static str,
    secret_arn: &str,
    keys: &[&str],
) -> Result<String, SecretError> {
    let output = client
        .get_secret_value()
        .secret_id(secret_arn)
        .send()
        .await
        .map_err(|err| SecretError::Fetch {
            variable,
            secret_arn: secret_arn.to_string(),
            reason: describe(&err),
        })?;
    match output
        .secret_string()
        .map(|s| token_from_secret_string(s, keys))
    {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(SecretError::NotAString {
            variable,
            secret_arn: secret_arn.to_string(),
        }),
    }
}

/// The value in a secret's `SecretString`: the string itself, or, for a key/value secret
/// (the console's default, a JSON object), the value of its first key of `keys` (for the
/// worker token `token`, `worker_token`, `IRONFLOW_WORKER_TOKEN`), or of its only key.
fn token_from_secret_string(secret: &str, keys: &[&str]) -> String {
    let trimmed = secret.trim();
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(trimmed) {
        let named = keys
            .iter()
            .find_map(|k| map.get(*k).and_then(serde_json::Value::as_str));
        let only = (map.len() == 1)
            .then(|| map.values().next().and_then(serde_json::Value::as_str))
            .flatten();
        if let Some(value) = named.or(only) {
            return value.trim().to_string();
        }
    }
    trimmed.to_string()
}

#[cfg(test)]
#[test]
fn key_value_secrets_give_their_token() {
    assert_eq!(
        token_from_secret_string(" plain-token \n", TOKEN_KEYS),
        "plain-token"
    );
    assert_eq!(
        token_from_secret_string(r#"{"token":"t1"}"#, TOKEN_KEYS),
        "t1"
    );
    assert_eq!(
        token_from_secret_string(r#"{"anything":"t2"}"#, TOKEN_KEYS),
        "t2"
    );
    assert_eq!(
        token_from_secret_string(r#"{"a":"x","worker_token":"t3"}"#, TOKEN_KEYS),
        "t3"
    );
}

/// The AWS error without anything the response body may hold: a response that arrived but
/// could not be parsed may carry the secret, so only its status is told.
fn describe(err: &SdkError<GetSecretValueError>) -> String {
    match err {
        SdkError::ServiceError(service) => format!(
            "{}: {} (HTTP {})",
            service.err().code().unwrap_or("unknown error"),
            service.err().message().unwrap_or("no message"),
            service.raw().status().as_u16()
        ),
        SdkError::ResponseError(response) => format!(
            "the response from Secrets Manager could not be read (HTTP {})",
            response.raw().status().as_u16()
        ),
        other => DisplayErrorContext(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_arns_are_recognised() {
        assert!(is_secret_arn(
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ironflow/worker-token-AbC123"
        ));
        assert!(is_secret_arn(
            "arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:t-AbC123"
        ));
        for bad in [
            "ironflow/worker-token",
            "arn:aws:ssm:eu-west-1:123456789012:parameter/token",
            "arn:aws:secretsmanager:eu-west-1:1234:secret:t",
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:",
        ] {
            assert!(!is_secret_arn(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_plain_token_wins_and_no_secret_is_fetched() {
        // An endpoint nothing listens on: any AWS call would fail.
        let aws = aws_config::SdkConfig::builder()
            .endpoint_url("http://127.0.0.1:1")
            .build();
        let lookup = |name: &str| match name {
            WORKER_TOKEN_VAR => Some("plain".to_string()),
            WORKER_TOKEN_SECRET_ARN_VAR => {
                Some("arn:aws:secretsmanager:eu-west-1:123456789012:secret:t-AbC123".to_string())
            }
            _ => None,
        };
        assert!(matches!(
            worker_token_from_lookup(lookup, &aws).await,
            Ok(None)
        ));
        assert!(matches!(
            worker_token_from_lookup(|_| None, &aws).await,
            Ok(None)
        ));
    }

    #[tokio::test]
    async fn a_name_instead_of_an_arn_is_refused_before_any_call() {
        let aws = aws_config::SdkConfig::builder().build();
        let lookup = |name: &str| {
            (name == WORKER_TOKEN_SECRET_ARN_VAR).then(|| "ironflow/worker-token".to_string())
        };
        let err = worker_token_from_lookup(lookup, &aws).await.unwrap_err();
        assert!(
            err.to_string().contains(WORKER_TOKEN_SECRET_ARN_VAR),
            "{err}"
        );
    }
}
