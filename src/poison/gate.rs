//! The poison-pill table as one invocation sees it.
//!
//! Each workflow's counter is read at most once per invocation and cached; a success writes
//! only when a counter exists; failures update the cache with the count the table returns, so
//! later claims of the same invocation see it. Every table error fails open: logged with the
//! table's name and cause, and the run executes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ironflow_store::entities::{Run, WorkerCapabilities};
use tracing::{error, warn};

use super::{FailureCounter, PoisonPolicy, PoisonTable, now_ms};
use crate::execution::{Outcome, RunReport};

/// The poison-pill table as seen by one invocation: each workflow's counter is read at most
/// once, and a success writes only when a counter exists.
pub struct PoisonGate {
    table: Arc<dyn PoisonTable>,
    policy: PoisonPolicy,
    seen: HashMap<String, Option<FailureCounter>>,
}

impl PoisonGate {
    /// A gate over `table` for one invocation.
    pub fn new(table: Arc<dyn PoisonTable>, policy: PoisonPolicy) -> Self {
        Self {
            table,
            policy,
            seen: HashMap::new(),
        }
    }

    async fn counter(&mut self, workflow: &str) -> Option<FailureCounter> {
        if let Some(known) = self.seen.get(workflow) {
            return *known;
        }
        let counter = match self.table.counter(workflow, now_ms()).await {
            Ok(c) => c,
            Err(e) => {
                // Fail open: an unreachable table must not stop the fleet.
                error!(workflow, error = %e, "poison-pill check failed: executing the run anyway");
                return None;
            }
        };
        self.seen.insert(workflow.to_string(), counter);
        counter
    }

    /// Why `workflow` is blocked now, if it is.
    pub async fn blocked_reason(&mut self, workflow: &str) -> Option<String> {
        let counter = self.counter(workflow).await?;
        let now = now_ms();
        self.policy.is_blocked(&counter, now).then(|| {
            let left = Duration::from_millis(
                (counter.last_failure_ms + self.policy.cooldown.as_millis() as u64)
                    .saturating_sub(now),
            );
            format!(
                "workflow '{workflow}' is blocked as a poison pill: {} consecutive failures \
                 (threshold {}); blocked for another {}s",
                counter.consecutive_failures,
                self.policy.threshold,
                left.as_secs()
            )
        })
    }

    /// Count a finished run's outcome: failures increment, a success resets.
    pub async fn record(&mut self, report: &RunReport) {
        let workflow = report.workflow.as_str();
        if report.outcome.is_workflow_failure() {
            let failure_id = format!("{}/{}", report.run_id, report.retry_count);
            match self
                .table
                .record_failure(workflow, &failure_id, now_ms())
                .await
            {
                Ok(counter) => {
                    if counter.consecutive_failures >= self.policy.threshold {
                        warn!(
                            workflow,
                            consecutive_failures = counter.consecutive_failures,
                            "workflow flagged as poison pill"
                        );
                    }
                    self.seen.insert(workflow.to_string(), Some(counter));
                }
                Err(e) => error!(workflow, error = %e, "could not record the failure"),
            }
        } else if report.outcome == Outcome::Completed && self.counter(workflow).await.is_some() {
            match self.table.reset(workflow).await {
                Ok(()) => {
                    self.seen.insert(workflow.to_string(), None);
                }
                Err(e) => error!(workflow, error = %e, "could not reset the failure counter"),
            }
        }
    }

    /// The capabilities to claim with. Fail mode (the default) claims every registered
    /// workflow and fails runs of blocked ones.
    pub async fn capabilities_for_claim(
        &mut self,
        registered: &WorkerCapabilities,
    ) -> WorkerCapabilities {
        registered.clone()
    }

    /// Called with every claimed run, before [`PoisonGate::blocked_reason`].
    pub async fn on_claim(&mut self, _run: &Run) {}
}
