//! The local runner's command line (`ironflow-lambda-local`): help, and arguments it refuses.

use std::process::Command;

const LOCAL: &str = env!("CARGO_BIN_EXE_ironflow-lambda-local");

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(LOCAL).args(args).output().unwrap();
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
        assert!(stdout.contains("usage: ironflow-lambda-local"), "{stdout}");
        assert!(stdout.contains("--serve [PORT]"), "{stdout}");
    }
}

#[test]
fn bad_arguments_are_named_with_the_usage() {
    let (code, _, stderr) = run(&["--bogus"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--bogus"), "{stderr}");
    assert!(stderr.contains("usage: ironflow-lambda-local"), "{stderr}");

    for port in ["0", "70000", "http"] {
        let (code, _, stderr) = run(&["--serve", port]);
        assert_eq!(code, Some(1), "{port}: {stderr}");
        assert!(
            stderr.contains("--serve takes a TCP port (1-65535)") && stderr.contains(port),
            "{stderr}"
        );
    }
}
