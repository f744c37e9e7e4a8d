//! What cfn-lint and `sam validate --lint` cannot see in template.yaml (both run in
//! `./scripts/test`): the queue's visibility timeout against the function timeout, partial batch
//! responses, the poison-pill table against the code, the environment the code reads, IAM scoped
//! to this stack's own resources, `infra/iam-policy.json` equal to the role's policy, and the
//! local stack (`infra/local_stack.py`) creating in moto what the template declares.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_sqs::types::QueueAttributeName;
use ironflow_lambda::poison::dynamodb::{PARTITION_KEY, TTL_ATTRIBUTE};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// YAML → JSON, CloudFormation's short tags in their long form (`!Ref X` → `{"Ref": "X"}`,
/// `!GetAtt A.B` → `{"Fn::GetAtt": ["A", "B"]}`, `!Sub s` → `{"Fn::Sub": s}`, ...).
fn to_json(value: yaml_serde::Value) -> Value {
    use yaml_serde::Value as Y;
    match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                json!(i)
            } else if let Some(u) = n.as_u64() {
                json!(u)
            } else {
                json!(n.as_f64())
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(items.into_iter().map(to_json).collect()),
        Y::Mapping(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let key = match to_json(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Y::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let name = tag.trim_start_matches('!');
            let inner = to_json(tagged.value);
            match name {
                "Ref" | "Condition" => json!({ name: inner }),
                "GetAtt" => match inner {
                    Value::String(s) => {
                        let (resource, attribute) = s.split_once('.').expect("!GetAtt A.B");
                        json!({ "Fn::GetAtt": [resource, attribute] })
                    }
                    other => json!({ "Fn::GetAtt": other }),
                },
                _ => json!({ format!("Fn::{name}"): inner }),
            }
        }
    }
}

fn template() -> Value {
    let text = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    to_json(yaml_serde::from_str(&text).unwrap())
}

fn resource<'a>(t: &'a Value, logical_id: &str) -> &'a Value {
    let r = &t["Resources"][logical_id];
    assert!(r.is_object(), "template.yaml has no resource {logical_id}");
    r
}

fn param_default(t: &Value, name: &str) -> i64 {
    t["Parameters"][name]["Default"]
        .as_i64()
        .unwrap_or_else(|| panic!("parameter {name} has no numeric default"))
}

fn function(t: &Value) -> &Value {
    &resource(t, "WorkerFunction")["Properties"]
}

/// The role's policy statements, `!If [cond, statement, AWS::NoValue]` taken as the statement.
fn role_statements(t: &Value) -> Vec<Value> {
    let policies = resource(t, "WorkerRole")["Properties"]["Policies"]
        .as_array()
        .unwrap();
    assert_eq!(
        policies.len(),
        1,
        "one inline policy, mirrored by infra/iam-policy.json"
    );
    policies[0]["PolicyDocument"]["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| match s.get("Fn::If") {
            Some(branches) => {
                assert_eq!(branches[2], json!({"Ref": "AWS::NoValue"}));
                branches[1].clone()
            }
            None => s.clone(),
        })
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        other => panic!("expected a string or a list of strings, found {other}"),
    }
}

#[test]
fn the_function_is_the_arm64_cargo_lambda_build_of_the_deployable_binary() {
    let t = template();
    let f = resource(&t, "WorkerFunction");
    assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda");
    assert_eq!(
        f["Metadata"]["BuildProperties"]["Binary"],
        "ironflow-lambda"
    );
    let p = &f["Properties"];
    assert_eq!(p["Runtime"], "provided.al2023");
    assert_eq!(p["Architectures"], json!(["arm64"]));
    assert_eq!(p["Handler"], "bootstrap");
    assert_eq!(p["CodeUri"], ".");

    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("name = \"ironflow-lambda\"\npath = \"src/bin/ironflow-lambda.rs\""),
        "Cargo.toml declares the binary the template builds"
    );
    // sam build cannot pass cargo flags: the worker crate itself has no embedded API (it lives
    // in crates/local-api, a dev-dependency of the tests only), so nothing has to be left out.
    let dependencies: String = cargo
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .collect();
    for embedded in ["ironflow-api", "ironflow-local-api", "axum"] {
        assert!(
            !dependencies.contains(&format!("\n{embedded} ")),
            "the deployed binary does not link {embedded}"
        );
    }
}

/// `cargo lambda build --release` (what `sam build` runs) sets `panic = "abort"`, `lto` and
/// `codegen-units` itself unless `[profile.release]` states them: a run's panic must unwind to
/// the handler (src/execution.rs catches it, records it and retries the run).
#[test]
fn the_deployed_build_unwinds_panics() {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let release: Vec<&str> = cargo
        .lines()
        .skip_while(|l| l.trim() != "[profile.release]")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(str::trim)
        .collect();
    assert!(
        release.contains(&"panic = \"unwind\""),
        "[profile.release] in Cargo.toml states panic = \"unwind\": {release:?}"
    );
    for key in ["lto", "codegen-units"] {
        assert!(
            release.iter().any(|l| l.starts_with(&format!("{key} ="))),
            "[profile.release] in Cargo.toml states {key}: {release:?}"
        );
    }
}

#[test]
fn the_wake_queue_visibility_timeout_is_at_least_six_function_timeouts() {
    let t = template();
    assert_eq!(function(&t)["Timeout"], json!({"Ref": "FunctionTimeout"}));
    let allowed: BTreeSet<i64> = t["Parameters"]["FunctionTimeout"]["AllowedValues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert!(allowed.contains(&param_default(&t, "FunctionTimeout")));
    assert!(
        allowed.iter().all(|&s| (1..=900).contains(&s)),
        "Lambda allows 1..=900 s"
    );

    let rows = t["Mappings"]["VisibilityTimeoutByFunctionTimeout"]
        .as_object()
        .unwrap();
    let keys: BTreeSet<i64> = rows.keys().map(|k| k.parse().unwrap()).collect();
    assert_eq!(
        keys, allowed,
        "one mapping row per allowed function timeout"
    );
    for (timeout, row) in rows {
        let timeout: i64 = timeout.parse().unwrap();
        let visibility = row["Seconds"].as_i64().unwrap();
        assert!(
            visibility >= 6 * timeout,
            "visibility timeout {visibility} s < 6 × function timeout {timeout} s"
        );
        assert!(visibility <= 43_200, "SQS allows at most 12 hours");
    }
    assert_eq!(
        resource(&t, "WakeQueue")["Properties"]["VisibilityTimeout"],
        json!({"Fn::FindInMap": ["VisibilityTimeoutByFunctionTimeout", {"Ref": "FunctionTimeout"}, "Seconds"]})
    );
}

#[test]
fn the_deadline_margin_is_below_every_allowed_function_timeout() {
    let t = template();
    let env = &function(&t)["Environment"]["Variables"];
    assert_eq!(
        env["IRONFLOW_FUNCTION_TIMEOUT_SECS"],
        json!({"Ref": "FunctionTimeout"})
    );
    assert_eq!(
        env["IRONFLOW_DEADLINE_MARGIN_MS"],
        json!({"Ref": "DeadlineMarginMs"})
    );
    let shortest = t["Parameters"]["FunctionTimeout"]["AllowedValues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .min()
        .unwrap();
    let margin = &t["Parameters"]["DeadlineMarginMs"];
    assert!(margin["MaxValue"].as_i64().unwrap() < shortest * 1000);
    assert_eq!(
        param_default(&t, "DeadlineMarginMs") as u128,
        ironflow_lambda::settings::DEFAULT_DEADLINE_MARGIN.as_millis(),
        "the template's default margin is the code's"
    );
}

#[test]
fn wake_ups_report_partial_batch_failures_with_bounded_concurrency() {
    let t = template();
    let events = function(&t)["Events"].as_object().unwrap();
    let sqs: Vec<&Value> = events.values().filter(|e| e["Type"] == "SQS").collect();
    assert_eq!(sqs.len(), 1, "one SQS event source: the wake-up queue");
    let p = &sqs[0]["Properties"];
    assert_eq!(p["Queue"], json!({"Fn::GetAtt": ["WakeQueue", "Arn"]}));
    assert_eq!(
        p["FunctionResponseTypes"],
        json!(["ReportBatchItemFailures"])
    );
    assert_eq!(p["BatchSize"], json!({"Ref": "WakeBatchSize"}));
    assert_eq!(
        p["MaximumBatchingWindowInSeconds"],
        json!({"Ref": "WakeBatchingWindowSecs"})
    );
    assert_eq!(
        p["ScalingConfig"]["MaximumConcurrency"],
        json!({"Ref": "WakeMaximumConcurrency"})
    );
    // Lambda refuses a batch above 10 without a batching window: the defaults respect it, and
    // the template's rule refuses other values that do not, before anything is deployed.
    if param_default(&t, "WakeBatchSize") > 10 {
        assert!(param_default(&t, "WakeBatchingWindowSecs") >= 1);
    }
    for (size, window, accepted) in [
        ("10", "0", true),
        ("1", "0", true),
        ("11", "0", false),
        ("10000", "0", false),
        ("11", "1", true),
        ("10000", "300", true),
    ] {
        let params = BTreeMap::from([
            ("WakeBatchSize", size),
            ("WakeBatchingWindowSecs", window),
            ("IronflowApiUrl", "https://ironflow.example.com"),
            ("InsecureIronflowApiUrl", ""),
        ]);
        assert_eq!(
            rules_accept(&t, &params),
            accepted,
            "WakeBatchSize {size} with WakeBatchingWindowSecs {window}"
        );
    }
    // The queue must not be able to start more instances than are reserved.
    let reserved = param_default(&t, "ReservedConcurrency");
    if reserved != -1 {
        assert!(param_default(&t, "WakeMaximumConcurrency") <= reserved);
    }

    let schedules: Vec<&Value> = events
        .values()
        .filter(|e| e["Type"] == "Schedule")
        .collect();
    assert_eq!(schedules.len(), 1);
    assert_eq!(
        schedules[0]["Properties"]["Schedule"],
        json!({"Ref": "ScheduleExpression"})
    );
    assert_eq!(
        schedules[0]["Properties"]["State"],
        json!({"Ref": "ScheduleState"})
    );
    assert_eq!(
        t["Parameters"]["ScheduleState"]["AllowedValues"],
        json!(["ENABLED", "DISABLED"])
    );
}

/// Whether every rule of the template's `Rules` accepts `params` (parameter values as
/// CloudFormation hands them to rules: strings). Evaluates the rule functions the template uses:
/// `Fn::Equals`, `Fn::Contains`, `Fn::Not`, `Fn::And`, `Fn::Or` and `Ref`; panics on others.
fn rules_accept(t: &Value, params: &BTreeMap<&str, &str>) -> bool {
    fn eval(v: &Value, params: &BTreeMap<&str, &str>) -> Value {
        let Some((f, args)) = v.as_object().and_then(|o| o.iter().next()) else {
            return v.clone();
        };
        let arg = |i: usize| eval(&args[i], params);
        match f.as_str() {
            "Ref" => json!(params[args.as_str().unwrap()]),
            "Fn::Equals" => json!(arg(0) == arg(1)),
            "Fn::Contains" => json!(arg(0).as_array().unwrap().contains(&arg(1))),
            "Fn::Not" => json!(!arg(0).as_bool().unwrap()),
            "Fn::And" => json!((0..args.as_array().unwrap().len()).all(|i| arg(i) == json!(true))),
            "Fn::Or" => json!((0..args.as_array().unwrap().len()).any(|i| arg(i) == json!(true))),
            other => panic!("rule function {other} is not evaluated by this test"),
        }
    }
    t["Rules"].as_object().unwrap().values().all(|rule| {
        let applies = rule
            .get("RuleCondition")
            .is_none_or(|c| eval(c, params) == json!(true));
        !applies
            || rule["Assertions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|a| eval(&a["Assert"], params) == json!(true))
    })
}

#[test]
fn the_api_url_is_https_unless_the_plain_http_one_is_named() {
    let t = template();
    let pattern = |name: &str| {
        t["Parameters"][name]["AllowedPattern"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(pattern("IronflowApiUrl").contains("https://"));
    assert!(!pattern("IronflowApiUrl").contains("https?"));
    assert!(pattern("InsecureIronflowApiUrl").contains("http://"));
    for (secure, insecure, accepted) in [
        ("https://ironflow.example.com", "", true),
        ("", "http://10.0.0.5:3000", true),
        ("", "", false),
        (
            "https://ironflow.example.com",
            "http://10.0.0.5:3000",
            false,
        ),
    ] {
        let params = BTreeMap::from([
            ("WakeBatchSize", "10"),
            ("WakeBatchingWindowSecs", "5"),
            ("IronflowApiUrl", secure),
            ("InsecureIronflowApiUrl", insecure),
        ]);
        assert_eq!(
            rules_accept(&t, &params),
            accepted,
            "{secure:?} / {insecure:?}"
        );
    }
    let env = &function(&t)["Environment"]["Variables"];
    assert_eq!(
        env["IRONFLOW_API_URL"],
        json!({"Fn::If": ["HasInsecureApiUrl", {"Ref": "InsecureIronflowApiUrl"}, {"Ref": "IronflowApiUrl"}]})
    );
    assert_eq!(
        env["IRONFLOW_ALLOW_INSECURE_HTTP"],
        json!({"Fn::If": ["HasInsecureApiUrl", "true", "false"]})
    );
    assert_eq!(
        t["Conditions"]["HasInsecureApiUrl"],
        json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "InsecureIronflowApiUrl"}, ""]}]})
    );
}

#[test]
fn failed_wake_ups_end_in_an_encrypted_dead_letter_queue() {
    let t = template();
    let wake = &resource(&t, "WakeQueue")["Properties"];
    let dlq = &resource(&t, "DeadLetterQueue")["Properties"];
    assert_eq!(
        wake["RedrivePolicy"],
        json!({
            "deadLetterTargetArn": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]},
            "maxReceiveCount": {"Ref": "WakeMaxReceiveCount"}
        })
    );
    assert_eq!(wake["SqsManagedSseEnabled"], true);
    assert_eq!(dlq["SqsManagedSseEnabled"], true);
    // A message keeps its first enqueue time in the dead-letter queue: it must live longer there.
    assert!(
        dlq["MessageRetentionPeriod"].as_i64().unwrap()
            > wake["MessageRetentionPeriod"].as_i64().unwrap()
    );
}

#[test]
fn the_poison_table_has_the_key_and_ttl_the_code_uses() {
    let t = template();
    let p = &resource(&t, "PoisonTable")["Properties"];
    assert_eq!(
        p["KeySchema"],
        json!([{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}])
    );
    assert_eq!(
        p["AttributeDefinitions"],
        json!([{"AttributeName": PARTITION_KEY, "AttributeType": "S"}])
    );
    // The TTL attribute the poison-pill table writes (epoch seconds).
    assert_eq!(p["TimeToLiveSpecification"]["AttributeName"], TTL_ATTRIBUTE);
    assert_eq!(p["TimeToLiveSpecification"]["Enabled"], true);
    assert_eq!(p["BillingMode"], "PAY_PER_REQUEST");
    assert_eq!(p["SSESpecification"]["SSEEnabled"], true);
    assert_eq!(
        p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"],
        true
    );
}

#[test]
fn the_environment_is_what_the_worker_reads_and_holds_no_token() {
    let t = template();
    let env = function(&t)["Environment"]["Variables"]
        .as_object()
        .unwrap();
    let names: BTreeSet<&str> = env.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = [
        "RUST_LOG",
        "IRONFLOW_API_URL",
        "IRONFLOW_ALLOW_INSECURE_HTTP",
        ironflow_lambda::settings::WORKER_TOKEN_SECRET_ARN_VAR,
        "IRONFLOW_WORKER_TAGS",
        "IRONFLOW_FUNCTION_TIMEOUT_SECS",
        "IRONFLOW_DEADLINE_MARGIN_MS",
        "IRONFLOW_MAX_RUNS_PER_INVOCATION",
        "IRONFLOW_CONCURRENCY",
        "IRONFLOW_CLAIM_AHEAD_PERCENT",
        "IRONFLOW_RUN_TIMEOUT_SECS",
        "IRONFLOW_LEASE_TTL_SECS",
        "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
        "IRONFLOW_POISON_TABLE",
        "IRONFLOW_POISON_NAMESPACE",
        "IRONFLOW_POISON_MODE",
        "IRONFLOW_POISON_THRESHOLD",
        "IRONFLOW_POISON_COOLDOWN_SECS",
        "IRONFLOW_WAKE_QUEUE_URL",
        "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION",
        "IRONFLOW_METRICS_NAMESPACE",
        "IRONFLOW_HEARTBEAT_URL",
    ]
    .into();
    assert_eq!(names, expected);
    assert!(!names.contains(ironflow_lambda::settings::WORKER_TOKEN_VAR));
    assert_eq!(
        env["IRONFLOW_WORKER_TOKEN_SECRET_ARN"],
        json!({"Ref": "WorkerTokenSecretArn"})
    );
    assert_eq!(env["IRONFLOW_POISON_TABLE"], json!({"Ref": "PoisonTable"}));
    assert_eq!(
        param_default(&t, "ClaimAheadPercent"),
        i64::from(ironflow_lambda::settings::DEFAULT_CLAIM_AHEAD_PERCENT),
        "the template's default is the code's"
    );
    assert_eq!(env["IRONFLOW_WAKE_QUEUE_URL"], json!({"Ref": "WakeQueue"}));
    // No parameter carries the token itself (only the secret's ARN and its key's).
    for name in t["Parameters"].as_object().unwrap().keys() {
        assert!(
            !name.contains("Token") || name.starts_with("WorkerTokenSecret"),
            "parameter {name} looks like a token"
        );
    }
    assert!(
        t["Parameters"]["HeartbeatUrl"]["NoEcho"] == true,
        "the heartbeat URL embeds a secret: NoEcho"
    );
    // Every setting's default is one the worker accepts (resources and pseudo parameters aside).
    let lookup = |name: &str| -> Option<String> {
        let value = env.get(name)?;
        let param = value.get("Ref")?.as_str()?;
        let default = t["Parameters"].get(param)?.get("Default")?;
        Some(match default {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let settings = ironflow_lambda::settings::Settings::from_lookup_with_token(
        |name| match name {
            "IRONFLOW_API_URL" => Some("https://ironflow.example.com".into()),
            // A resource of the stack (the wake queue's URL).
            "IRONFLOW_WAKE_QUEUE_URL" => {
                Some("https://sqs.eu-west-1.amazonaws.com/123456789012/wake".into())
            }
            _ => lookup(name),
        },
        Some(ironflow_lambda::settings::WorkerToken::new("t")),
    )
    .unwrap();
    assert!(settings.deadline_margin < settings.function_timeout);
    assert!(settings.lease_refresh_interval < settings.lease_ttl);
}

#[test]
fn async_retries_and_the_recursive_loop_are_set_on_purpose() {
    let t = template();
    let f = function(&t);
    // A retried schedule tick would be a second batch claiming more runs: the next tick is the retry.
    assert_eq!(f["EventInvokeConfig"]["MaximumRetryAttempts"], 0);
    // The Lambda → SQS → Lambda wake-up chain is intended and bounded by the worker.
    assert_eq!(f["RecursiveLoop"], "Allow");
    assert_eq!(
        f["ReservedConcurrentExecutions"],
        json!({"Fn::If": ["HasReservedConcurrency", {"Ref": "ReservedConcurrency"}, {"Ref": "AWS::NoValue"}]})
    );
}

#[test]
fn logs_go_to_a_log_group_with_retention() {
    let t = template();
    let f = function(&t);
    assert_eq!(
        f["LoggingConfig"]["LogGroup"],
        json!({"Ref": "WorkerLogGroup"})
    );
    assert_eq!(
        resource(&t, "WorkerLogGroup")["Properties"]["RetentionInDays"],
        json!({"Ref": "LogRetentionDays"})
    );
}

/// Every Allow statement of every policy in the template: no wildcard action, and resources
/// that are this stack's own resources or ARNs given as parameters, never `*`.
#[test]
fn iam_allows_only_named_actions_on_this_stacks_resources() {
    let t = template();
    let f = function(&t);
    // With its own role, SAM adds no managed policy (those grant logs and SQS on "*").
    assert_eq!(f["Role"], json!({"Fn::GetAtt": ["WorkerRole", "Arn"]}));
    assert!(f.get("Policies").is_none());
    let role = &resource(&t, "WorkerRole")["Properties"];
    assert!(role.get("ManagedPolicyArns").is_none());
    assert!(role.get("PermissionsBoundary").is_none());

    let resources: BTreeSet<&str> = t["Resources"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let parameters: BTreeSet<&str> = t["Parameters"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut actions = BTreeSet::new();
    for statement in role_statements(&t) {
        assert_eq!(statement["Effect"], "Allow");
        for action in strings(&statement["Action"]) {
            assert!(!action.contains('*'), "wildcard action {action}");
            actions.insert(action);
        }
        let resource_list = match &statement["Resource"] {
            Value::Array(items) => items.clone(),
            one => vec![one.clone()],
        };
        for r in resource_list {
            if let Some(att) = r.get("Fn::GetAtt") {
                assert!(resources.contains(att[0].as_str().unwrap()), "{r}");
                assert_eq!(att[1], "Arn", "{r}");
            } else if let Some(name) = r.get("Ref").and_then(Value::as_str) {
                assert!(
                    parameters.contains(name) && name.ends_with("Arn"),
                    "Ref {name} is not an ARN parameter"
                );
                let pattern = t["Parameters"][name]["AllowedPattern"].as_str().unwrap();
                assert!(
                    pattern.contains("arn:aws"),
                    "{name} must be constrained to an ARN"
                );
            } else {
                panic!("resource {r} is neither this stack's resource nor an ARN parameter");
            }
        }
    }
    let expected: BTreeSet<String> = [
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "secretsmanager:GetSecretValue",
        "kms:Decrypt",
        // The poison-pill table (issue 3): cold-start check, reads, counters.
        "dynamodb:DescribeTable",
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        // Wake-ups sent by the worker (SendMessageBatch is authorised by sqs:SendMessage).
        "sqs:SendMessage",
        // The SQS event source mapping polls with the function's role.
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(actions, expected);

    // Other policies in the template (the queues' TLS-only policy) only deny.
    for (id, r) in t["Resources"].as_object().unwrap() {
        if r["Type"] == "AWS::SQS::QueuePolicy" {
            for s in r["Properties"]["PolicyDocument"]["Statement"]
                .as_array()
                .unwrap()
            {
                assert_eq!(s["Effect"], "Deny", "{id}");
            }
        }
    }
}

/// The AWS SDK operations (as the Rust SDKs name their builder methods) and the IAM action
/// each needs.
const SDK_CALLS: &[(&str, &str)] = &[
    (".describe_table()", "dynamodb:DescribeTable"),
    (".get_item()", "dynamodb:GetItem"),
    (".batch_get_item()", "dynamodb:BatchGetItem"),
    (".put_item()", "dynamodb:PutItem"),
    (".update_item()", "dynamodb:UpdateItem"),
    (".delete_item()", "dynamodb:DeleteItem"),
    (".query()", "dynamodb:Query"),
    (".scan()", "dynamodb:Scan"),
    (".batch_write_item()", "dynamodb:BatchWriteItem"),
    (".transact_write_items()", "dynamodb:PutItem"),
    (".transact_get_items()", "dynamodb:GetItem"),
    (".send_message()", "sqs:SendMessage"),
    (".send_message_batch()", "sqs:SendMessage"),
    (".receive_message()", "sqs:ReceiveMessage"),
    (".delete_message()", "sqs:DeleteMessage"),
    (".delete_message_batch()", "sqs:DeleteMessage"),
    (
        ".change_message_visibility()",
        "sqs:ChangeMessageVisibility",
    ),
    (".get_queue_attributes()", "sqs:GetQueueAttributes"),
    (".get_queue_url()", "sqs:GetQueueUrl"),
    (".get_secret_value()", "secretsmanager:GetSecretValue"),
];

/// What Lambda's SQS poller calls with the function's role, whether the code does or not.
const EVENT_SOURCE_ACTIONS: &[&str] = &[
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
];

fn rust_sources(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path, text));
        }
    }
}

/// The role and the code agree: every AWS call in `src/` is allowed (moto does not check IAM,
/// so nothing else would catch an AccessDenied before production), and for each service the
/// code talks to, the role allows nothing the code does not call.
#[test]
fn the_role_allows_exactly_the_aws_calls_the_code_makes() {
    let mut sources = Vec::new();
    rust_sources(&root().join("src"), &mut sources);
    let mut used: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, text) in &sources {
        for (method, action) in SDK_CALLS {
            if text.contains(method) {
                used.entry(action)
                    .or_default()
                    .push(path.strip_prefix(root()).unwrap().display().to_string());
            }
        }
    }
    let t = template();
    let granted: BTreeSet<String> = role_statements(&t)
        .iter()
        .flat_map(|s| strings(&s["Action"]))
        .collect();
    for (action, files) in &used {
        assert!(
            granted.contains(*action),
            "{files:?} call {action}, which WorkerRole does not allow (template.yaml and \
             infra/iam-policy.json)"
        );
    }
    let services_used: BTreeSet<&str> = used.keys().map(|a| a.split(':').next().unwrap()).collect();
    for action in &granted {
        let service = action.split(':').next().unwrap();
        if services_used.contains(service) && !EVENT_SOURCE_ACTIONS.contains(&action.as_str()) {
            assert!(
                used.contains_key(action.as_str()),
                "WorkerRole allows {action}, which no code in src/ calls"
            );
        }
    }
    // The poison-pill table and the worker token are read by this code; the wake-ups' SQS
    // calls arrive with their own module.
    assert!(services_used.contains("dynamodb") && services_used.contains("secretsmanager"));
}

/// The template's expressions as the placeholders of infra/iam-policy.json:
/// `!GetAtt X.Arn` → `${XArn}`, `!Ref P` → `${P}`, `${AWS::Region}` → `${Region}`.
fn as_placeholders(v: &Value) -> Value {
    match v {
        Value::Object(map) if map.len() == 1 => {
            let (key, arg) = map.iter().next().unwrap();
            match key.as_str() {
                "Fn::GetAtt" => json!(format!(
                    "${{{}{}}}",
                    arg[0].as_str().unwrap(),
                    arg[1].as_str().unwrap()
                )),
                "Ref" => json!(format!("${{{}}}", arg.as_str().unwrap())),
                "Fn::Sub" => json!(arg.as_str().unwrap().replace("${AWS::", "${")),
                _ => Value::Object(
                    map.iter()
                        .map(|(k, v)| (k.clone(), as_placeholders(v)))
                        .collect(),
                ),
            }
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), as_placeholders(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(as_placeholders).collect()),
        other => other.clone(),
    }
}

#[test]
fn infra_iam_policy_json_is_the_roles_policy() {
    let t = template();
    let from_template: Vec<Value> = role_statements(&t).iter().map(as_placeholders).collect();
    let text = std::fs::read_to_string(root().join("infra/iam-policy.json")).unwrap();
    let document: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(document["Version"], "2012-10-17");
    assert_eq!(
        document["Statement"],
        Value::Array(from_template),
        "infra/iam-policy.json differs from WorkerRole's policy in template.yaml"
    );
}

#[test]
fn alarms_watch_the_dead_letter_queue_the_wake_queue_errors_and_throttles() {
    let t = template();
    let mut watched = BTreeMap::new();
    let mut thresholds = BTreeMap::new();
    for r in t["Resources"].as_object().unwrap().values() {
        if r["Type"] == "AWS::CloudWatch::Alarm" {
            let p = &r["Properties"];
            let dimension = &p["Dimensions"][0]["Value"];
            // The worker's own metrics are in the namespace the MetricsNamespace parameter sets.
            let namespace = match &p["Namespace"] {
                Value::String(ns) => ns.clone(),
                other => {
                    assert_eq!(other, &json!({"Ref": "MetricsNamespace"}));
                    "worker".to_string()
                }
            };
            let key = (namespace, p["MetricName"].as_str().unwrap().to_string());
            watched.insert(key.clone(), dimension.clone());
            thresholds.insert(key, p["Threshold"].clone());
            assert_eq!(p["ComparisonOperator"], "GreaterThanThreshold");
        }
    }
    // Any message in the dead-letter queue, any error, any throttle; a wake-up older than the
    // wake queue's own visibility timeout.
    for (key, threshold) in &thresholds {
        if key.1 == "ApproximateAgeOfOldestMessage" {
            assert_eq!(
                threshold,
                &resource(&t, "WakeQueue")["Properties"]["VisibilityTimeout"]
            );
        } else {
            assert_eq!(threshold, &json!(0), "{key:?}");
        }
    }
    assert_eq!(
        watched[&(
            "AWS/SQS".to_string(),
            "ApproximateAgeOfOldestMessage".to_string()
        )],
        json!({"Fn::GetAtt": ["WakeQueue", "QueueName"]})
    );
    let key = |ns: &str, m: &str| (ns.to_string(), m.to_string());
    assert_eq!(
        watched[&key("AWS/SQS", "ApproximateNumberOfMessagesVisible")],
        json!({"Fn::GetAtt": ["DeadLetterQueue", "QueueName"]})
    );
    assert_eq!(
        watched[&key("AWS/Lambda", "Errors")],
        json!({"Ref": "WorkerFunction"})
    );
    assert_eq!(
        watched[&key("AWS/Lambda", "Throttles")],
        json!({"Ref": "WorkerFunction"})
    );
    // Runs the API's reaper took back: invocations that died or could not hand them back.
    assert_eq!(
        watched[&key("worker", ironflow_lambda::metrics::LEASE_RECOVERIES)],
        json!({"Ref": "WorkerFunction"})
    );
}

#[test]
fn outputs_give_an_operator_every_name_and_address() {
    let t = template();
    let outputs = t["Outputs"].as_object().unwrap();
    for (name, value) in [
        ("WorkerFunctionName", json!({"Ref": "WorkerFunction"})),
        (
            "WorkerFunctionArn",
            json!({"Fn::GetAtt": ["WorkerFunction", "Arn"]}),
        ),
        ("WorkerLogGroupName", json!({"Ref": "WorkerLogGroup"})),
        ("WakeQueueUrl", json!({"Ref": "WakeQueue"})),
        ("DeadLetterQueueUrl", json!({"Ref": "DeadLetterQueue"})),
        (
            "DeadLetterQueueArn",
            json!({"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}),
        ),
        ("PoisonTableName", json!({"Ref": "PoisonTable"})),
    ] {
        assert_eq!(outputs[name]["Value"], value, "output {name}");
    }
}

// --- the local stack against moto ------------------------------------------------------------

fn moto_endpoint() -> String {
    std::env::var("IRONFLOW_TEST_MOTO_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "IRONFLOW_TEST_MOTO_ENDPOINT is not set: run the tests with ./scripts/test, \
             which starts moto's server"
        )
    })
}

fn venv_python() -> PathBuf {
    let python = root().join(".venv/bin/python");
    assert!(
        Path::new(&python).exists(),
        "{} is missing: run ./scripts/test, which installs the project's Python tools",
        python.display()
    );
    python
}

async fn moto_config(endpoint: &str) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "testing", "testing", None, None, "moto",
        ))
        .load()
        .await
}

#[tokio::test]
async fn the_local_stack_creates_what_the_template_declares() {
    let endpoint = moto_endpoint();
    let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let output = Command::new(venv_python())
        .arg(root().join("infra/local_stack.py"))
        .args(["create", "--endpoint", &endpoint, "--prefix", &prefix])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "infra/local_stack.py create failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let created: Value = serde_json::from_slice(&output.stdout).unwrap();
    let t = template();
    let aws = moto_config(&endpoint).await;

    // The table, read back with the SDK the worker uses.
    let table_name = created["environment"]["IRONFLOW_POISON_TABLE"]
        .as_str()
        .unwrap();
    assert_eq!(table_name, format!("{prefix}-PoisonTable"));
    let dynamodb = aws_sdk_dynamodb::Client::new(&aws);
    let table = dynamodb
        .describe_table()
        .table_name(table_name)
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    let declared = &resource(&t, "PoisonTable")["Properties"];
    let keys: Vec<Value> = table
        .key_schema()
        .iter()
        .map(|k| json!({"AttributeName": k.attribute_name(), "KeyType": k.key_type().as_str()}))
        .collect();
    assert_eq!(Value::Array(keys), declared["KeySchema"]);
    let attributes: Vec<Value> = table
        .attribute_definitions()
        .iter()
        .map(|a| json!({"AttributeName": a.attribute_name(), "AttributeType": a.attribute_type().as_str()}))
        .collect();
    assert_eq!(Value::Array(attributes), declared["AttributeDefinitions"]);
    assert_eq!(
        table
            .billing_mode_summary()
            .and_then(|b| b.billing_mode())
            .map(|m| m.as_str()),
        declared["BillingMode"].as_str()
    );
    let ttl = dynamodb
        .describe_time_to_live()
        .table_name(table_name)
        .send()
        .await
        .unwrap()
        .time_to_live_description
        .unwrap();
    assert_eq!(
        ttl.attribute_name(),
        declared["TimeToLiveSpecification"]["AttributeName"].as_str()
    );
    assert_eq!(
        ttl.time_to_live_status().map(|s| s.as_str()),
        Some("ENABLED")
    );

    // The queues.
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let wake_url = created["environment"]["IRONFLOW_WAKE_QUEUE_URL"]
        .as_str()
        .unwrap();
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(wake_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    let attr = |name: QueueAttributeName| attrs.get(&name).cloned().unwrap_or_default();
    let timeout = param_default(&t, "FunctionTimeout").to_string();
    let visibility = &t["Mappings"]["VisibilityTimeoutByFunctionTimeout"][&timeout]["Seconds"];
    assert_eq!(
        attr(QueueAttributeName::VisibilityTimeout),
        visibility.to_string()
    );
    assert_eq!(attr(QueueAttributeName::SqsManagedSseEnabled), "true");
    let redrive: Value = serde_json::from_str(&attr(QueueAttributeName::RedrivePolicy)).unwrap();
    assert_eq!(
        redrive["deadLetterTargetArn"],
        created["resources"]["DeadLetterQueue"]["Arn"]
    );
    assert_eq!(
        redrive["maxReceiveCount"].as_i64(),
        Some(param_default(&t, "WakeMaxReceiveCount"))
    );
}
