//! The worker's capacity-wait budget (`IRONFLOW_MAX_CAPACITY_WAIT_SECS`) for every provider: a
//! step that sets no `max_capacity_wait` gets it before its provider sees the step, so a
//! provider that waits for capacity on its own ([`crate::BedrockProvider`]) keeps to the same
//! budget as ironflow's account-aware provider.

use std::sync::Arc;
use std::time::Duration;

use ironflow_core::provider::{AgentConfig, AgentProvider, InvokeFuture, LogSink, ReleaseFuture};

/// `inner`, its steps given `max_capacity_wait` when they set none.
pub(crate) struct WorkerBudget {
    inner: Arc<dyn AgentProvider>,
    max_capacity_wait: Duration,
}

impl WorkerBudget {
    pub(crate) fn new(inner: Arc<dyn AgentProvider>, max_capacity_wait: Duration) -> Self {
        Self {
            inner,
            max_capacity_wait,
        }
    }

    /// `config` with the worker's budget when it has none of its own.
    fn budgeted(&self, config: &AgentConfig) -> AgentConfig {
        let mut config = config.clone();
        config
            .max_capacity_wait
            .get_or_insert(self.max_capacity_wait);
        config
    }
}

impl AgentProvider for WorkerBudget {
    fn invoke<'a>(&'a self, config: &'a AgentConfig) -> InvokeFuture<'a> {
        let config = self.budgeted(config);
        Box::pin(async move { self.inner.invoke(&config).await })
    }

    fn invoke_with_logs<'a>(
        &'a self,
        config: &'a AgentConfig,
        log_sink: Arc<dyn LogSink>,
    ) -> InvokeFuture<'a> {
        let config = self.budgeted(config);
        Box::pin(async move { self.inner.invoke_with_logs(&config, log_sink).await })
    }

    fn release_run<'a>(&'a self, run_id: &'a str) -> ReleaseFuture<'a> {
        self.inner.release_run(run_id)
    }

    fn account_kind(&self) -> Option<&'static str> {
        self.inner.account_kind()
    }

    fn account_kind_for(&self, config: &AgentConfig) -> Option<&'static str> {
        self.inner.account_kind_for(config)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ironflow_core::provider::AgentOutput;

    use super::*;

    /// Records the budget of each step it sees.
    #[derive(Default)]
    struct Seen(Mutex<Vec<Option<Duration>>>);

    impl AgentProvider for Seen {
        fn invoke<'a>(&'a self, config: &'a AgentConfig) -> InvokeFuture<'a> {
            self.0.lock().unwrap().push(config.max_capacity_wait);
            Box::pin(async { Ok(AgentOutput::new(serde_json::Value::Null)) })
        }
    }

    #[tokio::test]
    async fn a_step_without_a_budget_gets_the_worker_s_and_one_with_keeps_its_own() {
        let seen = Arc::new(Seen::default());
        let provider = WorkerBudget::new(seen.clone(), Duration::from_secs(600));
        provider.invoke(&AgentConfig::new("a")).await.unwrap();
        let own = AgentConfig::new("b").max_capacity_wait(Duration::from_secs(5));
        provider.invoke(&own).await.unwrap();
        assert_eq!(
            *seen.0.lock().unwrap(),
            [Some(Duration::from_secs(600)), Some(Duration::from_secs(5))]
        );
    }
}
