//! The managed-instances rows in the report (`BENCHMARKS.md`'s "Lambda Managed Instances"
//! section) and on the terminal (`managed`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::{Job, Managed, ManagedDrain, Shape};
use crate::Options;
use crate::markdown::yes;
use crate::stats::median;

/// The issue's bounds: one process's throughput at least this share of M processes'...
const THROUGHPUT_BOUND: f64 = 0.9;
/// ... with at most this share of their total peak RSS.
const RSS_BOUND: f64 = 0.4;

/// The medians of one row.
struct Row {
    wall: f64,
    runs_per_s: f64,
    peak_rss_mib: f64,
    anon_mib: f64,
    requests: f64,
    invocations: f64,
    empty: f64,
    /// Poll loops each process ran at the start, as seen over the rounds.
    loops: BTreeSet<usize>,
    /// The most invocations a process had out at once, over the rounds and processes.
    max_at_once: usize,
    /// The mean invocations out per process (median over the rounds).
    mean_at_once: f64,
    cpu_ms: f64,
    children_cpu_ms: f64,
    bench_cpu_ms: f64,
}

fn row(rs: &[ManagedDrain]) -> Row {
    let med = |f: &dyn Fn(&ManagedDrain) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
    let per_run = |d: &ManagedDrain, f: &dyn Fn(&super::ProcessUse) -> f64| {
        d.processes.iter().map(f).sum::<f64>() * 1000.0 / d.runs.max(1) as f64
    };
    let wall = med(&|d| d.wall.as_secs_f64());
    let runs = rs.first().map_or(0, |d| d.runs);
    Row {
        wall,
        runs_per_s: runs as f64 / wall.max(1e-9),
        peak_rss_mib: med(&|d| d.peak_rss_kib() as f64 / 1024.0),
        anon_mib: med(&|d| d.processes.iter().map(|p| p.rss_anon_kib).sum::<u64>() as f64 / 1024.0),
        requests: rs
            .iter()
            .map(|d| d.requests.values().sum::<u64>())
            .sum::<u64>() as f64
            / rs.iter().map(|d| d.runs).sum::<usize>().max(1) as f64,
        invocations: med(&|d| d.tally.invocations as f64),
        empty: med(&|d| d.tally.empty as f64),
        loops: rs
            .iter()
            .flat_map(|d| d.processes.iter().map(|p| p.slots.loops_at_start))
            .collect(),
        max_at_once: rs
            .iter()
            .flat_map(|d| d.processes.iter().map(|p| p.slots.max_in_flight))
            .max()
            .unwrap_or(0),
        mean_at_once: med(&|d| {
            d.processes
                .iter()
                .map(|p| p.slots.mean_in_flight(d.wall))
                .sum::<f64>()
                / d.processes.len().max(1) as f64
        }),
        cpu_ms: med(&|d| per_run(d, &|p| p.cpu.as_secs_f64())),
        children_cpu_ms: med(&|d| per_run(d, &|p| p.children_cpu.as_secs_f64())),
        bench_cpu_ms: med(&|d| d.bench_cpu.as_secs_f64() * 1000.0 / d.runs.max(1) as f64),
    }
}

/// Median over the rounds of `of(M processes) / of(one process)`, the rounds paired in order.
fn paired(one: &[ManagedDrain], many: &[ManagedDrain], of: fn(&ManagedDrain) -> f64) -> f64 {
    let ratios: Vec<f64> = one
        .iter()
        .zip(many)
        .map(|(o, m)| of(m) / of(o).max(1e-9))
        .collect();
    median(&ratios)
}

/// The two rows of `workload`, when both ran.
fn pair(p: &Managed, job: Job) -> Option<(&[ManagedDrain], &[ManagedDrain])> {
    Some((
        p.drains.get(&(job, Shape::OneProcess))?,
        p.drains.get(&(job, Shape::Processes))?,
    ))
}

/// `managed`: the medians and ratios, printed.
pub fn print_medians(p: &Managed, o: &Options) {
    if let Some(why) = &p.skipped {
        println!("{why}");
        return;
    }
    let m = o.managed.max_concurrency;
    for ((workload, shape), rs) in &p.drains {
        let r = row(rs);
        println!(
            "{:<14} {:<12} K = {}  {:.3} s  {:.1} runs/s  peak RSS {:.1} MiB (anon {:.1})  \
             {:.2} requests/run  poll loops {:?}  at once max {} mean {:.2}  CPU/run {:.3} ms + \
             children {:.3} ms, bench {:.3} ms",
            workload.workflow(),
            shape.flag(),
            o.managed.runs(*workload),
            r.wall,
            r.runs_per_s,
            r.peak_rss_mib,
            r.anon_mib,
            r.requests,
            r.loops,
            r.max_at_once,
            r.mean_at_once,
            r.cpu_ms,
            r.children_cpu_ms,
            r.bench_cpu_ms,
        );
    }
    for workload in Job::ALL {
        let Some((one, many)) = pair(p, workload) else {
            continue;
        };
        let (a, b) = (row(one), row(many));
        println!(
            "{:<14} one process / {m} processes: throughput {:.3} (per round {:.3}; target ≥ \
             {THROUGHPUT_BOUND}), total peak RSS {:.3} (target ≤ {RSS_BOUND})",
            workload.workflow(),
            a.runs_per_s / b.runs_per_s,
            paired(one, many, |d| d.wall.as_secs_f64()),
            a.peak_rss_mib / b.peak_rss_mib,
        );
    }
    let mut oddities = String::new();
    odd(&mut oddities, p);
    print!("{oddities}");
}

/// Writes the "Lambda Managed Instances" section.
pub fn section(md: &mut String, o: &Options, p: &Managed) {
    let m = o.managed.max_concurrency;
    let _ = writeln!(
        md,
        "\n## Lambda Managed Instances: one process, {m} invocations at once\n"
    );
    if let Some(why) = &p.skipped {
        let _ = writeln!(md, "{why}\n");
        return;
    }
    intro(md, o);
    targets(md, o, p);
    table(md, o, p);
    routes(md, p);
    odd(md, p);
}

fn intro(md: &mut String, o: &Options) {
    let (m, s) = (o.managed.max_concurrency, &o.drain);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let rounds = match o.managed.rounds {
        1 => "1 round".to_string(),
        n => format!("{n} rounds"),
    };
    let _ = writeln!(
        md,
        "Under Lambda Managed Instances one execution environment serves several invocations at \
         once: Lambda sets `AWS_LAMBDA_MAX_CONCURRENCY` and the runtime polls for that many \
         events at once. Here one function process with `AWS_LAMBDA_MAX_CONCURRENCY={m}` and \
         {m} function processes without it (one invocation each, as on classic Lambda) drain \
         the same backlog from a fresh embedded API (in-memory store, loopback): K = {} no-op \
         runs, K = {} three-step shell runs or K = {} `quick-shell` runs, every invocation at \
         C = {} with N = {} runs at most, so both layouts execute up to {} runs at once; \
         {rounds}, the layouts in turn first. All of it on this machine's {cores} cores: the \
         function processes, the API and the shell steps share them. The no-op and three-step \
         shell rows run the bench binary started again as a Lambda function \
         (`ironflow_lambda::run` with the bench's two workflows registered: the deployable \
         binary's entry point and release profile, but not its sample workflows, which do not \
         include these two); the `quick-shell` rows run the deployable `ironflow-lambda` \
         itself. Each process polls its own endpoint of a stand-in for the Lambda Runtime API \
         (a hand-written stub, as in the cold-start rows), which answers every \
         `GET .../invocation/next` at once with a direct invocation (`{{\"reason\": ...}}`, \
         deadline {} s away), so that each process keeps as many invocations out as it polls \
         for; once an answer reports the backlog empty (it claimed nothing) it serves only when \
         no invocation is out, and none once the answers have reported every run's end.\n",
        o.managed.noop_runs,
        o.managed.shell_runs,
        o.managed.quick_shell_runs,
        s.concurrency,
        s.max_runs,
        m * s.concurrency,
        s.invocation.as_secs(),
    );
    let _ = writeln!(
        md,
        "The drain's time runs from the first event, served once every process waits on its \
         poll loops (its cold start left out), to the invocation answer that reports the last \
         run's end; no watcher polls the store (it is checked afterwards: every run ended). \
         Throughput is K over the median time; \"per round\" is the median of each round's \
         ratio. Total peak RSS is the sum over the processes of `VmHWM` from \
         `/proc/<pid>/status` at the end (it counts the pages of the binary each process \
         mapped, once per process; `RssAnon`, the processes' own memory at the end, is beside \
         it). Requests are counted at the API from the first event to the end. \"Poll loops\" \
         is how many `GET .../next` each process had waiting when the drain started; \
         \"invocations at once\" is the most a process had out at any time, and the mean over \
         the drain. CPU is each process's (`/proc/<pid>/stat`), its reaped children's (the \
         shell steps) and the bench process's (the API and the stubs), per run.\n"
    );
}

fn targets(md: &mut String, o: &Options, p: &Managed) {
    let m = o.managed.max_concurrency;
    let _ = writeln!(md, "| target (issue 19) | measured | met |\n|---|---|---|");
    for workload in Job::ALL {
        let Some((one, many)) = pair(p, workload) else {
            continue;
        };
        let (a, b) = (row(one), row(many));
        let ratio = a.runs_per_s / b.runs_per_s;
        let per_round = paired(one, many, |d| d.wall.as_secs_f64());
        let _ = writeln!(
            md,
            "| drain throughput, {}: one process with {m} invocations at once ≥ \
             {THROUGHPUT_BOUND} × {m} single-invocation processes | {ratio:.3} ({:.1} vs {:.1} \
             runs/s; per round {per_round:.3}) | {} |",
            workload.describe(),
            a.runs_per_s,
            b.runs_per_s,
            yes(ratio >= THROUGHPUT_BOUND && per_round >= THROUGHPUT_BOUND)
        );
    }
    for workload in Job::ALL {
        let Some((one, many)) = pair(p, workload) else {
            continue;
        };
        let (a, b) = (row(one), row(many));
        let ratio = a.peak_rss_mib / b.peak_rss_mib;
        let _ = writeln!(
            md,
            "| total peak RSS, {}: one process ≤ {RSS_BOUND} × {m} processes' | {ratio:.3} \
             ({:.1} vs {:.1} MiB) | {} |",
            workload.describe(),
            a.peak_rss_mib,
            b.peak_rss_mib,
            yes(ratio <= RSS_BOUND)
        );
    }
    let _ = writeln!(md);
}

fn table(md: &mut String, o: &Options, p: &Managed) {
    let m = o.managed.max_concurrency;
    let _ = writeln!(
        md,
        "| workload | layout | K | drain (median) | runs/s | one process / {m} processes \
         (per round) | total peak RSS (median) | one process / {m} processes | `RssAnon` at \
         the end | requests per run | invocations (claiming nothing) | poll loops per process \
         | invocations at once per process: max / mean | CPU per run: processes + their \
         children | bench process CPU per run | time per round (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for ((workload, shape), rs) in &p.drains {
        let r = row(rs);
        let (ratio, rss_ratio) = match (shape, pair(p, *workload)) {
            (Shape::OneProcess, Some((one, many))) => {
                let b = row(many);
                (
                    format!(
                        "**{:.3}** ({:.3})",
                        r.runs_per_s / b.runs_per_s,
                        paired(one, many, |d| d.wall.as_secs_f64())
                    ),
                    format!("**{:.3}**", r.peak_rss_mib / b.peak_rss_mib),
                )
            }
            (Shape::Processes, Some(_)) => ("1".into(), "1".into()),
            _ => (String::new(), String::new()),
        };
        let loops: Vec<String> = r.loops.iter().map(usize::to_string).collect();
        let walls: Vec<String> = rs
            .iter()
            .map(|d| format!("{:.3}", d.wall.as_secs_f64()))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} s | {:.1} | {ratio} | {:.1} MiB | {rss_ratio} | {:.1} MiB | \
             {:.2} | {:.0} ({:.0}) | {} | {} / {:.2} | {:.3} + {:.3} ms | {:.3} ms | {} |",
            workload.describe(),
            shape.describe(m),
            rs.first().map_or(0, |d| d.runs),
            r.wall,
            r.runs_per_s,
            r.peak_rss_mib,
            r.anon_mib,
            r.requests,
            r.invocations,
            r.empty,
            loops.join(", "),
            r.max_at_once,
            r.mean_at_once,
            r.cpu_ms,
            r.children_cpu_ms,
            r.bench_cpu_ms,
            walls.join(", "),
        );
    }
    let _ = writeln!(md);
}

/// Requests per run by route, per row (all rounds).
fn routes(md: &mut String, p: &Managed) {
    let _ = writeln!(
        md,
        "Requests per run by route (all rounds):\n\n| workload | layout | route | per run |\n|---|---|---|---|"
    );
    for ((workload, shape), rs) in &p.drains {
        let mut routes: BTreeMap<&str, u64> = BTreeMap::new();
        for d in rs {
            for (route, n) in &d.requests {
                *routes.entry(route).or_default() += n;
            }
        }
        let runs = rs.iter().map(|d| d.runs).sum::<usize>().max(1) as f64;
        for (route, n) in routes {
            let _ = writeln!(
                md,
                "| {} | {} | `{route}` | {:.3} |",
                workload.describe(),
                shape.flag(),
                n as f64 / runs
            );
        }
    }
    let _ = writeln!(md);
}

/// What went wrong or looked odd: invocation errors, runs not completed, warnings and errors
/// in the functions' logs, lines on their stderr; a sentence when nothing did.
fn odd(md: &mut String, p: &Managed) {
    let mut lines = Vec::new();
    for ((workload, shape), rs) in &p.drains {
        let errors: usize = rs.iter().map(|d| d.tally.errors).sum();
        let not_completed: usize = rs.iter().map(|d| d.not_completed).sum();
        let logs = rs.iter().flat_map(|d| &d.processes).map(|p| &p.logs);
        let (warnings, log_errors, stderr) = logs.clone().fold((0, 0, 0), |(w, e, s), l| {
            (w + l.warnings, e + l.errors, s + l.stderr_lines)
        });
        if errors + not_completed + warnings + log_errors + stderr == 0 {
            continue;
        }
        let mut first: Vec<&String> = rs.iter().flat_map(|d| &d.tally.first_errors).collect();
        first.extend(logs.flat_map(|l| &l.first));
        first.truncate(3);
        let first: Vec<String> = first
            .iter()
            .map(|l| format!("`{}`", l.replace('`', "'")))
            .collect();
        lines.push(format!(
            "- {}, {}: {errors} invocation or batch errors, {not_completed} runs ended other \
             than completed, {warnings} warnings and {log_errors} errors in the logs, {stderr} \
             lines on stderr; first: {}",
            workload.describe(),
            shape.flag(),
            first.join("; ")
        ));
    }
    if lines.is_empty() {
        let _ = writeln!(
            md,
            "No invocation failed, every run completed, and the functions logged no warning \
             or error (nothing on stderr).\n"
        );
    } else {
        let _ = writeln!(md, "What went wrong:\n\n{}\n", lines.join("\n"));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::managed::ProcessUse;
    use crate::workload::Workload;

    fn drain(wall_ms: u64, peak_rss_kib: &[u64]) -> ManagedDrain {
        ManagedDrain {
            runs: 1000,
            wall: Duration::from_millis(wall_ms),
            requests: BTreeMap::from([("GET /api/v1/internal/runs/next".to_string(), 1000)]),
            processes: peak_rss_kib
                .iter()
                .map(|&kib| ProcessUse {
                    peak_rss_kib: kib,
                    ..ProcessUse::default()
                })
                .collect(),
            tally: Default::default(),
            bench_cpu: Duration::ZERO,
            not_completed: 0,
        }
    }

    #[test]
    fn the_section_compares_one_process_with_m_processes_against_the_issues_bounds() {
        let args = <crate::cli::Args as clap::Parser>::parse_from(["bench", "managed"]);
        let o = args.options(Vec::new()).unwrap();
        let noop = Job::Bench(Workload::NoOp);
        let mut p = Managed::default();
        // One process: 0.95 of the throughput (per round too), 30 % of the memory.
        p.drains.insert(
            (noop, Shape::OneProcess),
            vec![drain(2000, &[30 * 1024]), drain(2100, &[30 * 1024])],
        );
        p.drains.insert(
            (noop, Shape::Processes),
            vec![drain(1900, &[25 * 1024; 4]), drain(1995, &[25 * 1024; 4])],
        );
        let mut md = String::new();
        section(&mut md, &o, &p);
        assert!(md.contains("## Lambda Managed Instances: one process, 4 invocations at once"));
        let throughput = md
            .lines()
            .find(|l| l.starts_with("| drain throughput, no-op"))
            .unwrap();
        assert!(
            throughput.contains("| 0.950 (") && throughput.ends_with("| yes |"),
            "{throughput}"
        );
        let rss = md
            .lines()
            .find(|l| l.starts_with("| total peak RSS, no-op"))
            .unwrap();
        assert!(rss.contains("| 0.300 (30.0 vs 100.0 MiB) | yes |"), "{rss}");
        assert!(md.contains("| `GET /api/v1/internal/runs/next` | 1.000 |"));
        assert!(md.contains("every run completed"));

        // Slower than the bound: not met.
        p.drains.insert(
            (noop, Shape::OneProcess),
            vec![drain(2200, &[30 * 1024]); 2],
        );
        let mut md = String::new();
        section(&mut md, &o, &p);
        assert!(
            md.contains("| 0.885 (") && md.contains("| **no** |"),
            "{md}"
        );
    }
}
