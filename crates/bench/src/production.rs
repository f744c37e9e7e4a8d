//! The production path: the reference worker and ours draining the API on PostgreSQL (its
//! production store, a fresh database per drain), on loopback and over links with a round trip
//! (a delay proxy, `ironflow_local_api::DelayProxy`), the same for both workers, in one run.

use std::collections::BTreeMap;

use crate::drain::{self, DrainResult, Link, Which, Workload};
use crate::{BenchError, Options, report};

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

/// The medians, printed (`--production-only`).
pub fn print_medians(p: &Production, runs: usize) {
    if let Some(why) = &p.skipped {
        println!("{why}");
        return;
    }
    for ((link, workload, which), rs) in &p.drains {
        let wall = report::median(&report::walls(rs));
        let ratio = p
            .drains
            .get(&(*link, *workload, Which::Reference))
            .map(|reference| {
                format!(
                    " ({:.3} of the reference; per round {:.3})",
                    wall / report::median(&report::walls(reference)),
                    report::paired_ratio(rs, reference)
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
