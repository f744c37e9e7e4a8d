//! Which invocations a worker serves at once: at most M ([`Settings::concurrent_invocations`],
//! `AWS_LAMBDA_MAX_CONCURRENCY`), and none once the process is retiring.
//!
//! On-demand Lambda sends an execution environment one event at a time (M = 1); Lambda Managed
//! Instances send up to M at once, each to one of the runtime's M polling loops. A caller that
//! drives [`crate::handle`] itself with more events than M at once sees the extra ones wait
//! for a turn, their deadline running.
//!
//! A process *retires* when an execution is stuck in workflow code after a response
//! ([`crate::layers::ExitWhenStuckLayer`]): from then on it admits no invocation (the event is
//! answered with an error for Lambda to retry elsewhere; nothing is claimed: a run whose stuck
//! execution still holds it here would only wait), and it ends once the invocations still in
//! flight have answered. The retirement and the count of those in flight are one step under one
//! lock, so no invocation is admitted between them.
//!
//! A webhook request ([`crate::webhook`]) takes no slot (it runs no batch and answers within
//! milliseconds) but holds the process all the same: [`Admission::hold_request`] counts it
//! among those in flight until it is answered, retiring or not, so the last one to answer ends
//! the process and none is cut off unanswered.
//!
//! [`Settings::concurrent_invocations`]: crate::Settings::concurrent_invocations
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, timeout_at};

/// The invocations of one worker: a slot each, at most M, counted while in flight.
#[derive(Debug)]
pub(crate) struct Admission {
    slots: Semaphore,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    /// Webhook requests in flight (not in `in_flight`, which counts batches).
    requests: usize,
    retiring: bool,
}

/// Why an invocation was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No slot freed before the invocation's time was up.
    NoSlotInTime,
    /// The process is retiring.
    Retiring,
}

/// An admitted invocation: it holds its slot and counts as in flight until dropped.
#[derive(Debug)]
pub(crate) struct Admitted<'a> {
    admission: &'a Admission,
    _slot: SemaphorePermit<'a>,
}

/// A webhook request in flight: it holds the process until dropped.
#[derive(Debug)]
pub(crate) struct HeldRequest<'a> {
    admission: &'a Admission,
}

impl Admission {
    /// At most `max` invocations at once (at least 1).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            slots: Semaphore::new(max.max(1)),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for a slot until `until`, then count the invocation in flight, unless the process
    /// is retiring.
    pub(crate) async fn enter(&self, until: Instant) -> Result<Admitted<'_>, Refused> {
        let slot = match timeout_at(until, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            // The semaphore is never closed; a closed one admits nobody all the same.
            Ok(Err(_)) => return Err(Refused::Retiring),
            Err(_) => return Err(Refused::NoSlotInTime),
        };
        let mut state = self.state();
        if state.retiring {
            return Err(Refused::Retiring);
        }
        state.in_flight += 1;
        Ok(Admitted {
            admission: self,
            _slot: slot,
        })
    }

    /// Count a webhook request in flight until the guard is dropped: no slot, admitted even
    /// when retiring (it claims nothing), and the process does not end under it.
    pub(crate) fn hold_request(&self) -> HeldRequest<'_> {
        self.state().requests += 1;
        HeldRequest { admission: self }
    }

    /// Invocations in flight now (batches; webhook requests are not counted).
    pub(crate) fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    /// Retire the process: from now on it admits no invocation. Returns the invocations still
    /// in flight, webhook requests included (read in the same step: none can be admitted in
    /// between).
    pub(crate) fn retire(&self) -> usize {
        let mut state = self.state();
        state.retiring = true;
        state.in_flight.saturating_add(state.requests)
    }
}

impl Drop for HeldRequest<'_> {
    fn drop(&mut self) {
        let mut state = self.admission.state();
        state.requests = state.requests.saturating_sub(1);
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut state = self.admission.state();
        state.in_flight = state.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn at_most_m_are_in_flight_and_the_next_waits_for_a_slot_or_its_time() {
        let admission = Admission::new(2);
        let a = admission.enter(soon()).await.unwrap();
        let _b = admission.enter(soon()).await.unwrap();
        assert_eq!(admission.in_flight(), 2);
        let late = admission.enter(Instant::now()).await;
        assert_eq!(late.unwrap_err(), Refused::NoSlotInTime);
        drop(a);
        assert_eq!(admission.in_flight(), 1);
        let _c = admission.enter(soon()).await.unwrap();
        assert_eq!(admission.in_flight(), 2);
    }

    #[tokio::test]
    async fn a_retiring_process_admits_nobody_and_counts_those_still_in_flight() {
        let admission = Admission::new(2);
        let a = admission.enter(soon()).await.unwrap();
        assert_eq!(admission.retire(), 1, "one still in flight");
        assert_eq!(
            admission.enter(soon()).await.unwrap_err(),
            Refused::Retiring
        );
        drop(a);
        assert_eq!(admission.retire(), 0, "the last one has answered");
        assert_eq!(admission.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_webhook_request_in_flight_holds_a_retiring_process_without_taking_a_slot() {
        let admission = Admission::new(1);
        let batch = admission.enter(soon()).await.unwrap();
        let request = admission.hold_request();
        assert_eq!(admission.in_flight(), 1, "a request is not a batch");
        drop(batch);
        assert_eq!(
            admission.retire(),
            1,
            "the request still in flight holds the process"
        );
        let late = admission.hold_request();
        assert_eq!(admission.retire(), 2);
        drop((request, late));
        assert_eq!(admission.retire(), 0, "the last one has answered");
    }
}
