//! The report's pickup section (and `pickup`'s output).

use std::fmt::Write as _;

use super::fleet::{SCHEDULE_MAX_RUNS, TICK};
use super::workflows::{LONG_NAP_SECS, NAP_SECS};
use super::{Kind, Pickup, PickupSettings, Row, Setup};
use crate::markdown::yes;
use crate::stats::{median, percentile};

/// The pickup p99 target with push, from creation (issue 20): 200 ms.
const PUSH_P99_TARGET_MS: f64 = 200.0;
/// Published SQS → Lambda latency (event source mapping, standard queue): p50, p99 in ms.
const SQS_LAMBDA_MS: (f64, f64) = (16.2, 105.0);
const SQS_LAMBDA_SOURCE: &str = "Bite-Sized Serverless, \"Serverless Messaging: Latency Compared\" \
     (September 2022, eu-west-1: SQS standard → Lambda p10 13.7 ms, p50 16.2 ms, p90 33.8 ms, \
     p99 105 ms), https://bitesizedserverless.com/bite/serverless-messaging-latency-compared/";

/// `pickup`: the section as the full run writes it.
pub fn print(p: &Pickup) {
    let mut md = String::new();
    section(&mut md, p);
    println!("{md}");
}

/// Writes the "Pickup latency" section.
pub fn section(md: &mut String, p: &Pickup) {
    let _ = writeln!(md, "\n## Pickup latency at an idle fleet\n");
    let (Some(s), None) = (&p.settings, &p.skipped) else {
        let why = p.skipped.as_deref().unwrap_or("not measured");
        let _ = writeln!(md, "{why}\n");
        return;
    };
    intro(md, s, p);
    targets(md, p);
    latency_table(md, p);
    invocation_table(md, p);
    notes(md, p);
}

fn intro(md: &mut String, s: &PickupSettings, p: &Pickup) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let gaps = |k: Kind| {
        let (low, high) = k.gaps();
        format!("{}–{} s", low.as_secs(), high.as_secs())
    };
    let _ = writeln!(
        md,
        "How long a run waits to be claimed when nothing else is going on: from its creation, and \
         separately from coming due (a sleep's wake time, a retry's due time), to the claim, read \
         from the API's store (the claim's `started_at` against the run's `created_at`, the delay \
         step's `wake_at`, the retry's `scheduled_at`). K = {k} runs per row, created at random \
         moments through the API's route (seeded: {seed}), each after an idle gap drawn from a \
         range: {created} for creations, {sleep} for {NAP_SECS} s sleeps over {sleep_lanes} \
         lanes, {retry} for retries over {retry_lanes} lanes. A lane is a fleet of its own (an \
         embedded API, in-memory store, loopback, and its workers): any batch claims every run it \
         finds Pending, so in one fleet another run's creation would often claim a due run before \
         its own wake-up; the gaps are long enough that in a push lane the last run has come due \
         and been claimed before the next is created. Every lane of every row runs side by side, so the whole section took {min:.1} \
         min on this machine ({cores} cores); C = {c} for every worker.\n",
        k = s.runs,
        seed = s.seed,
        created = gaps(Kind::Created),
        sleep = gaps(Kind::Sleep),
        sleep_lanes = Kind::Sleep.lanes(),
        retry = gaps(Kind::Retry),
        retry_lanes = Kind::Retry.lanes(),
        min = p.elapsed.as_secs_f64() / 60.0,
        c = s.concurrency,
    );
    let _ = writeln!(
        md,
        "- **{}**: the API's webhook posts its run events, signed, through a Function URL \
         stand-in to the receiver (`ironflow_lambda::handle`), whose wake-ups go to a queue in \
         the process (`LocalWakeQueue`); a consumer loop hands each batch of visible wake-ups (up \
         to 10) to the handler as an SQS event, as Lambda's event source mapping would, in an \
         invocation of its own; the batches book timer wake-ups for the runs they leave due \
         later. N = {n}. No schedule tick, so that every claim is a wake-up's (deployed, the \
         schedule ticks too, which can only make a pickup earlier).\n\
         - **{}**: a schedule tick every {tick} s (`rate(1 minute)`, as deployed, the first at a \
         random moment), no wake queue, no receiver. N = {SCHEDULE_MAX_RUNS}, so that one tick \
         claims every run waiting (deployed, N = 8 and the backlog's wake-ups through the queue \
         take the rest at once).\n\
         - **{}**: ironflow-worker 3.1.1 with its default poll interval, 2 s after an empty poll, \
         4 s after 5 empty polls in a row, 6 s after 10.\n",
        Setup::Push.describe(),
        Setup::Schedule.describe(),
        Setup::Reference.describe(),
        n = s.max_runs,
        tick = TICK.as_secs(),
    );
}

/// The row's wait at percentile `p`, in ms (NaN without samples).
fn pct(row: Option<&Row>, p: f64) -> f64 {
    row.map_or(f64::NAN, |r| percentile(&r.samples_ms, p))
}

/// The row's median wait, in ms (NaN without samples).
fn mid(row: Option<&Row>) -> f64 {
    row.map_or(f64::NAN, |r| median(&r.samples_ms))
}

fn targets(md: &mut String, p: &Pickup) {
    let push = p.rows.get(&(Kind::Created, Setup::Push));
    let reference = p.rows.get(&(Kind::Created, Setup::Reference));
    let (push_p50, push_p99) = (mid(push), pct(push, 99.0));
    let (ref_p50, ref_p99) = (mid(reference), pct(reference, 99.0));
    let ours: Vec<(Setup, &Row)> = [Setup::Push, Setup::Schedule]
        .into_iter()
        .filter_map(|s| p.rows.get(&(Kind::Created, s)).map(|r| (s, r)))
        .collect();
    let idle = idle_cost(&ours);
    let _ = writeln!(md, "| target (issue 20) | measured | met |\n|---|---|---|");
    let _ = writeln!(
        md,
        "| pickup p99 ≤ {PUSH_P99_TARGET_MS:.0} ms locally with push (creation → claim) | p99 {}, \
         p50 {} | {} |",
        ms(push_p99),
        ms(push_p50),
        yes(push_p99 <= PUSH_P99_TARGET_MS)
    );
    let _ = writeln!(
        md,
        "| the reference at its default 2 s poll: seconds (creation → claim) | p99 {}, p50 {} | {} |",
        ms(ref_p99),
        ms(ref_p50),
        if ref_p50 >= 500.0 {
            "yes: seconds"
        } else {
            "**no**: under half a second"
        }
    );
    let _ = writeln!(
        md,
        "| idle cost unchanged: no invocation without an event or a tick | {} | {} |\n",
        idle.0,
        yes(idle.1)
    );
}

/// The idle-cost verdict over our creation rows: every SQS invocation was a wake-up's and
/// claimed a run, no tick where there is none, no error.
fn idle_cost(rows: &[(Setup, &Row)]) -> (String, bool) {
    let mut text = Vec::new();
    let mut ok = true;
    for &(setup, row) in rows {
        let t = &row.tally;
        let runs = row.samples_ms.len();
        match setup {
            Setup::Push => {
                ok &= t.sqs_empty == 0 && t.ticks == 0 && t.error_count == 0;
                text.push(format!(
                    "push: {} invocations for {runs} runs, each an event's or a wake-up's: {} \
                     Function URL requests (one per event the API posted, {} of them woke the \
                     fleet) and {} SQS invocations ({} claimed nothing); no tick",
                    t.invocations(),
                    t.url_invocations,
                    t.url_woke,
                    t.sqs_invocations,
                    t.sqs_empty
                ));
            }
            Setup::Schedule => {
                ok &= t.sqs_invocations == 0 && t.url_invocations == 0 && t.error_count == 0;
                text.push(format!(
                    "schedule alone: {}, nothing else ({} claimed nothing)",
                    plural(t.ticks, "tick"),
                    t.ticks_empty
                ));
            }
            Setup::Reference => {}
        }
    }
    (text.join("; "), ok)
}

fn latency_table(md: &mut String, p: &Pickup) {
    let k = p.settings.map_or(0, |s| s.runs);
    let _ = writeln!(
        md,
        "Waits per row (nearest-rank percentiles: with {k} runs the p99 is the largest of them, \
         the same as the max):\n"
    );
    let _ = writeln!(
        md,
        "| wait | setup | runs (lanes) | p50 | p90 | p99 | max | claimed by (ours) |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for kind in Kind::ALL {
        for &setup in kind.setups() {
            let Some(row) = p.rows.get(&(kind, setup)) else {
                continue;
            };
            let v = &row.samples_ms;
            let by = if row.claimed_by.is_empty() {
                "–".to_string()
            } else {
                row.claimed_by
                    .iter()
                    .map(|(trigger, n)| format!("{trigger} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} ({}) | {} | {} | {} | {} | {by} |",
                kind.describe(),
                setup.describe(),
                v.len(),
                row.lanes,
                ms(median(v)),
                ms(percentile(v, 90.0)),
                ms(percentile(v, 99.0)),
                ms(percentile(v, 100.0)),
            );
        }
    }
    let _ = writeln!(md);
}

fn invocation_table(md: &mut String, p: &Pickup) {
    let _ = writeln!(
        md,
        "What each row's fleets did: our invocations by trigger, the wake-ups sent (by reason: \
         `pushed` by the receiver, `due` booked by a batch for a run it left waiting, `backlog` by \
         a filled batch), and the claims the API received (`GET /api/v1/internal/runs/next`: our \
         batches' claims, the reference worker's polls).\n"
    );
    let _ = writeln!(
        md,
        "| wait | setup | Function URL invocations (woke) | wake-ups sent | SQS invocations \
         (claimed nothing) | ticks (claimed nothing) | invocations per run | claims per run |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for kind in Kind::ALL {
        for &setup in kind.setups() {
            let Some(row) = p.rows.get(&(kind, setup)) else {
                continue;
            };
            let t = &row.tally;
            let runs = row.samples_ms.len().max(1) as f64;
            let claims = t.claims as f64 / runs;
            if setup == Setup::Reference {
                let _ = writeln!(
                    md,
                    "| {} | {} | – | – | – | – | – (always on) | {claims:.1} |",
                    kind.describe(),
                    setup.describe(),
                );
                continue;
            }
            let sent = if t.wake_ups.is_empty() {
                "0".to_string()
            } else {
                t.wake_ups
                    .iter()
                    .map(|(reason, n)| format!("{reason} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} ({}) | {sent} | {} ({}) | {} ({}) | {:.2} | {claims:.1} |",
                kind.describe(),
                setup.describe(),
                t.url_invocations,
                t.url_woke,
                t.sqs_invocations,
                t.sqs_empty,
                t.ticks,
                t.ticks_empty,
                t.invocations() as f64 / runs,
            );
        }
    }
    let _ = writeln!(md);
}

fn notes(md: &mut String, p: &Pickup) {
    let row = |k, s| p.rows.get(&(k, s));
    let p50 = |k, s| mid(row(k, s));
    let push_p50 = p50(Kind::Created, Setup::Push);
    let push_p99 = pct(row(Kind::Created, Setup::Push), 99.0);
    let _ = writeln!(
        md,
        "**What Lambda adds on AWS.** Locally the push path is the API's webhook request to the \
         Function URL stand-in, the receiver's two calls (the API's pending count, the queue's \
         depth), the wake-up's send and receive in the process, and the woken invocation's claim. \
         On AWS the wake-up goes through SQS and the event source mapping instead: published \
         measurements put SQS → Lambda at p50 {:.0} ms, p99 {:.0} ms ({SQS_LAMBDA_SOURCE}); with \
         those added, creation → claim would be about {} at p50 and {} at p99 (a sum of \
         percentiles: an upper estimate at p99), plus the API's HTTPS request to the Function URL \
         and a cold start (this function's own is in the cold-start section; Lambda's environment \
         setup comes on top) whenever no environment is warm. Timer wake-ups take the same SQS hop \
         after their delay; a tick is EventBridge's, within its minute.\n",
        SQS_LAMBDA_MS.0,
        SQS_LAMBDA_MS.1,
        ms(push_p50 + SQS_LAMBDA_MS.0),
        ms(push_p99 + SQS_LAMBDA_MS.1),
    );
    due_note(md, p);
    behind_timer_note(md, p);
    errors_note(md, p);
}

fn due_note(md: &mut String, p: &Pickup) {
    let row = |k, s| p.rows.get(&(k, s));
    let p50 = |k, s| mid(row(k, s));
    let p99 = |k, s| pct(row(k, s), 99.0);
    let sleep = (
        p50(Kind::Sleep, Setup::Push),
        p50(Kind::Sleep, Setup::Reference),
        p99(Kind::Sleep, Setup::Push),
        p99(Kind::Sleep, Setup::Reference),
    );
    let retry = (
        p50(Kind::Retry, Setup::Push),
        p50(Kind::Retry, Setup::Reference),
    );
    let schedule = (
        p50(Kind::Sleep, Setup::Schedule),
        p50(Kind::Retry, Setup::Schedule),
    );
    // The looks at sleeping runs that found them still asleep: SQS invocations claiming nothing.
    let looks = row(Kind::Sleep, Setup::Push).map_or(f64::NAN, |r| {
        r.tally.sqs_empty as f64 / r.samples_ms.len().max(1) as f64
    });
    let _ = writeln!(
        md,
        "**Coming due.** A sleeping run is made Pending by the API's own waker, at its ticks every \
         10 s, and no event says so: its timer wake-up comes 1 s after the wake time and watches \
         it, looking again every second until the waker has woken it (`src/wake/timers.rs`, \
         docs/push.md), so with push its p50 is {} and its p99 {}, against the reference's {} and \
         {} (the waker's wait plus one poll). The looks that found the run still asleep are the \
         row's SQS invocations that claimed nothing: {looks:.1} per sleeping run. A retry is \
         claimable once due: its wake-up comes 1 s after, rounded up to a whole second, p50 {} \
         against the reference's {}. The reference's polls back off while it is idle (4 s after 5 \
         empty polls, 6 s after 10), which its rows with long gaps show. With the schedule alone a \
         run's first claim is at a tick, so it comes due a fixed time after that tick and waits \
         for the next: {tick} s − {NAP_SECS} s for a {NAP_SECS} s sleep (p50 {}), {tick} s − 1 s − \
         the backoff for a retry (p50 {}).\n",
        ms(sleep.0),
        ms(sleep.2),
        ms(sleep.1),
        ms(sleep.3),
        ms(retry.0),
        ms(retry.1),
        ms(schedule.0),
        ms(schedule.1),
        tick = TICK.as_secs(),
    );
}

fn behind_timer_note(md: &mut String, p: &Pickup) {
    let Some(row) = p.rows.get(&(Kind::BehindTimer, Setup::Push)) else {
        return;
    };
    let t = &row.tally;
    let n = p.settings.map_or(0, |s| s.max_runs);
    let pushed = t.wake_ups.get("pushed").copied().unwrap_or(0);
    let median_ms = median(&row.samples_ms);
    let verdict = if median_ms > 1000.0 {
        format!(
            "Push is held back: the receiver sends what the backlog needs beyond the wake-ups \
             already on the queue, `ceil(pending / N) − queued`, and counts the delayed ones among \
             them (`ApproximateNumberOfMessagesDelayed` on SQS, every message of the \
             `LocalWakeQueue`), so while one timer wake-up waits on the queue a push wakes the \
             fleet only once more than N = {n} runs are pending, and until then the runs wait \
             for the next tick. Leaving delayed messages out of the count for a push \
             (`ApproximateNumberOfMessages` alone) would let it through"
        )
    } else {
        "Push still woke the fleet at once".to_string()
    };
    let _ = writeln!(
        md,
        "**A timer wake-up on the queue (diagnostic).** In one push fleet a run sleeps \
         {LONG_NAP_SECS} s first (its timer wake-up is delayed on the queue for as long), with \
         schedule ticks as deployed; then {} runs are created as in the first row: p50 {}, max \
         {}; {} pushed for them, {}. {verdict}.\n",
        row.samples_ms.len(),
        ms(median_ms),
        ms(percentile(&row.samples_ms, 100.0)),
        plural(pushed, "wake-up"),
        plural(t.ticks, "tick"),
    );
}

fn errors_note(md: &mut String, p: &Pickup) {
    let errors: Vec<String> = p
        .rows
        .iter()
        .filter(|(_, r)| r.tally.error_count > 0)
        .map(|((k, s), r)| {
            format!(
                "{} / {}: {} ({})",
                k.describe(),
                s.describe(),
                r.tally.error_count,
                r.tally.errors.join("; ")
            )
        })
        .collect();
    if errors.is_empty() {
        let _ = writeln!(md, "No invocation reported an error.\n");
    } else {
        let _ = writeln!(md, "Errors reported: {}.\n", errors.join(" — "));
    }
}

/// `n` and `what`, with an `s` unless `n` is 1.
fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `ms` milliseconds, as ms under a second and as s above.
fn ms(ms: f64) -> String {
    if ms.is_nan() {
        "–".to_string()
    } else if ms.abs() < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickup::Tally;

    fn row(samples: &[f64], tally: Tally) -> Row {
        Row {
            lanes: 1,
            samples_ms: samples.to_vec(),
            tally,
            claimed_by: [("pushed".to_string(), samples.len())].into(),
        }
    }

    #[test]
    fn the_section_states_the_targets_from_the_rows() {
        let settings = PickupSettings {
            runs: 2,
            seed: 20,
            concurrency: 2,
            max_runs: 8,
        };
        let push = Tally {
            url_invocations: 6,
            url_woke: 2,
            sqs_invocations: 2,
            ..Tally::default()
        };
        let mut p = Pickup {
            settings: Some(settings),
            ..Pickup::default()
        };
        p.rows
            .insert((Kind::Created, Setup::Push), row(&[8.0, 12.0], push));
        p.rows.insert(
            (Kind::Created, Setup::Reference),
            row(&[900.0, 1900.0], Tally::default()),
        );
        let mut md = String::new();
        section(&mut md, &p);
        assert!(md.contains("| p99 12.0 ms, p50 10.0 ms | yes |"), "{md}");
        assert!(
            md.contains("| p99 1.90 s, p50 1.40 s | yes: seconds |"),
            "{md}"
        );
        assert!(md.contains("8 invocations for 2 runs"), "{md}");
        assert!(md.contains("| 6 (2) | 0 | 2 (0) | 0 (0) | 4.00 |"), "{md}");
        let mut skipped = String::new();
        section(
            &mut skipped,
            &Pickup {
                skipped: Some("not measured: --pickup-runs 0".into()),
                ..Pickup::default()
            },
        );
        assert!(skipped.contains("not measured: --pickup-runs 0"));
    }

    #[test]
    fn durations_read_as_ms_below_a_second() {
        assert_eq!(ms(12.345), "12.3 ms");
        assert_eq!(ms(1234.0), "1.23 s");
        assert_eq!(ms(f64::NAN), "–");
    }
}
