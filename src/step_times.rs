//! How long steps take, as this process saw them complete: the expectation cutoff-aware starts
//! compare with the time left before the cutoff (docs/design.md, "Cutoff-aware starts").
//!
//! Per (workflow name, step name), the last [`SAMPLES`] durations of completions this process
//! saw; the expectation is the longest of them. Not a mean: starting a step that does not fit
//! loses the whole step (and a model call's tokens), while deferring one that would have fit
//! loses only the rest of an invocation that then returns early; so the estimate leans long,
//! and with a handful of samples the longest is the honest high percentile. The last few only:
//! a step that got faster (a cache warmed, a smaller model) is believed after [`SAMPLES`]
//! completions. At most [`KEYS`] steps are kept; the one updated longest ago makes room.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Durations kept per step: 8.
pub const SAMPLES: usize = 8;

/// Steps kept: 1024 (a few hundred kilobytes at most).
pub const KEYS: usize = 1024;

/// One step's recent durations.
#[derive(Debug, Default)]
struct Recent {
    samples: VecDeque<Duration>,
    /// Whether the step was seen at position 0 (a workflow's first step).
    first: bool,
    /// When it was last updated, in updates of the table.
    touched: u64,
}

/// The durations of the steps this process saw complete (see the module docs).
#[derive(Debug, Default)]
pub struct StepTimes {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    steps: HashMap<(String, String), Recent>,
    updates: u64,
}

impl StepTimes {
    /// Step `step` of `workflow`, at `position` in its run, completed in `took`.
    pub fn saw(&self, workflow: &str, step: &str, position: u32, took: Duration) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.updates = table.updates.wrapping_add(1);
        let touched = table.updates;
        let key = (workflow.to_string(), step.to_string());
        if !table.steps.contains_key(&key)
            && table.steps.len() >= KEYS
            && let Some(oldest) = table
                .steps
                .iter()
                .min_by_key(|(_, r)| r.touched)
                .map(|(k, _)| k.clone())
        {
            table.steps.remove(&oldest);
        }
        let recent = table.steps.entry(key).or_default();
        if recent.samples.len() >= SAMPLES {
            recent.samples.pop_front();
        }
        recent.samples.push_back(took);
        recent.first |= position == 0;
        recent.touched = touched;
    }

    /// The longest of the recent durations of `step` of `workflow`; `None` if never seen.
    pub fn expected(&self, workflow: &str, step: &str) -> Option<Duration> {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (workflow.to_string(), step.to_string());
        table.steps.get(&key)?.samples.iter().max().copied()
    }

    /// The first step of `workflow` (one seen at position 0) and its expectation; `None` if
    /// none was seen.
    pub fn first_step(&self, workflow: &str) -> Option<(String, Duration)> {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table
            .steps
            .iter()
            .filter(|((w, _), r)| w == workflow && r.first)
            .filter_map(|((_, step), r)| Some((step.clone(), r.samples.iter().max().copied()?)))
            .max_by_key(|(_, took)| *took)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_expectation_is_the_longest_of_the_last_few_and_the_table_is_bounded() {
        let times = StepTimes::default();
        assert_eq!(times.expected("w", "s"), None);
        times.saw("w", "s", 1, S(40));
        for _ in 0..SAMPLES - 1 {
            times.saw("w", "s", 1, S(5));
        }
        assert_eq!(times.expected("w", "s"), Some(S(40)));
        times.saw("w", "s", 1, S(5));
        assert_eq!(
            times.expected("w", "s"),
            Some(S(5)),
            "40 s is out of the window"
        );
        assert_eq!(times.first_step("w"), None);
        times.saw("w", "a", 0, S(3));
        assert_eq!(times.first_step("w"), Some(("a".to_string(), S(3))));
        assert_eq!(times.expected("v", "s"), None, "per workflow");

        for i in 0..KEYS {
            times.saw("many", &i.to_string(), 1, S(1));
        }
        let table = times.table.lock().unwrap();
        assert_eq!(table.steps.len(), KEYS);
        assert!(
            !table
                .steps
                .contains_key(&("w".to_string(), "s".to_string())),
            "the oldest made room"
        );
    }
}
