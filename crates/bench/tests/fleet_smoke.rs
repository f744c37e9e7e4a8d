//! Smoke test of the bench's fleet section (issue 28; `.ci/run` runs it through
//! `./scripts/test`): `ironflow-lambda-bench fleet` at F = 2 on every workload, each window
//! closing once 3 runs have ended in it, on PostgreSQL when `IRONFLOW_TEST_POSTGRES_URL` names
//! a server (as `scripts/test` sets it), else on the in-memory store. It checks that the runs
//! completed without an error and that the section has its rows; no timing is asserted.

use std::process::Command;

/// The workloads' headings in the section, as the report names them.
const WORKLOADS: [&str; 3] = [
    "### no-op (a handler with no step)",
    "### three-step shell (`echo` ×3)",
    "### I/O-bound (`sleep 1` ×3)",
];

#[test]
fn two_workers_of_each_kind_run_every_workload_without_an_error_and_the_section_has_its_rows() {
    let out = Command::new(env!("CARGO_BIN_EXE_ironflow-lambda-bench"))
        .args([
            "fleet",
            "--fleets",
            "2",
            "--warmup-secs",
            "0",
            "--window-secs",
            "0",
            "--min-runs",
            "3",
            "--print-only",
        ])
        .output()
        .expect("the bench binary starts");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the fleet section failed ({}):\n{stderr}",
        out.status
    );

    // Every cell ran at least its 3 runs, with no error.
    let cells: Vec<&str> = stderr.lines().filter(|l| l.starts_with("fleet ")).collect();
    assert_eq!(cells.len(), 6, "3 workloads × 2 workers:\n{stderr}");
    for cell in &cells {
        let runs: u64 = cell
            .split_once(" runs/s (")
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no run count in {cell:?}"));
        assert!(runs >= 3, "fewer than 3 runs ended: {cell}");
        assert!(cell.ends_with("errors 0"), "errors: {cell}");
    }

    assert!(
        stdout.contains("## Fleet scale: many workers at once on one API and PostgreSQL"),
        "{stdout}"
    );
    for (i, heading) in WORKLOADS.iter().enumerate() {
        let start = stdout
            .find(heading)
            .unwrap_or_else(|| panic!("no {heading:?}:\n{stdout}"));
        let end = WORKLOADS
            .get(i + 1)
            .and_then(|next| stdout.find(next))
            .or_else(|| stdout.find("### Ours / reference"))
            .expect("the ratio table follows the workloads");
        let part = &stdout[start..end];
        for worker in ["reference", "ours"] {
            let rows: Vec<&str> = part
                .lines()
                .filter(|l| l.starts_with(&format!("| 2 | {worker} |")))
                .collect();
            assert_eq!(rows.len(), 2, "{heading}: {worker}'s two rows:\n{part}");
            assert!(rows[0].ends_with("| 0 |"), "errors in {:?}", rows[0]);
        }
        assert!(part.contains(&format!("- {}: peak", "ours")), "{part}");
    }
    for ratio in ["| noop | 2 |", "| shell | 2 |", "| sleep | 2 |"] {
        assert!(stdout.contains(ratio), "no ratio row {ratio:?}:\n{stdout}");
    }
    assert!(
        stdout.contains("### Projection: runs/s per API core"),
        "{stdout}"
    );
}
