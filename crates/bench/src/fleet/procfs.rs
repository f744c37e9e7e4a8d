//! What the fleet section reads from `/proc`: CPU time of processes and threads, context
//! switches of threads, the machine's busy time, and [`Counters`] that keep per-thread values
//! across a window in which threads come and go.
//!
//! CPU times are in clock ticks of `USER_HZ`, 100 per second on Linux (the kernel's ABI for
//! `/proc`, whatever its internal `HZ`).

use std::collections::HashMap;
use std::time::Duration;

/// `/proc`'s clock ticks per second.
const USER_HZ: u64 = 100;

/// Clock ticks as a duration.
pub fn ticks(t: u64) -> Duration {
    Duration::from_millis(t.saturating_mul(1000 / USER_HZ))
}

/// The fields of a `stat` line after the command name (which is in parentheses and may hold
/// spaces), and the command name: field 3 (state) comes first.
fn stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    Some((comm, rest.split_whitespace().collect()))
}

/// Field `n` (1-based, as `proc(5)` numbers them) of a parsed `stat` line.
fn field(fields: &[&str], n: usize) -> Option<u64> {
    fields.get(n.checked_sub(3)?)?.parse().ok()
}

/// A process's (or thread's) CPU use from its `stat` text: (own user + system ticks, reaped
/// children's user + system ticks), and its command name.
pub fn parse_stat(stat: &str) -> Option<(String, u64, u64)> {
    let (comm, f) = stat_fields(stat)?;
    let own = field(&f, 14)? + field(&f, 15)?;
    let children = field(&f, 16)? + field(&f, 17)?;
    Some((comm.to_string(), own, children))
}

/// `/proc/<pid>/stat`: the whole thread group's CPU ticks (the dead threads' included) and
/// its reaped children's.
pub fn process_cpu(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, own, children)| (own, children))
}

/// The thread ids of process `pid` (empty once it is gone).
pub fn threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// One thread's command name and CPU ticks.
pub fn thread_cpu(pid: u32, tid: u32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    parse_stat(&stat).map(|(comm, own, _)| (comm, own))
}

/// Voluntary and involuntary context switches from a `status` text.
pub fn parse_switches(status: &str) -> Option<(u64, u64)> {
    let value = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((
        value("voluntary_ctxt_switches")?,
        value("nonvoluntary_ctxt_switches")?,
    ))
}

/// One thread's voluntary and involuntary context switches (`/proc/<pid>/task/<tid>/status`:
/// a thread's own; the process's `status` shows its main thread's only).
pub fn thread_switches(pid: u32, tid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_switches(&status)
}

/// The CPU ticks of this process's threads named `name` (the embedded API's runtime threads
/// are `local-api`), per thread id.
pub fn own_threads_named(name: &str) -> HashMap<u32, u64> {
    let me = std::process::id();
    threads(me)
        .into_iter()
        .filter_map(|tid| {
            let (comm, cpu) = thread_cpu(me, tid)?;
            (comm == name).then_some((tid, cpu))
        })
        .collect()
}

/// The machine's CPU ticks from `/proc/stat`: (busy, all), summed over its CPUs.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine(&stat)
}

/// `(busy, all)` from the `cpu` line of a `/proc/stat` text: all but idle and iowait is busy.
pub fn parse_machine(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    let all: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0);
    Some((all.saturating_sub(idle), all))
}

/// Monotonic counters of things that come and go (threads, backends), over a window: each
/// key's value at the window's start (or 0 for a key first seen after it: born within the
/// window) and its last value seen, so that a key gone before the end still counts up to its
/// last sample.
#[derive(Debug, Clone, Default)]
pub struct Counters<K: std::hash::Hash + Eq> {
    base: HashMap<K, u64>,
    last: HashMap<K, u64>,
    started: bool,
}

impl<K: std::hash::Hash + Eq + Clone> Counters<K> {
    /// Start the window at these values.
    pub fn begin(&mut self, values: impl IntoIterator<Item = (K, u64)>) {
        self.last = values.into_iter().collect();
        self.base = self.last.clone();
        self.started = true;
    }

    /// Values seen within the window (ignored before [`Counters::begin`]).
    pub fn observe(&mut self, values: impl IntoIterator<Item = (K, u64)>) {
        if !self.started {
            return;
        }
        for (k, v) in values {
            self.base.entry(k.clone()).or_insert(0);
            self.last.insert(k, v);
        }
    }

    /// The growth over the window so far, summed over the keys.
    pub fn total(&self) -> u64 {
        self.per_key().map(|(_, d)| d).sum()
    }

    /// The growth over the window so far, per key.
    pub fn per_key(&self) -> impl Iterator<Item = (&K, u64)> {
        self.last
            .iter()
            .map(|(k, v)| (k, v.saturating_sub(self.base.get(k).copied().unwrap_or(0))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_its_name_is_read() {
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    7 3 5 2 20 0 2 0 100 1000 200";
        assert_eq!(parse_stat(stat), Some(("tokio (rt) 1".to_string(), 10, 7)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(ticks(250), Duration::from_millis(2500));
    }

    #[test]
    fn switches_and_machine_ticks_are_read() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_switches(status), Some((12, 3)));
        assert_eq!(parse_switches("Name:\tx\n"), None);
        let stat = "cpu  10 1 5 100 4 1 1 0 0 0\ncpu0 5 0 2 50 2 0 0 0 0 0\n";
        assert_eq!(parse_machine(stat), Some((18, 122)));
    }

    #[test]
    fn counters_keep_what_a_gone_key_did_and_count_a_new_one_from_zero() {
        let mut c = Counters::default();
        c.observe([(1, 5)]);
        assert_eq!(c.total(), 0, "nothing before the window");
        c.begin([(1, 10), (2, 100)]);
        c.observe([(1, 15), (2, 120), (3, 7)]);
        // Key 2 is gone by the next sample: its 20 stay counted.
        c.observe([(1, 18), (3, 9)]);
        assert_eq!(c.total(), 8 + 20 + 9);
    }

    #[test]
    fn this_process_and_its_threads_are_readable() {
        let me = std::process::id();
        assert!(process_cpu(me).is_some());
        let tids = threads(me);
        assert!(tids.contains(&me));
        assert!(thread_switches(me, me).is_some());
        assert!(machine_ticks().is_some_and(|(busy, all)| busy <= all && all > 0));
    }
}
