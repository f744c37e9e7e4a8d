//! A step's `AgentConfig` as a Converse request, and a Converse answer as a turn of the step.
//!
//! - System prompt: `system_prompt`, then `append_system_prompt` after a blank line (ironflow's
//!   `full_system_prompt`), as one system block.
//! - The conversation: the prompt as the user's first message, then each turn's assistant
//!   message and, when it called tools, their results as the next user message.
//! - Structured output (`json_schema`): Converse's output format (`outputConfig.textFormat`, a
//!   JSON schema) for the models that have it ([`NATIVE_STRUCTURED_OUTPUT`]), else a tool
//!   (`structured_output`) whose input is the answer, which the model is forced to call
//!   (`toolChoice: tool`; `any` when the step also has tools, so that it can use them first).

use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::operation::converse::ConverseOutput;
use aws_sdk_bedrockruntime::operation::converse::builders::ConverseFluentBuilder;
use aws_sdk_bedrockruntime::types::{
    AnyToolChoice, ContentBlock, ConversationRole, JsonSchemaDefinition, Message, OutputConfig,
    OutputFormat, OutputFormatStructure, OutputFormatType, SpecificToolChoice, StopReason,
    SystemContentBlock, ToolChoice, ToolConfiguration, ToolUseBlock,
};
use ironflow_core::error::AgentError;
use ironflow_core::provider::AgentConfig;
use ironflow_core::providers::http::tools::ToolRegistry;
use serde_json::Value;

use super::calls::refused;
use super::document::to_value;
use super::pricing::{Usage, foundation_model};
use super::schema::AnswerSchema;
use super::tools::{self, ANSWER_TOOL};

/// The foundation models (id prefixes, after an inference profile's geographic prefix) that
/// take Converse's structured output format; every other model answers through a forced tool.
pub(crate) const NATIVE_STRUCTURED_OUTPUT: &[&str] = &[
    "anthropic.claude-sonnet-4-5",
    "anthropic.claude-haiku-4-5",
    "anthropic.claude-opus-4-5",
    "anthropic.claude-opus-4-1",
    "openai.gpt-oss",
    "qwen.qwen3",
    "deepseek.v3",
];

/// Whether `model` answers a schema through Converse's output format.
pub(crate) fn has_native_structured_output(model: &str) -> bool {
    let id = foundation_model(model);
    NATIVE_STRUCTURED_OUTPUT.iter().any(|p| id.starts_with(p))
}

/// How the step's answer comes back.
#[derive(Debug)]
pub(crate) enum Answer {
    /// As text (no schema).
    Text,
    /// As JSON text, constrained by Converse's output format.
    Native(AnswerSchema),
    /// As the input of the forced answer tool.
    Tool(AnswerSchema),
}

/// A step's Converse request, growing by a turn at a time.
#[derive(Debug)]
pub(crate) struct Request {
    model: String,
    system: Option<SystemContentBlock>,
    messages: Vec<Message>,
    tool_config: Option<ToolConfiguration>,
    output_config: Option<OutputConfig>,
}

/// A request part the SDK refused to build (a required field missing): a bug of this crate,
/// reported as a refusal naming the model.
fn not_built(model: &str, e: impl std::fmt::Display) -> AgentError {
    refused(
        400,
        "RequestNotBuilt",
        format!("the request to Bedrock model '{model}' could not be built: {e}"),
    )
}

/// A message of `role` with `content`.
fn message(
    model: &str,
    role: ConversationRole,
    content: Vec<ContentBlock>,
) -> Result<Message, AgentError> {
    Message::builder()
        .role(role)
        .set_content(Some(content))
        .build()
        .map_err(|e| not_built(model, e))
}

impl Request {
    /// The first request of the step `config` to `model`, offering `registry`'s tools, answering
    /// as `answer` says.
    ///
    /// # Errors
    ///
    /// A refusal naming the model when a tool's specification cannot be built.
    pub fn new(
        config: &AgentConfig,
        model: &str,
        registry: Option<&ToolRegistry>,
        answer: &Answer,
    ) -> Result<Self, AgentError> {
        let mut offered = match registry {
            Some(r) => tools::specs(r, model)?,
            None => Vec::new(),
        };
        let has_tools = !offered.is_empty();
        let mut choice = None;
        let mut output_config = None;
        match answer {
            Answer::Text => {}
            Answer::Native(schema) => {
                let definition = JsonSchemaDefinition::builder()
                    .name("answer")
                    .schema(schema.sent().to_string())
                    .build()
                    .map_err(|e| not_built(model, e))?;
                let format = OutputFormat::builder()
                    .r#type(OutputFormatType::JsonSchema)
                    .structure(OutputFormatStructure::JsonSchema(definition))
                    .build()
                    .map_err(|e| not_built(model, e))?;
                output_config = Some(OutputConfig::builder().text_format(format).build());
            }
            Answer::Tool(schema) => {
                offered.push(tools::answer_spec(schema.sent(), model)?);
                choice = Some(if has_tools {
                    ToolChoice::Any(AnyToolChoice::builder().build())
                } else {
                    ToolChoice::Tool(
                        SpecificToolChoice::builder()
                            .name(ANSWER_TOOL)
                            .build()
                            .map_err(|e| not_built(model, e))?,
                    )
                });
            }
        }
        let tool_config = if offered.is_empty() {
            None
        } else {
            Some(
                ToolConfiguration::builder()
                    .set_tools(Some(offered))
                    .set_tool_choice(choice)
                    .build()
                    .map_err(|e| not_built(model, e))?,
            )
        };
        let prompt = message(
            model,
            ConversationRole::User,
            vec![ContentBlock::Text(config.prompt.clone())],
        )?;
        Ok(Self {
            model: model.to_string(),
            system: config.full_system_prompt().map(SystemContentBlock::Text),
            messages: vec![prompt],
            tool_config,
            output_config,
        })
    }

    /// The Converse call of the conversation so far, on `client`.
    pub fn call(&self, client: &Client) -> ConverseFluentBuilder {
        client
            .converse()
            .model_id(&self.model)
            .set_system(self.system.clone().map(|s| vec![s]))
            .set_messages(Some(self.messages.clone()))
            .set_tool_config(self.tool_config.clone())
            .set_output_config(self.output_config.clone())
    }

    /// The characters of text the call sends: the system prompt, the messages' text, and the
    /// other blocks and the tool specifications by the length of their debug text (an
    /// overestimate of their JSON); what a cut call's input tokens are estimated from.
    pub fn chars(&self) -> u64 {
        fn len(text: &str) -> u64 {
            u64::try_from(text.chars().count()).unwrap_or(u64::MAX)
        }
        let system = match &self.system {
            Some(SystemContentBlock::Text(text)) => len(text),
            Some(other) => len(&format!("{other:?}")),
            None => 0,
        };
        let messages = self
            .messages
            .iter()
            .flat_map(|m| m.content())
            .map(|block| match block {
                ContentBlock::Text(text) => len(text),
                other => len(&format!("{other:?}")),
            });
        let tools = self
            .tool_config
            .as_ref()
            .map_or(0, |t| len(&format!("{t:?}")));
        messages.fold(system.saturating_add(tools), u64::saturating_add)
    }

    /// Add the model's message `assistant` and the tool results `results` answering it.
    ///
    /// # Errors
    ///
    /// As [`Request::new`].
    pub fn push_turn(
        &mut self,
        assistant: Message,
        results: Vec<ContentBlock>,
    ) -> Result<(), AgentError> {
        self.messages.push(assistant);
        let results = message(&self.model, ConversationRole::User, results)?;
        self.messages.push(results);
        Ok(())
    }
}

/// One answer of the model.
#[derive(Debug)]
pub(crate) struct Turn {
    /// Its text blocks, joined.
    pub text: String,
    /// The answer tool's input, when it called it.
    pub answered: Option<Value>,
    /// The other tools it called.
    pub calls: Vec<ToolUseBlock>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Its tokens.
    pub usage: Usage,
    /// Its message, to send back with the tool results.
    pub message: Option<Message>,
}

/// The turn `output` is.
pub(crate) fn read(output: ConverseOutput) -> Turn {
    let count = |n: i32| u64::try_from(n).unwrap_or(0);
    let usage = output.usage().map_or_else(Usage::default, |u| Usage {
        input: count(u.input_tokens()),
        output: count(u.output_tokens()),
        cache_read: count(u.cache_read_input_tokens().unwrap_or(0)),
        cache_write: count(u.cache_write_input_tokens().unwrap_or(0)),
    });
    let stop = output.stop_reason().clone();
    let message = output.output.and_then(|o| o.as_message().ok().cloned());
    let mut turn = Turn {
        text: String::new(),
        answered: None,
        calls: Vec::new(),
        stop,
        usage,
        message: None,
    };
    if let Some(m) = &message {
        for block in m.content() {
            match block {
                ContentBlock::Text(t) => turn.text.push_str(t),
                ContentBlock::ToolUse(call) if call.name() == ANSWER_TOOL => {
                    turn.answered = Some(to_value(call.input()));
                }
                ContentBlock::ToolUse(call) => turn.calls.push(call.clone()),
                _ => {}
            }
        }
    }
    turn.message = message;
    turn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_of_native_models_take_the_output_format() {
        assert!(has_native_structured_output(
            "global.anthropic.claude-sonnet-4-5-20250929-v1:0"
        ));
        assert!(has_native_structured_output(
            "anthropic.claude-haiku-4-5-20251001-v1:0"
        ));
        assert!(!has_native_structured_output("us.amazon.nova-pro-v1:0"));
        assert!(!has_native_structured_output(
            "anthropic.claude-3-7-sonnet-20250219-v1:0"
        ));
    }
}
