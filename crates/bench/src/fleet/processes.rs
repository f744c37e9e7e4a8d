//! The F worker processes of one fleet: ours, each the bench binary as a Lambda function
//! ([`super::workloads::function_main`]) against its own endpoint of the managed section's
//! Runtime API stand-in (one [`Dispatcher`] behind them all), or the reference's
//! ([`super::workloads::reference_main`]); their output tallied, their CPU time and their
//! threads' context switches read from `/proc`, killed at the end.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::Worker;
use super::procfs;
use super::workloads::{POLL_MS, ROLE};
use crate::BenchError;
use crate::runtime_api::{Dispatcher, Endpoint, Tally};

/// Deadline of each invocation: Lambda's 60 s of the drain rows.
/// The body of the fleet's events: a direct invocation.
const FLEET_EVENT: &str = r#"{"reason": "bench: fleet"}"#;

pub const INVOCATION: Duration = Duration::from_secs(60);
/// The reference worker's poll interval after an empty poll (the drain rows').
pub const POLL: Duration = Duration::from_millis(100);
/// Problem lines kept word for word.
const KEPT: usize = 5;

/// What the processes wrote: JSON log lines on stdout, anything on stderr.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub lines: u64,
    pub warnings: u64,
    pub errors: u64,
    pub stderr_lines: u64,
    /// The first few errors, warnings and stderr lines.
    pub first: Vec<String>,
}

impl crate::process::LineTally for Output {
    fn line(&mut self, line: &str, stderr: bool) {
        let warning = line.contains(r#""level":"WARN""#);
        let error = line.contains(r#""level":"ERROR""#);
        self.lines += u64::from(!stderr);
        self.stderr_lines += u64::from(stderr);
        self.warnings += u64::from(warning);
        self.errors += u64::from(error);
        if (stderr || warning || error) && self.first.len() < KEPT {
            self.first.push(line.chars().take(300).collect());
        }
    }
}

impl Output {
    fn merge(&mut self, o: Output) {
        self.lines += o.lines;
        self.warnings += o.warnings;
        self.errors += o.errors;
        self.stderr_lines += o.stderr_lines;
        let room = KEPT.saturating_sub(self.first.len());
        self.first.extend(o.first.into_iter().take(room));
    }
}

/// One worker thread as `/proc` shows it.
#[derive(Debug, Clone)]
pub struct ThreadSample {
    /// Its name (`comm`: `ironflow-exec` for our runs' runtime, `tokio-runtime-w` for a tokio
    /// runtime's default, the binary's for the main thread).
    pub name: String,
    /// CPU ticks.
    pub cpu: u64,
    pub voluntary: u64,
    pub involuntary: u64,
}

/// What the fleet's processes are given.
pub struct Spec<'a> {
    pub worker: Worker,
    pub f: usize,
    pub concurrency: usize,
    pub max_runs: usize,
    pub api_url: &'a str,
    pub token: &'a str,
    /// Run each process under callgrind (`fleet --callgrind`).
    pub callgrind: Option<&'a super::callgrind::Dumps>,
}

/// The F processes, and for ours the Runtime API behind them.
pub struct Fleet {
    // Declared first: dropped (killed) before the endpoints stop.
    children: Vec<Child>,
    output: Vec<JoinHandle<Output>>,
    _endpoints: Vec<Endpoint>,
    dispatcher: Option<Arc<Dispatcher>>,
}

impl Fleet {
    /// Start the processes; ours wait on their Runtime API polls until [`Fleet::open`].
    pub async fn start(spec: &Spec<'_>) -> Result<Self, BenchError> {
        let exe = std::env::current_exe()?;
        let mut fleet = Self {
            children: Vec::new(),
            output: Vec::new(),
            _endpoints: Vec::new(),
            dispatcher: None,
        };
        let dispatcher = (spec.worker == Worker::Ours)
            .then(|| Dispatcher::steady(spec.f, INVOCATION, POLL, "fleet", FLEET_EVENT));
        for p in 0..spec.f {
            let mut cmd = match &dispatcher {
                Some(d) => {
                    let endpoint = Endpoint::start(d.clone(), p).await?;
                    let cmd = function(&exe, endpoint.addr, spec);
                    fleet._endpoints.push(endpoint);
                    cmd
                }
                None => reference(&exe, spec),
            };
            if let Some(dumps) = spec.callgrind {
                cmd = dumps.wrap(&cmd);
            }
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| {
                let under = match spec.callgrind {
                    Some(_) => " under valgrind (`--callgrind`: is valgrind installed, on PATH?)",
                    None => "",
                };
                BenchError::msg(format!(
                    "starting {} as a worker{under}: {e}",
                    exe.display()
                ))
            })?;
            let (out, err) = (child.stdout.take(), child.stderr.take());
            fleet.output.push(crate::process::read_lines(out, err));
            fleet.children.push(child);
        }
        if let Some(d) = &dispatcher {
            d.ready(
                1,
                Duration::from_secs(1),
                Duration::from_secs(60),
                &mut || fleet_alive(&mut fleet.children),
            )
            .await?;
        }
        fleet.dispatcher = dispatcher;
        Ok(fleet)
    }

    /// Start serving invocations (ours; the reference's workers poll from their start).
    pub fn open(&self) {
        if let Some(d) = &self.dispatcher {
            d.open();
        }
    }

    /// An error if a process has exited.
    pub fn alive(&mut self) -> Result<(), BenchError> {
        fleet_alive(&mut self.children)
    }

    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.children.iter().filter_map(Child::id)
    }

    /// The processes' CPU ticks and their reaped children's (the shell steps'), summed.
    pub fn cpu(&self) -> (u64, u64) {
        self.pids()
            .filter_map(procfs::process_cpu)
            .fold((0, 0), |(a, b), (own, children)| (a + own, b + children))
    }

    /// Every thread's name, CPU ticks and context switches, by (pid, tid).
    pub fn threads(&self) -> Vec<((u32, u32), ThreadSample)> {
        self.pids()
            .flat_map(|pid| {
                procfs::threads(pid).into_iter().filter_map(move |tid| {
                    let (name, cpu) = procfs::thread_cpu(pid, tid)?;
                    let (voluntary, involuntary) = procfs::thread_switches(pid, tid)?;
                    let sample = ThreadSample {
                        name,
                        cpu,
                        voluntary,
                        involuntary,
                    };
                    Some(((pid, tid), sample))
                })
            })
            .collect()
    }

    /// What our invocations' answers said so far (`None` for the reference).
    pub fn tally(&self) -> Option<Tally> {
        self.dispatcher.as_ref().map(|d| d.finish().1)
    }

    /// Kill every process; what they wrote.
    pub async fn stop(mut self) -> Output {
        for child in &mut self.children {
            let _ = child.kill().await;
        }
        let mut all = Output::default();
        for handle in self.output.drain(..) {
            let abort = handle.abort_handle();
            match tokio::time::timeout(Duration::from_secs(2), handle).await {
                Ok(Ok(o)) => all.merge(o),
                _ => abort.abort(),
            }
        }
        all
    }
}

fn fleet_alive(children: &mut [Child]) -> Result<(), BenchError> {
    for (p, child) in children.iter_mut().enumerate() {
        if let Some(status) = child.try_wait()? {
            return Err(BenchError::msg(format!(
                "worker process {p} exited ({status}) during the fleet's window"
            )));
        }
    }
    Ok(())
}

/// Our function process: the Lambda environment (`crate::process::function_command`), N and
/// the invocation's length.
fn function(exe: &std::path::Path, runtime: std::net::SocketAddr, spec: &Spec<'_>) -> Command {
    let mut cmd =
        crate::process::function_command(exe, runtime, spec.api_url, spec.token, spec.concurrency);
    cmd.env(ROLE, "function")
        .env(
            "IRONFLOW_MAX_RUNS_PER_INVOCATION",
            spec.max_runs.to_string(),
        )
        .env(
            "IRONFLOW_FUNCTION_TIMEOUT_SECS",
            INVOCATION.as_secs().to_string(),
        );
    cmd
}

/// A reference worker process.
fn reference(exe: &std::path::Path, spec: &Spec<'_>) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(ROLE, "reference")
        .env(POLL_MS, POLL.as_millis().to_string())
        .env("IRONFLOW_API_URL", spec.api_url)
        .env("IRONFLOW_WORKER_TOKEN", spec.token)
        .env("IRONFLOW_CONCURRENCY", spec.concurrency.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}
