//! What this worker knows of the runs it holds under its leases: one view per run, which
//! answers the engine's reads of that run without a request (see [`super`]'s module docs for
//! why that is sound).
//!
//! Invariants:
//! - a copy answers reads only until `fresh_until`: one lease refresh interval after the request
//!   that fetched it (the claim, or the latest live read) was sent;
//! - a write of the run takes the copy out while it is in flight; a write that lands and only
//!   records progress ([`is_progress`]) puts the copy back with the write applied, any other
//!   write leaves the next read to the API;
//! - the read-back of a final write that landed ([`is_final`]: the engine's finalize, a
//!   terminal status and its completion time) is built from the copy: the run as that write
//!   left it;
//! - the steps read while the run waited for a slot answer the engine's first step list only,
//!   within one refresh interval of their request;
//! - [`Views::forget`] (the run left Running by someone else's hand, seen by the refresher) wins
//!   over a write in flight: the copy taken out before it is never put back.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::Utc;
use ironflow_store::prelude::*;
use tokio::time::Instant;
use uuid::Uuid;

use crate::deadline::later;

/// The views of the runs held, by run id.
#[derive(Default)]
pub struct Views(Mutex<HashMap<Uuid, View>>);

/// One run's view.
struct View {
    /// The copy; `None` after a write that changed the run, until the next live read.
    run: Option<Run>,
    fresh_until: Instant,
    /// How long a copy answers reads after its request was sent (the lease refresh interval).
    valid_for: Duration,
    /// Bumped by [`Views::forget`]: a copy taken out under an older epoch is not put back.
    epoch: u64,
    /// The run's steps read while it waited for a slot (claimed ahead), for the engine's first
    /// step list, until when they answer it.
    steps: Option<(Vec<Step>, Instant)>,
}

/// A copy taken out for a write in flight (see [`Views::take`]).
pub struct Taken {
    run: Run,
    epoch: u64,
}

impl Views {
    fn entries(&self) -> MutexGuard<'_, HashMap<Uuid, View>> {
        // The map holds plain data: a panic while it was held leaves nothing half-written.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Start viewing `run`, fetched by a request sent at `sent`: its copy answers reads for
    /// `valid_for` after `sent`.
    pub fn insert(&self, run: &Run, sent: Instant, valid_for: Duration) {
        let view = View {
            run: Some(run.clone()),
            fresh_until: later(sent, valid_for),
            valid_for,
            epoch: 0,
            steps: None,
        };
        self.entries().insert(run.id, view);
    }

    /// Stop viewing `run_id` (its execution stopped).
    pub fn remove(&self, run_id: Uuid) {
        self.entries().remove(&run_id);
    }

    /// Runs viewed.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// The copy of `run_id`, if viewed and fresh.
    pub fn fresh(&self, run_id: Uuid) -> Option<Run> {
        let entries = self.entries();
        let view = entries.get(&run_id)?;
        view.run
            .as_ref()
            .filter(|_| Instant::now() < view.fresh_until)
            .cloned()
    }

    /// The epoch of `run_id`'s view, taken before a live read is sent (see [`Views::renew`]).
    pub fn epoch(&self, run_id: Uuid) -> Option<u64> {
        self.entries().get(&run_id).map(|v| v.epoch)
    }

    /// A live read of `run`, whose request was sent at `sent` under view epoch `epoch`, renews
    /// its view (if viewed), unless the run was forgotten meanwhile: the answer may predate
    /// what made it forgotten.
    pub fn renew(&self, run: &Run, sent: Instant, epoch: Option<u64>) {
        if let Some(view) = self.entries().get_mut(&run.id)
            && Some(view.epoch) == epoch
        {
            view.run = Some(run.clone());
            view.fresh_until = later(sent, view.valid_for);
        }
    }

    /// `steps` of a viewed run, read by a request sent at `sent` while it waited for a slot,
    /// answer the engine's first step list for one refresh interval after `sent`.
    pub fn keep_steps(&self, run_id: Uuid, steps: Vec<Step>, sent: Instant) {
        if let Some(view) = self.entries().get_mut(&run_id) {
            view.steps = Some((steps, later(sent, view.valid_for)));
        }
    }

    /// The steps kept for `run_id`, once, if still fresh.
    pub fn take_steps(&self, run_id: Uuid) -> Option<Vec<Step>> {
        let (steps, fresh_until) = self.entries().get_mut(&run_id)?.steps.take()?;
        (Instant::now() < fresh_until).then_some(steps)
    }

    /// The run left Running by someone else's hand (a pause or a cancel): the next read goes
    /// to the API, whatever write is in flight.
    pub fn forget(&self, run_id: Uuid) {
        if let Some(view) = self.entries().get_mut(&run_id) {
            view.run = None;
            view.steps = None;
            view.epoch = view.epoch.saturating_add(1);
        }
    }

    /// Take the copy out for a write of the run: until [`Views::put_back`], reads go to the API.
    pub fn take(&self, run_id: Uuid) -> Option<Taken> {
        let mut entries = self.entries();
        let view = entries.get_mut(&run_id)?;
        let run = view.run.take()?;
        Some(Taken {
            run,
            epoch: view.epoch,
        })
    }

    /// A write of progress (see [`is_progress`]) landed: put the copy back with `update`
    /// applied, as the API applied it, unless the run was forgotten since it was taken.
    pub fn put_back(&self, taken: Taken, update: &RunUpdate) {
        let Taken { mut run, epoch } = taken;
        let mut entries = self.entries();
        let Some(view) = entries.get_mut(&run.id) else {
            return;
        };
        if view.epoch == epoch && view.run.is_none() {
            apply_progress(&mut run, update);
            view.run = Some(run);
        }
    }

    /// What the read-back of a final write (see [`is_final`]) that landed returns, built from
    /// the copy taken out for it: the run as the API's transition left it (the status, its
    /// completion time and the fields given applied; the lease and any capacity wait cleared).
    /// `None` when    /// the run was forgotten since the copy was taken: the read-back then goes to the API.
    pub fn finished(&self, taken: Taken, update: &RunUpdate) -> Option<Run> {
        let Taken { mut run, epoch } = taken;
        let current = self.entries().get(&run.id).map(|v| v.epoch);
        if current != Some(epoch) {
            return None;
        }
        let status = update.status?;
        run.status.state = status;
        run.worker_id = None;
        run.lease_expires_at = None;
        run.capacity_wait_kind = None;
        apply_progress(&mut run, update);
        Some(run)
    }
}

/// Whether `update` only records a held run's progress: no status, lease, retry count,
/// schedule, resume target or capacity wait. The API applies such fields as given, so the
/// copy can apply them too (the engine's `persist_progress` after each step: cost, duration).
pub fn is_progress(update: &RunUpdate) -> bool {
    update.status.is_none() && only_given_fields(update)
}

/// Whether the API applies `update` as the fields given, and nothing it derives from the run:
/// no lease, retry count, schedule, resume target or capacity wait.
fn only_given_fields(update: &RunUpdate) -> bool {
    !update.increment_retry
        && update.lease.is_none()
        && update.scheduled_at.is_none()
        && update.resume_status.is_none()
        && update.capacity_wait_kind.is_none()
}

/// Whether `update` ends a held run as the engine's finalize does: a terminal status with its
/// completion time, and nothing else the API would apply beyond the fields given. Its
/// read-back is then known without a request ([`Views::finished`]).
pub fn is_final(update: &RunUpdate) -> bool {
    update.status.is_some_and(|s| s.is_terminal())
        && update.completed_at.is_some()
        && only_given_fields(update)
}

/// The fields of a progress update, applied as ironflow-store applies them.
fn apply_progress(run: &mut Run, update: &RunUpdate) {
    if let Some(error) = &update.error {
        run.error = Some(error.clone());
    }
    if let Some(cost) = update.cost_usd {
        run.cost_usd = cost;
    }
    if let Some(duration) = update.duration_ms {
        run.duration_ms = duration;
    }
    if let Some(started) = update.started_at {
        run.started_at = Some(started);
    }
    if let Some(completed) = update.completed_at {
        run.completed_at = Some(completed);
    }
    if let Some(output) = &update.output {
        run.output = Some(output.clone());
    }
    run.updated_at = Utc::now();
}
