//! The command line: the default mode, or `--serve [PORT]` with `--run WORKFLOW[=JSON]`, on
//! the in-memory store or `--database-url`.

use std::num::NonZeroU16;

use clap::Parser;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "ironflow-lambda-local",
    about = "Run ironflow-lambda end to end on the embedded ironflow API (no AWS account): the \
             sample runs, started on push (the API's webhook, the receiver's wake-ups, simulated \
             SQS invocations), until every one is terminal, then their table"
)]
pub struct Args {
    /// Instead, keep the API up on 127.0.0.1:PORT (default 3000) with the runs pending, for a
    /// function under `cargo lambda watch`; Ctrl-C prints the table of runs. 1 to 65535.
    #[arg(
        long,
        value_name = "PORT",
        num_args = 0..=1,
        default_missing_value = "3000",
        allow_negative_numbers = true,
        value_parser = parse_port
    )]
    pub serve: Option<NonZeroU16>,
    /// The API's store: a PostgreSQL database (postgres://user:password@host:5432/db; its
    /// migrations are applied) instead of the in-memory default.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        value_name = "URL",
        value_parser = parse_database_url
    )]
    pub database_url: Option<String>,
    /// With --serve: create a run of WORKFLOW, with the JSON object after `=` as its payload
    /// (e.g. --run 'greet={"name":"Ada"}'), instead of the sample runs. Repeatable.
    #[arg(long = "run", value_name = "WORKFLOW[=JSON]", requires = "serve", value_parser = parse_run)]
    pub runs: Vec<RunSpec>,
}

/// A run to create: its workflow and payload.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub workflow: String,
    pub payload: serde_json::Value,
}

/// A PostgreSQL URL (`postgres://` or `postgresql://`); empty, as an unset variable often is,
/// means none (the in-memory store). The error never shows the URL (it may hold a password).
fn parse_database_url(arg: &str) -> Result<String, String> {
    let url = arg.trim();
    if url.is_empty() || url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(url.to_string())
    } else {
        Err("expected a PostgreSQL URL such as postgres://user:password@host:5432/db".into())
    }
}

/// A TCP port, 1 to 65535; anything else (0, a sign, text) is refused with the range.
fn parse_port(arg: &str) -> Result<NonZeroU16, String> {
    arg.trim()
        .parse::<i64>()
        .ok()
        .and_then(|port| u16::try_from(port).ok())
        .and_then(NonZeroU16::new)
        .ok_or(format!("expected a port from 1 to 65535, got {arg:?}"))
}

/// `WORKFLOW` or `WORKFLOW=JSON` (a JSON object).
fn parse_run(arg: &str) -> Result<RunSpec, String> {
    let (workflow, payload) = match arg.split_once('=') {
        Some((workflow, json)) => {
            let payload: serde_json::Value = serde_json::from_str(json)
                .map_err(|e| format!("the payload after '=' is not JSON ({e}): {json}"))?;
            if !payload.is_object() {
                return Err(format!(
                    "the payload after '=' must be a JSON object, got {json}"
                ));
            }
            (workflow, payload)
        }
        None => (arg, serde_json::json!({})),
    };
    if workflow.trim().is_empty() {
        return Err("expected WORKFLOW or WORKFLOW=JSON, with a workflow name".into());
    }
    Ok(RunSpec {
        workflow: workflow.trim().to_string(),
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(args: &[&str]) -> String {
        Args::try_parse_from(std::iter::once("ironflow-lambda-local").chain(args.iter().copied()))
            .expect_err("refused")
            .render()
            .to_string()
    }

    #[test]
    fn serve_takes_a_port_from_1_to_65535_and_names_the_range_otherwise() {
        for port in ["0", "-1", "65536", "http"] {
            let message = refused(&["--serve", port]);
            assert!(
                message.contains("expected a port from 1 to 65535"),
                "{port}: {message}"
            );
        }
        let args = Args::try_parse_from(["ironflow-lambda-local", "--serve", "65535"]).unwrap();
        assert_eq!(args.serve.map(NonZeroU16::get), Some(65535));
        let args = Args::try_parse_from(["ironflow-lambda-local", "--serve"]).unwrap();
        assert_eq!(args.serve.map(NonZeroU16::get), Some(3000));
    }
}
