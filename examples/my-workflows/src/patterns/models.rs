//! Which Bedrock models the patterns call: the run's input first, then the function's
//! environment, then a default.
//!
//! | input field | variable | default |
//! |---|---|---|
//! | `model` | `BEDROCK_MODEL_ID` | [`DEFAULT_MODEL`] |
//! | `second_model` | `BEDROCK_SECOND_MODEL_ID` | [`DEFAULT_SECOND_MODEL`] |
//!
//! A model id is a foundation model id (`amazon.nova-lite-v1:0`) or an inference profile id
//! (`us.…`, `eu.…`, `global.…`); the function's role must be allowed to invoke it (docs/agents.md,
//! "IAM").

use serde_json::Value;

/// The main model: Claude Sonnet 4.5 through the US cross-region inference profile.
pub const DEFAULT_MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";

/// The second model (the judge's other candidate, the fan-out's workers): Amazon Nova Lite
/// through the US cross-region inference profile.
pub const DEFAULT_SECOND_MODEL: &str = "us.amazon.nova-lite-v1:0";

/// Variable naming the main model when the run's input does not.
pub const MODEL_VAR: &str = "BEDROCK_MODEL_ID";

/// Variable naming the second model when the run's input does not.
pub const SECOND_MODEL_VAR: &str = "BEDROCK_SECOND_MODEL_ID";

/// The two model ids a run uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Models {
    /// The main model: extraction, drafting, judging, the agents' turns.
    pub main: String,
    /// The second model: the judge's second candidate, the fan-out's workers.
    pub second: String,
}

impl Models {
    /// The models of a run whose input is `payload` (see the [module docs](self)). A blank
    /// value counts as unset.
    pub fn of(payload: &Value) -> Self {
        Self::from_lookup(payload, |name| std::env::var(name).ok())
    }

    /// [`Models::of`] with the environment given as a lookup.
    pub fn from_lookup(payload: &Value, env: impl Fn(&str) -> Option<String>) -> Self {
        let given = |id: &String| !id.trim().is_empty();
        let pick = |field: &str, var: &str, default: &str| {
            payload
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_string)
                .filter(given)
                .or_else(|| env(var).filter(given))
                .unwrap_or_else(|| default.to_string())
        };
        Self {
            main: pick("model", MODEL_VAR, DEFAULT_MODEL),
            second: pick("second_model", SECOND_MODEL_VAR, DEFAULT_SECOND_MODEL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_input_wins_over_the_environment_which_wins_over_the_default() {
        let env = |name: &str| (name == MODEL_VAR).then(|| "eu.amazon.nova-pro-v1:0".to_string());
        let models = Models::from_lookup(&json!({"second_model": "amazon.nova-micro-v1:0"}), env);
        assert_eq!(models.main, "eu.amazon.nova-pro-v1:0");
        assert_eq!(models.second, "amazon.nova-micro-v1:0");
        let models = Models::from_lookup(&json!({"model": "x", "second_model": " "}), env);
        assert_eq!(models.main, "x");
        assert_eq!(models.second, DEFAULT_SECOND_MODEL);
        let models = Models::from_lookup(&json!({"model": ""}), env);
        assert_eq!(models.main, "eu.amazon.nova-pro-v1:0");
    }
}
