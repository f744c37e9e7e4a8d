//! The worker token read from Secrets Manager at cold start, against moto's Secrets Manager
//! (started by `./scripts/test`, URL in `IRONFLOW_TEST_MOTO_ENDPOINT`) with the real SDK.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_secretsmanager::config::Credentials;
use aws_sdk_secretsmanager::primitives::Blob;
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::SecretError;
use ironflow_lambda::settings::ConfigError;
use ironflow_lambda::settings::WORKER_TOKEN_SECRET_ARN_VAR;
use ironflow_lambda::{BuildError, LambdaWorkerBuilder};

/// A secret with a name no other test uses; returns its ARN.
async fn create_secret(aws: &SdkConfig, string: Option<&str>, binary: Option<&[u8]>) -> String {
    let client = aws_sdk_secretsmanager::Client::new(aws);
    let name = format!("ironflow/worker-token-{}", uuid::Uuid::new_v4());
    let mut request = client.create_secret().name(name);
    if let Some(s) = string {
        request = request.secret_string(s);
    }
    if let Some(b) = binary {
        request = request.secret_binary(Blob::new(b));
    }
    request.send().await.unwrap().arn().unwrap().to_string()
}

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

async fn build(
    vars: &[(&str, &str)],
    aws: &SdkConfig,
) -> Result<ironflow_lambda::LambdaWorker, BuildError> {
    LambdaWorkerBuilder::from_lookup_and_secrets(lookup(vars), aws)
        .await?
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .build()
}

#[tokio::test]
async fn the_token_comes_from_the_secret_when_only_the_arn_is_set() {
    let aws = common::moto::aws_config().await;
    let arn = create_secret(&aws, Some("tok-from-secrets-manager\n"), None).await;
    let worker = build(
        &[
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            (WORKER_TOKEN_SECRET_ARN_VAR, &arn),
        ],
        &aws,
    )
    .await
    .unwrap();
    assert_eq!(
        worker.settings().worker_token.expose(),
        "tok-from-secrets-manager"
    );
    assert!(!format!("{:?}", worker.settings()).contains("tok-from-secrets-manager"));
}

#[tokio::test]
async fn a_plain_token_wins_over_the_secret() {
    let aws = common::moto::aws_config().await;
    let arn = create_secret(&aws, Some("from-secret"), None).await;
    let worker = build(
        &[
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            ("IRONFLOW_WORKER_TOKEN", "from-env"),
            (WORKER_TOKEN_SECRET_ARN_VAR, &arn),
        ],
        &aws,
    )
    .await
    .unwrap();
    assert_eq!(worker.settings().worker_token.expose(), "from-env");
}

#[tokio::test]
async fn an_unknown_secret_names_the_variable_and_the_arn() {
    let aws = common::moto::aws_config().await;
    let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:ironflow/missing-AbC123";
    let err = build(
        &[
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            (WORKER_TOKEN_SECRET_ARN_VAR, arn),
        ],
        &aws,
    )
    .await
    .err()
    .unwrap();
    let BuildError::Secret(SecretError::Fetch {
        variable,
        secret_arn,
        reason,
    }) = &err
    else {
        panic!("expected a fetch error, got {err:?}");
    };
    assert_eq!(*variable, WORKER_TOKEN_SECRET_ARN_VAR);
    assert_eq!(secret_arn, arn);
    assert!(reason.contains("ResourceNotFound"), "{reason}");
    let message = err.to_string();
    assert!(message.contains(WORKER_TOKEN_SECRET_ARN_VAR) && message.contains(arn));
}

#[tokio::test]
async fn a_binary_or_blank_secret_is_refused_without_its_value() {
    let aws = common::moto::aws_config().await;
    for arn in [
        create_secret(&aws, None, Some(b"binary-token-bytes")).await,
        create_secret(&aws, Some("  \n"), None).await,
    ] {
        let err = build(
            &[
                ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
                (WORKER_TOKEN_SECRET_ARN_VAR, &arn),
            ],
            &aws,
        )
        .await
        .err()
        .unwrap();
        assert!(
            matches!(&err, BuildError::Secret(SecretError::NotAString { secret_arn, .. }) if *secret_arn == arn),
            "{err:?}"
        );
        assert!(!err.to_string().contains("binary-token-bytes"), "{err}");
    }
}

#[tokio::test]
async fn a_token_secret_the_variable_would_refuse_is_refused_without_its_value() {
    let aws = common::moto::aws_config().await;
    for value in [
        "tok-with space-x1",
        "tok-line\nbreak-x2",
        "tok-bell\u{7}-x3",
        "tok-tab\tx4",
    ] {
        let arn = create_secret(&aws, Some(value), None).await;
        let err = build(
            &[
                ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
                (WORKER_TOKEN_SECRET_ARN_VAR, &arn),
            ],
            &aws,
        )
        .await
        .err()
        .unwrap();
        assert!(
            matches!(&err, BuildError::Secret(SecretError::Unusable { secret_arn, .. }) if *secret_arn == arn),
            "{value:?}: {err:?}"
        );
        let message = format!("{err} {err:?}");
        assert!(message.contains("visible ASCII"), "{message}");
        for part in value.split(|c: char| !c.is_ascii_graphic()) {
            assert!(!message.contains(part), "the value leaked: {message}");
        }
    }
}

#[tokio::test]
async fn a_secret_pasted_into_an_arn_variable_is_never_echoed() {
    let aws = common::moto::aws_config().await;
    for variable in [WORKER_TOKEN_SECRET_ARN_VAR, "IRONFLOW_WEBHOOK_SECRET_ARN"] {
        let err = build(
            &[
                ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
                ("IRONFLOW_WORKER_TOKEN", "t"),
                (variable, "tok-PASTED-by-mistake-77"),
            ],
            &aws,
        )
        .await
        .err()
        .unwrap();
        let message = format!("{err} {err:?}");
        assert!(
            message.contains(variable) && message.contains("ARN"),
            "{message}"
        );
        assert!(!message.contains("PASTED"), "the value leaked: {message}");
    }
}

#[tokio::test]
async fn a_secret_arn_does_not_hide_the_other_variables_problems() {
    let aws = common::moto::aws_config().await;
    let unknown = "arn:aws:secretsmanager:us-east-1:123456789012:secret:no-such-secret-AbCdEf";
    for (variable, value) in [
        // Malformed (a value pasted by mistake) or well formed but unreadable: either way the
        // other variables' problems are named before any secret is read.
        (WORKER_TOKEN_SECRET_ARN_VAR, "tok-PASTED-by-mistake-77"),
        (WORKER_TOKEN_SECRET_ARN_VAR, unknown),
        ("IRONFLOW_WEBHOOK_SECRET_ARN", "tok-PASTED-by-mistake-77"),
        ("IRONFLOW_WEBHOOK_SECRET_ARN", unknown),
    ] {
        let mut vars = vec![
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            ("IRONFLOW_CONCURRENCY", "0"),
            ("IRONFLOW_POISON_MODE", "explode"),
            (variable, value),
        ];
        if variable != WORKER_TOKEN_SECRET_ARN_VAR {
            vars.push(("IRONFLOW_WORKER_TOKEN", "t"));
        }
        let err = build(&vars, &aws).await.err().unwrap();
        let message = format!("{err}");
        for named in ["IRONFLOW_CONCURRENCY", "IRONFLOW_POISON_MODE"] {
            assert!(
                message.contains(named),
                "{variable}={value}: {named} not named in: {message}"
            );
        }
        assert!(!message.contains("PASTED"), "the value leaked: {message}");
    }
}

#[tokio::test]
async fn neither_token_nor_arn_names_both_variables() {
    let aws = SdkConfig::builder().build();
    let err = build(&[("IRONFLOW_API_URL", "http://127.0.0.1:3000")], &aws)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            &err,
            BuildError::Config(ConfigError::Missing {
                variable: "IRONFLOW_WORKER_TOKEN",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(WORKER_TOKEN_SECRET_ARN_VAR),
        "{err}"
    );
}

#[tokio::test]
async fn a_secrets_manager_that_never_answers_fails_the_cold_start_naming_the_secret() {
    // Fault injection, not a stand-in for Secrets Manager: a socket that accepts connections and
    // never answers, to show the cold start's call is bounded.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let aws = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .load()
        .await;
    let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:ironflow/silent-AbC123";
    let err = build(
        &[
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            (WORKER_TOKEN_SECRET_ARN_VAR, arn),
        ],
        &aws,
    )
    .await
    .err()
    .unwrap();
    let BuildError::Secret(SecretError::Fetch {
        secret_arn, reason, ..
    }) = &err
    else {
        panic!("expected a fetch error, got {err:?}");
    };
    assert_eq!(secret_arn, arn);
    assert!(
        reason.contains("timeout") || reason.contains("timed out"),
        "{reason}"
    );
}

/// A token rotated in Secrets Manager (and on the API) while the instance is warm: the first call
/// the API refuses re-reads the secret and goes out again with the new token.
#[tokio::test]
async fn a_token_rotated_while_the_instance_is_warm_is_read_again_when_the_api_refuses_it() {
    let h = common::Harness::start().await;
    let aws = common::moto::aws_config().await;
    let arn = create_secret(&aws, Some("the-token-before-rotation"), None).await;
    let url = h.api.url();
    let worker = LambdaWorkerBuilder::from_lookup_and_secrets(
        lookup(&[
            ("IRONFLOW_API_URL", url.as_str()),
            (WORKER_TOKEN_SECRET_ARN_VAR, &arn),
        ]),
        &aws,
    )
    .await
    .unwrap()
    .provider(Arc::new(ClaudeCodeProvider::new()))
    .register(common::ShellWorkflow::one("quick", "true"))
    .deadline_margin(std::time::Duration::from_millis(500))
    .build()
    .unwrap();
    // The rotation: the secret now holds the token the API accepts.
    aws_sdk_secretsmanager::Client::new(&aws)
        .put_secret_value()
        .secret_id(&arn)
        .secret_string(h.api.token())
        .send()
        .await
        .unwrap();
    let id = h.create("quick", 0).await;

    let summary = h.invoke(&worker, std::time::Duration::from_secs(30)).await;

    assert_eq!(
        summary.count(ironflow_lambda::Outcome::Completed),
        1,
        "{summary:?}"
    );
    assert_eq!(
        h.status(id).await,
        ironflow_store::entities::RunStatus::Completed
    );
    assert!(
        summary
            .api_errors
            .iter()
            .any(|e| e.kind == ironflow_lambda::report::FaultKind::Unauthorized),
        "{summary:?}"
    );
}
