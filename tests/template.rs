//! What cfn-lint and `sam validate --lint` cannot see in template.yaml (both run in
//! `./scripts/test`): the queue's visibility timeout against the function timeout, partial batch
//! responses, the poison-pill table against the code, the environment the code reads, IAM scoped
//! to this stack's own resources, `infra/iam-policy.json` equal to the role's policy, and the
//! local stack (`infra/local_stack.py`) creating in moto what the template declares. Both of the
//! template's variants, on-demand Lambda (the default) and managed instances (`ManagedInstances`),
//! each with and without the webhook receiver (`WebhookReceiver`, docs/push.md): what each
//! creates, before and after SAM's transform, and both linters on each; and the agent steps'
//! permissions (Bedrock models, the Anthropic key's secret: docs/agents.md), linted without
//! Bedrock and with the Anthropic key on both variants.

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
    // The worker needs the margin plus its minimum claim budget (2 s, not a parameter) below the
    // timeout: the largest margin works with the shortest timeout.
    let margin = &t["Parameters"]["DeadlineMarginMs"];
    let budget = ironflow_lambda::settings::DEFAULT_MIN_CLAIM_BUDGET.as_millis() as i64;
    assert!(margin["MaxValue"].as_i64().unwrap() + budget < shortest * 1000);
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
    // A batching window delays every wake-up, push and timer wake-ups included (docs/push.md).
    assert_eq!(param_default(&t, "WakeBatchingWindowSecs"), 0);
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

/// Whether every rule of the template's `Rules` accepts `params`, the other parameters at their
/// defaults (see [`parameter_values`]).
fn rules_accept(t: &Value, params: &BTreeMap<&str, &str>) -> bool {
    let overrides: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, *v)).collect();
    let values = parameter_values(t, &overrides);
    t["Rules"].as_object().unwrap().values().all(|rule| {
        let applies = rule
            .get("RuleCondition")
            .is_none_or(|c| evaluate(c, t, &values) == json!(true));
        !applies
            || rule["Assertions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|a| evaluate(&a["Assert"], t, &values) == json!(true))
    })
}

/// Every parameter's value as CloudFormation hands it to rules and conditions: the override, else
/// the default, as a string (numbers too), and a `CommaDelimitedList` as a list of strings (its
/// default `""` is the one-item list `[""]`). Parameters without either are left out. The
/// pseudo parameter `AWS::Partition` is `aws` unless overridden.
fn parameter_values(t: &Value, overrides: &[(&str, &str)]) -> BTreeMap<String, Value> {
    let parameters = t["Parameters"].as_object().unwrap();
    for (name, _) in overrides {
        assert!(
            parameters.contains_key(*name) || *name == "AWS::Partition",
            "template.yaml has no parameter {name}"
        );
    }
    let mut values = BTreeMap::new();
    let partition = overrides
        .iter()
        .find(|(n, _)| *n == "AWS::Partition")
        .map_or("aws", |(_, v)| *v);
    values.insert("AWS::Partition".to_string(), json!(partition));
    for (name, p) in parameters {
        let given = overrides
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_string());
        let Some(raw) = given.or_else(|| p.get("Default").map(text)) else {
            continue;
        };
        let value = if p["Type"] == "CommaDelimitedList" {
            json!(raw.split(',').collect::<Vec<_>>())
        } else {
            json!(raw)
        };
        values.insert(name.clone(), value);
    }
    values
}

/// A scalar as CloudFormation compares it: its text (`-1` and `"-1"` are equal).
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A rule or condition expression, with the functions the template uses in them: `Ref`,
/// `Condition`, `Fn::Equals`, `Fn::Contains`, `Fn::EachMemberEquals`, `Fn::Not`, `Fn::And`,
/// `Fn::Or`, `Fn::Join`; panics on others.
fn evaluate(v: &Value, t: &Value, values: &BTreeMap<String, Value>) -> Value {
    let Some((f, args)) = v
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    else {
        return v.clone();
    };
    let arg = |i: usize| evaluate(&args[i], t, values);
    let count = || args.as_array().unwrap().len();
    match f.as_str() {
        "Ref" => {
            let name = args.as_str().unwrap();
            values
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("parameter {name} has no value"))
        }
        "Condition" => json!(condition_holds(t, args.as_str().unwrap(), values)),
        "Fn::Equals" => json!(text(&arg(0)) == text(&arg(1))),
        "Fn::Contains" => {
            let needle = text(&arg(1));
            json!(arg(0).as_array().unwrap().iter().any(|v| text(v) == needle))
        }
        "Fn::EachMemberEquals" => {
            let value = text(&arg(1));
            json!(arg(0).as_array().unwrap().iter().all(|v| text(v) == value))
        }
        "Fn::Not" => json!(!arg(0).as_bool().unwrap()),
        "Fn::And" => json!((0..count()).all(|i| arg(i) == json!(true))),
        "Fn::Or" => json!((0..count()).any(|i| arg(i) == json!(true))),
        "Fn::Join" => {
            let items: Vec<String> = arg(1).as_array().unwrap().iter().map(text).collect();
            json!(items.join(&text(&arg(0))))
        }
        other => panic!("function {other} is not evaluated by this test"),
    }
}

fn condition_holds(t: &Value, name: &str, values: &BTreeMap<String, Value>) -> bool {
    let condition = &t["Conditions"][name];
    assert!(
        !condition.is_null(),
        "template.yaml has no condition {name}"
    );
    evaluate(condition, t, values) == json!(true)
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
        // Managed instances: the only variant where plain http:// is allowed (the next test).
        let params: BTreeMap<&str, &str> = MANAGED
            .iter()
            .copied()
            .chain([
                ("WakeBatchSize", "10"),
                ("WakeBatchingWindowSecs", "5"),
                ("IronflowApiUrl", secure),
                ("InsecureIronflowApiUrl", insecure),
            ])
            .collect();
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

/// The worker token crosses the network in clear text to a plain-http:// API: only from a
/// function inside the VPC of `ManagedSubnetIds`, i.e. the managed worker, and never with the
/// webhook receiver, which runs on demand outside any VPC (review H4).
#[test]
fn the_plain_http_api_url_is_only_for_functions_inside_the_vpc() {
    let t = template();
    let insecure = [
        ("IronflowApiUrl", ""),
        ("InsecureIronflowApiUrl", "http://10.0.0.5:3000"),
    ];
    let secure = [
        ("IronflowApiUrl", "https://ironflow.example.com"),
        ("InsecureIronflowApiUrl", ""),
    ];
    let webhook = [
        ("WebhookReceiver", "enabled"),
        ("WebhookSecretArn", WEBHOOK_SECRET_ARN),
    ];
    let with = |parts: &[&[(&'static str, &'static str)]]| -> BTreeMap<&str, &str> {
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    };
    for (label, params, accepted) in [
        ("on demand, https", with(&[&secure]), true),
        ("on demand, http", with(&[&insecure]), false),
        (
            "on demand, http, receiver",
            with(&[&insecure, &webhook]),
            false,
        ),
        ("managed, https", with(&[&secure, MANAGED]), true),
        ("managed, http", with(&[&insecure, MANAGED]), true),
        (
            "managed, http, receiver",
            with(&[&insecure, MANAGED, &webhook]),
            false,
        ),
        (
            "managed, https, receiver",
            with(&[&secure, MANAGED, &webhook]),
            true,
        ),
    ] {
        assert_eq!(rules_accept(&t, &params), accepted, "{label}");
    }
    // Where http:// is allowed, every function that gets it runs in the subnets.
    let overrides: Vec<(&str, &str)> = with(&[&insecure, MANAGED]).into_iter().collect();
    let managed = variant(&t, &overrides);
    let functions = of_type(&managed, "AWS::Serverless::Function");
    assert_eq!(
        functions,
        BTreeSet::from(["ManagedWorkerFunction".to_string()])
    );
    let f = &resource(&managed, "ManagedWorkerFunction")["Properties"];
    assert_eq!(
        f["Environment"]["Variables"]["IRONFLOW_API_URL"],
        json!({"Ref": "InsecureIronflowApiUrl"})
    );
    let provider = &resource(&managed, "WorkerCapacityProvider")["Properties"];
    assert_eq!(
        provider["VpcConfig"]["SubnetIds"],
        json!({"Ref": "ManagedSubnetIds"})
    );
    // The descriptions say so, where an operator reads them.
    let described = t["Parameters"]["InsecureIronflowApiUrl"]["Description"]
        .as_str()
        .unwrap();
    for needed in ["ManagedInstances=enabled", "WebhookReceiver=disabled"] {
        assert!(described.contains(needed), "{needed}: {described}");
    }
    let deploy = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    let row = deploy
        .lines()
        .find(|l| l.starts_with("| `InsecureIronflowApiUrl`"))
        .unwrap();
    assert!(row.contains("`ManagedInstances=enabled`"), "{row}");
    assert!(!deploy.contains("the function runs outside any VPC)"));
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
        "IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN",
    ]
    .into();
    assert_eq!(names, expected);
    assert!(!names.contains(ironflow_lambda::settings::WORKER_TOKEN_VAR));
    assert!(!names.contains(ironflow_lambda::settings::WEBHOOK_SECRET_VAR));
    // The worker's role is the default one (the receiver is a function of its own).
    assert!(!names.contains(ironflow_lambda::settings::FUNCTION_ROLE_VAR));
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
    // No parameter carries the token itself (only the secret's ARN and its key's), nor the
    // webhook's secret (only its secret's ARN).
    for name in t["Parameters"].as_object().unwrap().keys() {
        assert!(
            !name.contains("Token") || name.starts_with("WorkerTokenSecret"),
            "parameter {name} looks like a token"
        );
        assert!(
            !name.contains("Secret") || name.ends_with("SecretArn") || name.ends_with("KmsKeyArn"),
            "parameter {name} looks like a secret"
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
            } else if let Some((prefix, name)) = bedrock_arns(&r) {
                assert!(prefix.starts_with("arn:${AWS::Partition}:bedrock:"), "{r}");
                assert!(
                    parameters.contains(name.as_str()) && name.starts_with("Bedrock"),
                    "{r}"
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
        // Agent steps on Bedrock (Converse; no streaming call).
        "bedrock:InvokeModel",
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

/// Agent steps (docs/agents.md, "IAM"): the role may call `bedrock:InvokeModel` (Converse; no
/// streaming) on the inference profiles given, from the stack's region, and on the foundation
/// models given, in the regions given (where the profiles route calls): no other Bedrock action,
/// no `*` ARN, nothing without models. The Anthropic key's secret is read only when its ARN is
/// given.
#[test]
fn agent_steps_may_invoke_the_given_bedrock_models_and_nothing_else() {
    let t = template();
    let values = parameter_values(&t, &[]);
    let bedrock = |v: &Value| -> Vec<Value> {
        role_statements(v)
            .into_iter()
            .filter(|s| {
                strings(&s["Action"])
                    .iter()
                    .any(|a| a.starts_with("bedrock:"))
            })
            .collect()
    };
    let statements = bedrock(&variant(&t, &[]));
    assert_eq!(statements.len(), 2, "{statements:?}");
    let profiles = &statements[0];
    let models = &statements[1];
    for s in [profiles, models] {
        assert_eq!(s["Action"], "bedrock:InvokeModel", "{s}");
    }
    let profile_arns = bedrock_arn_list(&profiles["Resource"], &values);
    let model_arns = bedrock_arn_list(&models["Resource"], &values);
    assert_eq!(
        profile_arns,
        [
            "arn:aws:bedrock:*:*:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "arn:aws:bedrock:*:*:inference-profile/us.amazon.nova-lite-v1:0",
            // BedrockProvider's default model (a step that names none).
            "arn:aws:bedrock:*:*:inference-profile/global.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ]
    );
    assert_eq!(
        model_arns,
        [
            "arn:aws:bedrock:*::foundation-model/anthropic.claude-sonnet-4-5-20250929-v1:0",
            "arn:aws:bedrock:*::foundation-model/amazon.nova-lite-v1:0",
        ]
    );
    // The region is the condition's: the profiles from the stack's region, their models in the
    // listed destination regions.
    assert_eq!(
        profiles["Condition"],
        json!({"StringEquals": {"aws:RequestedRegion": {"Fn::Sub": "${AWS::Region}"}}})
    );
    assert_eq!(
        models["Condition"],
        json!({"StringEquals": {"aws:RequestedRegion": {"Ref": "BedrockModelRegions"}}})
    );
    assert_eq!(
        values["BedrockModelRegions"],
        json!(["us-east-1", "us-east-2", "us-west-2", "unspecified"])
    );
    // The models a step gets without naming one, and the example's defaults, are allowed.
    let profile_ids: Vec<String> = values["BedrockInferenceProfileIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    for default in [
        ironflow_lambda::agents::DEFAULT_BEDROCK_MODEL,
        my_workflows::patterns::models::DEFAULT_MODEL,
        my_workflows::patterns::models::DEFAULT_SECOND_MODEL,
    ] {
        assert!(profile_ids.iter().any(|id| id == default), "{default}");
    }
    // Each default profile's model is allowed: a profile's call is checked again on its model.
    for id in values["BedrockInferenceProfileIds"].as_array().unwrap() {
        let model = text(id).split_once('.').unwrap().1.to_string();
        assert!(
            model_arns
                .iter()
                .any(|arn| arn.ends_with(&format!("/{model}"))),
            "profile {id} without its model {model}"
        );
    }
    for arn in profile_arns.iter().chain(&model_arns) {
        assert!(!arn.ends_with('*') && !arn.ends_with('/'), "{arn}");
    }
    // Without models, no Bedrock permission at all.
    let none = variant(
        &t,
        &[
            ("BedrockInferenceProfileIds", ""),
            ("BedrockFoundationModelIds", ""),
        ],
    );
    assert!(bedrock(&none).is_empty());

    // The Anthropic key: the variable always (empty is unset), the permission only when given.
    let env = &function(&t)["Environment"]["Variables"];
    assert_eq!(
        env["IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN"],
        json!({"Ref": "AnthropicApiKeySecretArn"})
    );
    assert_eq!(
        secrets_read(&variant(&t, &[])),
        secret_refs(&["WorkerTokenSecretArn"])
    );
    let key = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:anthropic-AbCdEf";
    assert_eq!(
        secrets_read(&variant(&t, &[("AnthropicApiKeySecretArn", key)])),
        secret_refs(&["WorkerTokenSecretArn", "AnthropicApiKeySecretArn"])
    );
}

/// A list of ARNs made from a list parameter, one per id: `!Split [",", !Sub [<prefix>${Ids},
/// {Ids: !Join [",<prefix>", !Ref <name>]}]]`, as (prefix, name); `None` for any other form.
/// One per partition, `!If [InPartitionX, <the list in X>, <the list in aws>]` (a `!Join`'s
/// delimiter takes no `${AWS::Partition}`), is the prefix with `${AWS::Partition}` in place of
/// the partition; [`bedrock_arns_are_in_the_stacks_partition`] checks each branch's partition.
fn bedrock_arns(r: &Value) -> Option<(String, String)> {
    if let Some(branches) = r.get("Fn::If") {
        let forms: Vec<(String, String)> = branches.as_array()?[1..]
            .iter()
            .map(|b| bedrock_arns(b).map(|(prefix, name)| (any_partition(&prefix), name)))
            .collect::<Option<_>>()?;
        assert_eq!(forms[0], forms[1], "{r}");
        return Some(forms[0].clone());
    }
    let split = r.get("Fn::Split")?;
    assert_eq!(split[0], ",", "{r}");
    let sub = split[1].get("Fn::Sub")?;
    let template = sub[0].as_str()?;
    let prefix = template.strip_suffix("${Ids}")?;
    let join = sub[1]["Ids"].get("Fn::Join")?;
    assert_eq!(join[0], json!(format!(",{prefix}")), "{r}");
    let name = join[1].get("Ref")?.as_str()?;
    assert_eq!(sub[1].as_object().map(|o| o.len()), Some(1), "{r}");
    Some((prefix.to_string(), name.to_string()))
}

/// `arn:<partition>:rest` as `arn:${AWS::Partition}:rest`.
fn any_partition(arn: &str) -> String {
    let rest = arn
        .strip_prefix("arn:")
        .unwrap_or_else(|| panic!("{arn} is no ARN"));
    let (_, rest) = rest.split_once(':').unwrap();
    format!("arn:${{AWS::Partition}}:{rest}")
}

/// The ARNs a [`bedrock_arns`] list resolves to, for these parameter values.
fn bedrock_arn_list(r: &Value, values: &BTreeMap<String, Value>) -> Vec<String> {
    let (prefix, name) = bedrock_arns(r).unwrap_or_else(|| panic!("{r} is no list of ARNs"));
    values[&name]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| format!("{prefix}{}", text(id)))
        .collect()
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
    (".converse()", "bedrock:InvokeModel"),
    (".invoke_model()", "bedrock:InvokeModel"),
    (
        ".converse_stream()",
        "bedrock:InvokeModelWithResponseStream",
    ),
    (
        ".invoke_model_with_response_stream()",
        "bedrock:InvokeModelWithResponseStream",
    ),
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
                // One ARN per id of a list parameter: the ARN with the parameter in place of the id
                // (one list per partition: `${Partition}` in place of the partition).
                "Fn::Split" | "Fn::If" if bedrock_arns(v).is_some() => {
                    let (prefix, name) = bedrock_arns(v).expect("a list of Bedrock ARNs");
                    json!(format!("{}${{{name}}}", prefix.replace("${AWS::", "${")))
                }
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
    let text = std::fs::read_to_string(root().join("infra/iam-policy.json")).unwrap();
    let document: Value = serde_json::from_str(&text).unwrap();
    let from_template: Vec<Value> = role_statements(&t).iter().map(as_placeholders).collect();
    assert_eq!(document["Version"], "2012-10-17");
    assert_eq!(
        document["Statement"],
        Value::Array(from_template),
        "infra/iam-policy.json differs from WorkerRole's policy in template.yaml"
    );
}

#[test]
fn alarms_watch_the_dead_letter_queue_the_wake_queue_errors_and_throttles() {
    for (overrides, worker) in [
        (&[][..], "WorkerFunction"),
        (MANAGED, "ManagedWorkerFunction"),
    ] {
        alarms_watch(&variant(&template(), overrides), worker);
    }
}

/// The alarms of one variant, whose function is `worker`.
fn alarms_watch(t: &Value, worker: &str) {
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
                &resource(t, "WakeQueue")["Properties"]["VisibilityTimeout"]
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
        json!({"Ref": worker})
    );
    assert_eq!(
        watched[&key("AWS/Lambda", "Throttles")],
        json!({"Ref": worker})
    );
    // Runs the API's reaper took back: invocations that died or could not hand them back.
    assert_eq!(
        watched[&key("worker", ironflow_lambda::metrics::LEASE_RECOVERIES)],
        json!({"Ref": worker})
    );
}

#[test]
fn outputs_give_an_operator_every_name_and_address() {
    for (overrides, worker) in [
        (&[][..], "WorkerFunction"),
        (MANAGED, "ManagedWorkerFunction"),
    ] {
        outputs_name(&variant(&template(), overrides), worker);
    }
    // The managed variant's own: the alias its triggers invoke, and its capacity provider.
    let managed = variant(&template(), MANAGED);
    assert_eq!(
        managed["Outputs"]["WorkerFunctionAliasArn"]["Value"],
        json!({"Ref": "ManagedWorkerFunction.Alias"})
    );
    assert_eq!(
        managed["Outputs"]["CapacityProviderName"]["Value"],
        json!({"Ref": "WorkerCapacityProvider"})
    );
    let on_demand = variant(&template(), &[]);
    for name in ["WorkerFunctionAliasArn", "CapacityProviderName"] {
        assert!(on_demand["Outputs"].get(name).is_none(), "{name} on demand");
    }
    // The webhook receiver's: its URL, and the API's setting without the secret (see
    // the_webhook_outputs_give_the_url_and_the_apis_setting_without_the_secret).
    for overrides in [&[][..], MANAGED] {
        let off = variant(&template(), overrides);
        let on = variant(&template(), &with_webhook(overrides));
        for name in [
            "WebhookUrl",
            "WebhookApiSetting",
            "WebhookReceiverFunctionName",
            "WebhookReceiverLogGroupName",
        ] {
            assert!(
                off["Outputs"].get(name).is_none(),
                "{name} without the receiver"
            );
            assert!(
                on["Outputs"].get(name).is_some(),
                "{name} with the receiver"
            );
        }
        outputs_name(&on, &function_id(overrides));
    }
}

/// The outputs of one variant, whose function is `worker`.
fn outputs_name(t: &Value, worker: &str) {
    let outputs = t["Outputs"].as_object().unwrap();
    for (name, value) in [
        ("WorkerFunctionName", json!({"Ref": worker})),
        ("WorkerFunctionArn", json!({"Fn::GetAtt": [worker, "Arn"]})),
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

// --- the two variants: on-demand Lambda (the default) and managed instances --------------------

/// The parameters that make the managed-instances variant (IDs of the forms AWS gives them).
const MANAGED: &[(&str, &str)] = &[
    ("ManagedInstances", "enabled"),
    (
        "ManagedSubnetIds",
        "subnet-0a1b2c3d4e5f60718,subnet-0f1e2d3c4b5a69870",
    ),
    ("ManagedSecurityGroupIds", "sg-0123456789abcdef0"),
];

/// The template as CloudFormation sees it for these parameters (the others at their defaults),
/// before SAM's transform: the resources and outputs whose condition holds, each `Fn::If`
/// replaced by its branch and `AWS::NoValue` left out.
fn variant(t: &Value, overrides: &[(&str, &str)]) -> Value {
    let values = parameter_values(t, overrides);
    let mut out = t.clone();
    for section in ["Resources", "Outputs"] {
        let kept: serde_json::Map<String, Value> = t[section]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, r)| {
                r.get("Condition")
                    .and_then(Value::as_str)
                    .is_none_or(|c| condition_holds(t, c, &values))
            })
            .map(|(id, r)| (id.clone(), resolved(r, t, &values).unwrap()))
            .collect();
        out[section] = Value::Object(kept);
    }
    out
}

/// `v` with each `Fn::If` replaced by its branch; `None` for `Ref AWS::NoValue`.
fn resolved(v: &Value, t: &Value, values: &BTreeMap<String, Value>) -> Option<Value> {
    match v {
        Value::Object(map) => {
            if map.len() == 1 {
                if let Some(branches) = map.get("Fn::If") {
                    let holds = condition_holds(t, branches[0].as_str().unwrap(), values);
                    return resolved(&branches[if holds { 1 } else { 2 }], t, values);
                }
                if map.get("Ref") == Some(&json!("AWS::NoValue")) {
                    return None;
                }
            }
            Some(Value::Object(
                map.iter()
                    .filter_map(|(k, v)| resolved(v, t, values).map(|v| (k.clone(), v)))
                    .collect(),
            ))
        }
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .filter_map(|v| resolved(v, t, values))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

/// The logical IDs of a variant's resources of type `kind`.
fn of_type(t: &Value, kind: &str) -> BTreeSet<String> {
    t["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .map(|(id, _)| id.clone())
        .collect()
}

/// The properties that make a function run on managed instances.
const MANAGED_ONLY: &[&str] = &[
    "CapacityProviderConfig",
    "FunctionScalingConfig",
    "AutoPublishAlias",
    "AutoPublishAliasAllProperties",
    "VersionDeletionPolicy",
];

#[test]
fn the_default_deployment_is_on_demand_lambda_and_nothing_else() {
    let t = template();
    let p = &t["Parameters"]["ManagedInstances"];
    assert_eq!(p["Default"], "disabled");
    assert_eq!(p["AllowedValues"], json!(["disabled", "enabled"]));
    // The first-deployment-only rule is told where the choice is made.
    assert!(
        p["Description"]
            .as_str()
            .unwrap()
            .contains("only when it creates the function"),
        "{p}"
    );

    let d = variant(&t, &[]);
    assert_eq!(
        of_type(&d, "AWS::Serverless::Function"),
        BTreeSet::from(["WorkerFunction".to_string()])
    );
    for kind in [
        "AWS::Serverless::CapacityProvider",
        "AWS::Lambda::CapacityProvider",
        "AWS::Lambda::Function",
        "AWS::Lambda::Version",
        "AWS::Lambda::Alias",
    ] {
        assert!(
            of_type(&d, kind).is_empty(),
            "{kind} in the default variant"
        );
    }
    assert_eq!(
        of_type(&d, "AWS::IAM::Role"),
        BTreeSet::from(["WorkerRole".to_string()])
    );
    let f = &resource(&d, "WorkerFunction")["Properties"];
    for property in MANAGED_ONLY {
        assert!(f.get(*property).is_none(), "{property} on demand");
    }
    // On demand as before: its memory and reserved concurrency.
    assert_eq!(f["MemorySize"], json!({"Ref": "FunctionMemorySize"}));
    assert_eq!(
        f["ReservedConcurrentExecutions"],
        json!({"Ref": "ReservedConcurrency"})
    );
    // Nothing in the default variant refers to the managed one.
    let text = d["Resources"].to_string() + &d["Outputs"].to_string();
    for id in [
        "ManagedWorkerFunction",
        "WorkerCapacityProvider",
        "CapacityProviderOperatorRole",
    ] {
        assert!(!text.contains(id), "the default variant refers to {id}");
    }
}

#[test]
fn managed_instances_run_the_same_worker_on_a_capacity_provider() {
    let t = template();
    let m = variant(&t, MANAGED);
    assert_eq!(
        of_type(&m, "AWS::Serverless::Function"),
        BTreeSet::from(["ManagedWorkerFunction".to_string()])
    );
    assert_eq!(
        of_type(&m, "AWS::Serverless::CapacityProvider"),
        BTreeSet::from(["WorkerCapacityProvider".to_string()])
    );

    // The capacity provider: the network given, Lambda's operator role, arm64 instances as the
    // function's build, and its vCPU limit.
    let cp = &resource(&m, "WorkerCapacityProvider")["Properties"];
    assert_eq!(
        cp["VpcConfig"],
        json!({
            "SubnetIds": {"Ref": "ManagedSubnetIds"},
            "SecurityGroupIds": {"Ref": "ManagedSecurityGroupIds"}
        })
    );
    assert_eq!(
        cp["OperatorRole"],
        json!({"Fn::GetAtt": ["CapacityProviderOperatorRole", "Arn"]})
    );
    let f = &resource(&m, "ManagedWorkerFunction")["Properties"];
    assert_eq!(f["Architectures"], json!(["arm64"]));
    assert_eq!(
        cp["InstanceRequirements"]["Architectures"],
        f["Architectures"]
    );
    assert_eq!(
        cp["ScalingConfig"],
        json!({"MaxVCpuCount": {"Ref": "ManagedMaxVCpuCount"}})
    );

    // The function on it: the provider's ARN (arn:aws:lambda:REGION:ACCOUNT:capacity-provider:NAME,
    // its Ref being the name), the memory per vCPU and M from the parameters.
    let config = &f["CapacityProviderConfig"];
    assert_eq!(
        config,
        &json!({
            "Arn": {"Fn::Sub": "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:capacity-provider:${WorkerCapacityProvider}"},
            "ExecutionEnvironmentMemoryGiBPerVCpu": {"Ref": "ManagedMemoryGiBPerVCpu"},
            "PerExecutionEnvironmentMaxConcurrency": {"Ref": "ManagedMaxConcurrency"}
        })
    );
    assert_eq!(f["MemorySize"], json!({"Ref": "ManagedMemorySize"}));
    assert_eq!(
        f["FunctionScalingConfig"],
        json!({"MaxExecutionEnvironments": {"Ref": "ManagedMaxExecutionEnvironments"}})
    );
    // Published versions behind an alias the triggers use (see the SAM translation test), a new
    // one for any change, the replaced one deleted.
    assert_eq!(f["AutoPublishAlias"], "live");
    assert_eq!(f["AutoPublishAliasAllProperties"], true);
    assert_eq!(f["VersionDeletionPolicy"], "Delete");
    // What Lambda or SAM refuse beside a capacity provider, and reserved concurrency, which
    // FunctionScalingConfig replaces.
    for property in [
        "ReservedConcurrentExecutions",
        "ProvisionedConcurrencyConfig",
        "VpcConfig",
    ] {
        assert!(f.get(property).is_none(), "{property} on managed instances");
    }

    // Everything else is WorkerFunction's: the same build (equal Metadata, CodeUri, runtime and
    // architecture also make `sam build` build the binary once for both), role, environment,
    // logs, async settings, recursive loop setting and triggers.
    let on_demand = resource(&t, "WorkerFunction");
    let managed = resource(&t, "ManagedWorkerFunction");
    assert_eq!(managed["Metadata"], on_demand["Metadata"]);
    let without = |props: &Value, skip: &[&str]| -> Value {
        let mut props = props.as_object().unwrap().clone();
        for key in skip {
            props.remove(*key);
        }
        Value::Object(props)
    };
    let shared_on_demand = without(
        &on_demand["Properties"],
        &["MemorySize", "ReservedConcurrentExecutions"],
    );
    let mut skip = MANAGED_ONLY.to_vec();
    skip.push("MemorySize");
    assert_eq!(without(&managed["Properties"], &skip), shared_on_demand);
}

/// The parameters' bounds are Lambda's, and their defaults give the managed variant what the
/// on-demand default has: the same memory per run, and a bound on invocations at least as high
/// as what the wake-up queue may start.
#[test]
fn the_managed_parameters_keep_to_lambdas_limits_and_the_on_demand_defaults() {
    let t = template();
    let p = |name: &str| &t["Parameters"][name];
    let min = |name: &str| p(name)["MinValue"].as_i64().unwrap();
    let max = |name: &str| p(name)["MaxValue"].as_i64().unwrap();
    // Lambda: at least 2048 MB and one vCPU per environment, 2 to 8 GiB per vCPU, 1 to 1600
    // invocations per environment, vCPU and environment limits of its API.
    assert_eq!(min("ManagedMemorySize"), 2048);
    assert!(max("ManagedMemorySize") <= 32768);
    let ratios: Vec<i64> = p("ManagedMemoryGiBPerVCpu")["AllowedValues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert!(ratios.iter().all(|r| (2..=8).contains(r)), "{ratios:?}");
    assert!(
        param_default(&t, "ManagedMemorySize")
            >= 1024 * param_default(&t, "ManagedMemoryGiBPerVCpu"),
        "the defaults give an environment one vCPU at least"
    );
    assert_eq!(
        (min("ManagedMaxConcurrency"), max("ManagedMaxConcurrency")),
        (1, 1600)
    );
    assert!(min("ManagedMaxVCpuCount") >= 2 && max("ManagedMaxVCpuCount") <= 15000);
    assert!(min("ManagedMaxExecutionEnvironments") >= 3);

    // M x C runs share one environment's memory: each gets what an on-demand run gets.
    let m = param_default(&t, "ManagedMaxConcurrency");
    let c = param_default(&t, "RunConcurrency");
    assert_eq!(
        param_default(&t, "ManagedMemorySize") / (m * c),
        param_default(&t, "FunctionMemorySize") / c
    );
    // As ReservedConcurrency on demand: the queue cannot start more invocations than may run.
    assert!(
        param_default(&t, "WakeMaximumConcurrency")
            <= param_default(&t, "ManagedMaxExecutionEnvironments") * m
    );
}

#[test]
fn managed_instances_need_subnets_and_security_groups() {
    let t = template();
    let base = [
        ("IronflowApiUrl", "https://ironflow.example.com"),
        ("InsecureIronflowApiUrl", ""),
    ];
    for (mode, subnets, groups, accepted) in [
        ("disabled", "", "", true),
        ("enabled", "", "", false),
        ("enabled", "subnet-0a1b2c3d4e5f60718", "", false),
        ("enabled", "", "sg-0123456789abcdef0", false),
        (
            "enabled",
            "subnet-0a1b2c3d4e5f60718,subnet-0f1e2d3c4b5a69870",
            "sg-0123456789abcdef0",
            true,
        ),
    ] {
        let mut params = BTreeMap::from(base);
        params.insert("ManagedInstances", mode);
        params.insert("ManagedSubnetIds", subnets);
        params.insert("ManagedSecurityGroupIds", groups);
        assert_eq!(
            rules_accept(&t, &params),
            accepted,
            "{mode} with subnets {subnets:?} and security groups {groups:?}"
        );
    }
    let managed: BTreeMap<&str, &str> = base.into_iter().chain(MANAGED.iter().copied()).collect();
    assert!(rules_accept(&t, &managed));
}

/// The managed variant's IAM: the worker keeps its own role (the least-privilege tests above
/// hold for it), and the capacity provider's operator role holds the AWS managed policy made for
/// it and nothing else, assumable by Lambda only.
#[test]
fn the_capacity_provider_operator_role_holds_lambdas_policy_alone() {
    let t = template();
    let m = variant(&t, MANAGED);
    assert_eq!(
        of_type(&m, "AWS::IAM::Role"),
        BTreeSet::from([
            "CapacityProviderOperatorRole".to_string(),
            "WorkerRole".to_string()
        ])
    );
    let f = &resource(&m, "ManagedWorkerFunction")["Properties"];
    assert_eq!(f["Role"], json!({"Fn::GetAtt": ["WorkerRole", "Arn"]}));
    assert!(f.get("Policies").is_none());

    let role = resource(&t, "CapacityProviderOperatorRole");
    assert_eq!(role["Condition"], "OnManagedInstances");
    let p = &role["Properties"];
    assert_eq!(
        p["ManagedPolicyArns"],
        json!([{"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AWSLambdaManagedEC2ResourceOperator"}])
    );
    for absent in ["Policies", "PermissionsBoundary", "Path"] {
        assert!(p.get(absent).is_none(), "{absent} on the operator role");
    }
    assert_eq!(
        p["AssumeRolePolicyDocument"]["Statement"],
        json!([{
            "Effect": "Allow",
            "Principal": {"Service": "lambda.amazonaws.com"},
            "Action": "sts:AssumeRole"
        }])
    );
}

/// `template.yaml` with the parameters' defaults replaced, as a file the linters read: the
/// text itself (its short tags, its lines), only the `Default:` line of each changed.
fn with_defaults(text: &str, defaults: &[(&str, &str)]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for (name, value) in defaults {
        let start = lines
            .iter()
            .position(|l| l == &format!("  {name}:"))
            .unwrap_or_else(|| panic!("no parameter {name}"));
        let end = (start + 1..lines.len())
            .find(|&i| !lines[i].starts_with("   "))
            .unwrap();
        let line = (start + 1..end)
            .find(|&i| lines[i].starts_with("    Default:"))
            .unwrap_or_else(|| panic!("{name} has no default"));
        lines[line] = format!("    Default: {}", json!(value));
    }
    let rendered = lines.join("\n") + "\n";
    let parsed = to_json(yaml_serde::from_str(&rendered).unwrap());
    for (name, value) in defaults {
        assert_eq!(parsed["Parameters"][*name]["Default"], json!(value));
    }
    rendered
}

/// A variant of template.yaml in a directory of its own (without samconfig.toml, so that `sam
/// validate` alone translates rather than lints).
fn variant_file(name: &str, overrides: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    let path = dir.join("template.yaml");
    std::fs::write(&path, with_defaults(&text, overrides)).unwrap();
    path
}

fn venv_tool(name: &str) -> PathBuf {
    let tool = root().join(".venv/bin").join(name);
    assert!(
        tool.exists(),
        "{} is missing: run ./scripts/test, which installs the project's Python tools",
        tool.display()
    );
    tool
}

/// Runs a tool of .venv on `template` as scripts/test runs SAM: no AWS call, dummy credentials.
fn run_on(tool: &str, args: &[&str], template: &Path) -> String {
    let output = Command::new(venv_tool(tool))
        .args(args)
        .arg(template)
        .current_dir(template.parent().unwrap())
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("SAM_CLI_TELEMETRY", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{tool} {args:?} {} failed:\n{stdout}\n{}",
        template.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Both linters and SAM's own validation (its transform, offline) pass on each variant.
fn lints_clean(name: &str, overrides: &[(&str, &str)]) {
    let path = variant_file(name, overrides);
    // cfn-lint fails on any error or warning; it ignores --parameters on SAM templates, hence
    // the file with other defaults.
    assert_eq!(run_on("cfn-lint", &[], &path), "", "cfn-lint warnings");
    assert!(
        run_on("sam", &["validate", "--lint", "-t"], &path).contains("is a valid SAM Template")
    );
    assert!(run_on("sam", &["validate", "-t"], &path).contains("is a valid SAM Template"));
}

#[test]
fn the_on_demand_variant_passes_both_linters() {
    lints_clean("on-demand-variant", &[]);
}

#[test]
fn the_managed_variant_passes_both_linters() {
    lints_clean("managed-variant", MANAGED);
}

#[test]
fn the_webhook_variant_passes_both_linters() {
    lints_clean("webhook-variant", &with_webhook(&[]));
}

#[test]
fn the_managed_webhook_variant_passes_both_linters() {
    lints_clean("managed-webhook-variant", &with_webhook(MANAGED));
}

/// Agent steps: without Bedrock models and with the Anthropic key's secret, on demand and on
/// managed instances.
const AGENTS_ANTHROPIC: &[(&str, &str)] = &[
    ("BedrockInferenceProfileIds", ""),
    ("BedrockFoundationModelIds", ""),
    (
        "AnthropicApiKeySecretArn",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:anthropic-AbCdEf",
    ),
];

#[test]
fn the_agent_variants_pass_both_linters() {
    lints_clean("anthropic-variant", AGENTS_ANTHROPIC);
    let managed: Vec<(&str, &str)> = MANAGED.iter().chain(AGENTS_ANTHROPIC).copied().collect();
    lints_clean("managed-anthropic-variant", &managed);
}

/// template.yaml as SAM's transform makes it, by the SAM translator of .venv (offline), with
/// CodeUri pointing at an uploaded artefact as after `sam package`.
fn sam_translated() -> Value {
    sam_translated_with(false)
}

/// As [`sam_translated`]; with `function_urls`, each function first given SAM's own public URL,
/// `FunctionUrlConfig: {AuthType: NONE}`, to compare the template's URL with.
fn sam_translated_with(function_urls: bool) -> Value {
    const SCRIPT: &str = r#"
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

with open(sys.argv[1]) as f:
    template = yaml_parse(f.read())
for resource in template["Resources"].values():
    if resource["Type"] == "AWS::Serverless::Function":
        resource["Properties"]["CodeUri"] = "s3://artefacts/worker.zip"
        if sys.argv[2] == "true":
            resource["Properties"]["FunctionUrlConfig"] = {"AuthType": "NONE"}

class NoManagedPolicies:
    def load(self):
        return {}

print(json.dumps(transform(template, {}, NoManagedPolicies())))
"#;
    let output = Command::new(venv_python())
        .args(["-c", SCRIPT])
        .arg(root().join("template.yaml"))
        .arg(function_urls.to_string())
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "SAM's transform failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// What SAM makes of each variant: on demand, the function alone, unpublished; on managed
/// instances, the function with Lambda's capacity provider configuration, published behind the
/// alias `live` that the schedule, the wake-up queue and the async settings all target.
#[test]
fn sams_transform_wires_each_variant() {
    let translated = sam_translated();

    let d = variant(&translated, &[]);
    assert!(of_type(&d, "AWS::Lambda::CapacityProvider").is_empty());
    assert!(of_type(&d, "AWS::Lambda::Version").is_empty());
    assert!(of_type(&d, "AWS::Lambda::Alias").is_empty());
    assert_eq!(
        of_type(&d, "AWS::Lambda::Function"),
        BTreeSet::from(["WorkerFunction".to_string()])
    );
    assert_eq!(
        of_type(&d, "AWS::IAM::Role"),
        BTreeSet::from(["WorkerRole".to_string()]),
        "SAM adds no role of its own"
    );
    let f = &resource(&d, "WorkerFunction")["Properties"];
    assert!(f.get("CapacityProviderConfig").is_none());
    assert_eq!(
        resource(&d, "WorkerFunctionWakeUps")["Properties"]["FunctionName"],
        json!({"Ref": "WorkerFunction"})
    );

    let m = variant(&translated, MANAGED);
    assert_eq!(
        of_type(&m, "AWS::Lambda::Function"),
        BTreeSet::from(["ManagedWorkerFunction".to_string()])
    );
    assert_eq!(
        of_type(&m, "AWS::IAM::Role"),
        BTreeSet::from([
            "CapacityProviderOperatorRole".to_string(),
            "WorkerRole".to_string()
        ]),
        "SAM adds no operator role of its own"
    );
    let cp = &resource(&m, "WorkerCapacityProvider");
    assert_eq!(cp["Type"], "AWS::Lambda::CapacityProvider");
    assert_eq!(
        cp["Properties"]["PermissionsConfig"],
        json!({"CapacityProviderOperatorRoleArn": {"Fn::GetAtt": ["CapacityProviderOperatorRole", "Arn"]}})
    );
    assert_eq!(
        cp["Properties"]["CapacityProviderScalingConfig"],
        json!({"MaxVCpuCount": {"Ref": "ManagedMaxVCpuCount"}, "ScalingMode": "Auto"})
    );
    let f = &resource(&m, "ManagedWorkerFunction")["Properties"];
    let config = &f["CapacityProviderConfig"]["LambdaManagedInstancesCapacityProviderConfig"];
    assert!(
        config["CapacityProviderArn"]["Fn::Sub"]
            .as_str()
            .unwrap()
            .ends_with(":capacity-provider:${WorkerCapacityProvider}")
    );
    assert_eq!(
        config["PerExecutionEnvironmentMaxConcurrency"],
        json!({"Ref": "ManagedMaxConcurrency"})
    );

    let versions = of_type(&m, "AWS::Lambda::Version");
    assert_eq!(versions.len(), 1, "{versions:?}");
    let version = resource(&m, versions.first().unwrap());
    assert_eq!(version["DeletionPolicy"], "Delete");
    let alias = "ManagedWorkerFunctionAliaslive";
    assert_eq!(
        of_type(&m, "AWS::Lambda::Alias"),
        BTreeSet::from([alias.to_string()])
    );
    assert_eq!(resource(&m, alias)["Properties"]["Name"], "live");
    let to_alias = json!({"Ref": alias});
    assert_eq!(
        resource(&m, "ManagedWorkerFunctionWakeUps")["Properties"]["FunctionName"],
        to_alias
    );
    assert_eq!(
        resource(&m, "ManagedWorkerFunctionSchedule")["Properties"]["Targets"][0]["Arn"],
        to_alias
    );
    assert_eq!(
        resource(&m, "ManagedWorkerFunctionSchedulePermission")["Properties"]["FunctionName"],
        to_alias
    );
    let invoke = &resource(&m, "ManagedWorkerFunctionEventInvokeConfig")["Properties"];
    assert_eq!(invoke["Qualifier"], "live");
    assert_eq!(invoke["MaximumRetryAttempts"], 0);
    assert_eq!(m["Outputs"]["WorkerFunctionAliasArn"]["Value"], to_alias);
}

// --- the webhook receiver (WebhookReceiver, docs/push.md), in both variants ----------------------

/// A webhook secret's ARN of the form Secrets Manager gives it.
const WEBHOOK_SECRET_ARN: &str =
    "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ironflow/webhook-AbC123";

/// `overrides` with the webhook receiver enabled.
fn with_webhook(overrides: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    overrides
        .iter()
        .copied()
        .chain([
            ("WebhookReceiver", "enabled"),
            ("WebhookSecretArn", WEBHOOK_SECRET_ARN),
        ])
        .collect()
}

/// The function of the variant these parameters make.
fn function_id(overrides: &[(&str, &str)]) -> String {
    if overrides.contains(&("ManagedInstances", "enabled")) {
        "ManagedWorkerFunction".into()
    } else {
        "WorkerFunction".into()
    }
}

/// The receiver's function: on demand in both variants, behind the URL.
const RECEIVER: &str = "WebhookReceiverFunction";

/// What a Function URL and its permissions name: the receiver's function, in both variants.
fn url_target() -> Value {
    json!({ "Ref": RECEIVER })
}

/// The inline policy's statements of `role`, `!If [cond, statement, AWS::NoValue]` as a
/// variant resolves it.
fn statements_of(t: &Value, role: &str) -> Value {
    let policies = &resource(t, role)["Properties"]["Policies"];
    assert_eq!(
        policies.as_array().unwrap().len(),
        1,
        "{role}: one inline policy"
    );
    policies[0]["PolicyDocument"]["Statement"].clone()
}

/// The resources the role lets the function read secrets from.
fn secrets_read(t: &Value) -> BTreeSet<String> {
    role_statements(t)
        .iter()
        .filter(|s| strings(&s["Action"]).contains(&"secretsmanager:GetSecretValue".to_string()))
        .flat_map(|s| match &s["Resource"] {
            Value::Array(items) => items.clone(),
            one => vec![one.clone()],
        })
        .map(|r| r.to_string())
        .collect()
}

fn secret_refs(names: &[&str]) -> BTreeSet<String> {
    names
        .iter()
        .map(|n| json!({ "Ref": n }).to_string())
        .collect()
}

#[test]
fn the_webhook_receiver_is_off_by_default() {
    let t = template();
    let p = &t["Parameters"]["WebhookReceiver"];
    assert_eq!(p["Default"], "disabled");
    assert_eq!(p["AllowedValues"], json!(["disabled", "enabled"]));
    assert_eq!(t["Parameters"]["WebhookSecretArn"]["Default"], "");
    // SAM's own URL would be unconditional (it makes one even from an !If around it).
    for id in ["WorkerFunction", "ManagedWorkerFunction"] {
        assert!(
            resource(&t, id)["Properties"]
                .get("FunctionUrlConfig")
                .is_none(),
            "FunctionUrlConfig on {id}"
        );
    }
    // Off: no URL, no permission, no secret's ARN in the environment, no extra IAM, no output;
    // an ARN alone does not turn it on.
    for overrides in [
        vec![],
        MANAGED.to_vec(),
        vec![("WebhookSecretArn", WEBHOOK_SECRET_ARN)],
    ] {
        let d = variant(&t, &overrides);
        for kind in ["AWS::Lambda::Url", "AWS::Lambda::Permission"] {
            assert!(of_type(&d, kind).is_empty(), "{kind} without the receiver");
        }
        let f = &resource(&d, &function_id(&overrides))["Properties"];
        assert!(
            f["Environment"]["Variables"]
                .get("IRONFLOW_WEBHOOK_SECRET_ARN")
                .is_none()
        );
        assert_eq!(secrets_read(&d), secret_refs(&["WorkerTokenSecretArn"]));
        let text = d["Resources"].to_string() + &d["Outputs"].to_string();
        for name in [
            "WebhookSecretArn",
            "WebhookFunctionUrl",
            "WebhookReceiver",
            "ReadWebhookSecret",
        ] {
            assert!(!text.contains(name), "{name} without the receiver");
        }
    }
}

#[test]
fn the_webhook_receiver_needs_its_secrets_full_arn() {
    let t = template();
    let base = [
        ("IronflowApiUrl", "https://ironflow.example.com"),
        ("InsecureIronflowApiUrl", ""),
    ];
    for (receiver, arn, accepted) in [
        ("disabled", "", true),
        ("disabled", WEBHOOK_SECRET_ARN, true),
        ("enabled", "", false),
        ("enabled", WEBHOOK_SECRET_ARN, true),
    ] {
        let mut params = BTreeMap::from(base);
        params.insert("WebhookReceiver", receiver);
        params.insert("WebhookSecretArn", arn);
        assert_eq!(
            rules_accept(&t, &params),
            accepted,
            "WebhookReceiver {receiver} with WebhookSecretArn {arn:?}"
        );
    }
    // A full secret ARN as the worker token's (what IAM grants GetSecretValue on), or empty.
    let pattern = |name: &str| t["Parameters"][name]["AllowedPattern"].as_str().unwrap();
    assert_eq!(
        pattern("WebhookSecretArn"),
        format!("^$|{}", pattern("WorkerTokenSecretArn"))
    );
    // The condition holds exactly when the rule lets the receiver on.
    for (receiver, arn, holds) in [
        ("disabled", "", false),
        ("disabled", WEBHOOK_SECRET_ARN, false),
        ("enabled", WEBHOOK_SECRET_ARN, true),
    ] {
        let values = parameter_values(
            &t,
            &[("WebhookReceiver", receiver), ("WebhookSecretArn", arn)],
        );
        assert_eq!(condition_holds(&t, "HasWebhookReceiver", &values), holds);
    }
}

#[test]
fn the_webhook_receiver_is_a_function_of_its_own_behind_the_public_url() {
    let t = template();
    for overrides in [&[][..], MANAGED] {
        let w = variant(&t, &with_webhook(overrides));
        let worker = function_id(overrides);
        let target = url_target();
        assert_eq!(
            of_type(&w, "AWS::Serverless::Function"),
            BTreeSet::from([worker.clone(), RECEIVER.to_string()])
        );

        // The URL, public, on the receiver: it authenticates each request itself.
        assert_eq!(
            of_type(&w, "AWS::Lambda::Url"),
            BTreeSet::from(["WebhookFunctionUrl".to_string()])
        );
        assert_eq!(
            resource(&w, "WebhookFunctionUrl")["Properties"],
            json!({"AuthType": "NONE", "TargetFunctionArn": target})
        );
        // Anyone may invoke the receiver, through the URL only (both actions, as Lambda asks
        // of a new URL since October 2025).
        assert_eq!(
            of_type(&w, "AWS::Lambda::Permission"),
            BTreeSet::from([
                "WebhookUrlInvokeAccess".to_string(),
                "WebhookUrlPublicAccess".to_string()
            ])
        );
        assert_eq!(
            resource(&w, "WebhookUrlPublicAccess")["Properties"],
            json!({
                "Action": "lambda:InvokeFunctionUrl",
                "FunctionName": target,
                "Principal": "*",
                "FunctionUrlAuthType": "NONE"
            })
        );
        assert_eq!(
            resource(&w, "WebhookUrlInvokeAccess")["Properties"],
            json!({
                "Action": "lambda:InvokeFunction",
                "FunctionName": target,
                "Principal": "*",
                "InvokedViaFunctionUrl": true
            })
        );
        the_receiver_is_bounded_on_demand_with_its_own_log_group(&w, &worker);

        // The worker has no URL, no webhook secret, and its role reads the worker token only:
        // nothing of the worker differs from the variant without the receiver.
        for id in [
            "WebhookFunctionUrl",
            "WebhookUrlPublicAccess",
            "WebhookUrlInvokeAccess",
        ] {
            assert!(
                !resource(&w, id).to_string().contains(&worker),
                "{id} names {worker}"
            );
        }
        assert!(
            resource(&w, &worker)["Properties"]["Environment"]["Variables"]
                .get("IRONFLOW_WEBHOOK_SECRET_ARN")
                .is_none()
        );
        assert_eq!(secrets_read(&w), secret_refs(&["WorkerTokenSecretArn"]));
        let off = variant(&t, overrides);
        let mut rest = w["Resources"].clone();
        let resources = rest.as_object_mut().unwrap();
        for id in [
            "WebhookFunctionUrl",
            "WebhookUrlPublicAccess",
            "WebhookUrlInvokeAccess",
            RECEIVER,
            "WebhookReceiverRole",
            "WebhookReceiverLogGroup",
            "WebhookReceiverThrottlesAlarm",
            "WebhookReceiverErrorsAlarm",
        ] {
            resources.remove(id);
        }
        assert_eq!(rest, off["Resources"]);
    }
}

/// The receiver: the worker's build, on demand, its reserved concurrency, role and log group,
/// in the webhook-receiver role, with no trigger but its URL.
fn the_receiver_is_bounded_on_demand_with_its_own_log_group(w: &Value, worker: &str) {
    let r = resource(w, RECEIVER);
    assert_eq!(
        r["Metadata"],
        resource(w, worker)["Metadata"],
        "the same build"
    );
    let p = &r["Properties"];
    for property in MANAGED_ONLY {
        assert!(
            p.get(*property).is_none(),
            "{property}: the receiver is on demand"
        );
    }
    assert!(
        p.get("Events").is_none(),
        "the receiver has no schedule and no queue"
    );
    assert!(p.get("FunctionUrlConfig").is_none());
    assert_eq!(
        p["ReservedConcurrentExecutions"],
        json!({"Ref": "WebhookReservedConcurrency"})
    );
    assert_eq!(
        p["Role"],
        json!({"Fn::GetAtt": ["WebhookReceiverRole", "Arn"]})
    );
    assert_eq!(
        p["LoggingConfig"]["LogGroup"],
        json!({"Ref": "WebhookReceiverLogGroup"})
    );
    assert_ne!(
        resource(w, "WebhookReceiverLogGroup")["Properties"]["LogGroupName"],
        resource(w, "WorkerLogGroup")["Properties"]["LogGroupName"]
    );
    // A flood shows: any throttle of the receiver alarms.
    let alarm = &resource(w, "WebhookReceiverThrottlesAlarm")["Properties"];
    assert_eq!(
        (
            &alarm["MetricName"],
            &alarm["Threshold"],
            &alarm["Dimensions"][0]["Value"]
        ),
        (&json!("Throttles"), &json!(0), &json!({"Ref": RECEIVER}))
    );
    // A receiver that cannot start loses every push: any error of it alarms.
    let alarm = &resource(w, "WebhookReceiverErrorsAlarm")["Properties"];
    assert_eq!(
        (
            &alarm["MetricName"],
            &alarm["Threshold"],
            &alarm["Dimensions"][0]["Value"]
        ),
        (&json!("Errors"), &json!(0), &json!({"Ref": RECEIVER}))
    );
    let env = &p["Environment"]["Variables"];
    assert_eq!(env["IRONFLOW_FUNCTION_ROLE"], "webhook-receiver");
    assert_eq!(
        env["IRONFLOW_WEBHOOK_SECRET_ARN"],
        json!({"Ref": "WebhookSecretArn"})
    );
    assert_eq!(
        env["IRONFLOW_WORKER_TOKEN_SECRET_ARN"],
        json!({"Ref": "WorkerTokenSecretArn"})
    );
    let c = &w["Parameters"]["WebhookReservedConcurrency"];
    assert_eq!(
        (c["Default"].as_i64(), c["MinValue"].as_i64()),
        (Some(2), Some(1))
    );
    assert!(c["Description"].as_str().unwrap().contains("flood"), "{c}");
}

/// The receiver's role, statement for statement: its logs, the two secrets, items of the
/// poison-pill table, the wake queue; the worker token's KMS key only when there is one.
#[test]
fn the_webhook_receiver_role_is_least_privilege() {
    let t = template();
    let expected = |kms: bool| {
        let mut statements = vec![
            json!({"Sid": "WriteOwnLogs", "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": {"Fn::GetAtt": ["WebhookReceiverLogGroup", "Arn"]}}),
            json!({"Sid": "ReadSecrets", "Effect": "Allow",
                "Action": "secretsmanager:GetSecretValue",
                "Resource": [{"Ref": "WebhookSecretArn"}, {"Ref": "WorkerTokenSecretArn"}]}),
        ];
        if kms {
            statements.push(json!({"Sid": "DecryptWorkerTokenSecret", "Effect": "Allow",
                "Action": "kms:Decrypt", "Resource": {"Ref": "WorkerTokenSecretKmsKeyArn"},
                "Condition": {"StringEquals": {"kms:ViaService":
                    {"Fn::Sub": "secretsmanager.${AWS::Region}.amazonaws.com"}}}}));
        }
        statements.push(json!({"Sid": "WakeUpRecords", "Effect": "Allow",
            "Action": ["dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"],
            "Resource": {"Fn::GetAtt": ["PoisonTable", "Arn"]}}));
        statements.push(json!({"Sid": "SendWakeUps", "Effect": "Allow",
            "Action": ["sqs:SendMessage", "sqs:GetQueueAttributes"],
            "Resource": {"Fn::GetAtt": ["WakeQueue", "Arn"]}}));
        Value::Array(statements)
    };
    let key = (
        "WorkerTokenSecretKmsKeyArn",
        "arn:aws:kms:eu-west-1:123456789012:key/0a1b2c3d-aaaa-bbbb-cccc-0123456789ab",
    );
    for overrides in [&[][..], MANAGED] {
        let w = variant(&t, &with_webhook(overrides));
        assert_eq!(statements_of(&w, "WebhookReceiverRole"), expected(false));
        let mut with_key = with_webhook(overrides);
        with_key.push(key);
        assert_eq!(
            statements_of(&variant(&t, &with_key), "WebhookReceiverRole"),
            expected(true)
        );
        let role = &resource(&w, "WebhookReceiverRole")["Properties"];
        assert_eq!(
            role["AssumeRolePolicyDocument"],
            resource(&w, "WorkerRole")["Properties"]["AssumeRolePolicyDocument"]
        );
        assert!(role.get("ManagedPolicyArns").is_none());
    }
}

/// The receiver's environment is settings the binary accepts, in the receiver's role.
#[test]
fn the_webhook_receivers_environment_is_valid_receiver_settings() {
    let t = template();
    let w = variant(&t, &with_webhook(&[]));
    let env = resource(&w, RECEIVER)["Properties"]["Environment"]["Variables"].clone();
    let lookup = |name: &str| -> Option<String> {
        let value = env.get(name)?;
        if let Some(text) = value.as_str() {
            return Some(text.to_string());
        }
        let default = t["Parameters"]
            .get(value.get("Ref")?.as_str()?)?
            .get("Default")?;
        Some(match default {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let settings = ironflow_lambda::settings::Settings::from_lookup_with_token(
        |name| match name {
            "IRONFLOW_API_URL" => Some("https://ironflow.example.com".into()),
            "IRONFLOW_WAKE_QUEUE_URL" => {
                Some("https://sqs.eu-west-1.amazonaws.com/123456789012/wake".into())
            }
            "IRONFLOW_POISON_TABLE" => Some("ironflow-poison".into()),
            // The rule `WebhookSecretArn` required with the receiver enabled: an ARN is given.
            "IRONFLOW_WEBHOOK_SECRET_ARN" => Some(
                "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ironflow/webhook-AbCdEf"
                    .into(),
            ),
            _ => lookup(name),
        },
        Some(ironflow_lambda::settings::WorkerToken::new("t")),
    )
    .unwrap();
    assert_eq!(
        settings.function_role,
        ironflow_lambda::settings::FunctionRole::WebhookReceiver
    );
    assert!(settings.validate().is_empty(), "{:?}", settings.validate());
    assert_eq!(
        settings.function_timeout.as_secs(),
        resource(&w, RECEIVER)["Properties"]["Timeout"]
            .as_u64()
            .unwrap()
    );
}

/// The URL and its permissions are what SAM makes of a function's `FunctionUrlConfig: {AuthType:
/// NONE}` (which cannot be conditional), in both variants: the same properties, on the
/// receiver's function.
#[test]
fn the_webhook_url_is_what_sams_function_url_config_makes() {
    let ours = sam_translated();
    let sams = sam_translated_with(true);
    for overrides in [&[][..], MANAGED] {
        let overrides = with_webhook(overrides);
        let o = variant(&ours, &overrides);
        let s = variant(&sams, &overrides);
        let worker = RECEIVER;
        for (mine, sam) in [
            ("WebhookFunctionUrl", format!("{worker}Url")),
            (
                "WebhookUrlPublicAccess",
                format!("{worker}UrlPublicPermissions"),
            ),
            (
                "WebhookUrlInvokeAccess",
                format!("{worker}URLInvokeAllowPublicAccess"),
            ),
        ] {
            let (mine, sam) = (resource(&o, mine), resource(&s, &sam));
            assert_eq!(mine["Type"], sam["Type"]);
            assert_eq!(mine["Properties"], sam["Properties"], "{sam}");
        }
    }
}

#[test]
fn the_webhook_outputs_give_the_url_and_the_apis_setting_without_the_secret() {
    for overrides in [&[][..], MANAGED] {
        let w = variant(&template(), &with_webhook(overrides));
        let outputs = &w["Outputs"];
        assert_eq!(
            outputs["WebhookUrl"]["Value"],
            json!({"Fn::GetAtt": ["WebhookFunctionUrl", "FunctionUrl"]})
        );
        // The URL (it ends in '/') with the token parameter the receiver reads, and a
        // placeholder naming the secret instead of its value: the output takes nothing but the
        // URL and the secret's ARN.
        let setting = outputs["WebhookApiSetting"]["Value"]["Fn::Sub"]
            .as_str()
            .unwrap();
        assert!(
            setting.starts_with("WEBHOOK_URL=${WebhookFunctionUrl.FunctionUrl}?token=<"),
            "{setting}"
        );
        let substituted: BTreeSet<&str> = setting
            .split("${")
            .skip(1)
            .map(|part| part.split('}').next().unwrap())
            .collect();
        assert_eq!(
            substituted,
            BTreeSet::from(["WebhookFunctionUrl.FunctionUrl", "WebhookSecretArn"])
        );
        assert!(!outputs.to_string().contains("resolve:secretsmanager"));
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

// --- the parameters' constraints against the worker's own checks ------------------------------

/// Whether template.yaml's constraints on parameter `name` allow `value`, as CloudFormation
/// checks them before it creates anything: `AllowedValues`, `MinValue` and `MaxValue`, and
/// `AllowedPattern` (matched against the whole value; against each item of a list).
fn template_allows(t: &Value, name: &str, value: &str) -> bool {
    let p = &t["Parameters"][name];
    assert!(p.is_object(), "template.yaml has no parameter {name}");
    if let Some(allowed) = p["AllowedValues"].as_array()
        && !allowed.iter().any(|a| text(a) == value)
    {
        return false;
    }
    if p["Type"] == "Number" {
        let Ok(n) = value.parse::<f64>() else {
            return false;
        };
        let below = p["MinValue"].as_f64().is_some_and(|min| n < min);
        let above = p["MaxValue"].as_f64().is_some_and(|max| n > max);
        if below || above {
            return false;
        }
    }
    let Some(pattern) = p["AllowedPattern"].as_str() else {
        return true;
    };
    let schema = json!({"type": "string", "pattern": format!("^(?:{pattern})$")});
    let items: Vec<&str> = if p["Type"] == "CommaDelimitedList" {
        value.split(',').collect()
    } else {
        vec![value]
    };
    items
        .iter()
        .all(|item| jsonschema::is_valid(&schema, &json!(item)))
}

/// What the API URL parameter is in every check below: the worker needs one.
const API_URL: (&str, &str) = ("IronflowApiUrl", "https://ironflow.example.com");

/// The parameters every stack is given (no default).
const GIVEN: &[(&str, &str)] = &[
    API_URL,
    (
        "WorkerTokenSecretArn",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:ironflow/worker-token-AbC123",
    ),
];

/// The functions that read the settings at cold start, each with the parameters that make it
/// exist.
fn settings_readers() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        ("WorkerFunction", GIVEN.to_vec()),
        (
            "ManagedWorkerFunction",
            MANAGED.iter().chain(GIVEN).copied().collect(),
        ),
        (RECEIVER, with_webhook(GIVEN)),
    ]
}

/// `base` with these parameters set, in place of any value `base` gives them.
fn setting<'a>(base: &[(&'a str, &'a str)], set: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    base.iter()
        .filter(|(name, _)| !set.iter().any(|(n, _)| n == name))
        .chain(set)
        .copied()
        .collect()
}

/// The environment template.yaml gives `function` for these parameters (the others at their
/// defaults): each `Ref` to a parameter its value, the stack's resources values of the form AWS
/// gives them, and on managed instances `AWS_LAMBDA_MAX_CONCURRENCY` as Lambda sets it.
fn environment(t: &Value, function: &str, overrides: &[(&str, &str)]) -> BTreeMap<String, String> {
    let values = parameter_values(t, overrides);
    let v = variant(t, overrides);
    let properties = &resource(&v, function)["Properties"];
    let mut env: BTreeMap<String, String> = properties["Environment"]["Variables"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, value)| {
            let value = match value.get("Ref").and_then(Value::as_str) {
                None => value.as_str().unwrap_or_else(|| panic!("{name}: {value}")).into(),
                Some("PoisonTable") => "ironflow-lambda-PoisonTable-1A2B3C4D5E6F".into(),
                Some("WakeQueue") => {
                    "https://sqs.us-east-1.amazonaws.com/123456789012/ironflow-lambda-WakeQueue-1A2B3C"
                        .into()
                }
                Some("AWS::StackName") => "ironflow-lambda".into(),
                Some(parameter) => text(&values[parameter]),
            };
            (name.clone(), value)
        })
        .collect();
    if let Some(m) =
        properties["CapacityProviderConfig"]["PerExecutionEnvironmentMaxConcurrency"]["Ref"]
            .as_str()
    {
        env.insert("AWS_LAMBDA_MAX_CONCURRENCY".into(), text(&values[m]));
    }
    env.insert(
        "AWS_LAMBDA_FUNCTION_NAME".into(),
        "ironflow-lambda-WorkerFunction-1A2B3C4D5E6F".into(),
    );
    env
}

/// The worker's cold-start check of `env` (`Settings::from_lookup`), the token as the secret in
/// `IRONFLOW_WORKER_TOKEN_SECRET_ARN` gives it.
fn worker_accepts(env: &BTreeMap<String, String>) -> Result<(), String> {
    ironflow_lambda::settings::Settings::from_lookup_with_token(
        |name| env.get(name).cloned(),
        Some(ironflow_lambda::settings::WorkerToken::new(
            "a-worker-token",
        )),
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

/// What the parameters' descriptions say the worker requires of two values together, which a
/// rule cannot check (rules do not compare numbers): `Err` names the broken requirement.
fn documented_pairs(env: &BTreeMap<String, String>) -> Result<(), &'static str> {
    let number =
        |name: &str, unset: u64| -> u64 { env.get(name).map_or(unset, |v| v.parse().unwrap()) };
    // Unset, the worker's defaults (the receiver sets neither lease nor concurrency).
    let ttl = number("IRONFLOW_LEASE_TTL_SECS", 90);
    let interval = number("IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", 30);
    if interval >= ttl {
        return Err("LeaseRefreshIntervalSecs below LeaseTtlSecs");
    }
    let (m, c) = (
        number("AWS_LAMBDA_MAX_CONCURRENCY", 1),
        number("IRONFLOW_CONCURRENCY", 2),
    );
    if m * c > 4096 {
        return Err("ManagedMaxConcurrency x RunConcurrency at most 4096");
    }
    let budget = ironflow_lambda::settings::DEFAULT_MIN_CLAIM_BUDGET.as_millis() as u64;
    let margin = number("IRONFLOW_DEADLINE_MARGIN_MS", 10_000);
    if margin + budget >= number("IRONFLOW_FUNCTION_TIMEOUT_SECS", 900) * 1000 {
        return Err("DeadlineMarginMs plus 2 s below FunctionTimeout");
    }
    Ok(())
}

/// The pairs of [`documented_pairs`], and what each one's descriptions must name.
const PAIRS: &[(&str, &str, &str)] = &[
    (
        "LeaseTtlSecs",
        "LeaseRefreshIntervalSecs",
        "LeaseRefreshIntervalSecs",
    ),
    ("LeaseRefreshIntervalSecs", "LeaseTtlSecs", "LeaseTtlSecs"),
    ("RunConcurrency", "ManagedMaxConcurrency", "4096"),
    ("ManagedMaxConcurrency", "RunConcurrency", "4096"),
    ("DeadlineMarginMs", "FunctionTimeout", "2 s"),
    ("FunctionTimeout", "DeadlineMarginMs", "margin"),
];

/// A parameter's bounds: its `MinValue`, `MaxValue`, default and `AllowedValues`.
fn bounds(t: &Value, name: &str) -> Vec<String> {
    let p = &t["Parameters"][name];
    let mut values: Vec<String> = ["MinValue", "MaxValue", "Default"]
        .iter()
        .filter_map(|key| p.get(*key).map(text))
        .chain(
            p["AllowedValues"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text),
        )
        .collect();
    values.sort();
    values.dedup();
    values
}

/// The parameters a function's settings come from (its environment's and, on managed
/// instances, M).
fn parameters_read(t: &Value, function: &str, overrides: &[(&str, &str)]) -> BTreeSet<String> {
    let v = variant(t, overrides);
    let properties = &resource(&v, function)["Properties"];
    let mut names: BTreeSet<String> = properties["Environment"]["Variables"]
        .as_object()
        .unwrap()
        .values()
        .chain([&properties["CapacityProviderConfig"]["PerExecutionEnvironmentMaxConcurrency"]])
        .filter_map(|v| v.get("Ref").and_then(Value::as_str))
        .filter(|name| t["Parameters"].get(*name).is_some())
        .map(String::from)
        .collect();
    // The URL of the API in use, whichever of the two it is.
    names.remove("InsecureIronflowApiUrl");
    names
}

/// Review H2: every parameter's bounds (its MinValue, MaxValue, default and allowed values),
/// through the worker's own cold-start check in each function that reads it. Each is accepted
/// with the other parameters at their defaults, or, for the pairs a rule cannot compare, with
/// its partner at one of its own bounds; and the worker refuses exactly the pairs the
/// descriptions say it refuses.
#[test]
fn every_parameter_bound_is_a_value_the_worker_accepts() {
    let t = template();
    let mut checked = 0;
    for (function, base) in settings_readers() {
        for name in parameters_read(&t, function, &base) {
            // The parameters that make the variant are its, not bounds to try.
            if base.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let partner = PAIRS
                .iter()
                .find(|(p, _, _)| *p == name)
                .map(|(_, q, _)| *q);
            for value in bounds(&t, &name) {
                assert!(template_allows(&t, &name, &value), "{name}={value}");
                let partner_values = match partner {
                    Some(q) => bounds(&t, q).into_iter().map(|v| Some((q, v))).collect(),
                    None => vec![None],
                };
                let mut accepted_once = false;
                for other in partner_values {
                    let mut set = vec![(name.as_str(), value.as_str())];
                    if let Some((q, v)) = &other {
                        set.push((q, v.as_str()));
                    }
                    let overrides = setting(&base, &set);
                    let env = environment(&t, function, &overrides);
                    let worker = worker_accepts(&env);
                    let documented = documented_pairs(&env);
                    assert_eq!(
                        worker.is_ok(),
                        documented.is_ok(),
                        "{function}, {name}={value} {other:?}: the worker says {worker:?}, the \
                         descriptions {documented:?}"
                    );
                    accepted_once |= worker.is_ok();
                    checked += 1;
                }
                assert!(
                    accepted_once,
                    "{function}: {name}={value} is never accepted"
                );
            }
        }
    }
    assert!(checked > 100, "{checked}");
    // Each pair's requirement is in both parameters' descriptions, where an operator reads it.
    for (name, partner, needed) in PAIRS {
        let description = t["Parameters"][*name]["Description"].as_str().unwrap();
        assert!(
            description.contains(needed),
            "{name}'s description does not state its requirement with {partner}: {description}"
        );
    }
}

/// A row of [`CODE_BOUNDS`].
type CodeBound = (
    &'static str,
    i64,
    Option<i64>,
    Option<(&'static str, &'static str)>,
    bool,
);

/// The code's bounds, in each parameter's unit, at the partner's value that allows the most
/// (src/settings/table/ and src/settings/validate.rs): (parameter, least, most, the partner's
/// value, managed instances). The checks below pin each to the code.
const CODE_BOUNDS: &[CodeBound] = &[
    // 500 ms at least; margin + 2 s below the function timeout, the shortest 30 s.
    (
        "DeadlineMarginMs",
        500,
        Some(27_999),
        Some(("FunctionTimeout", "30")),
        false,
    ),
    ("MaxRunsPerInvocation", 1, None, None, false),
    // M x C at most 4096: on demand M is 1.
    ("RunConcurrency", 1, Some(4096), None, false),
    ("ClaimAheadPercent", 0, Some(u32::MAX as i64), None, false),
    // 100 years at most (every deadline the worker computes stays representable).
    ("RunTimeoutSecs", 1, Some(3_153_600_000), None, false),
    // The API's 1 to 3600 s, above the interval (1 s at least).
    (
        "LeaseTtlSecs",
        2,
        Some(3600),
        Some(("LeaseRefreshIntervalSecs", "1")),
        false,
    ),
    (
        "LeaseRefreshIntervalSecs",
        1,
        Some(3599),
        Some(("LeaseTtlSecs", "3600")),
        false,
    ),
    ("PoisonThreshold", 1, Some(u32::MAX as i64), None, false),
    ("PoisonCooldownSecs", 0, Some(3_153_600_000), None, false),
    ("MaxWakeupsPerInvocation", 1, Some(10), None, false),
    // M x C at most 4096, with C at its least.
    (
        "ManagedMaxConcurrency",
        1,
        Some(4096),
        Some(("RunConcurrency", "1")),
        true,
    ),
];

/// Review H2: a value just outside each of the code's bounds is refused by the template's
/// constraints, before anything is deployed; the bound itself is accepted by the worker, and
/// the value outside refused (so the bounds above are the code's).
#[test]
fn a_value_just_outside_the_codes_bounds_is_refused_by_the_template() {
    let t = template();
    for (name, least, most, partner, managed) in CODE_BOUNDS {
        let (function, base) = settings_readers()
            .into_iter()
            .nth(usize::from(*managed))
            .unwrap();
        let base = setting(&base, partner.as_slice());
        let worker = |value: i64| {
            let value = value.to_string();
            let overrides = setting(&base, &[(*name, value.as_str())]);
            worker_accepts(&environment(&t, function, &overrides))
        };
        let mut edges = vec![(*least, least - 1)];
        edges.extend(most.map(|most| (most, most + 1)));
        for (bound, outside) in edges {
            assert!(worker(bound).is_ok(), "{name}={bound}: {:?}", worker(bound));
            assert!(
                worker(outside).is_err(),
                "{name}={outside} is accepted by the worker"
            );
            assert!(
                !template_allows(&t, name, &outside.to_string()),
                "template.yaml allows {name}={outside}, which the worker refuses"
            );
        }
    }
}

/// Review H2: the text parameters' patterns. Each value a pattern allows is accepted by the
/// worker, and each value the worker refuses is refused by the pattern.
#[test]
fn the_text_parameters_patterns_allow_only_what_the_worker_accepts() {
    let t = template();
    let many = |n: usize, item: &str| vec![item; n].join(",");
    let long = |n: usize, c: &str| c.repeat(n);
    // (parameter, function, values allowed, values the worker refuses)
    let cases: Vec<(&str, usize, Vec<String>, Vec<String>)> = vec![
        (
            "IronflowApiUrl",
            0,
            vec![
                "https://ironflow.example.com".into(),
                "https://api.example.com:8443/ironflow/".into(),
                "https://10.0.0.5".into(),
                "https://h:65535".into(),
            ],
            vec![
                "https://api.example.com?x=1".into(),
                "https://api.example.com#f".into(),
                "https://:443".into(),
                "https://u:p@api.example.com".into(),
                "https://api.example.com:0".into(),
                "https://api.example.com:65536".into(),
                "https://exa mple.com".into(),
                "http://api.example.com".into(),
                "https://".into(),
            ],
        ),
        (
            "InsecureIronflowApiUrl",
            1,
            vec![
                "http://10.0.0.5:3000".into(),
                "http://ironflow.internal/api/".into(),
            ],
            vec![
                "http://10.0.0.5:3000?x=1".into(),
                "http://10.0.0.5#f".into(),
                "http://:80".into(),
                "http://u:p@10.0.0.5".into(),
                "http://10.0.0.5:0".into(),
            ],
        ),
        (
            "WorkerTags",
            0,
            vec![
                "".into(),
                "gpu".into(),
                "gpu,arm64,region=eu-west-1,a.b:c/d_e-f".into(),
                long(64, "t"),
                many(32, "t"),
            ],
            vec![
                "bad tag".into(),
                "a,,b".into(),
                "a,".into(),
                long(65, "t"),
                many(33, "t"),
                "é".into(),
            ],
        ),
        (
            "PoisonNamespace",
            0,
            vec!["".into(), "team-a".into(), "a b~!$%".into(), long(200, "a")],
            vec![long(201, "a"), long(200, "é"), "a\tb".into(), "a#b".into()],
        ),
        (
            "MetricsNamespace",
            0,
            vec![
                "ironflow-lambda".into(),
                "Team/ironflow_1.0#a:b".into(),
                long(255, "a"),
            ],
            vec![":x".into(), "AWS/x".into(), long(256, "a"), "a+b".into()],
        ),
        (
            "HeartbeatUrl",
            0,
            vec![
                "".into(),
                "https://hc-ping.com/6f1c2a9e-0123-4567-89ab-cdef01234567".into(),
                "https://hc.example.com:8443/p?x=1".into(),
            ],
            vec![
                // With an https:// API, the worker refuses plain http:// (the URL embeds a secret).
                "http://hc.example.com/p".into(),
                "https://:443".into(),
                "https://hc.example.com:0/p".into(),
                "https://hc example.com".into(),
                "ftp://hc.example.com".into(),
            ],
        ),
    ];
    let readers = settings_readers();
    for (name, reader, allowed, refused) in cases {
        let (function, base) = &readers[reader];
        let run = |value: &str| {
            let mut set = vec![(name, value)];
            if name == "InsecureIronflowApiUrl" {
                set.push(("IronflowApiUrl", ""));
            }
            worker_accepts(&environment(&t, function, &setting(base, &set)))
        };
        for value in &allowed {
            assert!(template_allows(&t, name, value), "{name}={value:?}");
            assert!(run(value).is_ok(), "{name}={value:?}: {:?}", run(value));
        }
        for value in &refused {
            assert!(
                run(value).is_err(),
                "{name}={value:?} is accepted by the worker"
            );
            assert!(
                !template_allows(&t, name, value),
                "template.yaml allows {name}={value:?}, which the worker refuses"
            );
        }
    }
}

/// Whether the filter `directives` (RUST_LOG) lets the worker's error lines through, as
/// `tracing_subscriber::EnvFilter` parses it (src/logging/).
fn lets_the_workers_errors_through(directives: &str) -> Option<bool> {
    use tracing_subscriber::layer::SubscriberExt;
    let filter = tracing_subscriber::EnvFilter::try_new(directives).ok()?;
    let subscriber = tracing_subscriber::registry().with(filter);
    Some(tracing::subscriber::with_default(
        subscriber,
        || tracing::enabled!(target: "ironflow_lambda", tracing::Level::ERROR),
    ))
}

/// Review H5: `LogLevel` (RUST_LOG) takes a level then `target=level` directives. A typo such as
/// `infoo` parses as a target of its own and silences every line the worker writes, the cold
/// start's errors included: the pattern refuses it, and every value it allows lets the worker's
/// errors through.
#[test]
fn the_log_level_pattern_refuses_what_would_silence_the_worker() {
    let t = template();
    let env = &function(&t)["Environment"]["Variables"];
    assert_eq!(env["RUST_LOG"], json!({"Ref": "LogLevel"}));
    // Why: a bare word parses, and turns the worker's lines off.
    assert_eq!(lets_the_workers_errors_through("infoo"), Some(false));
    for allowed in [
        "info",
        "INFO",
        "error",
        "trace",
        "warn,ironflow_lambda=debug",
        "info,aws_config=warn,ironflow_lambda::handler=trace",
        "debug,hyper_util=info,h2=error",
    ] {
        assert!(template_allows(&t, "LogLevel", allowed), "{allowed}");
        assert_eq!(
            lets_the_workers_errors_through(allowed),
            Some(true),
            "{allowed}"
        );
    }
    assert!(template_allows(
        &t,
        "LogLevel",
        &text(&t["Parameters"]["LogLevel"]["Default"])
    ));
    for refused in [
        "infoo",
        "ironflow_lambda",
        "ironflow_lambda=debug",
        "info,ironflow_lambda",
        "info,ironflow_lambda=verbose",
        "info,ironflow_lambda=off",
        "off",
        "",
        "info,",
        " info",
        "info ,x=debug",
    ] {
        assert!(!template_allows(&t, "LogLevel", refused), "{refused:?}");
    }
}

/// Review H9: the role's Bedrock ARNs are in the stack's partition (aws, or GovCloud's
/// aws-us-gov), as every other ARN of the template; in another partition the rule
/// `BedrockInAKnownPartition` refuses the stack unless it grants no Bedrock model.
#[test]
fn bedrock_arns_are_in_the_stacks_partition() {
    let t = template();
    for partition in ["aws", "aws-us-gov"] {
        let overrides = [("AWS::Partition", partition)];
        let values = parameter_values(&t, &overrides);
        let arns: Vec<String> = role_statements(&variant(&t, &overrides))
            .iter()
            .filter(|s| {
                strings(&s["Action"])
                    .iter()
                    .any(|a| a.starts_with("bedrock:"))
            })
            .flat_map(|s| bedrock_arn_list(&s["Resource"], &values))
            .collect();
        assert_eq!(arns.len(), 5, "{arns:?}");
        for arn in arns {
            assert!(
                arn.starts_with(&format!("arn:{partition}:bedrock:")),
                "{arn}"
            );
        }
        let params = BTreeMap::from([API_URL, ("AWS::Partition", partition)]);
        assert!(rules_accept(&t, &params), "{partition}");
    }
    let elsewhere = BTreeMap::from([API_URL, ("AWS::Partition", "aws-iso")]);
    assert!(!rules_accept(&t, &elsewhere));
    let mut without_bedrock = elsewhere.clone();
    without_bedrock.insert("BedrockInferenceProfileIds", "");
    without_bedrock.insert("BedrockFoundationModelIds", "");
    assert!(rules_accept(&t, &without_bedrock));
    // No other ARN of the resources names a partition: they take ${AWS::Partition}.
    fn texts(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|i| texts(i, out)),
            Value::Object(map) => map.values().for_each(|i| texts(i, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    texts(&t["Resources"], &mut all);
    for s in all.iter().filter(|s| s.contains("arn:aws")) {
        assert!(s.contains(":bedrock:"), "a partition written out: {s}");
    }
}
