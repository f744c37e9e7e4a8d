//! A step's structured answer, checked against the step's JSON schema (`AgentConfig::json_schema`)
//! with the `jsonschema` validator ironflow-engine itself uses.
//!
//! A schema that is not JSON, or not a valid JSON Schema, fails the step before any model call,
//! naming the model (it cannot pass on a retry). An answer that does not match is
//! [`AgentError::SchemaValidation`], the error ironflow retries (a model may answer well the next
//! time): ironflow's agent operation retries it twice by default, a step's retry policy more.

use ironflow_core::error::{AgentError, PartialUsage};
use jsonschema::Validator;
use serde_json::Value;

use super::calls::refused;

/// How much of a refused answer an error carries (bytes).
const RAW_ANSWER_MAX: usize = 4000;

/// How much of one mismatch an error carries (bytes): the validator's message quotes the value
/// it refused, which can be the model's whole answer.
const PROBLEM_MAX: usize = 500;

/// The step's schema and its validator.
pub(crate) struct AnswerSchema {
    /// What is sent to the model: ironflow's transformation for constrained decoding
    /// (`additionalProperties: false` on every object, `$ref`s inlined).
    sent: Value,
    validator: Validator,
}

impl std::fmt::Debug for AnswerSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerSchema")
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl AnswerSchema {
    /// The schema of a step of `model`.
    ///
    /// # Errors
    ///
    /// A non-retryable [`AgentError::Api`] naming the model and what is wrong with the schema.
    pub fn parse(model: &str, schema: &str) -> Result<Self, AgentError> {
        let bad = |why: String| {
            refused(
                400,
                "InvalidJsonSchema",
                format!("the step's JSON schema for Bedrock model '{model}' is unusable: {why}"),
            )
        };
        let value: Value =
            serde_json::from_str(schema).map_err(|e| bad(format!("not JSON ({e})")))?;
        let validator = jsonschema::validator_for(&value)
            .map_err(|e| bad(format!("not a valid JSON Schema ({e})")))?;
        let sent = serde_json::from_str(&ironflow_core::schema_transform::transform_schema(schema))
            .unwrap_or(value);
        Ok(Self { sent, validator })
    }

    /// The schema the model is asked to answer with.
    pub fn sent(&self) -> &Value {
        &self.sent
    }

    /// `answer` when it matches the schema.
    ///
    /// # Errors
    ///
    /// [`AgentError::SchemaValidation`] listing the first mismatches (at most 5), with the answer
    /// (truncated) and the usage so far.
    pub fn check(
        &self,
        model: &str,
        answer: Value,
        usage: PartialUsage,
    ) -> Result<Value, AgentError> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(&answer)
            .take(5)
            .map(|e| {
                let at = e.instance_path.to_string();
                let mut problem = format!("{}: {e}", if at.is_empty() { "/" } else { &at });
                if problem.len() > PROBLEM_MAX {
                    problem.truncate(problem.floor_char_boundary(PROBLEM_MAX));
                    problem.push_str(" [...]");
                }
                problem
            })
            .collect();
        if problems.is_empty() {
            return Ok(answer);
        }
        Err(mismatch(
            model,
            problems.join("; "),
            Some(answer.to_string()),
            usage,
        ))
    }
}

/// The step's retryable error for an answer of `model` that is not what the schema asks: `got`
/// says what was wrong, `raw` is the answer as the model gave it.
pub(crate) fn mismatch(
    model: &str,
    got: String,
    raw: Option<String>,
    usage: PartialUsage,
) -> AgentError {
    AgentError::SchemaValidation {
        expected: format!("an answer of Bedrock model '{model}' matching the step's JSON schema"),
        got,
        debug_messages: Vec::new(),
        partial_usage: Box::new(usage),
        raw_response: raw.map(|mut r| {
            if r.len() > RAW_ANSWER_MAX {
                r.truncate(r.floor_char_boundary(RAW_ANSWER_MAX));
            }
            r
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_checked_and_bad_schemas_refused_naming_the_model() {
        let schema = r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}"#;
        let s = AnswerSchema::parse("m.x", schema).unwrap();
        assert_eq!(s.sent()["additionalProperties"], json!(false));
        assert!(
            s.check("m.x", json!({"n": 1}), PartialUsage::default())
                .is_ok()
        );
        let err = s
            .check("m.x", json!({"n": "one"}), PartialUsage::default())
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::SchemaValidation { got, .. } if got.contains("/n")),
            "{err}"
        );
        // A huge answer of the wrong type: the validator quotes it, the error does not.
        let huge = "x".repeat(3 << 20);
        let err = s
            .check("m.x", json!({ "n": huge }), PartialUsage::default())
            .unwrap_err();
        let AgentError::SchemaValidation {
            got, raw_response, ..
        } = &err
        else {
            panic!("{err}");
        };
        assert!(
            got.len() <= PROBLEM_MAX + 10 && got.starts_with("/n"),
            "{got}"
        );
        assert!(raw_response.as_ref().unwrap().len() <= RAW_ANSWER_MAX);
        let err = AnswerSchema::parse("m.x", r#"{"type": 12}"#).unwrap_err();
        assert!(err.to_string().contains("'m.x'"), "{err}");
        assert!(!ironflow_core::retry::is_retryable(&err.into()));
    }
}
