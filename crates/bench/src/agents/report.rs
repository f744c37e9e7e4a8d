//! The agent section of `BENCHMARKS.md` ("Agent runs and dollars"), written into its own
//! part of the file ([`replace_section`]), and printed.

use std::fmt::Write;
use std::path::Path;

use super::cost::{self, Measured, Param, Prices};
use super::{AgentSettings, Agents, CutRow};
use crate::drain::{DrainResult, Which};
use crate::machine::Machine;
use crate::markdown::{self, yes};
use crate::stats::median;
use crate::workload::Workload;
use crate::{BenchError, Options};

/// The section's heading: what [`replace_section`] looks for.
pub const HEADING: &str = "## Agent runs and dollars";

/// Replace the section in the report at `path` (from its heading to the next `## ` heading
/// or the end), or append it; the rest of the file is kept as it is.
pub fn replace_section(path: &Path, section: &str) -> Result<(), BenchError> {
    Ok(markdown::replace_section(path, HEADING, section)?)
}

/// `new` (the full run's report, which does not measure the agent rows) with the agent
/// section of `old` (the file it replaces) kept at its end: written by `agents`, it is
/// not lost when the rest of the file is measured again.
pub fn keep_section(old: &str, new: String) -> String {
    markdown::keep_section(old, new, HEADING)
}

/// The section, from what was measured.
pub fn section(o: &Options, m: &Machine, r: &Agents) -> String {
    let a = &o.agents;
    let mut md = String::new();
    let _ = writeln!(md, "{HEADING}\n");
    let _ = writeln!(
        md,
        "Measured on {} at commit {} by `{}` ({:.1} min; `nproc` {}, load {} at the start, {} \
         at the end), which writes this section only. Agent runs are three model calls (steps \
         `plan`, `act`, `answer`) against the scripted model server (`crates/model-server`, \
         Bedrock Converse through the worker's `BedrockProvider`). **Time scale {}**: each \
         call's latency is drawn uniformly from {:.0}–{:.0} s (seeded: {}) and, like the \
         invocation's length ({:.0} s on demand, {:.0} s on managed instances) and the \
         worker's deadline margin and minimum claim budget, multiplied by {}; times below are \
         given back in real seconds (measured ÷ {}) where marked \"real\". The API's own \
         latency is not scaled, so the scaled runs carry {:.0}× its relative weight. Each \
         answer reports {} input and {} output tokens.\n",
        m.date,
        m.commit,
        markdown::command(&o.args),
        r.elapsed.as_secs_f64() / 60.0,
        m.nproc,
        m.load_start,
        m.load_end,
        a.time_scale,
        a.latency.0.as_secs_f64(),
        a.latency.1.as_secs_f64(),
        a.seed,
        a.invocation.as_secs_f64(),
        a.managed_invocation.as_secs_f64(),
        a.time_scale,
        a.time_scale,
        1.0 / a.time_scale,
        a.tokens.0,
        a.tokens.1,
    );
    drains(&mut md, a, r);
    cutoff(&mut md, a, r);
    managed(&mut md, a, r);
    dollars(&mut md, a, r);
    md
}

/// Real seconds from a scaled duration.
fn real(a: &AgentSettings, d: std::time::Duration) -> f64 {
    a.unscaled_secs(d)
}

fn drains(md: &mut String, a: &AgentSettings, r: &Agents) {
    let _ = writeln!(
        md,
        "\n### Drain of agent runs: PostgreSQL, {} ms round trip\n",
        a.rtt_us as f64 / 1000.0
    );
    if let Some(why) = &r.drains.skipped {
        let _ = writeln!(md, "{why}\n");
        return;
    }
    let _ = writeln!(
        md,
        "K = {} agent runs drained by each worker at C = {} (ours: N = C per invocation, \
         invocations back to back, cutoff-aware starts on as by default), rounds: {}, each worker first in turn, from the embedded API on \
         PostgreSQL behind the production rows' delay proxy.\n",
        a.drain_runs, a.drain_concurrency, a.drain_rounds
    );
    let _ = writeln!(
        md,
        "| worker | drain (s, scaled; median) | real runs/s | ours / reference | requests per \
         run | model calls per run | calls cut | invocations |\n|---|---|---|---|---|---|---|---|"
    );
    let wall = |which: Which| {
        let walls: Vec<f64> = r
            .drains
            .rows
            .iter()
            .filter(|(w, ..)| *w == which)
            .map(|(_, d, _)| d.wall.as_secs_f64())
            .collect();
        median(&walls)
    };
    for which in [Which::Reference, Which::Ours] {
        let rows: Vec<_> = r.drains.rows.iter().filter(|(w, ..)| *w == which).collect();
        if rows.is_empty() {
            continue;
        }
        let n = (rows.len() * a.drain_runs).max(1) as f64;
        let requests: f64 = rows.iter().map(|(_, d, _)| d.total_requests() as f64).sum();
        let calls: u64 = rows.iter().map(|(.., c)| c.total).sum();
        let cut: u64 = rows.iter().map(|(.., c)| c.abandoned).sum();
        let invocations: usize = rows.iter().map(|(_, d, _)| d.invocations).sum();
        let w = wall(which);
        let _ = writeln!(
            md,
            "| {} | {w:.3} | {:.2} | {:.3} | {:.2} | {:.2} | {cut} of {calls} | {} |",
            which.name(&crate::drain::DrainSettings {
                runs: a.drain_runs,
                concurrency: a.drain_concurrency,
                max_runs: a.drain_concurrency,
                invocation: a.invocation,
                poll_interval: std::time::Duration::ZERO,
                postgres: None,
                model_endpoint: None,
                time_scale: a.time_scale,
                cutoff_aware: None,
            }),
            a.drain_runs as f64 / (w / a.time_scale).max(1e-9),
            w / wall(Which::Reference),
            requests / n,
            calls as f64 / n,
            if which == Which::Reference {
                "–".to_string()
            } else {
                invocations.to_string()
            },
        );
    }
}

fn cutoff(md: &mut String, a: &AgentSettings, r: &Agents) {
    let _ = writeln!(
        md,
        "\n### Model calls cut at the cutoff, per 1 000 runs\n\n\
         K = {} runs through {} on-demand instances side by side (each its own worker, one \
         invocation at a time, back to back), each invocation claiming C = N = {} runs with a \
         {:.0} s deadline (real; a {:.0} s cutoff margin), on the in-memory store on loopback. \
         Cut calls and their tokens are counted at the model server: requests whose client \
         closed the connection before the answer (the tokens each answer would have \
         reported). A handback more than {:.0} % of the invocation before its cutoff is a \
         deferred start; \"budget left\" is the time from each handback (the run's \
         `updated_at` in the store, read as the invocation returns) to its invocation's \
         cutoff. Billed is the invocations' summed duration \
         per run (real), of the invocations that claimed a run (the row's instances poll \
         while others hold every run; a deployed fleet is woken instead); executed, the run's own execution time summed over its \
         invocations (what one invocation per run would bill, less its overhead).\n",
        a.cut_runs,
        a.cut_parallel,
        a.cut_concurrency,
        a.invocation.as_secs_f64(),
        ironflow_lambda::settings::DEFAULT_DEADLINE_MARGIN.as_secs_f64(),
        100.0 * super::cutoff::EARLY,
    );
    let _ = writeln!(
        md,
        "| cutoff-aware starts | completed | model calls | cut (share) | tokens wasted (in + \
         out) | handbacks and releases | of them deferred starts | budget left at handbacks (real s) | \
         billed per run (real s) | executed per run (real s) | drain (real s) \
         |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for row in &r.cut {
        cut_line(md, a, row);
    }
    if let Some(on) = r.cut.iter().find(|c| c.aware) {
        let _ = writeln!(
            md,
            "\n| target (issue 26) | measured | met |\n|---|---|---|\n| calls cut at the \
             cutoff ≤ 1 % with cutoff-aware starts | {:.2} % | {} |",
            100.0 * on.cut_share(),
            yes(on.cut_share() <= 0.01)
        );
    }
}

fn cut_line(md: &mut String, a: &AgentSettings, row: &CutRow) {
    let per = 1000.0 / row.runs.max(1) as f64;
    let _ = writeln!(
        md,
        "| {} | {} of {} | {:.0} | {:.0} ({:.2} %) | {:.0} + {:.0} | {:.0} | {:.0} | {:.0} | \
         {:.1} | {:.1} | {:.0} |",
        if row.aware { "on" } else { "off" },
        row.completed,
        row.runs,
        row.calls.total as f64 * per,
        row.calls.abandoned as f64 * per,
        100.0 * row.cut_share(),
        row.calls.abandoned_tokens.input as f64 * per,
        row.calls.abandoned_tokens.output as f64 * per,
        row.handbacks as f64 * per,
        row.early_handbacks as f64 * per,
        real(a, row.unused_before_cutoff) * per,
        real(a, row.billed) / row.runs.max(1) as f64,
        real(a, row.executed) / row.runs.max(1) as f64,
        real(a, row.wall),
    );
}

fn managed(md: &mut String, a: &AgentSettings, r: &Agents) {
    let _ = writeln!(
        md,
        "\n### Lambda Managed Instances: runs per process\n\n\
         One function process (this bench binary as a function, as in the managed-instances \
         section) serving M invocations at once (`AWS_LAMBDA_MAX_CONCURRENCY`), each \
         claiming C = N runs; agent runs with a {:.0} s invocation (real), K = {}; no-op and \
         shell runs unscaled. Peak RSS is the process's `VmHWM` at the end.\n",
        a.managed_invocation.as_secs_f64(),
        a.managed_runs
    );
    let _ = writeln!(
        md,
        "| workload | M | C = N | runs at once (M × C) | runs/s (real) | peak RSS (MiB) | \
         RSS per run at once (KiB) | calls cut | requests per run |\n|---|---|---|---|---|---|---|---|---|"
    );
    for row in &r.managed {
        let scale = if row.workload == Workload::Agent {
            a.time_scale
        } else {
            1.0
        };
        let at_once = row.m * row.concurrency;
        let rss = row.drain.peak_rss_kib();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {at_once} | {:.2} | {:.1} | {:.0} | {} | {:.2} |",
            row.workload.describe(),
            row.m,
            row.concurrency,
            row.drain.runs_per_s() * scale,
            rss as f64 / 1024.0,
            rss as f64 / at_once.max(1) as f64,
            row.calls.abandoned,
            row.drain.requests_per_run(),
        );
    }
}

/// The measured figures the dollars of `workload` use, in real time.
pub fn measured(a: &AgentSettings, r: &Agents, workload: Workload) -> Option<Measured> {
    let (ours, reference, scale): (Vec<&DrainResult>, Vec<&DrainResult>, f64) =
        if workload == Workload::Agent {
            let pick = |which| {
                r.drains
                    .rows
                    .iter()
                    .filter(move |(w, ..)| *w == which)
                    .map(|(_, d, _)| d)
                    .collect()
            };
            (pick(Which::Ours), pick(Which::Reference), a.time_scale)
        } else {
            let pick = |which| {
                r.billed
                    .iter()
                    .filter(move |(w, x, _)| *w == workload && *x == which)
                    .map(|(.., d)| d)
                    .collect()
            };
            (pick(Which::Ours), pick(Which::Reference), 1.0)
        };
    let runs = |d: &[&DrainResult]| {
        d.len() as f64
            * if workload == Workload::Agent {
                a.drain_runs as f64
            } else {
                a.billed_runs as f64
            }
    };
    let billed: f64 = ours.iter().map(|d| d.billed.as_secs_f64()).sum();
    let ref_wall: f64 = reference.iter().map(|d| d.wall.as_secs_f64()).sum();
    let managed = r
        .managed
        .iter()
        .find(|m| m.workload == workload)?
        .drain
        .runs_per_s();
    if ours.is_empty() || reference.is_empty() {
        return None;
    }
    Some(Measured {
        billed_ms_per_run: billed * 1000.0 / scale / runs(&ours),
        short_invocation_ms: r.idle_invocation_ms.ceil().max(1.0),
        managed_runs_per_s: managed * scale,
        reference_runs_per_s: runs(&reference) / ref_wall.max(1e-9) * scale,
    })
}

fn dollars(md: &mut String, a: &AgentSettings, r: &Agents) {
    let p = &a.prices;
    let _ = writeln!(
        md,
        "\n### Dollars per run (docs/cost.md)\n\n\
         Lambda time and requests only; the model's tokens are apart (the cutoff rows give \
         the tokens wasted). Every input is a parameter below or a figure measured above; \
         the arithmetic is `crates/bench/src/agents/cost.rs` (unit-tested).\n\n\
         | parameter | value | unit | source |\n|---|---|---|---|"
    );
    for (name, param) in params(p) {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} |",
            number(param.value),
            param.unit,
            param.source
        );
    }
    let _ = writeln!(
        md,
        "\nMeasured (real time): billed ms per run of ours at a backlog (the invocations' \
         summed durations, each rounded up to 1 ms, ÷ K: runs share an invocation), the \
         idle invocation's median (the billed time given to each receiver request and each \
         wake-up that runs nothing), runs per second of one managed process (at the first \
         M), and of the reference worker at its C.\n\n\
         | workload | billed ms per run | short invocation (ms) | managed runs/s per process \
         | reference runs/s |\n|---|---|---|---|---|"
    );
    let workloads = [Workload::NoOp, Workload::ThreeStepShell, Workload::Agent];
    let figures: Vec<(Workload, Option<Measured>)> =
        workloads.iter().map(|&w| (w, measured(a, r, w))).collect();
    for (w, m) in &figures {
        match m {
            Some(m) => {
                let _ = writeln!(
                    md,
                    "| {} | {:.2} | {:.0} | {:.2} | {:.2} |",
                    w.describe(),
                    m.billed_ms_per_run,
                    m.short_invocation_ms,
                    m.managed_runs_per_s,
                    m.reference_runs_per_s
                );
            }
            None => {
                let _ = writeln!(md, "| {} | not measured | | | |", w.describe());
            }
        }
    }
    dollar_table(md, p, &figures);
}

fn dollar_table(md: &mut String, p: &Prices, figures: &[(Workload, Option<Measured>)]) {
    let _ = writeln!(
        md,
        "\n| workload | on-demand, a created run ($ per 1 M runs) | on-demand, a run that \
         sleeps once | managed instances at capacity | always-on reference at capacity | \
         always-on cheaper than on-demand from | managed cheaper than on-demand from | \
         managed cheaper than always-on from |\n|---|---|---|---|---|---|---|---|"
    );
    let (od, mi, ao) = (
        (|h: (f64, f64, f64)| h.0) as fn((f64, f64, f64)) -> f64,
        (|h: (f64, f64, f64)| h.1) as fn((f64, f64, f64)) -> f64,
        (|h: (f64, f64, f64)| h.2) as fn((f64, f64, f64)) -> f64,
    );
    for (w, m) in figures {
        let Some(m) = m else { continue };
        let rate = |x: Option<f64>| {
            x.map_or("never (up to 10 000 runs/s)".to_string(), |r| {
                format!("{r:.4} runs/s ({:.0} runs a month)", r * 3600.0 * 730.0)
            })
        };
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            w.describe(),
            1e6 * cost::on_demand_per_run(p, m, p.invocations_per_run.value),
            1e6 * cost::on_demand_per_run(p, m, p.invocations_per_sleeping_run.value),
            1e6 * cost::managed_per_run_at_capacity(p, m),
            1e6 * cost::always_on_per_run_at_capacity(p, m),
            rate(cost::cheaper_from(p, m, ao, od)),
            rate(cost::cheaper_from(p, m, mi, od)),
            rate(cost::cheaper_from(p, m, mi, ao)),
        );
    }
    let _ = writeln!(
        md,
        "\nA month is 730 hours. At a rate, managed and always-on run as many instances as it \
         needs at the measured capacity (managed at least its minimum, always-on at least \
         one); on-demand pays per run. Capacity is what one process or instance drained \
         here, on a 2-core machine shared with the API: on AWS the API is elsewhere."
    );
}

/// A parameter's value without float noise: up to 10 decimals, trailing zeros trimmed.
fn number(value: f64) -> String {
    let text = format!("{value:.10}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_string()
}

/// The parameters, named.
pub fn params(p: &Prices) -> [(&'static str, Param); 13] {
    [
        ("Lambda duration, arm64", p.lambda_gb_s),
        ("Lambda request", p.lambda_request),
        ("function memory", p.memory_mb),
        ("SQS request", p.sqs_request),
        ("SQS requests per wake-up", p.sqs_requests_per_wake_up),
        ("invocations per created run (push)", p.invocations_per_run),
        (
            "of them Function URL requests",
            p.function_url_requests_per_run,
        ),
        (
            "invocations per run that sleeps once",
            p.invocations_per_sleeping_run,
        ),
        ("managed instance", p.managed_instance_hour),
        ("managed instances' management fee", p.managed_fee),
        (
            "processes per managed instance",
            p.managed_processes_per_instance,
        ),
        ("managed instances at least", p.managed_min_instances),
        ("always-on reference instance", p.always_on_hour),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_replaces_its_own_part_of_the_report_and_nothing_else() {
        let old =
            "# B\n\n## A\n\na\n\n## Agent runs and dollars\n\nold\n\n### sub\n\nx\n\n## Z\n\nz\n";
        let new = markdown::splice(old, HEADING, "## Agent runs and dollars\n\nnew\n");
        assert_eq!(
            new,
            "# B\n\n## A\n\na\n\n## Agent runs and dollars\n\nnew\n\n## Z\n\nz\n"
        );
        // At the end of the file.
        let old = "# B\n\n## A\n\na\n\n## Agent runs and dollars\n\nold\n";
        assert_eq!(
            markdown::splice(old, HEADING, "## Agent runs and dollars\n\nnew"),
            "# B\n\n## A\n\na\n\n## Agent runs and dollars\n\nnew\n"
        );
        // Absent: appended.
        assert_eq!(
            markdown::splice(
                "# B\n\n## A\n\na\n",
                HEADING,
                "## Agent runs and dollars\n\nnew\n"
            ),
            "# B\n\n## A\n\na\n\n## Agent runs and dollars\n\nnew\n"
        );
    }

    #[test]
    fn the_full_run_keeps_the_agent_section_it_does_not_measure() {
        let old =
            "# B\n\n## A\n\nold a\n\n## Agent runs and dollars\n\nagents\n\n### x\n\n## Z\n\nz\n";
        assert_eq!(
            markdown::extract(old, HEADING),
            Some("## Agent runs and dollars\n\nagents\n\n### x")
        );
        let new = "# B\n\n## A\n\nnew a\n".to_string();
        assert_eq!(
            keep_section(old, new),
            "# B\n\n## A\n\nnew a\n\n## Agent runs and dollars\n\nagents\n\n### x\n"
        );
        // Nothing to keep.
        assert_eq!(keep_section("# B\n", "# C\n".to_string()), "# C\n");
    }
}
