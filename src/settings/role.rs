//! What one deployment of the binary serves: [`FunctionRole`] (`IRONFLOW_FUNCTION_ROLE`).

use std::fmt;
use std::str::FromStr;

/// The variable naming the function's role.
pub const FUNCTION_ROLE_VAR: &str = "IRONFLOW_FUNCTION_ROLE";

/// What the function serves. The template deploys the same binary twice: the worker, and (with
/// `WebhookReceiver=enabled`) the webhook receiver behind the public Function URL, each with its
/// own concurrency and role, so that URL traffic never takes the worker's capacity
/// (docs/push.md, "Denial of service").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FunctionRole {
    /// `worker` (the default): schedule ticks, wake-ups and direct invocations run batches; a
    /// Function URL request is answered by the receiver as well when a webhook secret is set
    /// (local runs, `cargo lambda watch`, tests).
    #[default]
    Worker,
    /// `webhook-receiver`: Function URL requests only; any other event is refused with an
    /// error naming the role, and the cold start does only what the receiver needs (no child
    /// subreaper, no poison-pill table check).
    WebhookReceiver,
}

impl FunctionRole {
    /// The variable's value for this role.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::WebhookReceiver => "webhook-receiver",
        }
    }
}

impl fmt::Display for FunctionRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value of `IRONFLOW_FUNCTION_ROLE` that names no role.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected worker or webhook-receiver")]
pub struct ParseFunctionRoleError;

impl FromStr for FunctionRole {
    type Err = ParseFunctionRoleError;

    /// `worker` or `webhook-receiver`, case-insensitive, surrounding whitespace ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "worker" => Ok(Self::Worker),
            "webhook-receiver" => Ok(Self::WebhookReceiver),
            _ => Err(ParseFunctionRoleError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_from_their_names_only() {
        for role in [FunctionRole::Worker, FunctionRole::WebhookReceiver] {
            assert_eq!(role.as_str().parse::<FunctionRole>(), Ok(role));
        }
        assert_eq!(
            " Webhook-Receiver ".parse(),
            Ok(FunctionRole::WebhookReceiver)
        );
        for bad in ["", "receiver", "webhook_receiver", "both"] {
            assert!(bad.parse::<FunctionRole>().is_err(), "{bad:?}");
        }
    }
}
