//! Whether a run the API's reaper recovered was held by an invocation that died executing it.
//!
//! The reaper recovers a run whose lease expired unrefreshed, whatever the reason: an
//! invocation that died mid-step (a function timeout, out of memory: what the poison pill is
//! for), but also a claim whose answer was lost (the run leased to a worker that never heard of
//! it) or a lease taken over by a worker that then let it expire. Only the first says anything
//! about the workflow, so a recovery counts as a death only when the run's steps show that its
//! last holder had started a step: the reaper's cleanup marks the steps left Running as
//! interrupted (`Failed`, `STEP_INTERRUPTED_ERROR`), without the mark every handback of this
//! worker writes ([`crate::handback::INTERRUPTION_KEY`]), and nobody has executed the run since.
//!
//! A step a live holder left Running when its lease was taken over looks like the taker's: the
//! holder that lost the lease notes the next recovery as expected instead
//! ([`super::gate::PoisonGate::record`]). The dead holder is the worker id its step names
//! ([`crate::store::holder`]): the runs one dead invocation held count as one death. What the
//! records cannot tell is in docs/faults.md ("The reaper").

use ironflow_store::entities::{Step, StepStatus};
use ironflow_store::store::STEP_INTERRUPTED_ERROR;

use crate::handback::interruption_mark;
use crate::store::holder::holder;

/// [`dead_holder_step`] as the worker id the step names: `Some(Some(id))`, `Some(None)` when
/// the holder started a step that names no holder, `None` when it had started no step.
#[cfg(test)]
pub(crate) fn dead_holder(steps: &[Step]) -> Option<Option<&str>> {
    dead_holder_step(steps).map(|step| step.and_then(holder))
}

/// Whether `steps` (all the run's) show that the holder whose lease the reaper recovered had
/// started a step: one is still Running (the reaper's cleanup comes after the run went back to
/// Pending), or the newest one is an interruption without a handback's mark (the reaper's).
/// `Some(Some(step))` with a step that names its holder ([`crate::store::holder`]) if one
/// does, `Some(None)` when the holder started steps that name none, `None` when it had started
/// no step.
pub(crate) fn dead_holder_step(steps: &[Step]) -> Option<Option<&Step>> {
    let running: Vec<&Step> = steps
        .iter()
        .filter(|s| s.status.state == StepStatus::Running)
        .collect();
    if !running.is_empty() {
        return Some(running.iter().copied().find(|s| holder(s).is_some()));
    }
    let newest = steps.iter().max_by_key(|s| (s.created_at, s.id))?;
    let reaped = newest.status.state == StepStatus::Failed
        && newest.error.as_deref() == Some(STEP_INTERRUPTED_ERROR)
        && interruption_mark(newest).is_none();
    reaped.then(|| holder(newest).is_some().then_some(newest))
}

#[cfg(test)]
pub(crate) mod tests {
    use ironflow_store::entities::{NewStep, StepKind, StepUpdate};
    use ironflow_store::memory::InMemoryStore;
    use ironflow_store::store::RunStore;
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::handback::{COUNTED_MARK, INTERRUPTION_KEY};
    use crate::store::holder::HOLDER_KEY;

    /// A step of `run` at `position`, started, then ended with `end` (if any).
    async fn step(store: &InMemoryStore, run: Uuid, position: u32, end: Option<StepUpdate>) {
        started_by(store, run, position, None, end).await;
    }

    /// A step of `run` at `position`, started by `holder` (its mark, as the worker's store
    /// writes it, if any), then ended with `end` (if any).
    pub(crate) async fn started_by(
        store: &InMemoryStore,
        run: Uuid,
        position: u32,
        holder: Option<&str>,
        end: Option<StepUpdate>,
    ) {
        let created = store
            .create_step(NewStep {
                run_id: run,
                trace_id: Uuid::new_v4(),
                name: format!("s{position}"),
                kind: StepKind::Shell,
                position,
                input: None,
                is_error_handler: false,
            })
            .await
            .unwrap();
        let running = StepUpdate {
            status: Some(StepStatus::Running),
            started_at: Some(chrono::Utc::now()),
            debug_messages: holder.map(|h| json!([{ HOLDER_KEY: h }])),
            ..StepUpdate::default()
        };
        store.update_step(created.id, running).await.unwrap();
        if let Some(end) = end {
            store.update_step(created.id, end).await.unwrap();
        }
    }

    fn interrupted(mark: Option<&str>) -> StepUpdate {
        StepUpdate {
            status: Some(StepStatus::Failed),
            error: Some(STEP_INTERRUPTED_ERROR.to_string()),
            completed_at: Some(chrono::Utc::now()),
            debug_messages: mark.map(|m| json!([{ INTERRUPTION_KEY: m }])),
            ..StepUpdate::default()
        }
    }

    fn completed() -> StepUpdate {
        StepUpdate {
            status: Some(StepStatus::Completed),
            completed_at: Some(chrono::Utc::now()),
            ..StepUpdate::default()
        }
    }

    /// A run of `workflow`, claimed.
    pub(crate) async fn run(store: &InMemoryStore, workflow: &str) -> Uuid {
        let new = ironflow_local_api::new_run(workflow, 0);
        store.create_run(new).await.unwrap();
        store.pick_next_pending(None).await.unwrap().unwrap().id
    }

    #[tokio::test]
    async fn a_step_left_running_or_interrupted_by_the_reaper_is_the_dead_holder_s() {
        let store = InMemoryStore::new();
        let id = run(&store, "wf").await;
        assert_eq!(dead_holder(&[]), None, "a claim that never executed");

        step(&store, id, 0, Some(completed())).await;
        let steps = store.list_steps(id).await.unwrap();
        assert_eq!(dead_holder(&steps), None, "died between steps");

        step(&store, id, 1, Some(interrupted(Some(COUNTED_MARK)))).await;
        let steps = store.list_steps(id).await.unwrap();
        assert_eq!(dead_holder(&steps), None, "handed back at the cutoff");

        step(&store, id, 1, Some(interrupted(None))).await;
        let steps = store.list_steps(id).await.unwrap();
        assert_eq!(dead_holder(&steps), Some(None), "interrupted by the reaper");

        let other = run(&store, "wf").await;
        step(&store, other, 0, None).await;
        let steps = store.list_steps(other).await.unwrap();
        assert_eq!(dead_holder(&steps), Some(None), "left Running");
    }

    #[tokio::test]
    async fn the_dead_holder_is_named_by_its_step_s_mark_which_the_reaper_keeps() {
        let store = InMemoryStore::new();
        let id = run(&store, "wf").await;
        started_by(&store, id, 0, Some("w-old"), Some(completed())).await;
        started_by(&store, id, 1, Some("w-dead"), None).await;
        let steps = store.list_steps(id).await.unwrap();
        assert_eq!(dead_holder(&steps), Some(Some("w-dead")), "left Running");

        let other = run(&store, "wf").await;
        started_by(&store, other, 0, Some("w-dead"), Some(interrupted(None))).await;
        let steps = store.list_steps(other).await.unwrap();
        assert_eq!(
            dead_holder(&steps),
            Some(Some("w-dead")),
            "interrupted by the reaper, whose cleanup leaves debug messages as they were"
        );

        let handed_back = run(&store, "wf").await;
        let mark = Some(interrupted(Some(COUNTED_MARK)));
        started_by(&store, handed_back, 0, Some("w-live"), mark).await;
        let steps = store.list_steps(handed_back).await.unwrap();
        assert_eq!(dead_holder(&steps), None, "a handback's mark replaces it");
    }
}
