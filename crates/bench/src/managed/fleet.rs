//! The function processes of one managed-instances drain: each started with the Lambda
//! variables against its own Runtime API endpoint, its output tallied, its CPU time and memory
//! read from `/proc`, killed at the end.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Child;
use tokio::task::JoinHandle;

use super::{FUNCTION_MODE, Job, ManagedSettings, Shape};
use crate::BenchError;
use crate::drain::DrainSettings;
use crate::runtime_api::{Dispatcher, Endpoint};

/// A process's output: its JSON log lines on stdout, anything on stderr.
#[derive(Debug, Clone, Default)]
pub struct Logs {
    pub lines: usize,
    pub warnings: usize,
    pub errors: usize,
    pub stderr_lines: usize,
    /// The first few warnings, errors and stderr lines.
    pub first: Vec<String>,
}

impl crate::process::LineTally for Logs {
    fn line(&mut self, line: &str, stderr: bool) {
        let (warning, error) = (
            line.contains(r#""level":"WARN""#),
            line.contains(r#""level":"ERROR""#),
        );
        self.lines += usize::from(!stderr);
        self.stderr_lines += usize::from(stderr);
        self.warnings += usize::from(warning);
        self.errors += usize::from(error);
        if (stderr || warning || error) && self.first.len() < 5 {
            self.first.push(line.chars().take(400).collect());
        }
    }
}

/// The function processes of one drain, each with its Runtime API endpoint.
pub struct Fleet {
    // Declared first: dropped (killed) before the endpoints stop.
    children: Vec<Child>,
    logs: Vec<JoinHandle<Logs>>,
    _endpoints: Vec<Endpoint>,
}

impl Fleet {
    pub async fn start(
        binary: &Path,
        (job, shape): (Job, Shape),
        m: &ManagedSettings,
        s: &DrainSettings,
        api_url: &str,
        token: &str,
        dispatcher: &Arc<Dispatcher>,
    ) -> Result<Self, BenchError> {
        let mut fleet = Self {
            children: Vec::new(),
            logs: Vec::new(),
            _endpoints: Vec::new(),
        };
        for p in 0..shape.processes(m.max_concurrency) {
            let endpoint = Endpoint::start(dispatcher.clone(), p).await?;
            let mut cmd = crate::process::function_command(
                binary,
                endpoint.addr,
                api_url,
                token,
                s.concurrency,
            );
            if matches!(job, Job::Bench(_)) {
                cmd.env(FUNCTION_MODE, "1");
            }
            cmd.env("IRONFLOW_MAX_RUNS_PER_INVOCATION", s.max_runs.to_string())
                .env(
                    "IRONFLOW_FUNCTION_TIMEOUT_SECS",
                    s.invocation.as_secs().max(1).to_string(),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if shape == Shape::OneProcess {
                cmd.env("AWS_LAMBDA_MAX_CONCURRENCY", m.max_concurrency.to_string());
            }
            cmd.envs(s.function_env());
            let mut child = cmd.spawn().map_err(|e| {
                BenchError::msg(format!("starting {} as a function: {e}", binary.display()))
            })?;
            let (out, err) = (child.stdout.take(), child.stderr.take());
            fleet.logs.push(crate::process::read_lines(out, err));
            fleet.children.push(child);
            fleet._endpoints.push(endpoint);
        }
        Ok(fleet)
    }

    /// An error if a process has exited.
    pub fn alive(&mut self) -> Result<(), BenchError> {
        for (p, child) in self.children.iter_mut().enumerate() {
            if let Some(status) = child.try_wait()? {
                return Err(BenchError::msg(format!(
                    "function process {p} exited ({status}) during the drain"
                )));
            }
        }
        Ok(())
    }

    fn pids(&self) -> impl Iterator<Item = Option<u32>> + '_ {
        self.children.iter().map(Child::id)
    }

    /// Each process's CPU time and its reaped children's (zero when unreadable).
    pub fn cpu(&self) -> Vec<(Duration, Duration)> {
        self.pids()
            .map(|pid| pid.and_then(process_cpu).unwrap_or_default())
            .collect()
    }

    /// Each process's `VmHWM` and `RssAnon`, in KiB (zero when unreadable).
    pub fn memory(&self) -> Vec<(u64, u64)> {
        self.pids()
            .map(|pid| {
                pid.map_or((0, 0), |pid| {
                    (
                        crate::process::status_kib(pid, "VmHWM").unwrap_or(0),
                        crate::process::status_kib(pid, "RssAnon").unwrap_or(0),
                    )
                })
            })
            .collect()
    }

    /// Kill every process; their output's tallies.
    pub async fn stop(mut self) -> Vec<Logs> {
        for child in &mut self.children {
            let _ = child.kill().await;
        }
        let mut logs = Vec::new();
        for handle in self.logs.drain(..) {
            let abort = handle.abort_handle();
            match tokio::time::timeout(Duration::from_secs(2), handle).await {
                Ok(Ok(l)) => logs.push(l),
                _ => {
                    abort.abort();
                    logs.push(Logs::default());
                }
            }
        }
        logs
    }
}

/// A process's CPU time (user + system) and its reaped children's, from `/proc/<pid>/stat`.
fn process_cpu(pid: u32) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces: the
    // third field of the line (state) comes first.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = Some(rustix::param::clock_ticks_per_second()).filter(|t| *t > 0)?;
    let time = |t: u64| Duration::from_micros(t * 1_000_000 / ticks);
    Some((time(field(14)? + field(15)?), time(field(16)? + field(17)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_cpu_time_is_read_in_clock_ticks() {
        // Spins until its own CPU time shows, one clock tick at least (10 s at most).
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        let own = loop {
            let (own, _children) = process_cpu(std::process::id()).unwrap();
            if own > Duration::ZERO || spin.elapsed() > Duration::from_secs(10) {
                break own;
            }
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        };
        assert!(
            own > Duration::ZERO && own < Duration::from_secs(3600),
            "{own:?}"
        );
        assert_eq!(process_cpu(u32::MAX), None, "no such process");
    }
}
