//! CPU time and context switches of the bench process and its reaped children over a span
//! (`getrusage(2)`), and per run drained.

use std::time::Duration;

use crate::stats;

/// [`Usage`] per run drained.
#[derive(Debug, Clone, Copy)]
pub struct UsagePerRun {
    /// This process's CPU time per run, in ms.
    pub cpu_ms: f64,
    /// The reaped children's CPU time per run, in ms.
    pub children_cpu_ms: f64,
    pub voluntary_switches: f64,
    pub involuntary_switches: f64,
}

impl UsagePerRun {
    /// The field-by-field median of `usages` per run, `runs` runs each.
    pub fn median<'a>(usages: impl IntoIterator<Item = &'a Usage>, runs: usize) -> Self {
        let per_run: Vec<UsagePerRun> = usages.into_iter().map(|u| u.per_run(runs)).collect();
        let median =
            |f: fn(&UsagePerRun) -> f64| stats::median(&per_run.iter().map(f).collect::<Vec<_>>());
        Self {
            cpu_ms: median(|u| u.cpu_ms),
            children_cpu_ms: median(|u| u.children_cpu_ms),
            voluntary_switches: median(|u| u.voluntary_switches),
            involuntary_switches: median(|u| u.involuntary_switches),
        }
    }
}

/// CPU time and context switches over a span, from `getrusage(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User + system CPU time of this process, all threads.
    pub cpu: Duration,
    /// User + system CPU time of the children reaped in the span (`RUSAGE_CHILDREN`).
    pub children_cpu: Duration,
    /// Voluntary context switches of this process (a thread parked: waiting for work or I/O).
    pub voluntary_switches: u64,
    /// Involuntary context switches of this process (a thread preempted by the scheduler).
    pub involuntary_switches: u64,
}

impl Usage {
    /// This process's and its reaped children's usage so far.
    pub(crate) fn now() -> Self {
        let get = |who| {
            // SAFETY: getrusage writes one rusage into the zeroed struct it is given and reads
            // nothing else.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            let rc = unsafe { libc::getrusage(who, &mut u) };
            (rc == 0).then_some(u)
        };
        let cpu = |u: &libc::rusage| {
            let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            Duration::from_micros(us(u.ru_utime) + us(u.ru_stime))
        };
        let (me, children) = (get(libc::RUSAGE_SELF), get(libc::RUSAGE_CHILDREN));
        Self {
            cpu: me.as_ref().map(cpu).unwrap_or_default(),
            children_cpu: children.as_ref().map(cpu).unwrap_or_default(),
            voluntary_switches: me.map_or(0, |u| u.ru_nvcsw as u64),
            involuntary_switches: me.map_or(0, |u| u.ru_nivcsw as u64),
        }
    }

    /// This usage divided among `runs` runs.
    pub fn per_run(&self, runs: usize) -> UsagePerRun {
        let runs = runs.max(1) as f64;
        UsagePerRun {
            cpu_ms: self.cpu.as_secs_f64() * 1000.0 / runs,
            children_cpu_ms: self.children_cpu.as_secs_f64() * 1000.0 / runs,
            voluntary_switches: self.voluntary_switches as f64 / runs,
            involuntary_switches: self.involuntary_switches as f64 / runs,
        }
    }

    /// The usage between `before` and now.
    pub(crate) fn since(before: Self) -> Self {
        let now = Self::now();
        Self {
            cpu: now.cpu.saturating_sub(before.cpu),
            children_cpu: now.children_cpu.saturating_sub(before.children_cpu),
            voluntary_switches: now
                .voluntary_switches
                .saturating_sub(before.voluntary_switches),
            involuntary_switches: now
                .involuntary_switches
                .saturating_sub(before.involuntary_switches),
        }
    }
}
