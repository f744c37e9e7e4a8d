//! The command line: one subcommand per section of the bench ([`Command`]; `all` when none is
//! given), the options every section shares ([`Shared`], accepted before or after the
//! subcommand), each section's own options, and the [`Options`] they make.

use std::path::PathBuf;
use std::time::Duration;

use crate::args::{MAX_RUNS, whole};
use crate::drain::{DrainSettings, Link, Which};
use crate::fleet::FleetArgs;
use crate::latency::DeadlineSettings;
use crate::managed::ManagedSettings;
use crate::pickup::PickupSettings;
use crate::production::ProductionSettings;
use crate::workload::Workload;
use crate::{Options, Section, agents};

/// The command line (`--help` prints it; each subcommand's `--help` its own options).
#[derive(Debug, clap::Parser)]
#[command(
    name = "ironflow-lambda-bench",
    about = "Benchmark ironflow-lambda against the reference worker on this machine; writes BENCHMARKS.md",
    after_help = "Without a subcommand: `all`."
)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    shared: Shared,
}

/// The sections of the bench.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Every section but `agents` and `fleet` (the default; what ./scripts/bench runs):
    /// drain, production, managed and pickup, plus idle latency, deadline precision, cold
    /// start, size and DynamoDB; writes BENCHMARKS.md, its agent and fleet sections kept as
    /// they were.
    All(AllArgs),
    /// The drain throughput rows (in-memory API, loopback): their medians printed and, for
    /// every workload and row and without --quick, their parts of BENCHMARKS.md replaced (the
    /// drain-time and request targets, "Drain throughput", "HTTP requests per run").
    Drain(DrainArgs),
    /// The production-path drains (PostgreSQL, round trips): their medians printed; nothing
    /// written. Needs --postgres-url.
    Production(ProductionArgs),
    /// The Lambda Managed Instances rows (one process with M invocations at once against M
    /// processes with one each): their medians and the report's section printed; nothing
    /// written.
    Managed(ManagedArgs),
    /// The pickup-latency rows (creation → claim and due → claim at an idle fleet, ours with
    /// push, ours with the schedule alone, the reference): the report's section printed;
    /// nothing written.
    Pickup(PickupArgs),
    /// The agent rows and the dollars (issue 26): agent drains against the reference on
    /// PostgreSQL over a 2 ms round trip, model calls cut at the cutoff with cutoff-aware
    /// starts off and on, agent runs per managed-instances process at M = 16 and 64, and $ per
    /// 1 million runs; replaces the "Agent runs and dollars" section of BENCHMARKS.md (with
    /// --quick: prints it only). About 17 minutes; --quick about 3-4.
    Agents(AgentArgs),
    /// Fleet scale (issue 28): F = 1, 2, 4, 8, 16, 32 workers at once, ours against the
    /// reference's, on one API on PostgreSQL behind a 2 ms round trip, three workloads;
    /// replaces the "Fleet scale" section of BENCHMARKS.md (with --print-only or --quick, or
    /// without --postgres-url: prints it only). About 20 minutes.
    Fleet(FleetArgs),
}

/// The options every section shares.
#[derive(Debug, clap::Args)]
struct Shared {
    /// Small counts; prints the report, writes nothing.
    #[arg(long, global = true)]
    quick: bool,
    /// Runs per drain (default 500, 50 with --quick; 1 to 100000: every run is created before
    /// the drain starts, and 100000 is hours here).
    #[arg(long, global = true, value_name = "K", allow_negative_numbers = true, value_parser = whole(1, MAX_RUNS))]
    runs: Option<u32>,
    /// Runs executing at once (C; 1 to 64: the function refuses M × C above 4096, and
    /// --max-concurrency M goes to 64).
    #[arg(long, global = true, value_name = "C", default_value_t = 2, allow_negative_numbers = true, value_parser = whole(1_u32, 64))]
    concurrency: u32,
    /// Runs one invocation claims at most (N; 1 to 256: 32 times the default).
    #[arg(long, global = true, value_name = "N", default_value_t = 8, allow_negative_numbers = true, value_parser = whole(1_u32, 256))]
    max_runs: u32,
    /// Where to write the report (default BENCHMARKS.md of the repository).
    #[arg(long, global = true, value_name = "PATH")]
    out: Option<PathBuf>,
    /// The function binary to measure (default: the release `ironflow-lambda` beside the bench).
    #[arg(long, global = true, value_name = "PATH", value_parser = existing_file)]
    function: Option<PathBuf>,
    /// PostgreSQL server of the production-path rows and the agent drains (a fresh database
    /// per drain), e.g. postgres://postgres@127.0.0.1:5432 (default:
    /// IRONFLOW_TEST_POSTGRES_URL). Without one, those rows are not measured.
    #[arg(
        long,
        global = true,
        env = "IRONFLOW_TEST_POSTGRES_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    postgres_url: Option<String>,
}

/// `all`: the options of every section it measures.
#[derive(Debug, clap::Args)]
struct AllArgs {
    #[command(flatten)]
    rounds: Rounds,
    #[command(flatten)]
    production: ProductionArgs,
    #[command(flatten)]
    managed: ManagedArgs,
    #[command(flatten)]
    pickup: PickupArgs,
}

/// The loopback drain rows' rounds.
#[derive(Debug, clap::Args)]
struct Rounds {
    /// Rounds of drains (default 20, 2 with --quick; 1 to 1000).
    #[arg(long, value_name = "R", allow_negative_numbers = true, value_parser = whole(1, MAX_ROUNDS))]
    rounds: Option<u32>,
}

/// `drain`.
#[derive(Debug, clap::Args)]
struct DrainArgs {
    #[command(flatten)]
    rounds: Rounds,
    /// One workload instead of both (then nothing is written).
    #[arg(long, value_parser = ["noop", "shell"])]
    workload: Option<String>,
    /// The rows of each round, comma-separated, out of reference, ours, no-claim-ahead,
    /// one-invocation, larger-batch (default all; fewer: nothing is written).
    #[arg(long, value_name = "LIST", value_parser = rows)]
    rows: Option<Rows>,
}

/// The production-path rows.
#[derive(Debug, clap::Args)]
struct ProductionArgs {
    /// Round trips added between the workers and the API in the production-path rows, in ms,
    /// comma-separated (0: PostgreSQL on loopback; 0 to 1000).
    #[arg(long, value_name = "MS", value_delimiter = ',', default_value = "0,1,2,5", allow_hyphen_values = true, value_parser = rtt)]
    rtts_ms: Vec<u64>,
    /// Rounds of production-path drains (default 3, 1 with --quick; 1 to 1000).
    #[arg(long, value_name = "R", allow_negative_numbers = true, value_parser = whole(1, MAX_ROUNDS))]
    production_rounds: Option<u32>,
}

/// The Lambda Managed Instances rows.
#[derive(Debug, clap::Args)]
struct ManagedArgs {
    /// M: invocations at once in the managed-instances rows (`AWS_LAMBDA_MAX_CONCURRENCY` of
    /// the one process, and the number of single-invocation processes; 1 to 64: as many
    /// processes at once on this machine).
    #[arg(long, value_name = "M", default_value_t = 4, allow_negative_numbers = true, value_parser = whole(1_u32, 64))]
    max_concurrency: u32,
    /// Rounds of managed-instances drains (default 4, each layout first in half of them; 1 with
    /// --quick; 0: none; at most 1000).
    #[arg(long, value_name = "R", allow_negative_numbers = true, value_parser = whole(0, MAX_ROUNDS))]
    managed_rounds: Option<u32>,
    /// Runs per no-op managed-instances drain (default 6000, 600 with --quick; 1 to 100000).
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = whole(1, MAX_RUNS))]
    managed_noop_runs: Option<u32>,
    /// Runs per three-step shell managed-instances drain (default 1500, 150 with --quick; 1 to 100000).
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = whole(1, MAX_RUNS))]
    managed_shell_runs: Option<u32>,
    /// Runs per managed-instances drain of the deployable binary's `quick-shell` (default
    /// 3000, 300 with --quick; 1 to 100000).
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = whole(1, MAX_RUNS))]
    managed_quick_shell_runs: Option<u32>,
}

/// The pickup-latency rows.
#[derive(Debug, clap::Args)]
struct PickupArgs {
    /// K: runs per pickup row (default 50, 10 with --quick; 0: none; at most 100000).
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = whole(0, MAX_RUNS))]
    pickup_runs: Option<u32>,
    /// The seed of the pickup rows' random moments.
    #[arg(long, value_name = "SEED", default_value_t = 20, allow_negative_numbers = true, value_parser = whole(0, u64::MAX))]
    pickup_seed: u64,
}

/// The agent rows.
#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// The agent rows' time scale: model latencies, the invocation's length, the deadline
    /// margin, the minimum claim budget and the default step duration are multiplied by it
    /// (0.05 at least: the margin's 500 ms floor; at 0.1 the 1 s margin is short for a
    /// handback of 32 runs over PostgreSQL on a loaded machine).
    #[arg(long, value_name = "FACTOR", default_value_t = 0.2, allow_negative_numbers = true, value_parser = time_scale)]
    time_scale: f64,
    /// The seed of the agent rows' model latencies.
    #[arg(long, value_name = "SEED", default_value_t = 26, allow_negative_numbers = true, value_parser = whole(0, u64::MAX))]
    agent_seed: u64,
}

/// The most rounds of any section (`--rounds`, `--production-rounds`, `--managed-rounds`).
const MAX_ROUNDS: u32 = 1000;

/// The rows of `--rows`, in order, each once.
#[derive(Debug, Clone)]
struct Rows(Vec<Which>);

fn rows(list: &str) -> Result<Rows, String> {
    let mut rows: Vec<Which> = Vec::new();
    for name in list.split(',') {
        let row = Which::parse(name.trim()).ok_or(format!(
            "expected reference, ours, no-claim-ahead, one-invocation or larger-batch, got {name:?}"
        ))?;
        if rows.contains(&row) {
            return Err(format!("{name:?} is named twice"));
        }
        rows.push(row);
    }
    Ok(Rows(rows))
}

/// A round trip in ms (0 to 1000, fractions allowed), as µs.
fn rtt(ms: &str) -> Result<u64, String> {
    ms.trim()
        .parse::<f64>()
        .ok()
        .filter(|ms| (0.0..=1000.0).contains(ms))
        .map(|ms| (ms * 1000.0).round() as u64)
        .ok_or(format!(
            "expected a round trip in ms from 0 to 1000, got {ms:?}"
        ))
}

/// A time scale from 0.05 (the deadline margin's 500 ms floor at the default 10 s) to 1.
fn time_scale(factor: &str) -> Result<f64, String> {
    factor
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|f| (0.05..=1.0).contains(f))
        .ok_or(format!(
            "expected a time scale from 0.05 to 1, got {factor:?}"
        ))
}

/// Checked now, not after minutes of drains.
fn existing_file(path: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{}: no such file (the function binary to measure)",
            path.display()
        ))
    }
}

/// An error of the subcommand `name`'s command line, printed with that subcommand's usage.
fn usage_error(name: &str, kind: clap::error::ErrorKind, message: &str) -> clap::Error {
    let mut top = <Args as clap::CommandFactory>::command();
    // Builds every subcommand's usage (its binary name, its own and the shared options).
    top.build();
    if let Some(sub) = top.find_subcommand_mut(name) {
        return sub.error(kind, message);
    }
    top.error(kind, message)
}

/// A group of options with nothing given: its defaults. A failure here is this file's own
/// mistake (a default its parser refuses), reported as clap reports any.
fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    command
        .try_get_matches_from(std::iter::empty::<String>())
        .and_then(|m| T::from_arg_matches(&m))
        .unwrap_or_else(|e| e.exit())
}

/// A count: `given`, else `full`, or `small` with `--quick`.
fn count(quick: bool, given: Option<u32>, full: usize, small: usize) -> usize {
    given.map_or(if quick { small } else { full }, |n| n as usize)
}

impl Args {
    /// What to run. `args`: the command line as given, quoted by the report.
    pub fn options(self, args: Vec<String>) -> Result<Options, clap::Error> {
        let s = self.shared;
        let quick = s.quick;
        let command = self.command.unwrap_or_else(|| Command::All(defaults()));
        if matches!(command, Command::Production(_)) && s.postgres_url.is_none() {
            return Err(usage_error(
                "production",
                clap::error::ErrorKind::MissingRequiredArgument,
                "production needs --postgres-url (or IRONFLOW_TEST_POSTGRES_URL)",
            ));
        }
        let Groups {
            section,
            rounds,
            drain: drain_args,
            production,
            managed,
            pickup,
            agents,
            fleet,
        } = command.groups();
        // The fleet section takes the shared options it uses from here.
        let fleet = fleet.map(|f| FleetArgs {
            concurrency: s.concurrency,
            max_runs: s.max_runs,
            postgres_url: s.postgres_url.clone(),
            out: s.out.clone(),
            print_only: f.print_only || quick,
            ..f
        });
        let workloads = drain_args
            .as_ref()
            .and_then(|d| d.workload.as_deref())
            .and_then(Workload::parse)
            .map_or_else(|| Workload::ALL.to_vec(), |w| vec![w]);
        let rows = drain_args
            .and_then(|d| d.rows)
            .map_or_else(|| Which::ALL.to_vec(), |r| r.0);
        // Written: the whole report (`all`), the agent section (`agents`), the drain rows'
        // parts (`drain`, every workload and row); never with --quick.
        let whole_drain = workloads.len() == Workload::ALL.len() && rows.len() == Which::ALL.len();
        if section == Section::Drain && !whole_drain && s.out.is_some() {
            return Err(usage_error(
                "drain",
                clap::error::ErrorKind::ArgumentConflict,
                "drain writes --out only with every workload and row (no --workload, no --rows)",
            ));
        }
        let writes = match section {
            Section::All | Section::Agents => true,
            Section::Drain => whole_drain,
            // The fleet section writes its own part ([`crate::fleet::run`]).
            Section::Production | Section::Managed | Section::Pickup | Section::Fleet => false,
        };
        Ok(Options {
            quick,
            section,
            drain: DrainSettings {
                runs: count(quick, s.runs, 500, 50),
                concurrency: s.concurrency as usize,
                max_runs: s.max_runs as usize,
                invocation: Duration::from_secs(60),
                poll_interval: Duration::from_millis(100),
                postgres: s.postgres_url,
                model_endpoint: None,
                time_scale: 1.0,
                cutoff_aware: None,
            },
            workloads,
            rows,
            // Single rounds swing by ±20 % on a shared 2-core machine: medians of 20 hold to a
            // few %. 20 is two whole blocks of the round order's design (2 × 5 rows,
            // `round_order`).
            rounds: count(quick, rounds.rounds, 20, 2),
            idle_invocations: if quick { 50 } else { 200 },
            deadline: DeadlineSettings {
                invocation: Duration::from_secs(3),
                margin: Duration::from_secs(1),
                runs: 2,
            },
            deadline_invocations: if quick { 3 } else { 20 },
            cold_starts: if quick { 5 } else { 30 },
            dynamodb_runs: if quick { 16 } else { 96 },
            out: s.out.or_else(|| {
                (!quick && writes)
                    .then(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../BENCHMARKS.md"))
            }),
            function: s.function,
            args,
            production: production.settings(quick),
            managed: managed.settings(quick),
            pickup: pickup.settings(quick, s.concurrency, s.max_runs),
            agents: agents.settings(quick),
            fleet,
        })
    }
}

/// Each group of options: the section's own, the defaults for the others.
struct Groups {
    section: Section,
    rounds: Rounds,
    drain: Option<DrainArgs>,
    production: ProductionArgs,
    managed: ManagedArgs,
    pickup: PickupArgs,
    agents: AgentArgs,
    fleet: Option<FleetArgs>,
}

impl Command {
    fn groups(self) -> Groups {
        let mut g = Groups {
            section: Section::All,
            rounds: defaults(),
            drain: None,
            production: defaults(),
            managed: defaults(),
            pickup: defaults(),
            agents: defaults(),
            fleet: None,
        };
        match self {
            Command::All(a) => {
                (g.rounds, g.production, g.managed) = (a.rounds, a.production, a.managed);
                g.pickup = a.pickup;
            }
            Command::Drain(mut d) => {
                g.section = Section::Drain;
                g.rounds = std::mem::replace(&mut d.rounds, defaults());
                g.drain = Some(d);
            }
            Command::Production(p) => (g.section, g.production) = (Section::Production, p),
            Command::Managed(m) => (g.section, g.managed) = (Section::Managed, m),
            Command::Pickup(k) => (g.section, g.pickup) = (Section::Pickup, k),
            Command::Agents(a) => (g.section, g.agents) = (Section::Agents, a),
            Command::Fleet(f) => (g.section, g.fleet) = (Section::Fleet, Some(f)),
        }
        g
    }
}

impl ProductionArgs {
    fn settings(&self, quick: bool) -> ProductionSettings {
        ProductionSettings {
            links: self
                .rtts_ms
                .iter()
                .map(|&rtt_us| Link::Postgres { rtt_us })
                .collect(),
            rounds: count(quick, self.production_rounds, 3, 1),
        }
    }
}

impl ManagedArgs {
    fn settings(&self, quick: bool) -> ManagedSettings {
        ManagedSettings {
            max_concurrency: self.max_concurrency as usize,
            noop_runs: count(quick, self.managed_noop_runs, 6000, 600),
            shell_runs: count(quick, self.managed_shell_runs, 1500, 150),
            quick_shell_runs: count(quick, self.managed_quick_shell_runs, 3000, 300),
            agent_runs: 0,
            rounds: count(quick, self.managed_rounds, 4, 1),
            enabled: self.managed_rounds != Some(0),
        }
    }
}

impl PickupArgs {
    fn settings(&self, quick: bool, concurrency: u32, max_runs: u32) -> PickupSettings {
        PickupSettings {
            runs: count(quick, self.pickup_runs, 50, 10),
            seed: self.pickup_seed,
            concurrency: concurrency as usize,
            max_runs: max_runs as usize,
        }
    }
}

impl AgentArgs {
    fn settings(&self, quick: bool) -> agents::AgentSettings {
        agents::AgentSettings {
            time_scale: self.time_scale,
            latency: (Duration::from_secs(2), Duration::from_secs(40)),
            tokens: (2000, 500),
            invocation: Duration::from_secs(60),
            managed_invocation: Duration::from_secs(900),
            seed: self.agent_seed,
            drain_runs: if quick { 32 } else { 128 },
            drain_concurrency: 32,
            drain_rounds: if quick { 1 } else { 2 },
            rtt_us: 2000,
            cut_runs: if quick { 128 } else { 1000 },
            cut_parallel: 8,
            cut_concurrency: 16,
            managed_runs: if quick { 256 } else { 1000 },
            managed_ms: vec![16, 64],
            managed_concurrency: 8,
            billed_runs: if quick { 50 } else { 500 },
            prices: agents::cost::Prices::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        let args = <Args as clap::Parser>::try_parse_from(
            std::iter::once("ironflow-lambda-bench").chain(args.iter().copied()),
        )?;
        args.options(Vec::new())
    }

    #[test]
    fn each_section_is_a_subcommand_all_by_default_with_the_shared_options_on_either_side() {
        let o = parse(&["--postgres-url", "postgres://x", "--quick"]).unwrap();
        assert_eq!(o.section, Section::All);
        assert_eq!((o.rounds, o.drain.runs, o.managed.rounds), (2, 50, 1));
        assert_eq!(o.drain.postgres.as_deref(), Some("postgres://x"));
        assert!(o.out.is_none(), "--quick writes nothing");
        let o = parse(&["all", "--managed-rounds", "6", "--rounds", "10"]).unwrap();
        assert_eq!(
            (o.section, o.rounds, o.managed.rounds),
            (Section::All, 10, 6)
        );
        assert!(o.out.is_some(), "the full run writes BENCHMARKS.md");
        let o = parse(&["managed", "--managed-rounds", "6", "--runs", "100"]).unwrap();
        assert_eq!(
            (o.section, o.managed.rounds, o.drain.runs),
            (Section::Managed, 6, 100)
        );
        assert!(o.out.is_none());
        let o = parse(&["pickup", "--pickup-runs", "3"]).unwrap();
        assert_eq!((o.section, o.pickup.runs), (Section::Pickup, 3));
        let o = parse(&["agents", "--time-scale", "0.5"]).unwrap();
        assert_eq!((o.section, o.agents.time_scale), (Section::Agents, 0.5));
        assert!(o.out.is_some(), "agents replaces its section");
        // The fleet section takes the shared options it uses.
        let o = parse(&["--postgres-url", "postgres://x", "fleet", "--fleets", "1,2"]).unwrap();
        let f = o.fleet.expect("fleet's options");
        assert_eq!(o.section, Section::Fleet);
        assert_eq!((f.fleets, f.concurrency, f.max_runs), (vec![1, 2], 2, 8));
        assert_eq!(f.postgres_url.as_deref(), Some("postgres://x"));
        assert!(!f.print_only);
        let f = parse(&["fleet", "--concurrency", "4", "--quick"])
            .unwrap()
            .fleet;
        assert_eq!(f.map(|f| (f.concurrency, f.print_only)), Some((4, true)));
        assert!(parse(&["fleet", "--fleets", "0"]).is_err());
        // A section's own option belongs to it.
        assert!(parse(&["pickup", "--managed-rounds", "6"]).is_err());
        assert!(parse(&["--rows", "ours"]).is_err());
        assert!(parse(&["agents", "--time-scale", "2"]).is_err());
    }

    #[test]
    fn the_drain_rows_are_written_only_when_every_row_and_workload_is_measured() {
        let o = parse(&["drain"]).unwrap();
        assert_eq!((o.section, o.rounds), (Section::Drain, 20));
        assert_eq!((o.rows.len(), o.workloads.len()), (5, 2));
        assert!(o.out.is_some());
        let o = parse(&["drain", "--rows", "reference,ours", "--workload", "noop"]).unwrap();
        assert_eq!(o.rows, vec![Which::Reference, Which::Ours]);
        assert_eq!(o.workloads, vec![Workload::NoOp]);
        assert!(o.out.is_none(), "a part of the rows: printed only");
        assert!(parse(&["drain", "--quick"]).unwrap().out.is_none());
        assert!(parse(&["drain", "--workload", "shell", "--out", "x.md"]).is_err());
    }

    #[test]
    fn production_needs_a_postgres_server() {
        // The variable may be set where the tests run: then it is the server.
        let has_env = std::env::var_os("IRONFLOW_TEST_POSTGRES_URL").is_some();
        assert_eq!(parse(&["production"]).is_ok(), has_env);
        let o = parse(&[
            "production",
            "--postgres-url",
            "postgres://x",
            "--rtts-ms",
            "2",
        ])
        .unwrap();
        assert_eq!(o.section, Section::Production);
        assert_eq!(o.production.links.len(), 1);
    }

    /// The message of `args`' error, as printed.
    fn refused(args: &[&str]) -> String {
        parse(args).expect_err("refused").render().to_string()
    }

    #[test]
    fn a_negative_or_too_large_number_is_refused_with_the_expected_range() {
        for args in [
            &["--runs", "-5"][..],
            &["drain", "--runs", "-5"],
            &["--concurrency", "-1"],
            &["--max-runs", "-1"],
            &["drain", "--rounds", "-2"],
            &["production", "--production-rounds", "-1"],
            &["production", "--rtts-ms", "-1"],
            &["production", "--rtts-ms", "-1,2"],
            &["managed", "--max-concurrency", "-4"],
            &["managed", "--managed-rounds", "-1"],
            &["managed", "--managed-noop-runs", "-1"],
            &["pickup", "--pickup-runs", "-1"],
            &["pickup", "--pickup-seed", "-1"],
            &["agents", "--time-scale", "-1"],
            &["agents", "--agent-seed", "-1"],
            &["fleet", "--window-secs", "-1"],
            &["fleet", "--warmup-secs", "-1"],
            &["fleet", "--min-runs", "-1"],
            &["fleet", "--rtt-ms", "-1"],
            &["fleet", "--fleets", "-1"],
            &["fleet", "--fleets", "1,-2"],
        ] {
            let message = refused(args);
            assert!(
                message.contains("expected") && message.contains(" to "),
                "{args:?}: {message}"
            );
        }
        for (args, range) in [
            (&["--runs", "4294967295"][..], "from 1 to 100000"),
            (&["--concurrency", "100000"], "from 1 to 64"),
            (&["--max-runs", "100000"], "from 1 to 256"),
            (&["drain", "--rounds", "100000"], "from 1 to 1000"),
            (&["managed", "--managed-rounds", "100000"], "from 0 to 1000"),
            (
                &["pickup", "--pickup-runs", "4294967295"],
                "from 0 to 100000",
            ),
            (&["fleet", "--min-runs", "1000000000"], "from 0 to 100000"),
        ] {
            let message = refused(args);
            assert!(message.contains(range), "{args:?}: {message}");
        }
        let o = parse(&[
            "--runs",
            "100000",
            "--concurrency",
            "64",
            "--max-runs",
            "256",
        ])
        .unwrap();
        assert_eq!(
            (o.drain.runs, o.drain.concurrency, o.drain.max_runs),
            (100_000, 64, 256)
        );
    }

    #[test]
    fn a_subcommands_own_error_prints_its_usage() {
        let message = refused(&["drain", "--workload", "shell", "--out", "x.md"]);
        assert!(
            message.contains("Usage: ironflow-lambda-bench drain"),
            "{message}"
        );
        if std::env::var_os("IRONFLOW_TEST_POSTGRES_URL").is_none() {
            let message = refused(&["production"]);
            assert!(
                message.contains("Usage: ironflow-lambda-bench production"),
                "{message}"
            );
        }
    }
}
