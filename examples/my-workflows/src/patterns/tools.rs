//! `agent-with-tools`: the [agent loop](super::agent_loop) with two tools that need no human:
//! `weather` and `convert`.

use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use serde_json::json;

use super::agent_loop::{self, ToolName, Toolbox};
use super::models::Models;
use super::required_text;

/// `agent-with-tools`: `{"question": "…"}` → output `{"answer", "turns"}`.
pub struct AgentWithTools;

impl WorkflowHandler for AgentWithTools {
    fn name(&self) -> &str {
        "agent-with-tools"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let (payload, question) = required_text(ctx, "question").await?;
            let model = Models::of(&payload).main;
            let (answer, turns) = agent_loop::run(ctx, &model, &question, &Weather).await?;
            ctx.set_output(&json!({"answer": answer.raw(), "turns": turns}))
        })
    }
}

/// Canned forecasts: the example works offline.
const FORECASTS: &[(&str, &str)] = &[
    ("paris", "sunny, 21 c"),
    ("seattle", "rain, 12 c"),
    ("tokyo", "cloudy, 18 c"),
];

struct Weather;

impl Toolbox for Weather {
    fn describe(&self) -> &'static str {
        "weather (argument: a city; answers its forecast in °C), \
         convert (argument: a temperature such as \"21 c\" or \"70 f\"; answers it in the other scale)"
    }

    fn needs_approval(&self, _tool: ToolName) -> bool {
        false
    }

    fn run(&self, tool: ToolName, argument: &str) -> Result<String, String> {
        match tool {
            ToolName::Weather => FORECASTS
                .iter()
                .find(|(city, _)| argument.trim().eq_ignore_ascii_case(city))
                .map(|(_, forecast)| (*forecast).to_string())
                .ok_or_else(|| format!("no forecast for {argument:?}")),
            ToolName::Convert => convert(argument),
            other => Err(format!("this agent has no tool {}", other.as_str())),
        }
    }
}

/// `"21 c"` → `"69.8 f"`, `"70 f"` → `"21.1 c"`.
fn convert(argument: &str) -> Result<String, String> {
    let bad = || format!("expected a number and c or f, found {argument:?}");
    let argument = argument.trim().to_ascii_lowercase();
    let (number, scale) = argument.split_at(argument.len().saturating_sub(1));
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    match scale {
        "c" => Ok(format!("{:.1} f", value * 9.0 / 5.0 + 32.0)),
        "f" => Ok(format!("{:.1} c", (value - 32.0) * 5.0 / 9.0)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_answer_or_say_what_was_wrong() {
        assert_eq!(
            Weather.run(ToolName::Weather, " Paris "),
            Ok("sunny, 21 c".into())
        );
        assert!(Weather.run(ToolName::Weather, "Atlantis").is_err());
        assert_eq!(Weather.run(ToolName::Convert, "21 C"), Ok("69.8 f".into()));
        assert_eq!(Weather.run(ToolName::Convert, "70f"), Ok("21.1 c".into()));
        assert!(Weather.run(ToolName::Convert, "warm").is_err());
        assert!(Weather.run(ToolName::Convert, "").is_err());
        assert!(Weather.run(ToolName::Refund, "A-1").is_err());
    }
}
