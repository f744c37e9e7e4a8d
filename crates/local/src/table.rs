//! What the runner prints at the end: the table of runs ([`print_table`]), the tally of the
//! invocations and the webhook's posts ([`print_tally`]), and the last line ([`report_end`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use ironflow_local_api::LocalApi;
use ironflow_store::entities::StepStatus;
use uuid::Uuid;

use crate::driver::{Claims, Invoked, Posted, Record, Trigger, by_reason};

/// What the default mode's invocations did, for the table.
pub struct Drained {
    /// The invocations that listed each run.
    pub invocations_per_run: HashMap<Uuid, usize>,
    /// Milliseconds from each run's creation to its first claim.
    pub claim_ms: HashMap<Uuid, i64>,
}

/// What the table shows of the drive: invocations per run and each run's claim time.
pub fn drained(record: &Record, claims: Claims) -> Drained {
    let mut invocations_per_run: HashMap<Uuid, usize> = HashMap::new();
    for invoked in &record.invocations {
        for id in &invoked.claimed {
            *invocations_per_run.entry(*id).or_default() += 1;
        }
    }
    Drained {
        invocations_per_run,
        claim_ms: claims.claim_ms,
    }
}

/// The last line: whether every run is terminal.
pub fn report_end(terminal: usize, runs: usize, invocations: usize) -> bool {
    if terminal == runs {
        println!("\nall {runs} runs are terminal");
        true
    } else {
        println!(
            "\n{} of {runs} runs are not terminal after {invocations} invocations",
            runs - terminal
        );
        false
    }
}

pub fn print_created(runs: &[Uuid]) {
    println!(
        "created {} run{} through POST /api/v1/internal/runs\n",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );
}

/// How many invocations wake-ups and ticks started, what they claimed, and what the webhook
/// posted.
pub fn print_tally(invocations: &[Invoked], posted: &Posted, left_on_queue: usize) {
    let reasons: Vec<&String> = invocations
        .iter()
        .flat_map(|i| match &i.trigger {
            Trigger::WakeUps(reasons) => reasons.iter().collect(),
            Trigger::Tick => Vec::new(),
        })
        .collect();
    let from_queue = invocations
        .iter()
        .filter(|i| i.trigger != Trigger::Tick)
        .count();
    let pushed = invocations
        .iter()
        .filter(|i| matches!(&i.trigger, Trigger::WakeUps(r) if r.iter().any(|r| r == "pushed")))
        .count();
    let ticks = invocations.len() - from_queue;
    let claimed_by = |tick: bool| -> usize {
        invocations
            .iter()
            .filter(|i| (i.trigger == Trigger::Tick) == tick)
            .map(|i| i.claimed.len())
            .sum()
    };
    let counts = by_reason(reasons.iter().copied());
    println!(
        "\ninvocations: {} = {from_queue} from the wake queue ({pushed} with a pushed wake-up) + \
         {ticks} schedule tick{}",
        invocations.len(),
        if ticks == 1 { "" } else { "s" }
    );
    // Pushed first, then the batches' own (handed_back, backlog, due), as they occurred.
    let mut kinds = vec![format!(
        "{} pushed",
        counts.get("pushed").copied().unwrap_or(0)
    )];
    kinds.extend(
        counts
            .iter()
            .filter(|(reason, _)| **reason != "pushed")
            .map(|(reason, n)| format!("{n} {reason}")),
    );
    println!(
        "wake-ups taken from the queue: {} ({})",
        reasons.len(),
        kinds.join(", ")
    );
    println!(
        "claims: {} by wake-up invocations, {} by schedule ticks (a run handed back is claimed again)",
        claimed_by(false),
        claimed_by(true)
    );
    let refused = posted.refused.load(Ordering::Relaxed);
    println!(
        "the API's webhook: {} events posted to the receiver, {} of them sent wake-ups{}",
        posted.events.load(Ordering::Relaxed),
        posted.woke.load(Ordering::Relaxed),
        if refused == 0 {
            String::new()
        } else {
            format!(", {refused} answered with an error")
        }
    );
    if left_on_queue > 0 {
        println!("wake-ups left on the queue, not served: {left_on_queue}");
    }
}

/// Print the final table of runs, and return how many are terminal.
///
/// `drained`: the invocations that listed each run and each run's first claim (`None` under
/// `--serve`, where the deployable function's invocations are not seen here). Steps are counted
/// by position: a step interrupted at a handback (or failed before a run-level retry) keeps its
/// row, and the run's next execution adds another for the same position, shown apart as an
/// earlier attempt. A step's own retries (its retry policy) stay in one row. Tokens in/out are
/// the sums of the run's step records (every attempt's, as the provider reported them) and the
/// cost is the run's `cost_usd` (what the engine charged it); a model call cut at the cutoff is
/// in neither (each invocation's summary estimates it: docs/agents.md, "What a run costs").
pub async fn print_table(
    api: &LocalApi,
    runs: &[Uuid],
    drained: Option<&Drained>,
) -> Result<usize, Box<dyn std::error::Error>> {
    println!(
        "\n{:<17} {:<38} {:<10} {:>17}  {:>11} {:<26} {:>15} {:>10}  error",
        "workflow",
        "run",
        "state",
        "created → claimed",
        "invocations",
        "steps done/all",
        "tokens in/out",
        "cost $"
    );
    let mut terminal = 0;
    for id in runs {
        let Some(run) = api.store().get_run(*id).await? else {
            continue;
        };
        let steps = api.store().list_steps(*id).await?;
        let positions: BTreeSet<u32> = steps.iter().map(|s| s.position).collect();
        let done: BTreeSet<u32> = steps
            .iter()
            .filter(|s| s.status.state == StepStatus::Completed)
            .map(|s| s.position)
            .collect();
        let mut step_count = format!("{}/{}", done.len(), positions.len());
        match steps.len() - positions.len() {
            0 => {}
            1 => step_count.push_str(" +1 earlier attempt"),
            n => step_count.push_str(&format!(" +{n} earlier attempts")),
        }
        if run.status.state.is_terminal() {
            terminal += 1;
        }
        let tokens_in: u64 = steps.iter().filter_map(|s| s.input_tokens).sum();
        let tokens_out: u64 = steps.iter().filter_map(|s| s.output_tokens).sum();
        let claimed = drained
            .and_then(|d| d.claim_ms.get(id))
            .map_or("-".to_string(), |ms| format!("{ms} ms"));
        let invocations = drained.map_or("-".to_string(), |d| {
            d.invocations_per_run
                .get(id)
                .copied()
                .unwrap_or(0)
                .to_string()
        });
        println!(
            "{:<17} {:<38} {:<10} {:>17}  {:>11} {:<26} {:>15} {:>10}  {}",
            run.workflow_name,
            // Uuid's Display ignores the width: pad its string.
            run.id.to_string(),
            run.status.state.to_string(),
            claimed,
            invocations,
            step_count,
            format!("{tokens_in}/{tokens_out}"),
            run.cost_usd.round_dp(6).to_string(),
            run.error.as_deref().unwrap_or("")
        );
    }
    Ok(terminal)
}
