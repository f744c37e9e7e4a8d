//! No process started by a run outlives the invocation.
//!
//! ironflow's shell steps kill their direct child on drop (`kill_on_drop`), but a command's own
//! children (`sh -c 'slow & wait'`, a build tool's workers) are re-parented and would live on
//! into the frozen process, or the next invocation. At cold start the worker makes itself a
//! *child subreaper* (Linux `PR_SET_CHILD_SUBREAPER`), so such orphans are re-parented to it
//! rather than to init; at the end of each invocation [`sweep_sparing`] kills every descendant
//! that is left (but the processes of runs still executing in the process) and reaps it.
//!
//! The worker owns every child process of its process: it starts none of its own that must
//! survive an invocation. Each run's processes end with the run (`src/process_mark.rs`); when
//! several invocations run in one process (Lambda Managed Instances, tests), only the last one to
//! finish sweeps, and it spares the processes of runs that still execute (an invocation that
//! started as it finished).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{
    Pid, Signal, WaitId, WaitIdOptions, WaitOptions, getpid, kill_process, set_child_subreaper,
    waitid, waitpid,
};
use tracing::{info, warn};

static ACTIVE: Mutex<usize> = Mutex::new(0);

/// Make this process the subreaper of its descendants. Call once at cold start; harmless to
/// call again. Returns `false` (and logs) where the kernel refuses.
pub fn become_subreaper() -> bool {
    // prctl(PR_SET_CHILD_SUBREAPER, <non-zero>): this process's pid serves as the non-zero.
    match set_child_subreaper(Some(getpid())) {
        Ok(()) => true,
        Err(e) => {
            warn!(error = %std::io::Error::from(e), "could not become child subreaper");
            false
        }
    }
}

/// Marks one invocation as active until dropped; see [`InvocationGuard::finish`].
pub struct InvocationGuard {
    finished: bool,
}

impl InvocationGuard {
    /// Register an active invocation.
    pub fn enter() -> Self {
        *ACTIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        Self { finished: false }
    }

    /// End the invocation; if it was the last active one, kill and reap every descendant
    /// process left but those `spared` (a run that still executes owns it: an invocation that
    /// started meanwhile). Returns how many processes were killed.
    pub async fn finish(mut self, spared: fn(i32) -> bool) -> usize {
        self.finished = true;
        let last = {
            let mut active = ACTIVE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *active = active.saturating_sub(1);
            *active == 0
        };
        if !last || has_no_child() {
            return 0;
        }
        match tokio::task::spawn_blocking(move || sweep_sparing(Duration::from_secs(2), spared))
            .await
        {
            Ok(killed) => killed,
            Err(e) => {
                warn!(error = %e, "orphan sweep task failed");
                0
            }
        }
    }
}

impl Drop for InvocationGuard {
    fn drop(&mut self) {
        if !self.finished {
            let mut active = ACTIVE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *active = active.saturating_sub(1);
        }
    }
}

/// Kill every descendant of this process with SIGKILL, then reap the ones that are its direct
/// children, waiting at most `wait` for them to exit. Returns how many were killed.
#[cfg(any(test, feature = "test-support"))]
pub fn sweep(wait: Duration) -> usize {
    sweep_sparing(wait, |_| false)
}

/// `sweep` (tests), sparing the processes for which `spared` holds. The descendants are listed before
/// `spared` looks at them: a process that exists by then and belongs to a live run was marked
/// as such before it was spawned.
pub fn sweep_sparing(wait: Duration, spared: impl Fn(i32) -> bool) -> usize {
    if has_no_child() {
        return 0;
    }
    let descendants: Vec<i32> = descendants().into_iter().filter(|p| !spared(*p)).collect();
    if descendants.is_empty() {
        return 0;
    }
    let killed = kill_and_reap(&descendants, wait);
    info!(count = killed, "killed processes left over by runs");
    killed
}

/// Kill `pids` (descendants of this process, just read from `/proc`) with SIGKILL, then reap
/// the ones that are its direct children, waiting at most `wait` for them to exit. Returns how
/// many were signalled.
pub fn kill_and_reap(pids: &[i32], wait: Duration) -> usize {
    if pids.is_empty() {
        return 0;
    }
    let me = std::process::id() as i32;
    for pid in pids.iter().filter_map(|p| Pid::from_raw(*p)) {
        // A pid just read from /proc: at worst it no longer exists.
        let _ = kill_process(pid, Signal::KILL);
    }
    let deadline = std::time::Instant::now() + wait;
    let children: HashSet<i32> = if has_children_files() {
        children_of(me).into_iter().collect()
    } else {
        parent_map()
            .into_iter()
            .filter_map(|(pid, ppid)| (ppid == me).then_some(pid))
            .collect()
    };
    let mut pending: HashSet<i32> = pids
        .iter()
        .copied()
        .filter(|p| children.contains(p))
        .collect();
    while !pending.is_empty() && std::time::Instant::now() < deadline {
        // Still pending: not reaped yet (`Ok(None)`); reaped, or no longer ours: done.
        pending.retain(|pid| {
            Pid::from_raw(*pid)
                .is_some_and(|pid| matches!(waitpid(Some(pid), WaitOptions::NOHANG), Ok(None)))
        });
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    pids.len()
}

/// Whether this process has no child process at all: then it has no descendant either, since
/// every descendant's chain of parents goes through a child of this process (an orphan is
/// re-parented to this process, the subreaper, or leaves the tree for init).
///
/// One `waitid(P_ALL, WNOHANG | WNOWAIT)` call: it fails with `ECHILD` only when no child
/// exists, running or exited, and reaps nothing (`WNOWAIT`), so the child handles of
/// `tokio::process` keep their exit statuses. The common end of an invocation (every process a
/// run started has exited and been reaped) costs one system call instead of the `/proc` reads of
/// [`descendants`].
pub fn has_no_child() -> bool {
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    matches!(waitid(WaitId::All, options), Err(Errno::CHILD))
}

/// The pids of every live descendant of this process (read from `/proc`).
///
/// Walks down from this process through each task's `children` file (`children_of`), which
/// reads a file per thread of the descendants only; where the kernel has no such files, reads
/// the parent of every process on the host (`descendants_by_scan`). On a host shared with
/// many processes (a bench, a managed instance's neighbours) the walk costs a few reads where
/// the scan costs one per process. A process whose parent exits during the walk (a run's `sh`
/// killed as the run ends) is re-parented to this process, the subreaper, after this process's
/// list was read: the walk reads that list again until it names nobody new (`walk_down`).
/// Only a process started after the walk is missed; the invocation's last sweep finds it.
pub fn descendants() -> Vec<i32> {
    let me = std::process::id() as i32;
    if !has_children_files() {
        return descendants_by_scan(me);
    }
    walk_down(me, children_of)
}

/// Every descendant of `root`, each once, by `children` (a process's children now): down from
/// `root`, then from what `root`'s list names that was not there before, until it names nobody
/// new (at most [`ROOT_READS`] reads of it: a run that keeps orphaning new processes cannot
/// hold the walk).
///
/// Sound because re-parenting only moves a process up to the subreaper `root`: a process whose
/// parent exits before the walk reads the parent's list is in `root`'s list by the next read
/// of it (the kernel re-parents the children as the parent exits, before it is a zombie).
fn walk_down(root: i32, children: impl Fn(i32) -> Vec<i32>) -> Vec<i32> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for _ in 0..ROOT_READS {
        let mut stack: Vec<i32> = children(root)
            .into_iter()
            .filter(|pid| !seen.contains(pid))
            .collect();
        if stack.is_empty() {
            break;
        }
        while let Some(pid) = stack.pop() {
            if seen.insert(pid) {
                out.push(pid);
                // A process that exited since its parent listed it has no children: none.
                stack.extend(children(pid));
            }
        }
    }
    out
}

/// The most times [`walk_down`] reads the root's list: 8.
const ROOT_READS: usize = 8;

/// Whether this kernel has the `children` files (Linux's `CONFIG_PROC_CHILDREN`), looked up
/// once per process.
fn has_children_files() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| std::fs::metadata("/proc/thread-self/children").is_ok())
}

/// The children of process `pid`, from `/proc/<pid>/task/<tid>/children` (a child is listed
/// under the thread that forked it, so every thread's file is read); none where `pid` has
/// exited or the files do not exist ([`has_children_files`]).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.filter_map(Result::ok) {
        let mut path = task.path();
        path.push("children");
        if let Ok(list) = std::fs::read_to_string(path) {
            children.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    children
}

/// Every process whose chain of parents leads to `root`, from the parent of every process on
/// the host.
fn descendants_by_scan(root: i32) -> Vec<i32> {
    let parents = parent_map();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, ppid) in &parents {
        children.entry(*ppid).or_default().push(*pid);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for c in children.get(&p).into_iter().flatten() {
            out.push(*c);
            stack.push(*c);
        }
    }
    out
}

/// pid → parent pid, read from `/proc/<pid>/stat` (empty where /proc is unreadable).
fn parent_map() -> HashMap<i32, i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect()
}

/// The parent pid of process `pid`, from `/proc/<pid>/stat` (`None` where it has exited or the
/// file cannot be read).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: read after it.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process tree that changes as it is read: `sh` (2) dies just after the root's (1) list
    /// was read the first time, and its child `sleep` (3) moves to the root, as the kernel
    /// re-parents an orphan to its subreaper.
    #[test]
    fn a_process_re_parented_to_the_root_during_the_walk_is_found_by_reading_the_root_again() {
        let root_reads = std::cell::Cell::new(0);
        let children = |pid: i32| match pid {
            1 => {
                root_reads.set(root_reads.get() + 1);
                if root_reads.get() == 1 {
                    vec![2]
                } else {
                    vec![3]
                }
            }
            // 2 has exited: its children were re-parented before it became a zombie.
            _ => vec![],
        };
        let mut found = walk_down(1, children);
        found.sort_unstable();
        assert_eq!(found, [2, 3]);
        // The root read until it named nobody new: twice with someone new, once without.
        assert_eq!(root_reads.get(), 3);

        // A run that keeps orphaning new processes does not hold the walk.
        let next = std::cell::Cell::new(100);
        let endless = |pid: i32| match pid {
            1 => {
                next.set(next.get() + 1);
                vec![next.get()]
            }
            _ => vec![],
        };
        assert_eq!(walk_down(1, endless).len(), ROOT_READS);
    }

    /// Relies on nextest's one process per test (`./scripts/test`): under `cargo test`, another
    /// test's child could be alive during the last assertion.
    #[test]
    fn has_no_child_sees_a_running_child_and_an_exited_unreaped_one_and_leaves_it_reapable() {
        assert!(has_no_child(), "the test process starts without children");
        let mut running = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(!has_no_child(), "a running child");
        running.kill().unwrap();
        running.wait().unwrap();

        let mut exited = std::process::Command::new("true").spawn().unwrap();
        // Not reaped yet: it is a zombie child, still a child.
        while std::fs::read_to_string(format!("/proc/{}/stat", exited.id()))
            .is_ok_and(|stat| !stat.contains(") Z "))
        {
            std::thread::yield_now();
        }
        assert!(!has_no_child(), "an exited child not yet reaped");
        // WNOWAIT left its exit status for its owner.
        assert!(exited.wait().unwrap().success());
        assert!(has_no_child(), "every child reaped");
    }

    /// The walk through the `children` files finds what the scan of every process finds: a
    /// child, its children, and a detached grandchild re-parented to this process. Relies on
    /// nextest's one process per test.
    #[test]
    fn the_walk_down_the_children_files_finds_every_descendant_the_scan_finds() {
        assert!(become_subreaper());
        assert!(
            has_children_files(),
            "this kernel has the children files: the walk is tested, not the fallback"
        );
        // sh with a sleep under it, and a sleep whose parent (a subshell) exits: it is
        // re-parented to this process.
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "(setsid sleep 30 &); sleep 30 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let sorted = |mut v: Vec<i32>| {
            v.sort_unstable();
            v
        };
        // The shell takes a moment to start them; a walk that misses one fails here.
        let give_up = std::time::Instant::now() + Duration::from_secs(20);
        let walked = loop {
            let walked = sorted(descendants());
            assert!(
                std::time::Instant::now() < give_up,
                "walked {walked:?}, scanned {:?}",
                sorted(descendants_by_scan(me))
            );
            let orphans = walked
                .iter()
                .filter(|p| **p != sh.id() as i32 && parent_of(**p) == Some(me))
                .count();
            if walked.len() == 3 && orphans == 1 && sorted(descendants_by_scan(me)) == walked {
                break walked;
            }
            std::thread::yield_now();
        };
        assert!(walked.contains(&(sh.id() as i32)));
        // Kills all three and reaps this process's two children (sh and the orphan). sh's
        // sleep, killed with it, may be re-parented to this process as a zombie once sh is gone:
        // the invocation's last sweep reaps such a one, as `sweep` does here.
        assert_eq!(kill_and_reap(&walked, Duration::from_secs(2)), 3);
        assert!(
            sh.wait().is_err(),
            "kill_and_reap reaped sh: no status is left"
        );
        let dead = |pid: i32| {
            !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| !stat.contains(") Z "))
        };
        // SIGKILL is delivered, not awaited: wait for the three to be gone or zombies.
        while !walked.iter().all(|p| dead(*p)) {
            assert!(std::time::Instant::now() < give_up, "not all killed");
            std::thread::yield_now();
        }
        while !has_no_child() {
            sweep(Duration::from_secs(2));
            assert!(std::time::Instant::now() < give_up, "{:?}", descendants());
        }
        assert!(descendants().is_empty(), "{:?}", descendants());
        assert!(descendants_by_scan(me).is_empty());
    }
}
