//! The Markdown report (`BENCHMARKS.md`): the machine, the command, the numbers, the targets.

pub mod drain;

use std::fmt::Write;

use crate::drain::DrainSettings;
use crate::dynamodb::DynamoDb;
use crate::machine::Machine;
use crate::markdown::yes;
use crate::stats::{max, median, min, percentile};
use crate::{Options, Results};
use drain::DrainSummary;

const MIB: f64 = 1024.0 * 1024.0;

/// The process's figures several sections share, computed once.
struct Summary {
    /// Median cold start, in ms.
    cold: f64,
    /// Binary size, in MiB.
    binary_mib: f64,
    /// Peak RSS after the batch of 8, in MiB.
    rss_mib: f64,
}

impl Summary {
    fn new(r: &Results) -> Self {
        Self {
            cold: median(&r.cold_start_ms),
            binary_mib: r.binary_bytes as f64 / MIB,
            rss_mib: r.batch.peak_rss_kib as f64 / 1024.0,
        }
    }
}

/// Render the whole report.
pub fn render(o: &Options, m: &Machine, r: &Results) -> String {
    let s = &o.drain;
    let sum = Summary::new(r);
    let drains = DrainSummary::new(s, &r.drains);
    let mut md = String::new();
    header_section(&mut md, o, m);
    machine_section(&mut md, o, m);
    // Targets first: the summary a reader wants.
    targets_section(&mut md, r, &sum, &drains);
    drain::sections(&mut md, s, &r.drains, &drains);
    idle_section(&mut md, r);
    deadline_section(&mut md, r);
    cold_start_section(&mut md, s, r, &sum);
    dynamodb_section(&mut md, s, r);
    crate::production::section(&mut md, o, &r.production);
    crate::managed::section(&mut md, o, &r.managed);
    crate::pickup::section(&mut md, &r.pickup);
    md
}

/// Writes the title and the introduction (date, command, mode).
fn header_section(md: &mut String, o: &Options, m: &Machine) {
    let command = if o.args.is_empty() {
        format!(
            "{} && cargo run --release -p ironflow-lambda-bench",
            crate::process::BUILD_FUNCTION
        )
    } else {
        format!(
            "{} && cargo run --release -p ironflow-lambda-bench -- {}",
            crate::process::BUILD_FUNCTION,
            o.args.join(" ")
        )
    };
    let _ = writeln!(
        md,
        "# Benchmarks: ironflow-lambda against the reference worker\n"
    );
    let _ = writeln!(
        md,
        "Measured on {} by `{command}`{}. Not part of the test command. Every number below \
         comes from that one run on this machine; timings are medians over rounds in a balanced \
         order, and the ratios compare the two workers in the same run.\n",
        m.date,
        if o.quick {
            " (quick mode: small counts, indicative only)"
        } else {
            ""
        }
    );
}

/// Writes the "Machine" section.
fn machine_section(md: &mut String, o: &Options, m: &Machine) {
    let s = &o.drain;
    let _ = writeln!(md, "## Machine\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| `nproc` | {} |", m.nproc);
    let _ = writeln!(md, "| CPU | {} |", m.cpu);
    let _ = writeln!(md, "| memory | {} |", m.memory);
    let _ = writeln!(md, "| kernel | {} |", m.kernel);
    let _ = writeln!(md, "| rustc | {} |", m.rustc);
    let _ = writeln!(md, "| commit measured | {} |", m.commit);
    let _ = writeln!(
        md,
        "| load average (1, 5, 15 min) at start / end | {} / {} |",
        m.load_start, m.load_end
    );
    let _ = writeln!(
        md,
        "| settings | K = {} runs per drain, C = {} (both workers), N = {} runs per invocation, \
         invocation deadline {} s, reference poll interval {} ms, {} rounds |\n",
        s.runs,
        s.concurrency,
        s.max_runs,
        s.invocation.as_secs(),
        s.poll_interval.as_millis(),
        o.rounds
    );
}

/// Writes the "Targets" section.
fn targets_section(md: &mut String, r: &Results, sum: &Summary, drains: &DrainSummary) {
    let idle_p99 = percentile(&r.idle.warm_ms, 99.0);
    let (cold, binary_mib, rss_mib) = (sum.cold, sum.binary_mib, sum.rss_mib);
    let _ = writeln!(md, "## Targets\n");
    let _ = writeln!(md, "| target (issue 7) | measured | met |\n|---|---|---|");
    drain::targets(md, drains);
    let _ = writeln!(
        md,
        "| idle invocation p99 ≤ 10 ms (loopback API, back to back) | {idle_p99:.2} ms | {} |",
        yes(idle_p99 <= 10.0)
    );
    let _ = writeln!(
        md,
        "| cold start ≤ 30 ms (median) | {cold:.1} ms | {} |",
        yes(cold <= 30.0)
    );
    let _ = writeln!(
        md,
        "| binary ≤ 20 MB stripped | {binary_mib:.1} MiB ({} bytes) | {} |",
        r.binary_bytes,
        yes(r.binary_bytes as f64 <= 20e6)
    );
    let _ = writeln!(
        md,
        "| peak RSS ≤ 40 MB with N = 8 | {rss_mib:.1} MiB | {} |",
        yes(r.batch.peak_rss_kib as f64 * 1024.0 <= 40e6)
    );
    dynamodb_targets(md, &r.dynamodb);
    let _ = writeln!(md);
}

/// Writes the "Targets" section's DynamoDB rows.
fn dynamodb_targets(md: &mut String, dynamodb: &DynamoDb) {
    match dynamodb {
        DynamoDb::NotMeasured(why) => {
            let _ = writeln!(
                md,
                "| DynamoDB: ≤ 1 read per distinct workflow per invocation, 0 writes on the \
                 success path | {why} | |"
            );
        }
        DynamoDb::Measured(phases) => {
            if let Some(p) = phases.first() {
                let reads = p.reads() as f64 / p.invocations as f64;
                let ok = reads <= p.workflows_per_invocation + 1e-9;
                let _ = writeln!(
                    md,
                    "| DynamoDB: ≤ 1 read per distinct workflow per invocation | {reads:.2} reads \
                     for {:.2} workflows per invocation | {} |",
                    p.workflows_per_invocation,
                    yes(ok)
                );
                let _ = writeln!(
                    md,
                    "| DynamoDB: 0 writes on the success path | {} writes for {} runs | {} |",
                    p.writes(),
                    p.runs,
                    yes(p.writes() == 0)
                );
            }
        }
    }
}

/// Writes the "Idle invocation" section.
fn idle_section(md: &mut String, r: &Results) {
    let i = &r.idle;
    let _ = writeln!(md, "## Idle invocation\n");
    let _ = writeln!(
        md,
        "{} invocations in a row through the handler with nothing pending (after 5 unmeasured \
         ones), against the embedded API on loopback. \"After an idle gap\" forces the \
         connection-pool probe that an invocation sends after more than 10 s without one \
         (`idle_probe_after(0)`): `2 × C + 2` concurrent `GET`s before the claim.\n",
        i.warm_ms.len()
    );
    let _ = writeln!(
        md,
        "| kind | median | p99 | max | HTTP requests |\n|---|---|---|---|---|"
    );
    for (kind, v, req) in [
        ("back to back", &i.warm_ms, i.warm_requests),
        ("after an idle gap", &i.after_gap_ms, i.after_gap_requests),
    ] {
        let _ = writeln!(
            md,
            "| {kind} | {:.2} ms | {:.2} ms | {:.2} ms | {req:.1} |",
            median(v),
            percentile(v, 99.0),
            max(v)
        );
    }
}

/// Writes the "Deadline precision" section.
fn deadline_section(md: &mut String, r: &Results) {
    let d = &r.deadline;
    let _ = writeln!(md, "\n## Deadline precision\n");
    let _ = writeln!(
        md,
        "{} invocations, each with a deadline {} ms away, a margin of {} ms (cutoff = deadline \
         − margin) and {} runs whose one step (`sleep 600`) outlasts it: every run is handed \
         back at the cutoff. Time left is measured when the handler returned; the handback \
         latency is from the cutoff to the API storing the run back as Pending (the store's \
         `updated_at` of that write), both on the wall clock.\n",
        d.invocations,
        d.settings.invocation.as_millis(),
        d.settings.margin.as_millis(),
        d.settings.runs
    );
    let _ = writeln!(
        md,
        "| measure | min | median | max |\n|---|---|---|---|\n\
         | time left before the deadline at return | {:.1} ms | {:.1} ms | {:.1} ms |\n\
         | cutoff → handback written ({} handbacks) | {:.1} ms | {:.1} ms | {:.1} ms |",
        min(&d.time_left_ms),
        median(&d.time_left_ms),
        max(&d.time_left_ms),
        d.handback_ms.len(),
        min(&d.handback_ms),
        median(&d.handback_ms),
        max(&d.handback_ms)
    );
}

/// Writes the "Cold start, size, memory" section.
fn cold_start_section(md: &mut String, s: &DrainSettings, r: &Results, sum: &Summary) {
    let (cold, binary_mib, rss_mib) = (sum.cold, sum.binary_mib, sum.rss_mib);
    let _ = writeln!(md, "\n## Cold start, size, memory\n");
    let _ = writeln!(
        md,
        "The deployable binary, `cargo build --release --bin \
         ironflow-lambda` (the release profile of `Cargo.toml`: stripped, `opt-level = \"s\"`, fat \
         LTO, one codegen unit: the profile `sam build` builds the arm64 function with), started \
         against a stand-in for AWS's Lambda Runtime API on loopback (a hand-written stub: the Runtime \
         API is AWS's protocol and no package ships it). Cold start is from just before the \
         process is spawned until its first `GET /2018-06-01/runtime/invocation/next` reaches \
         the stub: settings from the environment, logging, the HTTP clients, the engine and \
         the poison-pill table are built by then. Peak RSS is `VmHWM` from `/proc/<pid>/status`, \
         read after the process answered one invocation of 8 pending `quick-shell` runs (one \
         `echo` step each, the simplest workflow the deployable binary registers) at \
         concurrency {} and polled for the next.\n",
        s.concurrency
    );
    let _ = writeln!(
        md,
        "| measure | value |\n|---|---|\n\
         | cold start, median of {} | {:.1} ms |\n\
         | cold start, min / p90 / max | {:.1} / {:.1} / {:.1} ms |\n\
         | binary size (stripped) | {:.2} MiB ({} bytes) |\n\
         | peak RSS at first poll (cold, idle) | {:.1} MiB |\n\
         | peak RSS after a batch of 8 runs | {:.1} MiB |\n\
         | that batch's outcomes | {} |",
        r.cold_start_ms.len(),
        cold,
        min(&r.cold_start_ms),
        percentile(&r.cold_start_ms, 90.0),
        max(&r.cold_start_ms),
        binary_mib,
        r.binary_bytes,
        r.cold_start_rss_kib as f64 / 1024.0,
        rss_mib,
        r.batch.summary["outcomes"]
    );
}

/// Writes the "DynamoDB calls per run" section.
fn dynamodb_section(md: &mut String, s: &DrainSettings, r: &Results) {
    let _ = writeln!(md, "\n## DynamoDB calls per run\n");
    match &r.dynamodb {
        DynamoDb::NotMeasured(why) => {
            let _ = writeln!(md, "{why}.");
        }
        DynamoDb::Measured(phases) => {
            let _ = writeln!(
                md,
                "The poison-pill table in DynamoDB (`src/poison/dynamodb/`, fail mode) against \
                 moto's server, counted by the table's own per-operation counter (every HTTP \
                 request its client sends, retries included; the cold start's `DescribeTable` \
                 left out). Our invocations back to back, N = {}, C = {}; the failure path runs \
                 under a threshold of 1000, so that no run is blocked and each failure costs \
                 what it costs.\n",
                s.max_runs, s.concurrency
            );
            let _ = writeln!(
                md,
                "| phase | runs | invocations | distinct workflows per invocation | reads per \
                 invocation | writes per run | calls per run | calls by operation |\n\
                 |---|---|---|---|---|---|---|---|"
            );
            for p in phases {
                let total: u64 = p.calls.values().sum();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                    p.what,
                    p.runs,
                    p.invocations,
                    p.workflows_per_invocation,
                    p.reads() as f64 / p.invocations as f64,
                    p.writes() as f64 / p.runs as f64,
                    total as f64 / p.runs as f64,
                    if p.calls.is_empty() {
                        "none".to_string()
                    } else {
                        p.calls
                            .iter()
                            .map(|(op, n)| format!("{op} {n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
            }
        }
    }
}
