//! A wake queue in this process, for local runs: what the receiver and the batches send waits
//! here, delayed as SQS would delay it, until the local runner takes it
//! ([`LocalWakeQueue::receive`]) and hands it to the handler as an SQS event, as Lambda's event
//! source mapping does with the deployed queue.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use super::WakeQueue;

/// Messages one receive takes at most: 10, as an SQS event source mapping's batch.
pub const MAX_RECEIVED: usize = 10;

/// A wake queue in memory (see the module docs).
#[derive(Debug, Default)]
pub struct LocalWakeQueue {
    /// Each message's body and when it becomes visible.
    messages: Mutex<Vec<(Instant, String)>>,
    arrived: Notify,
}

impl LocalWakeQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn messages(&self) -> MutexGuard<'_, Vec<(Instant, String)>> {
        self.messages.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Messages waiting now, visible or delayed.
    pub fn len(&self) -> usize {
        self.messages().len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait until a message is visible (or `until`), then take the visible ones, oldest first,
    /// at most 10 (as an SQS event source mapping); empty when `until` came first.
    pub async fn receive(&self, until: Instant) -> Vec<String> {
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let now = Instant::now();
            let next = {
                let mut messages = self.messages();
                messages.sort_by_key(|(visible, _)| *visible);
                let visible = messages.iter().take_while(|(at, _)| *at <= now).count();
                if visible > 0 {
                    let taken = messages.drain(..visible.min(MAX_RECEIVED));
                    return taken.map(|(_, body)| body).collect();
                }
                messages.first().map(|(at, _)| *at)
            };
            if now >= until {
                return Vec::new();
            }
            let wake_at = next.map_or(until, |at| at.min(until));
            tokio::select! {
                () = &mut arrived => {}
                () = sleep_until(wake_at) => {}
            }
        }
    }
}

#[async_trait]
impl WakeQueue for LocalWakeQueue {
    async fn depth(&self) -> Result<u64, String> {
        let now = Instant::now();
        let visible = self.messages().iter().filter(|(at, _)| *at <= now).count();
        Ok(u64::try_from(visible).unwrap_or(u64::MAX))
    }

    async fn send(
        &self,
        count: usize,
        body: &str,
        delay_secs: u64,
        _trace_id: Option<&str>,
    ) -> (usize, Vec<String>) {
        let visible = Instant::now() + Duration::from_secs(delay_secs.min(900));
        self.messages()
            .extend((0..count).map(|_| (visible, body.to_string())));
        self.arrived.notify_waiters();
        (count, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn messages_become_visible_after_their_delay_and_are_taken_once() {
        let queue = LocalWakeQueue::new();
        queue.send(2, "later", 5, None).await;
        queue.send(1, "now", 0, None).await;
        assert_eq!(queue.depth().await, Ok(1), "the visible one");
        assert_eq!(queue.len(), 3);
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(queue.receive(far).await, ["now"]);
        let started = Instant::now();
        assert_eq!(queue.receive(far).await, ["later", "later"]);
        assert!(started.elapsed() >= Duration::from_secs(5), "delayed");
        assert!(queue.is_empty());
        assert!(
            queue
                .receive(Instant::now() + Duration::from_secs(1))
                .await
                .is_empty()
        );
    }
}
