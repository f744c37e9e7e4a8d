//! Which run started a process: every process a run's steps start carries that run's mark, so
//! that the end of one run kills its processes and no other run's, while other runs (of this
//! invocation or of another in the same process) go on.
//!
//! The mark is the Linux *timer slack* (`prctl(PR_SET_TIMERSLACK)`): a per-thread value that a
//! child inherits at `fork`, keeps across `exec`, passes on to its own children whatever they do
//! (`setsid`, a double fork, re-parenting to the subreaper), that programs seldom change, and that
//! `/proc/<pid>/timerslack_ns` shows. ironflow's shell steps spawn their processes from the
//! thread that polls the step (tokio's `Command::spawn` forks there, with `kill_on_drop` as its
//! only cleanup), so a run's execution sets the run's mark on the thread for each poll
//! ([`RunMark::mark`]) and puts the thread's own value back after it.
//!
//! Invariants:
//! - marks are 50 001 to 115 535 ns, each live run's its own (they repeat only after 65 535 runs,
//!   far more than run at once); the default slack is 50 000 ns, so a thread polling a run wakes
//!   from its timers at most ~65 µs later than it would;
//! - [`RunMark::kill_processes`] kills only descendants of this process that carry the mark;
//!   where `/proc/<pid>/timerslack_ns` cannot be read (an old kernel, a restricted `/proc`) it
//!   finds none, and the invocation's sweep ([`crate::orphans`]) remains the last resort.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use rustix::thread::{current_timer_slack, set_current_timer_slack};

use crate::orphans;

/// The default timer slack of a Linux thread, in ns: the marks sit just above it.
const BASE: u64 = 50_000;
/// How many marks there are before they repeat.
const SPAN: u64 = 65_535;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// Marks of the runs executing now, with how many runs hold each (marks repeat after
/// [`SPAN`] runs).
static LIVE: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

fn live() -> MutexGuard<'static, BTreeMap<u64, usize>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One run's mark (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunMark(NonZeroU64);

/// A mark held by a run that executes: [`belongs_to_a_live_run`] sees the processes that carry
/// it until it is dropped. Take it before the run spawns anything. Dropped before its run's
/// processes were ended ([`LiveMark::ended`]) — the execution was cancelled, as when its
/// invocation is dropped — it kills them (SIGKILL, without waiting: the last sweep reaps them),
/// so that they never outlive a run another worker may take next.
#[derive(Debug)]
pub struct LiveMark {
    mark: RunMark,
    ended: bool,
}

impl LiveMark {
    /// A new run's mark ([`RunMark::next`]), live until dropped.
    pub fn new() -> Self {
        let mark = RunMark::next();
        *live().entry(mark.nanos()).or_default() += 1;
        Self { mark, ended: false }
    }

    /// The mark.
    pub fn mark(&self) -> RunMark {
        self.mark
    }

    /// The run's processes were ended ([`RunMark::kill_processes`]): dropping the mark leaves
    /// the rest to the invocation's sweep.
    pub fn ended(mut self) {
        self.ended = true;
    }
}

impl Default for LiveMark {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LiveMark {
    fn drop(&mut self) {
        if !self.ended && !orphans::has_no_child() {
            self.mark.kill_processes(Duration::ZERO);
        }
        let mut live = live();
        let nanos = self.mark.nanos();
        if let Some(holders) = live.get_mut(&nanos) {
            *holders = holders.saturating_sub(1);
            if *holders == 0 {
                live.remove(&nanos);
            }
        }
    }
}

/// Whether process `pid` carries the mark of a run that executes now (false where its timer
/// slack cannot be read). Blocking: reads `/proc`.
pub fn belongs_to_a_live_run(pid: i32) -> bool {
    timer_slack(pid).is_some_and(|nanos| live().contains_key(&nanos))
}

impl RunMark {
    /// A mark no live run of this process has.
    pub fn next() -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % SPAN + 1;
        Self(NonZeroU64::new(BASE + n).unwrap_or(NonZeroU64::MIN))
    }

    /// The timer slack that is this mark, in ns.
    pub fn nanos(self) -> u64 {
        self.0.get()
    }

    /// `future`, polled with this mark on the polling thread: the processes it spawns carry it.
    pub fn mark<F: Future>(self, future: F) -> Marked<F> {
        Marked {
            mark: self,
            inner: Box::pin(future),
        }
    }

    /// Kill (SIGKILL) every descendant of this process that carries this mark, and reap those
    /// that are its children, waiting at most `wait`. Blocking: `/proc` is read (callers skip
    /// it when [`orphans::has_no_child`]). Returns how many were killed.
    pub fn kill_processes(self, wait: Duration) -> usize {
        let marked: Vec<i32> = orphans::descendants()
            .into_iter()
            .filter(|pid| carries(*pid, self))
            .collect();
        orphans::kill_and_reap(&marked, wait)
    }
}

/// Whether process `pid` carries `mark` (false where its timer slack cannot be read).
fn carries(pid: i32, mark: RunMark) -> bool {
    timer_slack(pid) == Some(mark.nanos())
}

/// The timer slack of process `pid`, in ns, where `/proc` shows it.
fn timer_slack(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/timerslack_ns"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
}

/// A future polled under a run's mark ([`RunMark::mark`]).
pub struct Marked<F> {
    mark: RunMark,
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for Marked<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _restored = Slack::set(self.mark.0);
        self.inner.as_mut().poll(cx)
    }
}

thread_local! {
    /// The timer slack of this thread as [`Slack`] last left it: `None` until the thread's first
    /// marked poll reads it from the kernel. Only marked polls change a thread's slack, and each
    /// puts the value it found back, so the value kept here is the kernel's: a poll makes two
    /// system calls (set the mark, put the value back), not three. A process spawned from a
    /// thread's own code (outside a marked poll) carries the thread's value, as before.
    static SLACK: std::cell::Cell<Option<Option<NonZeroU64>>> = const { std::cell::Cell::new(None) };
}

/// A mark set on the polling thread; dropping it puts the thread's previous value back (after
/// the poll, or while a panic in the poll unwinds).
struct Slack {
    previous: Option<NonZeroU64>,
}

impl Slack {
    /// Set `mark` on this thread. A kernel that refuses leaves the processes unmarked: the
    /// invocation's sweep remains.
    fn set(mark: NonZeroU64) -> Self {
        // The thread's value before the poll (0, the thread's default, if it cannot be read).
        let previous = SLACK
            .with(std::cell::Cell::get)
            .unwrap_or_else(|| current_timer_slack().ok().and_then(NonZeroU64::new));
        let _ = set_current_timer_slack(Some(mark));
        SLACK.with(|slack| slack.set(Some(Some(mark))));
        Self { previous }
    }
}

impl Drop for Slack {
    fn drop(&mut self) {
        let _ = set_current_timer_slack(self.previous);
        SLACK.with(|slack| slack.set(Some(self.previous)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marked poll leaves the thread's slack as it found it: after the poll, after a nested
    /// marked poll, and after a poll that panics.
    #[test]
    fn a_marked_poll_puts_the_thread_s_slack_back_even_when_it_panics() {
        std::thread::spawn(|| {
            let own = current_timer_slack().unwrap();
            let (outer, inner) = (RunMark::next(), RunMark::next());
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            let nested = outer.mark(async move {
                assert_eq!(current_timer_slack().unwrap(), outer.nanos());
                let mut inner_future = Box::pin(inner.mark(async move {
                    assert_eq!(current_timer_slack().unwrap(), inner.nanos());
                }));
                assert!(
                    inner_future
                        .as_mut()
                        .poll(&mut Context::from_waker(std::task::Waker::noop()))
                        .is_ready()
                );
                // Back to the outer mark: a process spawned now is the outer run's.
                assert_eq!(current_timer_slack().unwrap(), outer.nanos());
            });
            assert!(std::pin::pin!(nested).poll(&mut cx).is_ready());
            assert_eq!(current_timer_slack().unwrap(), own);

            let panicking = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let marked = outer.mark(async { panic!("a step panics") });
                let _ = std::pin::pin!(marked).poll(&mut Context::from_waker(waker));
            }));
            assert!(panicking.is_err());
            assert_eq!(
                current_timer_slack().unwrap(),
                own,
                "the panic's unwind puts it back"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn marks_differ_and_sit_above_the_default_slack() {
        let (a, b) = (RunMark::next(), RunMark::next());
        assert_ne!(a, b);
        for m in [a, b] {
            assert!((BASE + 1..=BASE + SPAN).contains(&m.nanos()), "{m:?}");
        }
    }

    /// Relies on nextest's one process per test: no other test's processes are about.
    #[tokio::test]
    async fn a_marked_future_s_processes_and_their_detached_children_are_killed_and_no_other() {
        // Detached processes are re-parented to this process, as in the worker.
        assert!(orphans::become_subreaper());
        let own = current_timer_slack().unwrap();
        let (mine, other) = (RunMark::next(), RunMark::next());
        let dir = std::env::temp_dir().join(format!("mark-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let spawn = |file: &str| {
            let pid_file = dir.join(file);
            // A detached grandchild (its own session), its pid written down.
            let script = format!("setsid sleep 600 & echo $! > '{}'", pid_file.display());
            async move {
                tokio::process::Command::new("sh")
                    .args(["-c", &script])
                    .status()
                    .await
                    .unwrap();
                std::fs::read_to_string(pid_file)
                    .unwrap()
                    .trim()
                    .parse::<i32>()
                    .unwrap()
            }
        };
        let mine_pid = mine.mark(spawn("mine")).await;
        let other_pid = other.mark(spawn("other")).await;
        assert_eq!(
            current_timer_slack().unwrap(),
            own,
            "the thread's own slack is back after each poll"
        );

        assert!(mine.kill_processes(Duration::from_secs(1)) >= 1);
        let alive = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| !stat.contains(") Z "))
        };
        assert!(!alive(mine_pid), "the marked run's grandchild is killed");
        assert!(alive(other_pid), "another run's process is left alone");
        assert!(other.kill_processes(Duration::from_secs(1)) >= 1);
        assert!(!alive(other_pid));
        let _ = std::fs::remove_dir_all(dir);
    }
}
