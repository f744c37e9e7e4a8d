//! The local runner (`ironflow-lambda-local`, the README's first command): the main job end to
//! end, help, and arguments it refuses.

use std::process::Command;

const LOCAL: &str = env!("CARGO_BIN_EXE_ironflow-lambda-local");

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    run_with(args, &[])
}

fn run_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(LOCAL)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_prints_the_usage_and_succeeds() {
    for flag in ["--help", "-h"] {
        let (code, stdout, _) = run(&[flag]);
        assert_eq!(code, Some(0), "{flag}: {stdout}");
        assert!(stdout.contains("Usage: ironflow-lambda-local"), "{stdout}");
        assert!(stdout.contains("--serve [<PORT>]"), "{stdout}");
        assert!(stdout.contains("--run <WORKFLOW[=JSON]>"), "{stdout}");
    }
}

#[test]
fn bad_arguments_are_named_with_the_usage() {
    // clap's usage errors exit with status 2 and name the argument.
    let (code, _, stderr) = run(&["--bogus"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--bogus"), "{stderr}");
    assert!(stderr.contains("Usage: ironflow-lambda-local"), "{stderr}");

    for port in ["0", "70000", "http"] {
        let (code, _, stderr) = run(&["--serve", port]);
        assert_eq!(code, Some(2), "{port}: {stderr}");
        assert!(
            stderr.contains("invalid value") && stderr.contains(port) && stderr.contains("--serve"),
            "{stderr}"
        );
    }
    for (args, expected) in [
        (&["--run", "greet"][..], "--serve"),
        (
            &["--serve", "3000", "--run", "greet=notjson"][..],
            "not JSON",
        ),
        (
            &["--serve", "3000", "--run", "greet=[1]"][..],
            "must be a JSON object",
        ),
        (
            &["--serve", "3000", "--run", "={}"][..],
            "with a workflow name",
        ),
    ] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// The number just before `after` in `line` (`"7 = 5 from"`, after `" from"`: 5).
fn number_before(line: &str, after: &str) -> usize {
    let head = &line[..line
        .find(after)
        .unwrap_or_else(|| panic!("{after:?} in {line}"))];
    head.split_whitespace()
        .last()
        .and_then(|n| n.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("a number before {after:?} in {line}"))
}

fn line_starting<'a>(stdout: &'a str, start: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?}: {stdout}"))
}

#[test]
fn the_main_job_drains_every_run_on_push_and_counts_steps_by_position() {
    let (code, stdout, stderr) = run_with(&[], &[("RUST_LOG", "info")]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("all 14 runs are terminal"), "{stdout}");
    // The agent runs (crates/local/src/agents.rs): the example's patterns on the Bedrock provider
    // against the scripted model server, the human review approved by the runner while it waited.
    for (workflow, steps) in [
        ("prompt-chaining ", " 3/3"),
        ("human-review ", " 3/3"),
        ("structured-output ", " 1/1"),
    ] {
        let row = line_starting(&stdout, workflow);
        assert!(row.contains("Completed") && row.contains(steps), "{row}");
        // Its tokens in/out (the server's counts) and its cost (Nova Lite's price) in the table.
        let cells: Vec<&str> = row.split_whitespace().collect();
        // A completed run has no error: its last cells are tokens in/out, then the cost.
        let (tokens, cost) = (cells[cells.len() - 2], cells[cells.len() - 1]);
        let (tokens_in, tokens_out) = tokens
            .split_once('/')
            .unwrap_or_else(|| panic!("no tokens in/out in {row}"));
        assert!(tokens_in.parse::<u64>().unwrap() > 0, "{row}");
        assert!(tokens_out.parse::<u64>().unwrap() > 0, "{row}");
        assert!(cost.parse::<f64>().unwrap() > 0.0, "{row}");
    }
    let approved = line_starting(&stdout, "approved human-review run ");
    let review = line_starting(&stdout, "human-review ");
    assert!(
        review.contains(
            approved
                .split_whitespace()
                .nth(3)
                .unwrap()
                .trim_end_matches(',')
        ),
        "{approved} / {review}"
    );
    // Six steps, the invalid structured answer asked again: seven calls at least (one more per
    // call a handback cut).
    let calls = line_starting(&stdout, "model calls: ");
    assert!(number_before(calls, " (") >= 7, "{calls}");
    // The multi-step runs outlast one invocation: handed back once or more, their interrupted
    // step shows as an earlier attempt, not as a step left undone.
    let multi: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("multi-step ") && l.contains("Completed"))
        .collect();
    assert_eq!(multi.len(), 2, "{stdout}");
    for row in multi {
        assert!(row.contains(" 3/3 +"), "{row}");
        assert!(row.contains("earlier attempt"), "{row}");
    }

    // Runs start on push: the API's webhook reached the receiver, whose wake-ups, taken from
    // the queue, started invocations that claimed the runs.
    let webhook = line_starting(&stdout, "the API's webhook: ");
    assert!(number_before(webhook, " events posted") >= 11, "{webhook}");
    assert!(
        number_before(webhook, " of them sent wake-ups") > 0,
        "{webhook}"
    );
    assert!(!webhook.contains("answered with an error"), "{webhook}");
    let invocations = line_starting(&stdout, "invocations: ");
    assert!(
        number_before(invocations, " from the wake queue") > 0,
        "{invocations}"
    );
    assert!(
        number_before(invocations, " with a pushed wake-up") > 0,
        "{invocations}"
    );
    let wake_ups = line_starting(&stdout, "wake-ups taken from the queue: ");
    assert!(number_before(wake_ups, " pushed") > 0, "{wake_ups}");
    let claims = line_starting(&stdout, "claims: ");
    // Every run is claimed at least once, the handed-back ones again.
    let by_wake_ups = number_before(claims, " by wake-up invocations");
    assert!(by_wake_ups > 0, "{claims}");
    assert!(
        by_wake_ups + number_before(claims, " by schedule ticks") >= 13,
        "{claims}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("invocation ")
            && l.contains("pushed")
            && !l.contains("\"claimed\":0,")),
        "an invocation of pushed wake-ups claimed runs: {stdout}"
    );

    // Each run's time from creation to its first claim, in the table.
    let header = line_starting(&stdout, "workflow ");
    assert!(header.contains("created → claimed"), "{header}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            ["quick-shell ", "multi-step ", "flaky ", "always-fails "]
                .iter()
                .any(|w| l.starts_with(w))
        })
        .collect();
    assert_eq!(rows.len(), 11, "{stdout}");
    for row in rows {
        let ms = number_before(row, " ms ");
        // Generous: a push claims within milliseconds; the safety net's tick, within seconds.
        assert!(ms < 60_000, "{row}");
    }

    // A pipe, not a terminal: no colour codes in the worker's logs.
    assert!(
        stdout.contains("INFO"),
        "RUST_LOG=info shows the logs: {stdout}"
    );
    assert!(!stdout.contains('\x1b'), "colour codes in piped output");
}
