//! Agent providers that work inside a Lambda function, where there is no `claude` CLI and no
//! place for a long-lived key: [`BedrockProvider`] (Amazon Bedrock's Converse API, signed by the
//! function's role) and [`AnthropicSecretProvider`] (the Anthropic Messages API, its key read
//! from Secrets Manager). Register one on the worker with
//! [`LambdaWorkerBuilder::provider`](crate::LambdaWorkerBuilder::provider). Which to use, the
//! time limits and the IAM setup: the repository's `docs/agents.md`; the module map:
//! [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

mod anthropic;
mod attempts;
mod bedrock;
pub(crate) mod budget;
mod calls;
mod converse;
mod document;
pub(crate) mod pricing;
mod schema;
mod session;
mod tools;
mod trace;

pub use anthropic::{AnthropicSecretProvider, REREAD_AT_MOST_EVERY};
pub use bedrock::{BEDROCK_HAIKU, BEDROCK_OPUS, BedrockProvider, DEFAULT_BEDROCK_MODEL};
