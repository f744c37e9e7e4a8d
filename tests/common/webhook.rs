//! Function URL requests for the webhook receiver, as Lambda hands them to the handler (signed,
//! by token, or with any headers), the events they carry, and the receiver's answer.

use std::time::Duration;

use ironflow_lambda::webhook::auth;
use ironflow_lambda::{LambdaWorker, Response, settings::WebhookSecret};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use uuid::Uuid;

use super::deadline_in;

/// An invocation of `payload` with 30 s to its deadline.
pub fn lambda_event(payload: Value) -> LambdaEvent<Value> {
    lambda_event_traced(payload, None)
}

/// An invocation of `payload` with 30 s to its deadline and `trace` as its X-Ray trace header.
pub fn lambda_event_traced(payload: Value, trace: Option<&str>) -> LambdaEvent<Value> {
    lambda_event_within(payload, trace, Duration::from_secs(30))
}

/// An invocation of `payload` with `left` to its deadline and `trace` as its X-Ray trace
/// header.
pub fn lambda_event_within(
    payload: Value,
    trace: Option<&str>,
    left: Duration,
) -> LambdaEvent<Value> {
    let mut context = Context::default();
    context.request_id = Uuid::new_v4().to_string();
    context.deadline = deadline_in(left);
    context.xray_trace_id = trace.map(str::to_string);
    LambdaEvent::new(payload, context)
}

/// A Function URL request posting `body`, with `headers` and the query string `query`.
pub fn request(body: &str, headers: Value, query: &str) -> Value {
    let parameters: serde_json::Map<String, Value> = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "version": "2.0",
        "rawPath": "/",
        "rawQueryString": query,
        "headers": headers,
        "queryStringParameters": parameters,
        "requestContext": {"http": {"method": "POST", "path": "/"}, "timeEpoch": 0},
        "body": body,
        "isBase64Encoded": false,
    })
}

/// A Function URL request posting `body`, signed with `secret` (`X-Signature-256`).
pub fn signed(secret: &str, body: &str) -> Value {
    let signature = auth::sign(&WebhookSecret::new(secret), body.as_bytes());
    request(body, json!({"x-signature-256": signature}), "")
}

/// A Function URL request posting `body`, with `token` in the query string.
pub fn by_token(token: &str, body: &str) -> Value {
    request(body, json!({}), &format!("token={token}"))
}

/// An API event of type `kind` for a new run of `workflow`, stamped now.
pub fn event(kind: &str, workflow: &str) -> String {
    json!({"type": kind, "run_id": Uuid::new_v4(), "workflow_name": workflow, "at": chrono::Utc::now()})
        .to_string()
}

/// A `run_created` event for `workflow`, stamped now (inside the replay window).
pub fn created(workflow: &str) -> String {
    created_at(workflow, 0)
}

/// A `run_created` event for `workflow`, stamped `offset_secs` from now.
pub fn created_at(workflow: &str, offset_secs: i64) -> String {
    let at = chrono::Utc::now() + chrono::TimeDelta::seconds(offset_secs);
    json!({"type": "run_created", "run_id": Uuid::new_v4(), "workflow_name": workflow, "at": at})
        .to_string()
}

/// The receiver's answer to `event`: status and JSON body (checked to be what the Function URL
/// response carries).
pub async fn post(worker: &LambdaWorker, event: Value) -> (u16, Value) {
    post_traced(worker, event, None).await
}

/// [`post`], in an invocation with `trace` as its X-Ray trace header.
pub async fn post_traced(worker: &LambdaWorker, event: Value, trace: Option<&str>) -> (u16, Value) {
    answer_to(worker, lambda_event_traced(event, trace)).await
}

/// [`post`], in an invocation with `left` to its deadline.
pub async fn post_within(worker: &LambdaWorker, event: Value, left: Duration) -> (u16, Value) {
    answer_to(worker, lambda_event_within(event, None, left)).await
}

/// The receiver's answer to the invocation `event`.
async fn answer_to(worker: &LambdaWorker, event: LambdaEvent<Value>) -> (u16, Value) {
    let response = ironflow_lambda::handle_response(worker, event)
        .await
        .unwrap();
    let Response::Webhook(answer) = &response else {
        panic!("not a webhook answer: {response:?}");
    };
    let json = response.to_json();
    assert_eq!(json["statusCode"], answer.status);
    let body: Value = serde_json::from_str(json["body"].as_str().unwrap()).unwrap();
    assert_eq!(body, answer.body);
    (answer.status, body)
}
