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
