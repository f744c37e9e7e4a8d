//! moto's server on loopback (`IRONFLOW_TEST_MOTO_ENDPOINT`, started by `./scripts/test`): its
//! address and an SQS client for it.

/// moto's endpoint.
pub fn moto_endpoint() -> String {
    std::env::var("IRONFLOW_TEST_MOTO_ENDPOINT").unwrap_or_else(|_| {
        panic!("IRONFLOW_TEST_MOTO_ENDPOINT is not set: run the tests with ./scripts/test, which starts moto's server")
    })
}

/// An SQS client of moto's server, with test credentials.
pub fn sqs_client() -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .endpoint_url(moto_endpoint())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// Take the messages visible on the queue at `url`: receive up to 10, waiting up to 1 s for the
/// first, and delete them.
pub async fn take_visible(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
) -> Vec<aws_sdk_sqs::types::Message> {
    let out = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    for m in out.messages() {
        sqs.delete_message()
            .queue_url(url)
            .receipt_handle(m.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    out.messages().to_vec()
}

/// The SQS event Lambda's event source mapping would hand the function for `messages`.
pub fn sqs_event(messages: &[aws_sdk_sqs::types::Message]) -> serde_json::Value {
    let records: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::json!({"messageId": m.message_id(), "body": m.body(), "eventSource": "aws:sqs"}))
        .collect();
    serde_json::json!({ "Records": records })
}

/// A new queue of moto's, with a name of its own: its URL.
pub async fn new_queue(sqs: &aws_sdk_sqs::Client) -> String {
    sqs.create_queue()
        .queue_name(format!("wake-{}", uuid::Uuid::new_v4().simple()))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string()
}
