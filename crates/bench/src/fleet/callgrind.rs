//! `fleet --callgrind DIR`, a diagnostic: every worker process runs under valgrind's callgrind,
//! whose counters are zeroed when the window opens and dumped when it closes, so that a cell
//! also gives the user-space instructions its workers executed per run. Unlike CPU time, that
//! count does not move with the machine's load, so two builds (or ours and the reference) can be
//! compared run for run; it leaves out the kernel (system calls, context switches, process
//! creation), which `/proc`'s CPU time includes. Under callgrind a worker runs 20 to 50 times
//! slower, so that cell's runs/s and CPU figures are not comparable with a normal run's. The
//! dumps stay in DIR (`<worker>-<workload>-f<F>.<pid>.1`) for `callgrind_annotate`.
//!
//! Needs `valgrind` and `callgrind_control` on `PATH` (Debian's `valgrind` package).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::BenchError;

/// Where a cell's workers write their counts: the directory and the file name's stem.
#[derive(Debug, Clone)]
pub struct Dumps {
    pub dir: PathBuf,
    pub stem: String,
}

impl Dumps {
    /// `cmd` (a worker process's command, environment cleared and set) run under callgrind
    /// instead: the same program, arguments, environment and working directory. Counting starts
    /// at once; [`zero`] resets it when the window opens.
    pub fn wrap(&self, cmd: &Command) -> Command {
        let std = cmd.as_std();
        let mut wrapped = Command::new("valgrind");
        wrapped
            // Without its banner, which would take the slots of the cell's first problems.
            .arg("-q")
            .arg("--tool=callgrind")
            .arg(format!(
                "--callgrind-out-file={}",
                self.dir.join(format!("{}.%p", self.stem)).display()
            ))
            .arg(std.get_program())
            .args(std.get_args())
            .env_clear()
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (key, value) in std.get_envs() {
            if let Some(value) = value {
                wrapped.env(key, value);
            }
        }
        if let Some(dir) = std.get_current_dir() {
            wrapped.current_dir(dir);
        }
        // `callgrind_control` (run with the bench's environment) finds the process through
        // valgrind's FIFOs in `$TMPDIR`: both sides must agree on it.
        if let Some(tmp) = std::env::var_os("TMPDIR") {
            wrapped.env("TMPDIR", tmp);
        }
        wrapped
    }

    /// Dump the counts of processes `pids` (since [`zero`]) and sum them: the instructions
    /// they executed over the window.
    ///
    /// # Errors
    ///
    /// `callgrind_control` failed, or a dump is missing or holds no `summary:` line.
    pub async fn count(&self, pids: &[u32]) -> Result<u64, BenchError> {
        dump(pids).await?;
        let mut sum = 0_u64;
        for &pid in pids {
            sum = sum.saturating_add(self.instructions(pid)?);
        }
        Ok(sum)
    }

    /// The instructions counted in process `pid`'s dump (its first: the window's).
    fn instructions(&self, pid: u32) -> Result<u64, BenchError> {
        let path = self.dir.join(format!("{}.{pid}.1", self.stem));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            BenchError::msg(format!(
                "reading the callgrind dump {}: {e}",
                path.display()
            ))
        })?;
        summary(&text).ok_or_else(|| {
            BenchError::msg(format!(
                "the callgrind dump {} has no `summary: <instructions>` line",
                path.display()
            ))
        })
    }
}

/// The `summary:` line of a callgrind dump: the instructions (`Ir`) it counted.
fn summary(dump: &str) -> Option<u64> {
    dump.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Reset the counters of the callgrind processes `pids` (`callgrind_control -z`).
///
/// # Errors
///
/// `callgrind_control` could not run or failed.
pub async fn zero(pids: &[u32]) -> Result<(), BenchError> {
    control("-z", pids).await
}

/// Write the callgrind processes' counts to their dump files (`callgrind_control -d`), which
/// returns once they are written.
///
/// # Errors
///
/// `callgrind_control` could not run or failed.
async fn dump(pids: &[u32]) -> Result<(), BenchError> {
    control("-d", pids).await
}

/// The longest one `callgrind_control` may take (it waits for the process to answer).
const CONTROL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// `callgrind_control <flag> <pid>` for each pid. It exits with 0 even when it found no such
/// process or could not reach it, so its answer is read: each pid must say `OK.`.
async fn control(flag: &str, pids: &[u32]) -> Result<(), BenchError> {
    for pid in pids {
        let run = Command::new("callgrind_control")
            .arg(flag)
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(CONTROL_TIMEOUT, run)
            .await
            .map_err(|_| {
                BenchError::msg(format!(
                    "callgrind_control {flag} {pid} did not answer in {} s",
                    CONTROL_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| BenchError::msg(format!("running callgrind_control {flag}: {e}")))?;
        let said = String::from_utf8_lossy(&output.stdout);
        if !answered(&said) {
            return Err(BenchError::msg(format!(
                "callgrind_control {flag} {pid} did not confirm ({}): {} {}",
                output.status,
                said.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// Whether `callgrind_control`'s output confirms the command (`  OK.` under the process's
/// line).
fn answered(stdout: &str) -> bool {
    stdout.lines().any(|l| l.trim() == "OK.")
}

/// The directory given, created if needed.
///
/// # Errors
///
/// It cannot be created.
pub fn prepare(dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        BenchError::msg(format!(
            "creating the callgrind directory {}: {e}",
            dir.display()
        ))
    })
}

/// One cell's count, for [`table`].
pub struct Row<'a> {
    pub workload: &'a str,
    pub f: usize,
    pub worker: super::Worker,
    /// Runs ended in the window.
    pub runs: u64,
    /// Instructions over the window, all the cell's workers.
    pub instructions: u64,
}

/// The section's table of instructions per run, with ours / the reference's at each workload
/// and F measured with both; nothing when no row was counted.
pub fn table(md: &mut String, rows: &[Row<'_>]) {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "### User-space instructions per run (callgrind)\n\n\
         Every worker ran under valgrind's callgrind, its counters zeroed when the window opened \
         and dumped when it closed (`fleet --callgrind`): the instructions its threads executed \
         in user space (the kernel's work apart), over the runs ended in the window. Under \
         callgrind the workers ran 20 to 50 times slower, so this run's runs/s and CPU figures \
         are not those of a normal run.\n"
    );
    let _ = writeln!(
        md,
        "| workload | F | worker | runs | instructions per run (millions) | ours / reference |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    // No run ended in the window: no count per run.
    let per_run = |r: &Row<'_>| (r.runs > 0).then(|| r.instructions as f64 / r.runs as f64 / 1e6);
    for r in rows {
        let ratio = (r.worker == super::Worker::Ours)
            .then(|| {
                rows.iter().find(|o| {
                    o.worker == super::Worker::Reference && o.workload == r.workload && o.f == r.f
                })
            })
            .flatten()
            .and_then(|re| Some(per_run(r)? / per_run(re)?))
            .map_or_else(|| "–".to_string(), |ratio| format!("{ratio:.3}"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {ratio} |",
            r.workload,
            r.f,
            r.worker.name(),
            r.runs,
            per_run(r).map_or_else(|| "–".to_string(), |n| format!("{n:.3}"))
        );
    }
    let _ = writeln!(md);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_read_from_the_dump_s_summary_line() {
        let dump = "# callgrind format\nversion: 1\npid: 7\n\nevents: Ir\nsummary: 2345713872\n\n\
                    fn=(1) main\n16 3\ntotals: 2346127393\n";
        assert_eq!(summary(dump), Some(2_345_713_872));
        assert_eq!(summary("events: Ir\ntotals: 5\n"), None);
    }

    #[test]
    fn the_table_gives_each_cell_s_count_per_run_and_ours_against_the_reference_s() {
        let row = |worker, runs, instructions| Row {
            workload: "shell",
            f: 1,
            worker,
            runs,
            instructions,
        };
        // The reference's row beside ours (`runs` and `instructions` ours).
        let beside_the_reference = |runs, instructions| {
            let mut md = String::new();
            table(
                &mut md,
                &[
                    row(super::super::Worker::Reference, 731, 2_652_208_328),
                    row(super::super::Worker::Ours, runs, instructions),
                ],
            );
            md
        };
        let md = beside_the_reference(670, 2_345_713_872);
        assert!(
            md.contains("| shell | 1 | reference | 731 | 3.628 | – |"),
            "{md}"
        );
        assert!(
            md.contains("| shell | 1 | ours | 670 | 3.501 | 0.965 |"),
            "{md}"
        );
        let mut empty = String::new();
        table(&mut empty, &[]);
        assert!(empty.is_empty());
        let none_ended = beside_the_reference(0, 5_000_000);
        assert!(
            none_ended.contains("| shell | 1 | ours | 0 | – | – |"),
            "{none_ended}"
        );
    }

    #[test]
    fn only_an_ok_from_callgrind_control_confirms_a_command() {
        assert!(answered("PID 21048: sleep 20\n  OK.\n"));
        // What it prints, exiting with 0, for a process it cannot find.
        assert!(!answered(""));
        assert!(!answered(
            "Error: Callgrind task with PID/name '999999' not detected.\n"
        ));
    }

    #[test]
    fn a_wrapped_command_keeps_the_program_its_arguments_and_its_environment() {
        let mut cmd = Command::new("/bin/worker");
        cmd.env_clear().env("ROLE", "function").arg("--x");
        let dumps = Dumps {
            dir: PathBuf::from("/tmp/cg"),
            stem: "ours-shell-f2".to_string(),
        };
        let wrapped = dumps.wrap(&cmd);
        let std = wrapped.as_std();
        assert_eq!(std.get_program(), "valgrind");
        let args: Vec<_> = std.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args,
            [
                "-q",
                "--tool=callgrind",
                "--callgrind-out-file=/tmp/cg/ours-shell-f2.%p",
                "/bin/worker",
                "--x"
            ]
        );
        // The command's own environment, and the bench's TMPDIR where it has one.
        let envs: Vec<_> = std.get_envs().filter(|(key, _)| *key != "TMPDIR").collect();
        assert_eq!(
            envs,
            [(
                std::ffi::OsStr::new("ROLE"),
                Some(std::ffi::OsStr::new("function"))
            )]
        );
        assert_eq!(
            std.get_envs()
                .find(|(key, _)| *key == "TMPDIR")
                .and_then(|(_, v)| v),
            std::env::var_os("TMPDIR").as_deref()
        );
    }
}
