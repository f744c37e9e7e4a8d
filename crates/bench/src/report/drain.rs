//! The drain rows' part of the report: the drain-time and request targets, the "Drain
//! throughput" section (with where the time goes and the CPU per run) and the "HTTP requests per
//! run" section; printed medians for `drain`, and those parts written alone into
//! `BENCHMARKS.md` ([`write()`]) when the drain rows are measured on their own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;

use crate::drain::{DrainResult, DrainSettings, Which, paired_ratio, walls};
use crate::machine::Machine;
use crate::markdown::{self, yes};
use crate::stats::median;
use crate::usage::UsagePerRun;
use crate::workload::Workload;
use crate::{BenchError, Options};

/// The headings of the sections [`sections`] writes.
const HEADINGS: [&str; 2] = ["## Drain throughput", "## HTTP requests per run"];

/// Every drain of the loopback rows, by workload and row, in round order.
pub type Drains = BTreeMap<(Workload, Which), Vec<DrainResult>>;

fn from_first_claim(results: &[DrainResult]) -> Vec<f64> {
    results
        .iter()
        .map(|r| r.from_first_claim.as_secs_f64())
        .collect()
}

/// Requests per run, per route, over every round.
fn per_run(results: &[DrainResult], runs: usize) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for r in results {
        for (route, n) in &r.requests {
            *out.entry(route.clone()).or_insert(0.0) += *n as f64;
        }
    }
    let total_runs = (results.len() * runs) as f64;
    for v in out.values_mut() {
        *v /= total_runs;
    }
    out
}

/// The medians of one row's drains (one workload, one worker) over the rounds.
struct Row {
    /// Median wall time, in s.
    wall: f64,
    /// Median time from the first claim, in s.
    claimed: f64,
    /// Median invocations per drain.
    invocations: f64,
    /// API requests per run, per route.
    requests: BTreeMap<String, f64>,
    /// API requests per run, all routes.
    requests_total: f64,
}

/// One row of ours against the reference worker's row of the same workload.
struct Ratios {
    /// Ratio of the median wall times.
    wall: f64,
    /// Ratio of the median times from the first claim.
    claimed: f64,
    /// Median of the rounds' ratios of wall times (`paired_ratio`).
    paired: f64,
}

/// The drain rows' medians and ratios, computed once for every part that shows them.
pub struct DrainSummary {
    /// Every row, by workload and worker.
    rows: BTreeMap<(Workload, Which), Row>,
    /// Every row of ours (no reference), by workload and worker.
    ratios: BTreeMap<(Workload, Which), Ratios>,
}

impl DrainSummary {
    pub fn new(s: &DrainSettings, drains: &Drains) -> Self {
        let mut rows = BTreeMap::new();
        for w in Workload::ALL {
            for which in Which::ALL {
                let results = &drains[&(w, which)];
                let requests = per_run(results, s.runs);
                let row = Row {
                    wall: median(&walls(results)),
                    claimed: median(&from_first_claim(results)),
                    invocations: median(
                        &results
                            .iter()
                            .map(|d| d.invocations as f64)
                            .collect::<Vec<_>>(),
                    ),
                    requests_total: requests.values().sum::<f64>(),
                    requests,
                };
                rows.insert((w, which), row);
            }
        }
        let mut ratios = BTreeMap::new();
        for w in Workload::ALL {
            let reference = &rows[&(w, Which::Reference)];
            for which in Which::ALL.into_iter().filter(|&x| x != Which::Reference) {
                let ours = &rows[&(w, which)];
                let ratio = Ratios {
                    wall: ours.wall / reference.wall,
                    claimed: ours.claimed / reference.claimed,
                    paired: paired_ratio(&drains[&(w, which)], &drains[&(w, Which::Reference)]),
                };
                ratios.insert((w, which), ratio);
            }
        }
        Self { rows, ratios }
    }
}

/// `drain`: per workload and row, the median wall time, its ratio to the reference's
/// (when the reference row ran) and the median CPU time and context switches per run.
pub fn print_medians(drains: &Drains, runs: usize) {
    let median_wall = |rs: &[DrainResult]| median(&walls(rs));
    for ((w, which), rs) in drains {
        let wall = median_wall(rs);
        let ratio = drains
            .get(&(*w, Which::Reference))
            .map(|reference| {
                format!(
                    " ({:.3} of the reference; per round {:.3})",
                    wall / median_wall(reference),
                    paired_ratio(rs, reference)
                )
            })
            .unwrap_or_default();
        let u = UsagePerRun::median(rs.iter().map(|r| &r.usage), runs);
        println!(
            "{:<14} {:<15} {wall:.3} s{ratio}  per run: CPU {:.3} ms + children {:.3} ms, \
             {:.1} voluntary + {:.1} involuntary switches",
            w.name(),
            which.flag(),
            u.cpu_ms,
            u.children_cpu_ms,
            u.voluntary_switches,
            u.involuntary_switches,
        );
    }
}

/// Replace the drain rows' parts of the report at `out` with those of `drains` (every
/// workload and row): their target rows, "Drain throughput" (opened by a line saying when and
/// by what command they were measured on their own) and "HTTP requests per run". The rest of
/// the file is kept as it is; a file without those parts is an error (the full run writes them).
pub fn write(out: &Path, o: &Options, m: &Machine, drains: &Drains) -> Result<(), BenchError> {
    let s = &o.drain;
    let sum = DrainSummary::new(s, drains);
    let old = std::fs::read_to_string(out)?;
    let mut rows = String::new();
    targets(&mut rows, &sum);
    let rows: Vec<String> = rows.lines().map(str::to_string).collect();
    let mut new = markdown::replace_rows(&old, &rows)
        .map_err(|e| BenchError::msg(format!("{}: {e}", out.display())))?;
    let mut md = String::new();
    sections(&mut md, s, drains, &sum);
    let note = format!(
        "Measured on their own, not by the run the rest of this file comes from: on {} at \
         commit {} by `{}` ({} rounds; \
         `nproc` {}, load {} at the start, {} at the end); their target rows above come \
         from the same run.\n\n",
        m.date,
        m.commit,
        markdown::command(&o.args),
        o.rounds,
        m.nproc,
        m.load_start,
        m.load_end,
    );
    for heading in HEADINGS {
        let start = md
            .find(heading)
            .ok_or_else(|| BenchError::msg(format!("the drain rows wrote no {heading:?}")))?;
        let end = md[start + heading.len()..]
            .find("\n## ")
            .map_or(md.len(), |e| start + heading.len() + e + 1);
        let mut section = md[start..end].to_string();
        if heading == HEADINGS[0] {
            section.insert_str(heading.len() + 2, &note);
        }
        if markdown::extract(&new, heading).is_none() {
            return Err(BenchError::msg(format!(
                "{}: no {heading:?} section to replace (the full run writes it)",
                out.display()
            )));
        }
        new = markdown::splice(&new, heading, &section);
    }
    std::fs::write(out, new)?;
    Ok(())
}

/// Writes the "Targets" section's rows of the drain rows: drain time, then requests per run,
/// one per workload each.
pub fn targets(md: &mut String, sum: &DrainSummary) {
    drain_targets(md, sum);
    for w in Workload::ALL {
        let (ours, reference) = (
            sum.rows[&(w, Which::Ours)].requests_total,
            sum.rows[&(w, Which::Reference)].requests_total,
        );
        let _ = writeln!(
            md,
            "| API requests per run, {}: ours ≤ reference | {ours:.2} vs {reference:.2} | {} |",
            w.describe(),
            yes(ours <= reference + 1e-9)
        );
    }
}

/// Writes the drain rows' sections: "Drain throughput" (with where the time goes and the CPU
/// per run) and "HTTP requests per run".
pub fn sections(md: &mut String, s: &DrainSettings, drains: &Drains, sum: &DrainSummary) {
    drain_section(md, s, drains, sum);
    boundary_section(md, s, sum);
    cpu_section(md, s, drains);
    requests_section(md, s, sum);
}

/// Writes the "Targets" section's drain-time rows, one per workload.
fn drain_targets(md: &mut String, sum: &DrainSummary) {
    // Met only if every measure holds. The ratio of medians and the median of per-round
    // ratios can differ by several percent on a machine whose speed drifts (see
    // `paired_ratio`). The wall time counts what each worker does before its
    // first claim, and the reference's `Worker::run` builds its log pusher's HTTP client there
    // (native TLS, loading the system's CA certificates): most of the difference between the
    // reference's two columns. Our invocations do not pay it: their clients are built with the
    // worker, as at a cold start, before the clock starts (the cold start is measured below).
    // From the first claim on, the two drain the same backlog.
    for w in Workload::ALL {
        let ratios = &sum.ratios[&(w, Which::Ours)];
        let (x, claimed) = (ratios.wall, ratios.claimed);
        let paired = ratios.paired;
        let aim = if w == Workload::NoOp {
            " (aim ≤ 0.8)"
        } else {
            ""
        };
        let met = x <= 1.0 && claimed <= 1.0 && paired <= 1.0;
        let _ = writeln!(
            md,
            "| drain time ours / reference, {} ≤ 1.0{aim}: wall time; from the first claim; \
             per round (median of the rounds' ratios) | {x:.3}; {claimed:.3}; {paired:.3} | \
             {}{} |",
            w.describe(),
            yes(met),
            if w == Workload::NoOp && met {
                if x.max(claimed).max(paired) <= 0.8 {
                    ", ≤ 0.8 too"
                } else {
                    ", not ≤ 0.8"
                }
            } else {
                ""
            }
        );
    }
}

/// Writes the "Drain throughput" section: its introduction and its table.
fn drain_section(md: &mut String, s: &DrainSettings, drains: &Drains, sum: &DrainSummary) {
    let _ = writeln!(md, "## Drain throughput\n");
    let _ = writeln!(
        md,
        "K = {} pending runs drained from a fresh embedded API (the real ironflow router over \
         an in-memory store, on 127.0.0.1), at concurrency C = {} for both workers. Wall time \
         runs from the worker's start (the reference's `Worker::run`, our first invocation) \
         until a watcher polling the API's store every 1 ms sees all K runs terminal; \
         \"from first claim\" starts instead when the watcher first sees a run claimed, \
         leaving out what a worker does before its first claim (the reference's `Worker::run` \
         builds its log pusher's HTTP client, with native TLS, before its first claim: most of \
         the difference between its two columns; ours are built with the worker, as at \
         a cold start). \"Per round\" is the median of each round's ratio of the two \
         drains' wall times, which pairs drains run seconds apart, one after the other: on a machine whose \
         speed drifts during the run it can differ from the ratio of medians by several \
         percent. A drain target is met only if all three ratios are. Ours: \
         invocations back to back through `ironflow_lambda::handle_summary` (the Lambda code path), \
         awaited one after the other from a task on the worker threads, as the deployed \
         function's Lambda runtime loop runs them (`handler::in_worker_task`), \
         each claiming at most N = {} runs with a deadline {} s away. The rounds follow a Williams \
         design: over every 10 rounds each of the 5 rows drains twice in each position and \
         twice right after each other row.\n",
        s.runs,
        s.concurrency,
        s.max_runs,
        s.invocation.as_secs()
    );
    let _ = writeln!(
        md,
        "| workflow | worker | wall time (median) | runs/s | ours / reference | from first \
         claim (median) | ours / reference | per round: ours / reference (median) | \
         invocations | wall time per round (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    for w in Workload::ALL {
        for which in Which::ALL {
            let results = &drains[&(w, which)];
            let row = &sum.rows[&(w, which)];
            let (wall, invocations, claimed) = (row.wall, row.invocations, row.claimed);
            let _ = writeln!(
                md,
                "| {} | {} | {wall:.3} s | {:.1} | {} | {claimed:.3} s | {} | {} | {} | {} |",
                w.describe(),
                which.name(s),
                s.runs as f64 / wall,
                match which {
                    Which::Reference => "1".to_string(),
                    Which::Ours => format!("**{:.2}**", sum.ratios[&(w, which)].wall),
                    Which::OursNoClaimAhead | Which::OursOneInvocation | Which::OursLargerBatch =>
                        format!("{:.2}", sum.ratios[&(w, which)].wall),
                },
                match which {
                    Which::Reference => "1".to_string(),
                    _ => format!("{:.2}", sum.ratios[&(w, which)].claimed),
                },
                match which {
                    Which::Reference => "1".to_string(),
                    _ => format!("{:.2}", sum.ratios[&(w, which)].paired),
                },
                match which {
                    Which::Reference => "–".to_string(),
                    _ => format!("{invocations:.0}"),
                },
                walls(results)
                    .iter()
                    .map(|x| format!("{x:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

/// Writes the drain section's "Where the time goes" paragraphs: what the invocation boundaries cost.
fn boundary_section(md: &mut String, s: &DrainSettings, sum: &DrainSummary) {
    let _ = writeln!(
        md,
        "\n**Where the time goes.** The one-invocation row runs our per-run path (claim, \
         execution under the lease refresher, poison-pill gate, log forwarding) with no \
         invocation boundary: against the reference it compares the per-run cost alone. \
         The difference between the two rows of ours is what the boundaries cost: an \
         invocation returns only once its last run has ended, so at its end one slot idles \
         while the other finishes (the batch's tail, half a run on average), and then come \
         the last log flush and the orphan check; at its start, the slots wait for the first \
         claims. The claim-ahead row shows what claiming one run ahead of a free slot buys: \
         without it, every run start waits for a claim round trip, as the reference worker's \
         do. The N = {} row has fewer boundaries (counted below): what a larger \
         `IRONFLOW_MAX_RUNS_PER_INVOCATION` buys. On Lambda a boundary costs more than here: \
         the runtime's response and next-event calls, and a wake-up's trip through SQS when \
         the next invocation is not already queued. On this in-memory store a claim holds the \
         store's one write lock while it scans every run (ironflow-store's \
         `memory/run_store.rs`), so a claim sent while runs execute delays their own requests, \
         which may be why claiming ahead gains little here; on PostgreSQL, whose claims lock \
         the rows they take (`FOR UPDATE OF r, sm SKIP LOCKED`), and over a link, see the \
         production-path section below.",
        Which::OursLargerBatch.max_runs(s)
    );
    for w in Workload::ALL {
        let row = |which: Which| &sum.rows[&(w, which)];
        let invocations = row(Which::Ours).invocations;
        let boundaries = (invocations - 1.0).max(1.0);
        let with = row(Which::Ours).wall;
        let one = row(Which::OursOneInvocation).wall;
        let reference = row(Which::Reference).wall;
        let cost_ms = (with - one) * 1000.0 / boundaries;
        let c = s.concurrency as f64;
        let run_ms = reference * 1000.0 * c / s.runs as f64;
        let without = row(Which::OursNoClaimAhead).wall;
        let larger = row(Which::OursLargerBatch).wall;
        let larger_boundaries = (row(Which::OursLargerBatch).invocations - 1.0).max(0.0);
        // The batch's tail alone: when an invocation's last run starts, each of the other
        // C − 1 slots ends its own run after a uniformly spread part of a run, then idles until
        // the last one ends: half a run on average, so (C − 1) / (2C) of a run in wall time.
        let tail_ms = one * 1000.0 * c / s.runs as f64 * (c - 1.0) / (2.0 * c);
        let expected = one + boundaries * tail_ms / 1000.0;
        let expected_ratio = expected / reference;
        let _ = writeln!(
            md,
            "- {}: {cost_ms:.2} ms per invocation boundary ({boundaries:.0} boundaries), against \
             {run_ms:.2} ms per run per slot for the reference worker (its wall time × C / K). \
             The batch's tail alone (when the last run starts, each other slot idles once its \
             own run ends, half a run on average: (C − 1) / (2C) of one of our runs, from the \
             one-invocation row) is {tail_ms:.2} ms of it; the one-invocation drain plus that \
             tail at every boundary would take {expected:.3} s, {expected_ratio:.2} of the \
             reference, against {with:.3} s measured. Claim-ahead off: \
             {without:.3} s, on: {with:.3} s (it claims ahead only while a claim takes at least \
             {}% of a run). N = {}: {larger:.3} s ({larger_boundaries:.0} boundaries), {:.2} of \
             the reference.",
            w.describe(),
            ironflow_lambda::settings::DEFAULT_CLAIM_AHEAD_PERCENT,
            Which::OursLargerBatch.max_runs(s),
            sum.ratios[&(w, Which::OursLargerBatch)].wall
        );
    }
}

/// Writes the drain section's "CPU per run" paragraph and table.
fn cpu_section(md: &mut String, s: &DrainSettings, drains: &Drains) {
    let _ = writeln!(
        md,
        "\n**CPU per run.** `getrusage(2)` of the bench's process, from the worker's start \
         until it stopped (as the HTTP requests are counted), divided by K: the process holds \
         the worker, the embedded API and the watcher polling the store every 1 ms alike, so \
         this is the worker's cost plus the API's for the requests it sends, plus the watcher's \
         (which grows with the wall time); \"children\" is the shell steps' processes. Where the machine is \
         busy (the shell drains keep both cores near saturation), a thread's CPU time grows \
         with its wait for a core, so compare rows of one workload, and the process's CPU with \
         its children's (their work is the same for every row).\n\n\
         | workflow | worker | process CPU per run (median) | children's CPU per run | \
         process / children | voluntary context switches per run | involuntary |\n\
         |---|---|---|---|---|---|---|"
    );
    for w in Workload::ALL {
        for which in Which::ALL {
            let results = &drains[&(w, which)];
            let u = UsagePerRun::median(results.iter().map(|r| &r.usage), s.runs);
            let (cpu, children) = (u.cpu_ms, u.children_cpu_ms);
            let _ = writeln!(
                md,
                "| {} | {} | {cpu:.3} ms | {} | {} | {:.1} | {:.1} |",
                w.describe(),
                which.name(s),
                if children > 0.0 {
                    format!("{children:.3} ms")
                } else {
                    "–".to_string()
                },
                if children > 0.0 {
                    format!("{:.2}", cpu / children)
                } else {
                    "–".to_string()
                },
                u.voluntary_switches,
                u.involuntary_switches,
            );
        }
    }
}

/// Writes the "HTTP requests per run" section.
fn requests_section(md: &mut String, s: &DrainSettings, sum: &DrainSummary) {
    let _ = writeln!(md, "\n## HTTP requests per run\n");
    let _ = writeln!(
        md,
        "Counted at the API (a middleware on the router, per matched route) from the worker's \
         start until it stopped, over every round, divided by the runs drained. The reference \
         worker is stopped {} ms after the last run is terminal so that its log pusher \
         delivers the last lines; the empty claims it makes meanwhile (one per \
         {} ms poll interval) are included.\n",
        400,
        s.poll_interval.as_millis()
    );
    for w in Workload::ALL {
        let (reference, ours) = (
            &sum.rows[&(w, Which::Reference)],
            &sum.rows[&(w, Which::Ours)],
        );
        let (reference_total, ours_total) = (reference.requests_total, ours.requests_total);
        let (reference, ours) = (&reference.requests, &ours.requests);
        let routes: BTreeSet<&String> = reference.keys().chain(ours.keys()).collect();
        let _ = writeln!(
            md,
            "**{}**\n\n| route | reference | ours |\n|---|---|---|",
            w.describe()
        );
        for route in routes {
            let _ = writeln!(
                md,
                "| `{route}` | {:.3} | {:.3} |",
                reference.get(route).copied().unwrap_or(0.0),
                ours.get(route).copied().unwrap_or(0.0)
            );
        }
        let _ = writeln!(
            md,
            "| **total** | **{:.3}** | **{:.3}** |\n",
            reference_total, ours_total
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::usage::Usage;

    fn drains() -> Drains {
        let mut drains = Drains::new();
        for w in Workload::ALL {
            for which in Which::ALL {
                let ms = if which == Which::Reference { 1000 } else { 700 };
                let result = DrainResult {
                    wall: Duration::from_millis(ms),
                    from_first_claim: Duration::from_millis(ms - 10),
                    requests: BTreeMap::from([("POST /claim".to_string(), 3 * 500)]),
                    invocations: 63,
                    billed: Duration::ZERO,
                    run_latency: None,
                    measured_rtt: Duration::ZERO,
                    usage: Usage::default(),
                };
                drains.insert((w, which), vec![result.clone(), result]);
            }
        }
        drains
    }

    #[test]
    fn the_drain_rows_replace_their_parts_of_the_report_and_nothing_else() {
        let args = <crate::cli::Args as clap::Parser>::parse_from(["bench", "drain"]);
        let o = args.options(vec!["drain".into()]).unwrap();
        let old = include_str!("../../../../BENCHMARKS.md");
        let out = std::env::temp_dir().join(format!("bench-{}.md", uuid::Uuid::new_v4()));
        std::fs::write(&out, old).unwrap();
        let written = write(&out, &o, &Machine::read().finish(), &drains());
        let new = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        written.unwrap();
        let throughput = markdown::extract(&new, HEADINGS[0]).unwrap();
        assert!(throughput.contains("Measured on their own"), "{throughput}");
        assert!(throughput.contains("`cargo run --release -p ironflow-lambda-bench -- drain`"));
        assert!(
            new.contains("| 0.700; 0.697; 0.700 | yes, ≤ 0.8 too |"),
            "the targets"
        );
        assert!(new.contains("| API requests per run, no-op (a handler with no step): ours ≤ reference | 3.00 vs 3.00 | yes |"));
        // Every other section as it was, in its place.
        let headings = |md: &str| {
            md.lines()
                .filter(|l| l.starts_with("## "))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(headings(&new), headings(old));
        for heading in headings(old)
            .iter()
            .filter(|h| !HEADINGS.contains(&h.as_str()) && *h != "## Targets")
        {
            assert_eq!(
                markdown::extract(&new, heading),
                markdown::extract(old, heading),
                "{heading}"
            );
        }
        let rest = |md: &str| {
            md.lines()
                .filter(|l| {
                    !l.starts_with("| drain time") && !l.starts_with("| API requests per run")
                })
                .take_while(|l| !l.starts_with(HEADINGS[0]))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            rest(&new),
            rest(old),
            "the file's head and the other targets"
        );
    }
}
