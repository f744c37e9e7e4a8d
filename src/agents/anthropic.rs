//! [`AnthropicSecretProvider`]: the Anthropic Messages API with its key from Secrets Manager.

/// The Anthropic Messages API (ironflow-core's `AnthropicApiProvider`) with its key read from
/// Secrets Manager. Work in progress.
#[derive(Debug)]
pub struct AnthropicSecretProvider;
