//! How one store call is attempted, retried and given up, inside its [`CallScope`].
//!
//! Every attempt is bounded: by the scope's end (its bound, and for an execution the end of the
//! lease's validity) and by a per-attempt limit that grows from [`FIRST_ATTEMPT_TIMEOUT`] to
//! [`MAX_ATTEMPT_TIMEOUT`], so that a request the API never answers is dropped and sent again
//! instead of waiting out the HTTP client's 30 s timeout. Between attempts the call backs off
//! (50 ms doubling to 1 s, with jitter). Three shapes of call:
//!
//! - [`read`]: safe to repeat; retried on every [fault](super::fault) until the scope's end
//!   (or a given number of attempts, [`Retries`]). A claim (`GET /runs/next`) is not dropped at
//!   the per-attempt limit: the API may have taken a run for it, which would then sit under a
//!   lease nobody refreshes; it is awaited until the scope's end.
//! - [`write()`]: an update the API may have applied although its answer was lost (a reset, a
//!   timeout, or `ApiRunStore`'s own retry meeting the illegal-transition 500 that the first,
//!   applied, attempt causes). Before it is sent again, a read-back of the stored state says
//!   whether it landed ([`ReadBack`]): a landed write is done, a run no longer this worker's
//!   stops everything, and only a write that did not land is sent again.
//! - [`once`]: must not be applied twice and cannot be read back: sent again only when the
//!   fault proves the request never left ([`ApiFault::never_sent`]).
//!
//! A refused worker token (401) first asks [`Credentials`] for a newer one (re-read from
//! Secrets Manager at most once a minute): a token rotated while the instance was warm is
//! picked up and the call retried at once.
//!
//! A call that cannot succeed before the scope's end gives up as the scope says
//! ([`OnFault`]): it returns the error, or stops the work and never returns.

use std::sync::Arc;
use std::time::Duration;

use ironflow_store::entities::RunStatus;
use ironflow_store::error::StoreError;
use rand::Rng;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::fault::{ApiFault, FaultKind, Route, classify};
use super::scope::{CallScope, OnFault, ScopeStop};
use crate::credentials::Credentials;
use crate::deadline::later;

/// Limit of a call's first attempt: 2 s. A healthy API answers in milliseconds (an answer of
/// [`super::scope::SLOW_ANSWER`] or more is time lost to the API already).
pub const FIRST_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// The per-attempt limit doubles up to 8 s, so that an API that is slow (not dead) is still
/// waited for.
pub const MAX_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(8);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How a [`read`] is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    /// At most this many attempts (`None`: until the scope's end).
    pub attempts: Option<u32>,
    /// Whether an attempt is dropped at the per-attempt limit (else awaited until the scope's
    /// end).
    pub attempt_limit: bool,
}

impl Retries {
    /// Every fault retried until the scope's end, each attempt bounded.
    pub const UNTIL_END: Self = Self {
        attempts: None,
        attempt_limit: true,
    };
}

/// What a read-back found about a write whose answer was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadBack<T> {
    /// The write landed (with the result the call returns).
    Applied(T),
    /// It did not land, and the run is still this worker's: send it again.
    Resend,
    /// The run is no longer Running under this worker's lease: nothing more may be written.
    RunLeft {
        /// Its status as read back.
        status: RunStatus,
        /// Who holds its lease now.
        held_by: Option<String>,
    },
    /// It cannot land: what it writes is settled otherwise (a step interrupted meanwhile, by
    /// an operator's pause or the API's reaper). The refusal goes to the caller, whose own
    /// handling decides (the engine's for an interrupted step).
    Refused(String),
    /// The state could not be read: read again before deciding.
    Unknown,
}

/// Attempts, backoff and the scope one call runs under.
struct Attempts<'a> {
    scope: Arc<CallScope>,
    route: Route,
    credentials: Option<&'a Credentials>,
    /// The token generation the last attempt was sent with.
    generation: u64,
    made: u32,
    backoff: Duration,
    /// Whether attempts are dropped at the per-attempt limit.
    attempt_limit: bool,
    /// Whether an attempt leaves a quarter of the time left for a read-back (writes).
    leave_for_read_back: bool,
}

impl<'a> Attempts<'a> {
    fn new(route: Route, credentials: Option<&'a Credentials>) -> Self {
        Self {
            scope: CallScope::current(),
            route,
            credentials,
            generation: 0,
            made: 0,
            backoff: FIRST_BACKOFF,
            attempt_limit: true,
            leave_for_read_back: false,
        }
    }

    /// One attempt of the call `call` makes: `Ok(Ok)` its answer, `Ok(Err)` an infrastructure
    /// fault (counted), `Err` an error that is the caller's (a refusal of the API's own). `None`
    /// when the scope has no time left for an attempt (and `call` is not called).
    ///
    /// The call's future is made here, in the timeout that bounds it, so that this future
    /// holds it once: every store call's future is moved whole into its box, so its size is
    /// paid at every call.
    async fn attempt<T, Fut: Future<Output = Result<T, StoreError>>>(
        &mut self,
        call: impl FnOnce() -> Fut,
    ) -> Option<Result<Result<T, ApiFault>, StoreError>> {
        let start = Instant::now();
        let end = self.scope.end();
        if start >= end {
            return None;
        }
        let limit = FIRST_ATTEMPT_TIMEOUT
            .saturating_mul(1 << self.made.min(3))
            .min(MAX_ATTEMPT_TIMEOUT);
        self.made += 1;
        self.generation = self.credentials.map_or(0, Credentials::generation);
        let mut bound = if self.attempt_limit {
            end.min(later(start, limit))
        } else {
            end
        };
        if self.leave_for_read_back {
            // A write that meets a fault is read back before anything else: keep time for it.
            bound = bound.min(later(start, (end - start).mul_f64(0.75)));
        }
        let answer = timeout_at(bound, call()).await;
        let fault = match answer {
            Ok(Ok(answer)) => {
                self.scope.answered(start.elapsed());
                return Some(Ok(Ok(answer)));
            }
            Ok(Err(e)) => match classify(self.route, &e) {
                Some(fault) => fault,
                None => {
                    self.scope.answered(start.elapsed());
                    return Some(Err(e));
                }
            },
            Err(_) => ApiFault::timeout(self.route, start.elapsed()),
        };
        self.scope.record(&fault);
        Some(Ok(Err(fault)))
    }

    /// Wait before the next attempt after `fault`. `false` when there is no point: no time left
    /// before the scope's end, or a refused token and no newer one.
    async fn pause(&mut self, fault: &ApiFault) -> bool {
        if fault.kind == FaultKind::Unauthorized {
            let renewed = match self.credentials {
                // Boxed: the renewal (a Secrets Manager call) is a large future, and only a
                // refused token awaits it; inline it would size every store call's future.
                Some(credentials) => {
                    Box::pin(credentials.renew_after_refusal(self.generation, self.scope.end()))
                        .await
                }
                None => false,
            };
            return renewed && Instant::now() < self.scope.end();
        }
        let jitter = rand::rng().random_range(0.5..1.5);
        let wait = self.backoff.mul_f64(jitter);
        self.backoff = self.backoff.saturating_mul(2).min(MAX_BACKOFF);
        let at = later(Instant::now(), wait);
        if at >= self.scope.end() {
            return false;
        }
        sleep_until(at).await;
        true
    }

    /// Give up on the call as the scope says, with `fault` (or, without one, for lack of time).
    async fn give_up<T>(&self, fault: Option<ApiFault>) -> Result<T, StoreError> {
        let fault = fault.unwrap_or_else(|| ApiFault {
            route: self.route,
            kind: FaultKind::Timeout,
            detail: "no time left for another attempt before the invocation's bound".into(),
        });
        match self.scope.on_fault() {
            OnFault::Return => Err(into_store_error(&fault)),
            OnFault::Stop => {
                self.scope.stop(ScopeStop::Fault(fault));
                std::future::pending().await
            }
        }
    }

    /// The run left this worker: stop, or return `LeaseLost`.
    async fn run_left<T>(
        &self,
        status: RunStatus,
        held_by: Option<String>,
    ) -> Result<T, StoreError> {
        match self.scope.on_fault() {
            OnFault::Return => Err(StoreError::LeaseLost {
                run_id: self.scope.run_key().map_or(uuid::Uuid::nil(), |k| k.run_id),
                held_by,
            }),
            OnFault::Stop => {
                self.scope.stop(ScopeStop::RunLeft { status, held_by });
                std::future::pending().await
            }
        }
    }

    /// Whether the call must not be sent: its scope is fenced, or the invocation claimed the
    /// scope's run again ([`CallScope::claimed_again`]).
    fn withheld(&self) -> bool {
        self.scope.is_fenced() || self.scope.claimed_again()
    }

    /// The answer of a call [withheld](Attempts::withheld).
    async fn withhold<T>(&self) -> Result<T, StoreError> {
        match self.scope.is_fenced() {
            true => self.held_back().await,
            false => self.claimed_again().await,
        }
    }

    /// The invocation claimed the scope's run again since the holding the call is made for
    /// began ([`CallScope::claimed_again`]): not sent. Stop, or return `LeaseLost` (held by this
    /// invocation's worker id, for its later claim).
    async fn claimed_again<T>(&self) -> Result<T, StoreError> {
        match self.scope.on_fault() {
            OnFault::Return => Err(StoreError::LeaseLost {
                run_id: self.scope.run_key().map_or(uuid::Uuid::nil(), |k| k.run_id),
                held_by: self.scope.run_key().map(|k| k.worker_id.clone()),
            }),
            OnFault::Stop => {
                self.scope.stop(ScopeStop::ClaimedAgain);
                std::future::pending().await
            }
        }
    }

    /// A fenced scope's call is held back: it never reaches the API.
    async fn held_back<T>(&self) -> Result<T, StoreError> {
        match self.scope.on_fault() {
            OnFault::Return => Err(StoreError::Database(format!(
                "worker HTTP error: {}: not sent, the run's fate is already being written",
                self.route
            ))),
            OnFault::Stop => std::future::pending().await,
        }
    }
}

/// The error a returning scope's caller gets for `fault`: the store's own message when the
/// fault came from one (`worker API error: ...` keeps its body), else ours.
fn into_store_error(fault: &ApiFault) -> StoreError {
    if fault.detail.starts_with("worker ") {
        StoreError::Database(fault.detail.clone())
    } else {
        StoreError::Database(format!("worker HTTP error: {fault}"))
    }
}

/// A call safe to repeat, retried on every fault until the scope's end, or until `attempts`
/// were made.
///
/// # Errors
///
/// The API's own refusal as it came; the last fault once retries are over (a returning scope).
pub async fn read<T, F, Fut>(
    route: Route,
    credentials: Option<&Credentials>,
    retries: Retries,
    mut call: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut a = Attempts::new(route, credentials);
    a.attempt_limit = retries.attempt_limit;
    let attempts = retries.attempts;
    let mut last = None;
    loop {
        if a.withheld() {
            return a.withhold().await;
        }
        let fault = match a.attempt(&mut call).await {
            None => return a.give_up(last).await,
            Some(Err(refused)) => return Err(refused),
            Some(Ok(Ok(answer))) => return Ok(answer),
            Some(Ok(Err(fault))) => fault,
        };
        if attempts.is_some_and(|max| a.made >= max) || !a.pause(&fault).await {
            return a.give_up(Some(fault)).await;
        }
        last = Some(fault);
    }
}

/// A write the API may have applied although its answer was lost: sent, and after a fault,
/// read back with `check` until it is known to have landed, to need sending again, or to be
/// moot (the run left this worker).
///
/// # Errors
///
/// The API's own refusal as it came; the last fault once the scope's time is over; `LeaseLost`
/// when the run left this worker (a returning scope).
pub async fn write<T, F, Fut, C, CFut>(
    route: Route,
    credentials: Option<&Credentials>,
    mut call: F,
    mut check: C,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
    C: FnMut() -> CFut,
    CFut: Future<Output = ReadBack<T>>,
{
    let mut a = Attempts::new(route, credentials);
    a.leave_for_read_back = true;
    let mut last = None;
    loop {
        if a.withheld() {
            return a.withhold().await;
        }
        let fault = match a.attempt(&mut call).await {
            None => return a.give_up(last).await,
            Some(Err(refused)) => return Err(refused),
            Some(Ok(Ok(answer))) => return Ok(answer),
            Some(Ok(Err(fault))) => fault,
        };
        // Not sent, or refused before it could apply: send it again as it is.
        if fault.never_sent() || fault.kind == FaultKind::Unauthorized {
            if !a.pause(&fault).await {
                return a.give_up(Some(fault)).await;
            }
            last = Some(fault);
            continue;
        }
        // The first read-back goes out at once (it is a request of its own); later ones back
        // off.
        let mut first = true;
        loop {
            if !first && !a.pause(&fault).await {
                return a.give_up(Some(fault)).await;
            }
            first = false;
            if Instant::now() >= a.scope.end() {
                return a.give_up(Some(fault)).await;
            }
            if a.scope.is_fenced() {
                return a.held_back().await;
            }
            let end = a
                .scope
                .end()
                .min(later(Instant::now(), MAX_ATTEMPT_TIMEOUT));
            match timeout_at(end, check()).await {
                Ok(ReadBack::Applied(answer)) => return Ok(answer),
                Ok(ReadBack::Resend) => {
                    last = Some(fault);
                    break;
                }
                Ok(ReadBack::RunLeft { .. }) if a.scope.claimed_again() => {
                    return a.claimed_again().await;
                }
                Ok(ReadBack::RunLeft { status, held_by }) => {
                    return a.run_left(status, held_by).await;
                }
                Ok(ReadBack::Refused(why)) => return Err(StoreError::Database(why)),
                Ok(ReadBack::Unknown) | Err(_) => {}
            }
        }
    }
}

/// A call that must not be applied twice and cannot be read back: sent again only when the
/// request surely never left (a connection that could not be made, a refused token renewed).
/// `stop_on_fault: false` returns the fault even in a stopping scope (a best-effort call whose
/// failure the engine tolerates).
///
/// # Errors
///
/// The API's own refusal as it came; the fault (a returning scope, or a best-effort call).
pub async fn once<T, F, Fut>(
    route: Route,
    credentials: Option<&Credentials>,
    stop_on_fault: bool,
    mut call: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut a = Attempts::new(route, credentials);
    let mut last = None;
    loop {
        if a.withheld() {
            return a.withhold().await;
        }
        let fault = match a.attempt(&mut call).await {
            None => return a.give_up(last).await,
            Some(Err(refused)) => return Err(refused),
            Some(Ok(Ok(answer))) => return Ok(answer),
            Some(Ok(Err(fault))) => fault,
        };
        let resendable = fault.never_sent() || fault.kind == FaultKind::Unauthorized;
        if !resendable || !a.pause(&fault).await {
            if !stop_on_fault {
                return Err(into_store_error(&fault));
            }
            return a.give_up(Some(fault)).await;
        }
        last = Some(fault);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::store::fault::FaultLog;

    fn refused_by_server() -> StoreError {
        StoreError::Database(
            "worker API error: {\"error\":{\"code\":\"DATABASE_ERROR\",\"message\":\"x\"}}".into(),
        )
    }

    fn reset() -> StoreError {
        StoreError::Database("worker HTTP error: connection reset by peer".into())
    }

    fn returning(for_: Duration) -> Arc<CallScope> {
        Arc::new(CallScope::returning(
            later(Instant::now(), for_),
            Arc::new(FaultLog::default()),
        ))
    }

    #[tokio::test]
    async fn a_read_is_retried_until_it_succeeds_and_the_faults_are_counted() {
        let faults = Arc::new(FaultLog::default());
        let scope = Arc::new(CallScope::returning(
            later(Instant::now(), Duration::from_secs(10)),
            faults.clone(),
        ));
        let calls = AtomicU32::new(0);
        let answer = scope
            .run(read("GET /runs/{id}", None, Retries::UNTIL_END, || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(refused_by_server()),
                    1 => Err(reset()),
                    _ => Ok(7),
                }
            }))
            .await;
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let counts = faults.snapshot();
        assert_eq!(counts.len(), 2, "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_is_time_lost_to_the_api_and_a_quick_one_is_not() {
        let scope = returning(Duration::from_secs(10));
        let quick = scope
            .clone()
            .run(read("GET /runs/{id}", None, Retries::UNTIL_END, || async {
                Ok::<_, StoreError>(1)
            }))
            .await;
        assert_eq!(quick.unwrap(), 1);
        assert!(!scope.lost_time_to_api());
        let slow = scope
            .clone()
            .run(read("GET /runs/{id}", None, Retries::UNTIL_END, || async {
                tokio::time::sleep(Duration::from_millis(1200)).await;
                Ok::<_, StoreError>(2)
            }))
            .await;
        assert_eq!(slow.unwrap(), 2);
        assert!(scope.lost_time_to_api(), "an answer of 1.2 s");
        assert!(!scope.saw_fault(), "slow, not a fault");
    }

    #[tokio::test]
    async fn the_api_s_own_refusal_is_returned_at_once() {
        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = returning(Duration::from_secs(10))
            .run(read("GET /runs/{id}", None, Retries::UNTIL_END, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Database(
                    "worker API error: {\"error\":{\"code\":\"BAD_REQUEST\"}}".into(),
                ))
            }))
            .await;
        assert!(answer.unwrap_err().to_string().contains("BAD_REQUEST"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_is_dropped_at_the_scope_s_end() {
        let started = Instant::now();
        let answer: Result<(), _> = returning(Duration::from_secs(5))
            .run(read("GET /runs/next", None, Retries::UNTIL_END, || {
                std::future::pending::<Result<(), StoreError>>()
            }))
            .await;
        let waited = started.elapsed();
        assert!(waited <= Duration::from_secs(5), "{waited:?}");
        let error = answer.unwrap_err().to_string();
        assert!(error.contains("did not answer in time"), "{error}");
    }

    #[tokio::test]
    async fn a_write_whose_answer_was_lost_is_read_back_and_not_sent_twice() {
        let sent = AtomicU32::new(0);
        let answer = returning(Duration::from_secs(10))
            .run(write(
                "PUT /runs/{id}",
                None,
                || async {
                    sent.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(reset())
                },
                || async { ReadBack::Applied(()) },
            ))
            .await;
        assert!(answer.is_ok());
        assert_eq!(sent.load(Ordering::SeqCst), 1, "landed: not sent again");
    }

    #[tokio::test]
    async fn a_write_that_did_not_land_is_sent_again_and_one_whose_run_left_is_not() {
        let sent = AtomicU32::new(0);
        let answer = returning(Duration::from_secs(10))
            .run(write(
                "PUT /runs/{id}",
                None,
                || async {
                    match sent.fetch_add(1, Ordering::SeqCst) {
                        0 => Err(refused_by_server()),
                        _ => Ok(()),
                    }
                },
                || async { ReadBack::Resend },
            ))
            .await;
        assert!(answer.is_ok());
        assert_eq!(sent.load(Ordering::SeqCst), 2);

        let answer: Result<(), _> = returning(Duration::from_secs(10))
            .run(write(
                "PUT /runs/{id}",
                None,
                || async { Err(reset()) },
                || async {
                    ReadBack::RunLeft {
                        status: RunStatus::Cancelled,
                        held_by: None,
                    }
                },
            ))
            .await;
        assert!(matches!(answer, Err(StoreError::LeaseLost { .. })));
    }

    #[tokio::test]
    async fn a_call_that_must_not_be_repeated_is_sent_again_only_when_it_never_left() {
        let sent = AtomicU32::new(0);
        let answer = returning(Duration::from_secs(10))
            .run(once("POST /steps", None, true, || async {
                match sent.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(StoreError::Database(
                        "worker HTTP error: error sending request: client error (Connect): \
                         tcp connect error"
                            .into(),
                    )),
                    _ => Ok(1),
                }
            }))
            .await;
        assert_eq!(answer.unwrap(), 1);
        assert_eq!(sent.load(Ordering::SeqCst), 2);

        let sent = AtomicU32::new(0);
        let answer: Result<(), _> = returning(Duration::from_secs(10))
            .run(once("POST /steps", None, true, || async {
                sent.fetch_add(1, Ordering::SeqCst);
                Err(reset())
            }))
            .await;
        assert!(answer.is_err());
        assert_eq!(sent.load(Ordering::SeqCst), 1, "it may have landed");
    }

    #[tokio::test]
    async fn a_stopping_scope_stops_its_work_instead_of_returning_a_fault() {
        let faults = Arc::new(FaultLog::default());
        let lease = Arc::new(crate::deadline::LeaseClock::new(
            Instant::now(),
            Duration::from_millis(300),
        ));
        let key = super::super::scope::RunKey {
            run_id: uuid::Uuid::nil(),
            worker_id: "w".into(),
            claimed_recoveries: None,
            holding: None,
        };
        let scope = Arc::new(CallScope::execution(
            key,
            later(Instant::now(), Duration::from_secs(60)),
            lease,
            faults,
        ));
        let work = scope
            .clone()
            .run(read("GET /runs/{id}", None, Retries::UNTIL_END, || async {
                Err::<(), _>(reset())
            }));
        tokio::select! {
            _ = work => panic!("a stopping scope's call returned"),
            stop = scope.stopped() => assert!(matches!(stop, ScopeStop::Fault(f) if f.kind == FaultKind::Transport)),
        }
    }

    #[tokio::test]
    async fn a_fenced_scope_sends_nothing() {
        let scope = returning(Duration::from_secs(10));
        scope.fence();
        let sent = AtomicU32::new(0);
        let answer: Result<(), _> = scope
            .run(read("GET /runs/{id}", None, Retries::UNTIL_END, || async {
                sent.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }))
            .await;
        assert!(answer.is_err());
        assert_eq!(sent.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_calls_of_a_holding_claimed_again_are_not_sent() {
        use super::super::claim_log::ClaimLog;
        use super::super::scope::RunKey;

        let log = Arc::new(ClaimLog::default());
        let key = RunKey::claimed_in(&log);
        let run_id = key.run_id;
        let sent = AtomicU32::new(0);
        let write = || {
            write(
                "PUT /runs/{id}",
                None,
                || async {
                    sent.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
                || async { ReadBack::Resend },
            )
        };
        let returning = || {
            Arc::new(
                CallScope::returning(
                    later(Instant::now(), Duration::from_secs(10)),
                    Arc::default(),
                )
                .with_run(key.clone()),
            )
        };
        returning().run(write()).await.unwrap();
        assert_eq!(sent.load(Ordering::SeqCst), 1, "its own claim's holding");

        log.claimed(run_id);
        let answer = returning().run(write()).await;
        assert!(
            matches!(&answer, Err(StoreError::LeaseLost { held_by: Some(w), .. }) if w == "w"),
            "{answer:?}"
        );
        assert_eq!(sent.load(Ordering::SeqCst), 1, "not sent after the claim");

        let lease = Arc::new(crate::deadline::LeaseClock::new(
            Instant::now(),
            Duration::from_secs(30),
        ));
        let scope = Arc::new(CallScope::execution(
            key.clone(),
            later(Instant::now(), Duration::from_secs(60)),
            lease,
            Arc::default(),
        ));
        tokio::select! {
            _ = scope.clone().run(write()) => panic!("a stopping scope's call returned"),
            stop = scope.stopped() => assert_eq!(stop, ScopeStop::ClaimedAgain),
        }
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }
}
