//! Which invocation started a step: its worker id, in the step's debug messages.
//!
//! Neither `Run` nor `Step` names the worker that executed a step, and the API's reaper clears
//! the run's `worker_id` when it recovers a lease. So every step an execution starts carries its
//! holder's worker id (`<prefix>-<Lambda request id>-<8 hex>`, which also leads an operator from
//! a step to the invocation's CloudWatch lines): the engine's `PUT /steps/{id}` that moves the
//! step to Running gets `debug_messages: [{"ironflow_lambda_holder": "<worker id>"}]`, unless
//! it already carries debug messages. A step that ends with debug messages of its own (an agent
//! step's conversation) replaces the mark; a handback's interruption replaces it with its own
//! ([`crate::handback::INTERRUPTION_KEY`]).
//!
//! What reads it: the poison pill counts the death of one invocation once per workflow, however
//! many invocations recover the runs it held ([`crate::poison::recovery`]).

use ironflow_store::entities::{Step, StepStatus, StepUpdate};
use serde_json::json;

use super::scope::CallScope;

/// The key of the holder's mark in a step's debug messages.
pub(crate) const HOLDER_KEY: &str = "ironflow_lambda_holder";
/// Beside it: the run's `lease_recoveries` when its holder claimed it (n). The holder's own
/// death, if it died, is the run's recovery n + 1; a later recovery is another holder's.
pub(crate) const RECOVERIES_KEY: &str = "ironflow_lambda_recoveries";

/// `update` with the holder's mark when it moves a step to Running with no debug messages of
/// its own and `scope` executes a run (the calls of a task outside any execution, such as a
/// parallel branch's, are left as they are: their step names no holder).
pub(crate) fn mark_start(mut update: StepUpdate, scope: &CallScope) -> StepUpdate {
    if update.status == Some(StepStatus::Running)
        && update.debug_messages.is_none()
        && let Some(key) = scope.run_key()
    {
        update.debug_messages = Some(match key.claimed_recoveries {
            Some(n) => json!([{ HOLDER_KEY: key.worker_id, RECOVERIES_KEY: n }]),
            None => json!([{ HOLDER_KEY: key.worker_id }]),
        });
    }
    update
}

/// The run's lease recoveries when the holder `step`'s mark names claimed it, if it says.
pub(crate) fn holder_claimed_recoveries(step: &Step) -> Option<u32> {
    step.debug_messages
        .as_ref()
        .and_then(|m| m.as_array())
        .and_then(|m| m.iter().find_map(|e| e.get(RECOVERIES_KEY)?.as_u64()))
        .and_then(|n| u32::try_from(n).ok())
}

/// The worker id `step`'s mark names, if it has one.
pub(crate) fn holder(step: &Step) -> Option<&str> {
    step.debug_messages
        .as_ref()
        .and_then(|m| m.as_array())
        .and_then(|m| m.iter().find_map(|e| e.get(HOLDER_KEY)?.as_str()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;
    use uuid::Uuid;

    use super::*;
    use crate::deadline::{LeaseClock, later};
    use crate::store::scope::RunKey;

    fn execution() -> CallScope {
        let key = RunKey {
            run_id: Uuid::nil(),
            worker_id: "ironflow-lambda-req-1-0badcafe".into(),
            claimed_recoveries: None,
            holding: None,
        };
        let now = Instant::now();
        let lease = Arc::new(LeaseClock::new(now, Duration::from_secs(30)));
        CallScope::execution(
            key,
            later(now, Duration::from_secs(60)),
            lease,
            Arc::default(),
        )
    }

    fn running() -> StepUpdate {
        StepUpdate {
            status: Some(StepStatus::Running),
            ..StepUpdate::default()
        }
    }

    #[test]
    fn only_a_start_without_debug_messages_under_an_execution_is_marked() {
        let marked = mark_start(running(), &execution());
        assert_eq!(
            marked.debug_messages,
            Some(json!([{ HOLDER_KEY: "ironflow-lambda-req-1-0badcafe" }]))
        );

        let own = StepUpdate {
            debug_messages: Some(json!([{"role": "assistant"}])),
            ..running()
        };
        let kept = mark_start(own, &execution());
        assert_eq!(kept.debug_messages, Some(json!([{"role": "assistant"}])));

        let completed = StepUpdate {
            status: Some(StepStatus::Completed),
            ..StepUpdate::default()
        };
        assert_eq!(mark_start(completed, &execution()).debug_messages, None);

        let outside = CallScope::returning(Instant::now(), Arc::default());
        assert_eq!(mark_start(running(), &outside).debug_messages, None);
    }
}
