//! The fleet section of `BENCHMARKS.md` ("Fleet scale"): per workload the cells' figures,
//! where each worker's curve bends and what saturated, the ratio table against the goals of
//! issue 28, and the projection per API host; written into its own part of the file
//! ([`replace_section`]).

use std::fmt::Write;
use std::path::Path;

use super::cell::BacklogLevel;
use super::{Cell, FleetWorkload, Fleets, Worker};
use crate::BenchError;
use crate::machine::Machine;
use crate::markdown;

/// The section's heading: what [`replace_section`] looks for.
pub const HEADING: &str = "## Fleet scale: many workers at once on one API and PostgreSQL";
/// A doubling of F that gains less than this share of runs/s is where the curve bends.
const BEND_GAIN: f64 = 0.2;
/// The machine counts as CPU-bound from this busy share of all its CPUs.
const CPU_BOUND: f64 = 0.85;

/// One cell's figures on a line (the bench's progress on stderr).
pub fn line(c: &Cell) -> String {
    format!(
        "{:<6} F={:<3} {:<9} {:>8.1} runs/s ({} runs in {:.1} s)  {:.2} requests/run  API {:.2} \
         ms/run  PG {} ms/run  worker {:.2} ms/run  {:.1} voluntary switches/run  machine {}  \
         errors {}",
        c.spec.workload.flag(),
        c.spec.f,
        c.spec.worker.name(),
        c.runs_per_s(),
        c.runs,
        c.secs(),
        c.requests_per_run(),
        c.ms_per_run(c.api_cpu),
        opt(c.pg_cpu.map(|d| c.ms_per_run(d)), 2),
        c.ms_per_run(c.worker_cpu),
        c.voluntary as f64 / c.runs.max(1) as f64,
        opt(c.machine_busy.map(|b| b * 100.0), 0) + " % busy",
        c.errors,
    )
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

/// The section, from what was measured.
pub fn section(r: &Fleets, m: &Machine) -> String {
    let mut md = String::new();
    header(&mut md, r, m);
    for &w in &r.args.workloads {
        let cells: Vec<&Cell> = r.cells.iter().filter(|c| c.spec.workload == w).collect();
        workload_tables(&mut md, w, &cells);
        bends(&mut md, &cells);
    }
    ratios(&mut md, r);
    cpu_ratios(&mut md, &r.args.workloads, &r.cells);
    instructions(&mut md, &r.cells);
    projection(&mut md, r);
    errors(&mut md, r);
    md
}

/// The cells counted under callgrind (`fleet --callgrind`), in its table; nothing without.
fn instructions(md: &mut String, cells: &[Cell]) {
    let counted: Vec<super::callgrind::Row<'_>> = cells
        .iter()
        .filter_map(|c| {
            Some(super::callgrind::Row {
                workload: c.spec.workload.flag(),
                f: c.spec.f,
                worker: c.spec.worker,
                runs: c.runs,
                instructions: c.instructions?,
            })
        })
        .collect();
    super::callgrind::table(md, &counted);
}

/// The cells with errors, and their first ones.
fn errors(md: &mut String, r: &Fleets) {
    for c in r.cells.iter().filter(|c| c.errors > 0) {
        let _ = writeln!(
            md,
            "\n{} errors at F = {} ({}, {}): {}",
            c.errors,
            c.spec.f,
            c.spec.worker.name(),
            c.spec.workload.flag(),
            c.first_errors.join(" / ")
        );
    }
}

fn header(md: &mut String, r: &Fleets, m: &Machine) {
    let a = &r.args;
    let store = if a.postgres_url.is_some() {
        format!(
            "ironflow-store's PostgreSQL store (a fresh database per cell with `{}`, its runs' \
             statistics kept current by `{}` every {} s as on a long-lived database, the server \
             on this machine)",
            ironflow_local_api::NO_JIT,
            super::postgres::ANALYZE,
            super::postgres::ANALYZE_EVERY * super::postgres::SAMPLE.as_millis() as u64 / 1000
        )
    } else {
        "the in-memory store (no PostgreSQL server given: no PostgreSQL figures)".to_string()
    };
    let _ = writeln!(md, "{HEADING}\n");
    let _ = writeln!(
        md,
        "Measured on {} at commit {} by `cargo run --release -p ironflow-lambda-bench -- {}` \
         ({:.1} min; `nproc` {}, load {} at the start, {} at the end), which writes this section \
         only. Method and limits: docs/benchmark.md, \"Fleet scale\".\n",
        m.date,
        m.commit,
        command(&r.command),
        r.elapsed.as_secs_f64() / 60.0,
        m.nproc,
        m.load_start,
        m.load_end,
    );
    let _ = writeln!(
        md,
        "Each cell: the real ironflow API (its router on 2 threads of its own) on {store}, behind \
         the delay proxy ({} ms round trip); F workers at once, each C = {}: ours are F function \
         processes, one invocation at a time, fed back to back by the Runtime API stand-in \
         (N = {} runs per invocation at most; after an invocation that claimed nothing, its \
         process is served again 100 ms later, the reference's own pause after an empty poll); \
         the reference's are F `ironflow_worker::Worker` processes. A feeder keeps the backlog \
         at 2·F·N + 64 pending runs (it reads the backlog every 100 ms and keeps up to 8 \
         creations in flight until it is full; it creates the runs through the store: their \
         INSERTs are in PostgreSQL's CPU); **backlog pending** is what its reads found over the \
         window, **ran dry** where one found none (a claim could then come back empty for want \
         of runs: the cell measures the feeder as much as the workers). After a {} s warm-up, a \
         window of fixed length (at least {} runs ended in it) is measured: runs/s are the runs \
         ended in it; requests are counted at the API; CPU per run is the API's threads', \
         PostgreSQL's (the backends of the fleet's database and the server's background \
         processes, from `/proc/<pid>/stat`), the worker processes' own and their reaped \
         children's (the steps'); switches are the worker threads' (`/proc/<pid>/task/*/status`); \
         by thread: for ours `ironflow-exec` is the runtime that executes the runs and the \
         main thread (`ironflow-lambda`, the binary's name cut to 15 characters) the Lambda \
         runtime loop with the claims, lease refreshers, watches, handbacks and the answer; for \
         the reference `tokio-rt-worker` is its runtime (all of its work) and the main thread \
         waits on it. \
         **Claim latency** is from a run's `started_at` (written by its claim, in the API's \
         transaction) to its first step's start (its end for a no-op run), read back from the \
         store for up to 300 runs claimed in the window: it includes the answer's way back, and \
         for ours the wait of a run claimed ahead for a free slot. **Lock waits**: backends of \
         the fleet's database with `wait_event_type = 'Lock'` in `pg_stat_activity`, sampled \
         every 100 ms (mean, max, share of samples with one). **Empty claims**: claim requests \
         that claimed no run, per 1 000 runs (the reference's empty polls; ours, claims of an \
         invocation that found nothing); ours also counts invocations that claimed nothing. \
         Errors (must be 0): our answers' invocation and batch errors and API faults, ERROR log \
         lines, runs ended failed. Cores: CPU time over the window's length (2 cores here). \
         The round trip measured through the proxy: {:.2} ms (median over the cells).\n",
        a.rtt_ms,
        a.concurrency,
        a.max_runs,
        a.warmup_secs,
        a.min_runs,
        crate::stats::median(
            &r.cells
                .iter()
                .map(|c| c.measured_rtt.as_secs_f64() * 1000.0)
                .collect::<Vec<_>>()
        ),
    );
}

/// A cell's backlog at the feeder's reads: `min / mean`, **ran dry** when a read found none.
fn backlog(b: &BacklogLevel) -> String {
    match (b.min, b.mean()) {
        (Some(min), Some(mean)) if b.ran_dry() => format!("**{min} / {mean:.0}: ran dry**"),
        (Some(min), Some(mean)) => format!("{min} / {mean:.0}"),
        _ => "–".to_string(),
    }
}

/// The command line, without a PostgreSQL URL (it may hold a password).
fn command(args: &[String]) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if a == "--postgres-url" {
            skip = true;
            continue;
        }
        if a.starts_with("--postgres-url=") || a.starts_with("postgres://") {
            continue;
        }
        out.push(a);
    }
    out.join(" ")
}

fn workload_tables(md: &mut String, w: FleetWorkload, cells: &[&Cell]) {
    let _ = writeln!(md, "### {}\n", w.describe());
    let _ = writeln!(
        md,
        "| F | worker | runs/s | requests per run | requests/s | API CPU per run (ms) | \
         PostgreSQL CPU per run (ms) | claim → first step p50 / p99 (ms) | lock waits: mean / \
         max / share of samples | active backends (mean) | empty claims per 1 000 runs | invocations claiming nothing \
         per 1 000 runs | backlog pending: min / mean | errors |"
    );
    let _ = writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in cells {
        let locks = c.locks.map_or_else(
            || "–".to_string(),
            |l| {
                format!(
                    "{:.2} / {} / {:.0} %",
                    l.mean(),
                    l.max,
                    l.with_any as f64 * 100.0 / l.samples.max(1) as f64
                )
            },
        );
        let empty_invocations = c
            .invocations
            .map(|(_, empty)| empty as f64 * 1000.0 / c.runs.max(1) as f64);
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.2} | {:.0} | {:.2} | {} | {} / {} | {locks} | {} | {:.1} | {} | {} | {} |",
            c.spec.f,
            c.spec.worker.name(),
            c.runs_per_s(),
            c.requests_per_run(),
            c.requests_per_s(),
            c.ms_per_run(c.api_cpu),
            opt(c.pg_cpu.map(|d| c.ms_per_run(d)), 2),
            opt(c.latency_ms(0.5), 1),
            opt(c.latency_ms(0.99), 1),
            opt(c.locks.map(|l| l.mean_active()), 2),
            c.empty_claims_per_1000(),
            opt(empty_invocations, 1),
            backlog(&c.backlog),
            c.errors,
        );
    }
    let _ = writeln!(
        md,
        "\n| F | worker | worker CPU per run (ms) | steps' CPU per run (ms) | voluntary switches \
         per run | involuntary per run | worker CPU per run by thread (ms) | cores: API / \
         PostgreSQL / workers + steps / bench | machine busy |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for c in cells {
        let runs = c.runs.max(1) as f64;
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {} | {:.2} / {} / {:.2} / {:.2} | {} |",
            c.spec.f,
            c.spec.worker.name(),
            c.ms_per_run(c.worker_cpu),
            c.ms_per_run(c.steps_cpu),
            c.voluntary as f64 / runs,
            c.involuntary as f64 / runs,
            by_thread(c),
            c.cores(c.api_cpu),
            opt(c.pg_cpu.map(|d| c.cores(d)), 2),
            c.cores(c.worker_cpu + c.steps_cpu),
            c.cores(c.bench_cpu),
            opt(c.machine_busy.map(|b| b * 100.0), 0) + " %",
        );
    }
    let _ = writeln!(md);
}

/// The worker processes' CPU per run by thread name, the three largest first.
fn by_thread(c: &Cell) -> String {
    let mut v: Vec<(&String, &std::time::Duration)> = c.worker_threads.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    let top: Vec<String> = v
        .iter()
        .take(3)
        .map(|(name, cpu)| format!("`{name}` {:.2}", c.ms_per_run(**cpu)))
        .collect();
    if top.is_empty() {
        "–".to_string()
    } else {
        top.join(", ")
    }
}

/// A worker's cells of one workload, by F ascending.
fn curve<'a>(cells: &[&'a Cell], worker: Worker) -> Vec<&'a Cell> {
    let mut v: Vec<&Cell> = cells
        .iter()
        .copied()
        .filter(|c| c.spec.worker == worker)
        .collect();
    v.sort_by_key(|c| c.spec.f);
    v
}

/// Ours and the reference's cells at each F both measured, by F.
fn pairs<'a>(cells: &[&'a Cell]) -> Vec<(&'a Cell, &'a Cell)> {
    let reference = curve(cells, Worker::Reference);
    curve(cells, Worker::Ours)
        .into_iter()
        .filter_map(|o| {
            let re = reference.iter().find(|c| c.spec.f == o.spec.f)?;
            Some((o, *re))
        })
        .collect()
}

/// The cell with the most runs/s: the saturation point.
fn peak<'a>(curve: &[&'a Cell]) -> Option<&'a Cell> {
    curve
        .iter()
        .copied()
        .max_by(|a, b| a.runs_per_s().total_cmp(&b.runs_per_s()))
}

/// The first F whose runs/s grew less than [`BEND_GAIN`] over the F before it.
pub fn bend<'a>(curve: &[&'a Cell]) -> Option<&'a Cell> {
    curve
        .windows(2)
        .find(|w| w[1].runs_per_s() < w[0].runs_per_s() * (1.0 + BEND_GAIN))
        .map(|w| w[1])
}

/// What saturated at `c`, with the evidence.
pub fn saturated(c: &Cell) -> String {
    let busy = c.machine_busy.unwrap_or(0.0);
    let pg = c.pg_cpu.map_or(0.0, |d| c.cores(d));
    let evidence = format!(
        "machine {:.0} % busy; cores: workers + steps {:.2}, PostgreSQL {pg:.2}, API {:.2}, \
         bench {:.2}; lock waits {}",
        busy * 100.0,
        c.cores(c.worker_cpu + c.steps_cpu),
        c.cores(c.api_cpu),
        c.cores(c.bench_cpu),
        c.locks
            .map_or_else(|| "–".to_string(), |l| format!("{:.2}", l.mean())),
    );
    let locks = c.locks.map_or(0.0, |l| l.mean());
    let what = if busy >= CPU_BOUND {
        let users = [
            (
                "the workers and their steps",
                c.cores(c.worker_cpu + c.steps_cpu),
            ),
            ("PostgreSQL", pg),
            ("the API", c.cores(c.api_cpu)),
        ];
        let top = users
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("", |u| u.0);
        format!("the machine's CPU (its largest user: {top})")
    } else if locks >= 0.5 {
        "PostgreSQL's row locks".to_string()
    } else {
        "neither CPU nor locks: the fleet's own concurrency (F × C runs at once) and the round \
         trips bound it"
            .to_string()
    };
    format!("{what} ({evidence})")
}

fn bends(md: &mut String, cells: &[&Cell]) {
    for worker in [Worker::Reference, Worker::Ours] {
        let curve = curve(cells, worker);
        let Some(top) = peak(&curve) else { continue };
        let bend = bend(&curve);
        let _ = writeln!(
            md,
            "- {}: peak {:.1} runs/s at F = {}; {}.",
            worker.name(),
            top.runs_per_s(),
            top.spec.f,
            match bend {
                Some(b) => format!(
                    "the curve bends at F = {} (less than {:.0} % more runs/s than at half the \
                     fleet); saturated there: {}",
                    b.spec.f,
                    BEND_GAIN * 100.0,
                    saturated(b)
                ),
                None => "no bend within the fleets measured".to_string(),
            }
        );
    }
    let _ = writeln!(md);
}

/// The goal of ours / reference at the saturation point (issue 28).
fn saturation_goal(w: FleetWorkload) -> f64 {
    match w {
        FleetWorkload::Noop => 1.5,
        FleetWorkload::Shell => 1.2,
        FleetWorkload::Sleep => 1.0,
    }
}

/// Whether `ours` ended within one run of what the reference's rate gives over ours' window:
/// a difference the window's run count cannot resolve (a workload bound by its concurrency on
/// both sides, as the I/O-bound one, ends the same runs in each window).
fn within_one_run(ours: &Cell, reference: &Cell) -> bool {
    (ours.runs as f64 - reference.runs_per_s() * ours.secs()).abs() <= 1.0
}

fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

fn ratios(md: &mut String, r: &Fleets) {
    let _ = writeln!(md, "### Ours / reference\n");
    let _ = writeln!(
        md,
        "Goals (issue 28): ours ≥ the reference at every F; at each one's saturation point \
         (its peak) ≥ 1.5× for no-op, ≥ 1.2× for three-step shell (≥ 1× for the I/O-bound \
         workload, which has no goal of its own).\n"
    );
    let _ = writeln!(
        md,
        "| workload | F | ours runs/s | reference runs/s | ours / reference | goal | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let mut missed = Vec::new();
    let mut compared = 0_usize;
    for &w in &r.args.workloads {
        let cells: Vec<&Cell> = r.cells.iter().filter(|c| c.spec.workload == w).collect();
        let (ours, reference) = (
            curve(&cells, Worker::Ours),
            curve(&cells, Worker::Reference),
        );
        for (o, re) in pairs(&cells) {
            compared += 1;
            let ratio = o.runs_per_s() / re.runs_per_s().max(1e-9);
            let tie = ratio < 1.0 && within_one_run(o, re);
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} | {:.1} | {ratio:.2} | ≥ 1.0 | {} |",
                w.flag(),
                o.spec.f,
                o.runs_per_s(),
                re.runs_per_s(),
                if tie {
                    "tie (within one run)"
                } else {
                    met(ratio >= 1.0)
                }
            );
            if ratio < 1.0 && !tie {
                missed.push(format!("{} at F = {} ({ratio:.2})", w.flag(), o.spec.f));
            }
        }
        if let (Some(o), Some(re)) = (peak(&ours), peak(&reference)) {
            let ratio = o.runs_per_s() / re.runs_per_s().max(1e-9);
            let goal = saturation_goal(w);
            let _ = writeln!(
                md,
                "| {} | saturation: ours F = {}, reference F = {} | {:.1} | {:.1} | {ratio:.2} | \
                 ≥ {goal:.1} | {} |",
                w.flag(),
                o.spec.f,
                re.spec.f,
                o.runs_per_s(),
                re.runs_per_s(),
                met(ratio >= goal)
            );
            if ratio < goal {
                missed.push(format!(
                    "{} at saturation ({ratio:.2} < {goal:.1}; at ours' peak, F = {}: {}; {})",
                    w.flag(),
                    o.spec.f,
                    saturated(o),
                    per_run_split(o, re)
                ));
            }
        }
    }
    let _ = writeln!(
        md,
        "\n{}\n",
        if compared == 0 && missed.is_empty() {
            NOTHING_COMPARED.to_string()
        } else if missed.is_empty() {
            "Every goal is met.".to_string()
        } else {
            format!(
                "Missed: {}. Why, from the rows above: where the machine's CPU saturated, the \
                 runs/s are its cores over the CPU every part spends per run. Our fewer requests \
                 per run cut the API's share; PostgreSQL's, most of it the claim query that \
                 either worker sends once per run (docs/benchmark.md, \"PostgreSQL's JIT\"), \
                 does not shrink with them, and the workers' own CPU per run decides the rest.",
                missed.join("; ")
            )
        }
    );
}

/// What a goal's verdict says when no fleet was measured with both workers: nothing was
/// compared, so nothing is met or missed.
const NOTHING_COMPARED: &str = "No goal is judged: no fleet size was measured with both \
     workers (run both, `--workers reference,ours`, to compare them).";

/// Where the CPU of a run goes at two peaks, ours (`o`) against the reference's (`re`), in ms
/// per run: PostgreSQL (`–` where not measured), the API, the workers with their steps.
fn per_run_split(o: &Cell, re: &Cell) -> String {
    let pg = |c: &Cell| {
        c.pg_cpu
            .map_or_else(|| "–".to_string(), |d| format!("{:.2}", c.ms_per_run(d)))
    };
    format!(
        "CPU per run at the peaks, ours / reference: PostgreSQL {} / {} ms, API {:.2} / {:.2} \
         ms, workers and steps {:.2} / {:.2} ms",
        pg(o),
        pg(re),
        o.ms_per_run(o.api_cpu),
        re.ms_per_run(re.api_cpu),
        o.ms_per_run(o.worker_cpu + o.steps_cpu),
        re.ms_per_run(re.worker_cpu + re.steps_cpu),
    )
}

/// Our main thread's name: the binary's, cut to 15 characters (the Lambda runtime loop).
const MAIN_THREAD: &str = "ironflow-lambda";

/// The goal of issue 28 for the worker's own CPU per run: ours at most 0.8 × the reference's.
const CPU_GOAL: f64 = 0.8;

/// The workers' own CPU per run, ours / reference, at every F (goal: at most [`CPU_GOAL`]).
fn cpu_ratios(md: &mut String, workloads: &[FleetWorkload], cells: &[Cell]) {
    let _ = writeln!(md, "### Worker CPU per run, ours / reference\n");
    let _ = writeln!(
        md,
        "Goal (issue 28): the worker's own CPU per run (the process's, its steps' children \
         apart) at most {CPU_GOAL}× the reference's. A worker's CPU per run is not a constant: a \
         worker that ends fewer runs per second wakes and parks its threads more often per run, \
         so compare rows of like runs/s before reading a difference as a cost.\n"
    );
    let _ = writeln!(
        md,
        "| workload | F | ours (ms) | reference (ms) | ours / reference | of which ours' main \
         thread (ms) | goal | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut missed = 0_usize;
    let mut rows = 0_usize;
    for &w in workloads {
        let cells: Vec<&Cell> = cells.iter().filter(|c| c.spec.workload == w).collect();
        for (o, re) in pairs(&cells) {
            let (ours_ms, ref_ms) = (o.ms_per_run(o.worker_cpu), re.ms_per_run(re.worker_cpu));
            let ratio = ours_ms / ref_ms.max(1e-9);
            let main = o
                .worker_threads
                .get(MAIN_THREAD)
                .copied()
                .unwrap_or_default();
            rows += 1;
            missed += usize::from(ratio > CPU_GOAL);
            let _ = writeln!(
                md,
                "| {} | {} | {ours_ms:.2} | {ref_ms:.2} | {ratio:.2} | {:.2} | ≤ {CPU_GOAL} | {} |",
                w.flag(),
                o.spec.f,
                o.ms_per_run(main),
                met(ratio <= CPU_GOAL)
            );
        }
    }
    let _ = writeln!(
        md,
        "\n{}\n",
        if rows == 0 {
            NOTHING_COMPARED.to_string()
        } else if missed == 0 {
            "The CPU goal is met in every row.".to_string()
        } else {
            format!("The CPU goal is missed in {missed} of {rows} rows.")
        }
    );
}

/// Runs/s one API core would serve per worker: 1 / (requests per run × API CPU per request),
/// from the median over the cells of each (workload, worker).
fn projection(md: &mut String, r: &Fleets) {
    let _ = writeln!(md, "### Projection: runs/s per API core\n");
    let _ = writeln!(
        md,
        "From each worker's requests per run and the API's CPU per request measured here \
         (medians over F), runs/s one core of an API host would serve if the API's CPU were \
         the bound (PostgreSQL on hosts of its own; docs/benchmark.md, \"Fleet scale\").\n"
    );
    let _ = writeln!(
        md,
        "| workload | worker | requests per run | API CPU per request (µs) | runs/s per API core |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    for &w in &r.args.workloads {
        for worker in [Worker::Reference, Worker::Ours] {
            let cells: Vec<&Cell> = r
                .cells
                .iter()
                .filter(|c| c.spec.workload == w && c.spec.worker == worker)
                .collect();
            if cells.is_empty() {
                continue;
            }
            let rpr = crate::stats::median(
                &cells
                    .iter()
                    .map(|c| c.requests_per_run())
                    .collect::<Vec<_>>(),
            );
            let per_request = crate::stats::median(
                &cells
                    .iter()
                    .map(|c| c.api_cpu.as_secs_f64() * 1e6 / c.total_requests().max(1) as f64)
                    .collect::<Vec<_>>(),
            );
            let per_core = 1e6 / (rpr * per_request).max(1e-9);
            let _ = writeln!(
                md,
                "| {} | {} | {rpr:.2} | {per_request:.0} | {per_core:.0} |",
                w.flag(),
                worker.name()
            );
        }
    }
}

/// Replace the section in the report at `path` (from its heading to the next `## ` heading
/// or the end), or append it; the rest of the file is kept as it is.
pub fn replace_section(path: &Path, section: &str) -> Result<(), BenchError> {
    Ok(markdown::replace_section(path, HEADING, section)?)
}

/// `new` (a report that does not measure the fleet, as the full run's) with the fleet section
/// of `old` (the file it replaces) kept at its end, so that it is not lost when the rest of the
/// file is measured again.
pub fn keep_section(old: &str, new: String) -> String {
    markdown::keep_section(old, new, HEADING)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(worker: Worker, runs: u64, window_ms: u64) -> Cell {
        Cell {
            spec: super::super::CellSpec {
                workload: FleetWorkload::Sleep,
                worker,
                f: 1,
                concurrency: 2,
                max_runs: 8,
                warmup: std::time::Duration::ZERO,
                window: std::time::Duration::from_millis(window_ms),
                min_runs: 1,
                rtt: std::time::Duration::ZERO,
                postgres: None,
                callgrind: None,
            },
            window: std::time::Duration::from_millis(window_ms),
            runs,
            claimed: runs,
            requests: Default::default(),
            api_cpu: Default::default(),
            pg_cpu: None,
            locks: None,
            worker_cpu: Default::default(),
            steps_cpu: Default::default(),
            worker_threads: Default::default(),
            voluntary: 0,
            involuntary: 0,
            bench_cpu: Default::default(),
            machine_busy: None,
            invocations: None,
            errors: 0,
            first_errors: Vec::new(),
            latencies: Vec::new(),
            measured_rtt: Default::default(),
            backlog: Default::default(),
            instructions: None,
        }
    }

    #[test]
    fn a_backlog_that_a_read_found_empty_is_marked_dry() {
        assert_eq!(backlog(&BacklogLevel::default()), "–");
        let mut b = BacklogLevel::default();
        for pending in [576, 500, 1] {
            b.read(pending);
        }
        assert_eq!(backlog(&b), "1 / 359");
        b.read(0);
        assert!(b.ran_dry());
        assert_eq!(backlog(&b), "**0 / 269: ran dry**");
    }

    #[test]
    fn the_worker_cpu_table_marks_each_f_against_the_goal_and_counts_the_misses() {
        let at = |worker, f, cpu_ms, main_ms| {
            let mut c = cell(worker, 100, 10_000);
            c.spec.f = f;
            c.worker_cpu = std::time::Duration::from_millis(cpu_ms);
            c.worker_threads.insert(
                MAIN_THREAD.to_string(),
                std::time::Duration::from_millis(main_ms),
            );
            c
        };
        // F = 1: 0.70 against 1.00 ms per run (met); F = 2: 0.90 against 1.00 (missed).
        let cells = vec![
            at(Worker::Ours, 1, 70, 30),
            at(Worker::Reference, 1, 100, 5),
            at(Worker::Ours, 2, 90, 40),
            at(Worker::Reference, 2, 100, 5),
        ];
        let mut md = String::new();
        cpu_ratios(&mut md, &[FleetWorkload::Sleep], &cells);
        assert!(
            md.contains("| sleep | 1 | 0.70 | 1.00 | 0.70 | 0.30 | ≤ 0.8 | yes |"),
            "{md}"
        );
        assert!(
            md.contains("| sleep | 2 | 0.90 | 1.00 | 0.90 | 0.40 | ≤ 0.8 | **no** |"),
            "{md}"
        );
        assert!(md.contains("missed in 1 of 2 rows"), "{md}");
    }

    #[test]
    fn a_fleet_measured_with_one_worker_only_judges_no_goal() {
        let mut ours = cell(Worker::Ours, 100, 10_000);
        ours.worker_cpu = std::time::Duration::from_millis(50);
        let mut md = String::new();
        cpu_ratios(&mut md, &[FleetWorkload::Sleep], &[ours]);
        assert!(md.contains(NOTHING_COMPARED), "{md}");
        assert!(!md.contains("is met"), "{md}");
    }

    #[test]
    fn a_missed_saturation_goal_says_where_each_run_s_cpu_went() {
        let ms = std::time::Duration::from_millis;
        let at = |worker, pg: Option<u64>, api, own| {
            let mut c = cell(worker, 100, 10_000);
            c.pg_cpu = pg.map(ms);
            c.api_cpu = ms(api);
            c.worker_cpu = ms(own);
            c.steps_cpu = ms(own);
            c
        };
        let ours = at(Worker::Ours, Some(590), 110, 45);
        let reference = at(Worker::Reference, Some(570), 140, 50);
        assert_eq!(
            per_run_split(&ours, &reference),
            "CPU per run at the peaks, ours / reference: PostgreSQL 5.90 / 5.70 ms, API 1.10 / \
             1.40 ms, workers and steps 0.90 / 1.00 ms"
        );
        let memory = at(Worker::Ours, None, 110, 45);
        assert!(
            per_run_split(&memory, &memory).starts_with(
                "CPU per run at the peaks, ours / reference: PostgreSQL – / – ms, API"
            )
        );
    }

    #[test]
    fn a_ratio_under_one_by_less_than_one_run_is_a_tie() {
        // 20 runs each, ours' window 40 ms longer: 0.999, not a miss.
        let (ours, reference) = (
            cell(Worker::Ours, 20, 30_040),
            cell(Worker::Reference, 20, 30_000),
        );
        assert!(ours.runs_per_s() < reference.runs_per_s());
        assert!(within_one_run(&ours, &reference));
        // Two runs fewer in the same window is a miss.
        assert!(!within_one_run(&cell(Worker::Ours, 18, 30_000), &reference));
    }

    #[test]
    fn the_section_is_replaced_in_place_or_appended_and_the_rest_is_kept() {
        let section = format!("{HEADING}\n\nnew\n");
        let old = format!("# B\n\n## A\n\na\n\n{HEADING}\n\nold\n\n## C\n\nc\n");
        assert_eq!(
            markdown::splice(&old, HEADING, &section),
            format!("# B\n\n## A\n\na\n\n{HEADING}\n\nnew\n\n## C\n\nc\n")
        );
        let last = format!("# B\n\n{HEADING}\n\nold\n");
        assert_eq!(
            markdown::splice(&last, HEADING, &section),
            format!("# B\n\n{HEADING}\n\nnew\n")
        );
        assert_eq!(
            markdown::splice("# B\n\n## A\n", HEADING, &section),
            format!("# B\n\n## A\n\n{HEADING}\n\nnew\n")
        );
    }

    #[test]
    fn a_report_without_the_section_gets_the_old_one_kept_at_its_end() {
        let old = format!("# B\n\n## A\n\na\n\n{HEADING}\n\nfleet\n\n## Agent runs\n\nx\n");
        assert_eq!(
            keep_section(&old, "# C\n\n## A\n\nb\n".to_string()),
            format!("# C\n\n## A\n\nb\n\n{HEADING}\n\nfleet\n")
        );
        let newer = format!("# C\n\n{HEADING}\n\nnew\n");
        assert_eq!(keep_section(&old, newer.clone()), newer);
        assert_eq!(keep_section("# B\n", "# C\n".to_string()), "# C\n");
    }

    #[test]
    fn the_command_in_the_header_leaves_out_the_postgres_url() {
        let args: Vec<String> = [
            "fleet",
            "--postgres-url",
            "postgres://u:pw@h/db",
            "--fleets",
            "1,2",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(command(&args), "fleet --fleets 1,2");
        let args: Vec<String> = ["fleet", "--postgres-url=postgres://u:pw@h/db"]
            .map(String::from)
            .to_vec();
        assert_eq!(command(&args), "fleet");
    }
}
