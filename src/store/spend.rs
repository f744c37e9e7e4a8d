//! What each held run's steps used and cost, as this worker writes their records (the cheapest
//! honest source: the usage and cost the engine puts in each step's final `PUT /steps/{id}`,
//! from the provider's answer), and which of its steps are still running.
//!
//! A step counts for the run whose execution scope created it (a sub-workflow child's steps for
//! the run executing it), else for the run it belongs to (created from a task outside any
//! execution scope: the branches of `ctx.parallel`), else, when this worker did not see it
//! created, for the run of the execution scope its write is made in.
//! Only writes that landed count; a write sent again after a lost answer counts once.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ironflow_store::entities::{StepStatus, StepUpdate};
use uuid::Uuid;

use crate::report::Spend;

/// One run's figures so far.
#[derive(Debug, Default)]
struct RunSpend {
    spend: Spend,
    /// Its steps created or started and not yet ended.
    open: HashSet<Uuid>,
}

/// The held runs' spend (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Spends {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    step_run: HashMap<Uuid, Uuid>,
    runs: HashMap<Uuid, RunSpend>,
}

impl Spends {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Each update is a few inserts and additions: a panic cannot leave it half-done.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Step `step_id` of run `run_id` was created (it is running).
    pub fn created(&self, step_id: Uuid, run_id: Uuid) {
        let mut inner = self.lock();
        inner.step_run.insert(step_id, run_id);
        inner.runs.entry(run_id).or_default().open.insert(step_id);
    }

    /// `update` of step `step_id` landed; `scope_run` is the run of the execution scope it was
    /// written in, if any (a step this worker did not see created).
    pub fn landed(&self, step_id: Uuid, update: &StepUpdate, scope_run: Option<Uuid>) {
        let mut inner = self.lock();
        let Some(run_id) = inner.step_run.get(&step_id).copied().or(scope_run) else {
            return;
        };
        // A write with nothing to count (a handback's interruption or mark, made with the
        // invocation's own calls) adds no entry: nothing would ever take it.
        let counts = update.input_tokens.is_some()
            || update.output_tokens.is_some()
            || update.cost_usd.is_some()
            || update.status == Some(StepStatus::Running);
        if !counts && !inner.runs.contains_key(&run_id) {
            return;
        }
        let run = inner.runs.entry(run_id).or_default();
        match update.status {
            Some(status) if status.is_terminal() => {
                run.open.remove(&step_id);
            }
            Some(StepStatus::Running) => {
                run.open.insert(step_id);
            }
            _ => {}
        }
        let spend = &mut run.spend;
        spend.input_tokens = spend
            .input_tokens
            .saturating_add(update.input_tokens.unwrap_or(0));
        spend.output_tokens = spend
            .output_tokens
            .saturating_add(update.output_tokens.unwrap_or(0));
        if let Some(cost) = update.cost_usd {
            // A `Decimal` of dollars: its text always parses.
            spend.cost_usd += cost.to_string().parse::<f64>().unwrap_or(0.0);
        }
    }

    /// The steps of run `run_id` (its execution's, as [`Spends::created`] counts them) created
    /// or started and not yet ended.
    pub fn open(&self, run_id: Uuid) -> Vec<Uuid> {
        let inner = self.lock();
        inner
            .runs
            .get(&run_id)
            .map(|run| run.open.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Take what run `run_id` used since this worker began holding it, and how many of its
    /// steps are still open; forget the run and its steps.
    pub fn take(&self, run_id: Uuid) -> (Spend, u32) {
        let mut inner = self.lock();
        inner.step_run.retain(|_, run| *run != run_id);
        let run = inner.runs.remove(&run_id).unwrap_or_default();
        let open = u32::try_from(run.open.len()).unwrap_or(u32::MAX);
        (run.spend, open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_s_usage_counts_for_its_run_and_an_ended_step_is_no_longer_open() {
        let spends = Spends::default();
        let (run, other, step, loose) = (
            Uuid::new_v4(),
            Uuid::new_v4(),
            Uuid::new_v4(),
            Uuid::new_v4(),
        );
        spends.created(step, run);
        let done = StepUpdate {
            status: Some(StepStatus::Completed),
            input_tokens: Some(10),
            output_tokens: Some(3),
            ..StepUpdate::default()
        };
        spends.landed(step, &done, Some(other));
        let running = StepUpdate {
            status: Some(StepStatus::Running),
            ..StepUpdate::default()
        };
        spends.landed(loose, &running, Some(other));
        let (spend, open) = spends.take(run);
        assert_eq!((spend.input_tokens, spend.output_tokens, open), (10, 3, 0));
        let (spend, open) = spends.take(other);
        assert_eq!((spend.input_tokens, open), (0, 1), "by its scope's run");
        assert_eq!(spends.take(run).0, Spend::default(), "taken once");
    }

    #[test]
    fn a_write_with_nothing_to_count_to_a_run_not_held_adds_nothing() {
        let spends = Spends::default();
        let (run, step) = (Uuid::new_v4(), Uuid::new_v4());
        // A handback's interruption and mark, with the invocation's own calls.
        let interrupted = StepUpdate {
            status: Some(StepStatus::Failed),
            ..StepUpdate::default()
        };
        let mark = StepUpdate {
            debug_messages: Some(serde_json::json!([{"mark": 1}])),
            ..StepUpdate::default()
        };
        spends.landed(step, &interrupted, Some(run));
        spends.landed(step, &mark, Some(run));
        assert!(spends.lock().runs.is_empty(), "{:?}", spends.lock().runs);
        // The same writes to a run its execution holds still count there.
        spends.created(Uuid::new_v4(), run);
        spends.landed(step, &interrupted, Some(run));
        assert_eq!(spends.open(run).len(), 1);
    }
}
