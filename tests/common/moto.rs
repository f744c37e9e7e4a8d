//! moto's server on loopback (`IRONFLOW_TEST_MOTO_ENDPOINT`, started by `./scripts/test`): its
//! address, SQS and DynamoDB clients for it, and the queues and tables the tests create.

use std::sync::{Arc, Mutex};

use aws_sdk_sqs::types::QueueAttributeName;

/// moto's endpoint.
pub fn moto_endpoint() -> String {
    std::env::var("IRONFLOW_TEST_MOTO_ENDPOINT").unwrap_or_else(|_| {
        panic!("IRONFLOW_TEST_MOTO_ENDPOINT is not set: run the tests with ./scripts/test, which starts moto's server")
    })
}

/// The AWS SDK's shared configuration for moto's server (any service's client), with test
/// credentials, through the SDK's own loader.
pub async fn aws_config() -> aws_config::SdkConfig {
    aws_config_at(&moto_endpoint()).await
}

/// The AWS SDK's shared configuration for a stand-in at `endpoint` (moto, the scripted model
/// server), with test credentials, through the SDK's own loader.
pub async fn aws_config_at(endpoint: &str) -> aws_config::SdkConfig {
    use aws_config::{BehaviorVersion, Region};
    aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new(
            "testing", "testing", None, None, "moto",
        ))
        .load()
        .await
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

/// The wake-ups visible on the queue at `url` (SQS's approximate count).
pub async fn queued(sqs: &aws_sdk_sqs::Client, url: &str) -> u64 {
    queue_count(sqs, url, QueueAttributeName::ApproximateNumberOfMessages).await
}

/// The wake-ups on the queue at `url` whose delay is still running (SQS's approximate count).
pub async fn delayed(sqs: &aws_sdk_sqs::Client, url: &str) -> u64 {
    queue_count(
        sqs,
        url,
        QueueAttributeName::ApproximateNumberOfMessagesDelayed,
    )
    .await
}

async fn queue_count(sqs: &aws_sdk_sqs::Client, url: &str, count: QueueAttributeName) -> u64 {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(count.clone())
        .send()
        .await
        .unwrap();
    out.attributes()
        .and_then(|a| a.get(&count))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Records the `X-Amzn-Trace-Id` of every `SendMessageBatch` an SQS client sends (the SDK's own
/// interceptor hook: the request as it goes on the wire).
#[derive(Debug, Default, Clone)]
pub struct TraceHeaders(Arc<Mutex<Vec<Option<String>>>>);

impl TraceHeaders {
    /// The trace headers recorded so far, in the order sent (`None`: a batch without one).
    pub fn recorded(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().clone()
    }
}

impl aws_sdk_sqs::config::Intercept for TraceHeaders {
    fn name(&self) -> &'static str {
        "TraceHeaders"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_sqs::config::RuntimeComponents,
        _: &mut aws_sdk_sqs::config::ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        let headers = context.request().headers();
        if headers
            .get("x-amz-target")
            .is_some_and(|t| t.ends_with("SendMessageBatch"))
        {
            let trace = headers.get("x-amzn-trace-id").map(str::to_string);
            self.0.lock().unwrap().push(trace);
        }
        Ok(())
    }
}

/// An SQS client of moto's server (as [`sqs_client`]) and the [`TraceHeaders`] it records.
pub fn traced_sqs_client() -> (aws_sdk_sqs::Client, TraceHeaders) {
    let recorded = TraceHeaders::default();
    let sqs = aws_sdk_sqs::Client::from_conf(
        sqs_client()
            .config()
            .to_builder()
            .interceptor(recorded.clone())
            .build(),
    );
    (sqs, recorded)
}

/// A DynamoDB client configuration for moto's server at `endpoint`, with test credentials.
pub fn dynamodb_config(endpoint: &str) -> aws_sdk_dynamodb::Config {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .build()
}

/// Create the on-demand DynamoDB table `name` on moto's server at `endpoint`, keyed by the
/// string attribute `key` (a hash key alone, no TTL).
pub async fn create_table_keyed(endpoint: &str, name: &str, key: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    aws_sdk_dynamodb::Client::from_conf(dynamodb_config(endpoint))
        .create_table()
        .table_name(name)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
}

/// A new table name of its own, `poison-<uuid>`.
pub fn unique_table() -> String {
    format!("poison-{}", uuid::Uuid::new_v4().simple())
}

/// A new poison-pill table on moto's server ([`moto_endpoint`]) with the key schema of
/// `src/poison/dynamodb/` (`pk` S, on demand; no TTL): its name.
pub async fn poison_table() -> String {
    let name = unique_table();
    create_table_keyed(
        &moto_endpoint(),
        &name,
        ironflow_lambda::poison::dynamodb::PARTITION_KEY,
    )
    .await;
    name
}
