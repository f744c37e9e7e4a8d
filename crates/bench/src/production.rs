//! The production path: the reference worker and ours draining the API on PostgreSQL (its
//! production store, a fresh database per drain), on loopback and over links with a round trip
//! (a delay proxy, `ironflow_local_api::DelayProxy`), the same for both workers, in one run.

use std::collections::BTreeMap;

use crate::drain::{self, DrainResult, Link, Which};
use crate::markdown::yes;
use crate::stats::median;
use crate::workload::Workload;
use crate::{BenchError, Options};

/// The production-path drains, or why they were not measured.
#[derive(Debug, Default)]
pub struct Production {
    pub drains: BTreeMap<(Link, Workload, Which), Vec<DrainResult>>,
    /// Why nothing was measured (no PostgreSQL server given).
    pub skipped: Option<String>,
}

/// The production rows' settings.
#[derive(Debug, Clone)]
pub struct ProductionSettings {
    /// The links drained over, in order.
    pub links: Vec<Link>,
    pub rounds: usize,
}

/// The rows of a production round: the reference and ours, in turn first.
const ROWS: [Which; 2] = [Which::Reference, Which::Ours];

/// Drain every link, workload and row `o.production.rounds` times.
pub async fn measure(o: &Options) -> Result<Production, BenchError> {
    if o.drain.postgres.is_none() {
        return Ok(Production {
            skipped: Some(
                "not measured: no PostgreSQL server (give --postgres-url, or set \
                 IRONFLOW_TEST_POSTGRES_URL; scripts/bench starts one)"
                    .into(),
            ),
            ..Production::default()
        });
    }
    let mut drains: BTreeMap<(Link, Workload, Which), Vec<DrainResult>> = BTreeMap::new();
    let rounds = o.production.rounds;
    for round in 0..rounds {
        for &link in &o.production.links {
            for &workload in &o.workloads {
                let mut rows = ROWS;
                if round % 2 == 1 {
                    rows.reverse();
                }
                for which in rows {
                    let r = drain::drain(which, workload, &o.drain, link).await?;
                    eprintln!(
                        "production round {}/{rounds} {:<28} {:<14} {:<10} {:>8.3} s  {:>5.2} \
                         requests/run  claim to end {:.1} ms (median)  measured RTT {:.2} ms",
                        round + 1,
                        link.describe(),
                        workload.name(),
                        which.flag(),
                        r.wall.as_secs_f64(),
                        r.total_requests() as f64 / o.drain.runs as f64,
                        r.run_latency.unwrap_or_default().as_secs_f64() * 1000.0,
                        r.measured_rtt.as_secs_f64() * 1000.0,
                    );
                    drains.entry((link, workload, which)).or_default().push(r);
                }
            }
        }
    }
    Ok(Production {
        drains,
        skipped: None,
    })
}

/// The medians, printed (`production`).
pub fn print_medians(p: &Production, runs: usize) {
    if let Some(why) = &p.skipped {
        println!("{why}");
        return;
    }
    for ((link, workload, which), rs) in &p.drains {
        let wall = median(&drain::walls(rs));
        let ratio = p
            .drains
            .get(&(*link, *workload, Which::Reference))
            .map(|reference| {
                format!(
                    " ({:.3} of the reference; per round {:.3})",
                    wall / median(&drain::walls(reference)),
                    drain::paired_ratio(rs, reference)
                )
            })
            .unwrap_or_default();
        let requests = rs.iter().map(|r| r.total_requests() as f64).sum::<f64>()
            / (rs.len() * runs).max(1) as f64;
        println!(
            "{:<28} {:<14} {:<10} {wall:.3} s{ratio}  {requests:.2} requests/run",
            link.describe(),
            workload.name(),
            which.flag(),
        );
        let mut routes: BTreeMap<&str, u64> = BTreeMap::new();
        for r in rs {
            for (route, n) in &r.requests {
                *routes.entry(route).or_default() += n;
            }
        }
        for (route, n) in routes {
            println!(
                "    {route}: {:.2}",
                n as f64 / (rs.len() * runs).max(1) as f64
            );
        }
    }
}

/// The medians of one production row.
struct Medians {
    wall: f64,
    requests: f64,
    /// Median claim-to-terminal time of a run, in ms.
    latency_ms: f64,
    /// The round trip measured through the link, in ms.
    rtt_ms: f64,
}

fn medians(rs: &[DrainResult], runs: usize) -> Medians {
    let ms = |f: &dyn Fn(&DrainResult) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
    Medians {
        wall: median(&drain::walls(rs)),
        requests: rs.iter().map(|r| r.total_requests() as f64).sum::<f64>()
            / (rs.len() * runs).max(1) as f64,
        latency_ms: ms(&|r| r.run_latency.unwrap_or_default().as_secs_f64() * 1000.0),
        rtt_ms: ms(&|r| r.measured_rtt.as_secs_f64() * 1000.0),
    }
}

/// Writes the "Production path" section: the targets of issue 17, then a table per link.
pub fn section(md: &mut String, o: &Options, p: &Production) {
    use std::fmt::Write;
    let _ = writeln!(
        md,
        "\n## Production path: PostgreSQL and a network round trip\n"
    );
    if let Some(why) = &p.skipped {
        let _ = writeln!(md, "{why}\n");
        return;
    }
    let _ = writeln!(
        md,
        "K = {} runs drained at C = {} by each worker from the embedded API on ironflow-store's \
         PostgreSQL store (a fresh database per drain with `{}`, the server on this machine), \
         over each link in turn, {} rounds in a balanced order. The round trip is added by a delay \
         proxy between the workers and the API (`ironflow_local_api::DelayProxy`: each \
         direction of every connection delayed by half the RTT; this kernel has no `netem`), \
         the same for both workers; the RTT measured through it is shown. The end of a drain \
         is watched every 50 ms (not every 1 ms as on the in-memory rows: that poll costs \
         PostgreSQL CPU) and the drain's time is taken from the runs' own `started_at` and \
         `completed_at`: from the worker's start to the last run's end. Claim to end is the \
         median over runs of `completed_at - started_at`; the round trips on that critical \
         path are estimated as the time it gains over the loopback row divided by the \
         measured RTT.\n",
        o.drain.runs,
        o.drain.concurrency,
        ironflow_local_api::NO_JIT,
        o.production.rounds
    );
    targets(md, p, o.drain.runs);
    let loopback: BTreeMap<(Workload, Which), f64> = p
        .drains
        .iter()
        .filter(|((link, ..), _)| link.rtt().is_zero())
        .map(|((_, w, which), rs)| ((*w, *which), medians(rs, o.drain.runs).latency_ms))
        .collect();
    let _ = writeln!(
        md,
        "| link | workload | worker | drain (s) | ours / reference (per round) | requests per \
         run | claim to end (ms) | round trips on it | RTT measured (ms) |\n|---|---|---|---|---|---|---|---|---|"
    );
    for ((link, workload, which), rs) in &p.drains {
        let m = medians(rs, o.drain.runs);
        let ratio = match (which, p.drains.get(&(*link, *workload, Which::Reference))) {
            (Which::Reference, _) | (_, None) => String::new(),
            (_, Some(reference)) => format!(
                "{:.3} ({:.3})",
                m.wall / median(&drain::walls(reference)),
                drain::paired_ratio(rs, reference)
            ),
        };
        let trips = match loopback.get(&(*workload, *which)) {
            Some(base) if m.rtt_ms > 0.0 => format!("{:.1}", (m.latency_ms - base) / m.rtt_ms),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {ratio} | {:.2} | {:.1} | {trips} | {:.2} |",
            link.describe(),
            workload.describe(),
            which.flag(),
            m.wall,
            m.requests,
            m.latency_ms,
            m.rtt_ms
        );
    }
    let _ = writeln!(md, "\nRequests per run by route (all rounds):\n");
    routes(md, p, o.drain.runs);
}

/// The targets, on the 2 ms link (or the nearest measured), and the requests per run
/// on every link.
fn targets(md: &mut String, p: &Production, runs: usize) {
    use std::fmt::Write;
    let links: Vec<Link> = {
        let mut l: Vec<Link> = p.drains.keys().map(|(link, ..)| *link).collect();
        l.dedup();
        l
    };
    let Some(&link) = links
        .iter()
        .min_by_key(|l| l.rtt().as_micros().abs_diff(2000))
    else {
        return;
    };
    let _ = writeln!(md, "| target (issue 17) | measured | met |\n|---|---|---|");
    for (workload, bound) in [(Workload::NoOp, 0.6), (Workload::ThreeStepShell, 0.85)] {
        let (Some(ours), Some(reference)) = (
            p.drains.get(&(link, workload, Which::Ours)),
            p.drains.get(&(link, workload, Which::Reference)),
        ) else {
            continue;
        };
        let ratio = median(&drain::walls(ours)) / median(&drain::walls(reference));
        let paired = drain::paired_ratio(ours, reference);
        let _ = writeln!(
            md,
            "| drain ours / reference, {}, {}: ≤ {bound} | {ratio:.3} (per round {paired:.3}) | {} |",
            workload.describe(),
            link.describe(),
            yes(ratio <= bound && paired <= bound)
        );
    }
    for workload in Workload::ALL {
        for &link in &links {
            let (Some(ours), Some(reference)) = (
                p.drains.get(&(link, workload, Which::Ours)),
                p.drains.get(&(link, workload, Which::Reference)),
            ) else {
                continue;
            };
            let (ours, reference) = (
                medians(ours, runs).requests,
                medians(reference, runs).requests,
            );
            let _ = writeln!(
                md,
                "| API requests per run, {}, {}: ≤ reference − 2 | {ours:.2} vs {reference:.2} | {} |",
                workload.describe(),
                link.describe(),
                yes(ours <= reference - 2.0 + 1e-9)
            );
        }
    }
    let _ = writeln!(md);
}

/// Writes the requests per run by route, per link, workload and worker.
fn routes(md: &mut String, p: &Production, runs: usize) {
    use std::fmt::Write;
    let _ = writeln!(
        md,
        "| link | workload | worker | route | per run |\n|---|---|---|---|---|"
    );
    for ((link, workload, which), rs) in &p.drains {
        let mut routes: BTreeMap<&str, u64> = BTreeMap::new();
        for r in rs {
            for (route, n) in &r.requests {
                *routes.entry(route).or_default() += n;
            }
        }
        for (route, n) in routes {
            let _ = writeln!(
                md,
                "| {} | {} | {} | `{route}` | {:.2} |",
                link.describe(),
                workload.describe(),
                which.flag(),
                n as f64 / (rs.len() * runs).max(1) as f64
            );
        }
    }
}
