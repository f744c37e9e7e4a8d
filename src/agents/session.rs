//! Agent sessions, which these providers do not keep.
//!
//! ironflow-engine resumes an agent step that an earlier execution left unfinished (a handback
//! at the cutoff, a dead invocation) by asking the provider to continue the step's session
//! (`AgentConfig::resume_session_id`, a Claude Code CLI notion) with the step's
//! `resume_prompt`, by default a sentence ("The previous run of this task was interrupted…")
//! that carries no task. A provider without sessions that answered it would send the model that
//! sentence alone. So a resume is refused as the CLI refuses a session it cannot find, with the
//! message the engine recognises (`is_session_not_found`): the engine then runs the step's own
//! prompt again, in a session of the same id. No model call is made for the refused resume.

use ironflow_core::error::AgentError;
use ironflow_core::provider::AgentConfig;

/// What the Claude Code CLI prints for a session it cannot resume, which ironflow-engine reads
/// as "run the step's own prompt again".
const SESSION_NOT_FOUND: &str = "No conversation found with session ID";

/// `Ok` unless `config` asks to resume a session: then the error that makes the engine run the
/// step's own prompt again, naming `provider` (which keeps no session).
///
/// # Errors
///
/// [`AgentError::ProcessFailed`] whose message starts with the CLI's session-not-found sentence.
pub(crate) fn no_session_to_resume(config: &AgentConfig, provider: &str) -> Result<(), AgentError> {
    match &config.resume_session_id {
        Some(id) => Err(AgentError::ProcessFailed {
            exit_code: 1,
            stderr: format!(
                "{SESSION_NOT_FOUND}: {id} ({provider} keeps no session: the step runs again \
                 from its own prompt)"
            ),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use ironflow_core::providers::claude::is_session_not_found;

    use super::*;

    #[test]
    fn a_resume_is_refused_as_a_session_the_engine_runs_again_from_its_prompt() {
        let mut config = AgentConfig::new("the task");
        assert!(no_session_to_resume(&config, "Bedrock").is_ok());
        config.resume_session_id = Some("0192f0c1".into());
        let refused = no_session_to_resume(&config, "Bedrock").expect_err("a resume");
        assert!(is_session_not_found(&refused), "{refused}");
        assert!(refused.to_string().contains("Bedrock keeps no session"));
    }
}
