//! The SDK's shared configuration (aws-config's default chain, as a deployed function builds
//! it) reaches the server through `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`: the variable the local
//! runner and the end-to-end tests set. One test in its own binary, since it sets the
//! environment.

use aws_config::BehaviorVersion;
use aws_sdk_bedrockruntime::types::{ContentBlock, ConversationRole, Message};
use ironflow_model_server::{Match, ModelServer, Reply, Script};

#[test]
fn the_sdks_shared_config_finds_the_server_through_the_service_endpoint_variable() {
    const MODEL: &str = "global.anthropic.claude-sonnet-4-5-20250929-v1:0";
    let server = ModelServer::start_on_own_thread(
        Script::new().on(Match::model(MODEL), [Reply::text("via env")]),
    )
    .expect("the model server starts");
    // SAFETY: the only other thread of this process (one test per binary) is the model
    // server's, which reads no environment variable.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.url());
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    }
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let out = runtime.block_on(async {
        let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
        let client = aws_sdk_bedrockruntime::Client::new(&config);
        let hello = Message::builder()
            .role(ConversationRole::User)
            .content(ContentBlock::Text("hi".into()))
            .build();
        client
            .converse()
            .model_id(MODEL)
            .messages(hello.expect("a message"))
            .send()
            .await
    });
    let out = out.expect("answered by the model server");
    let text = out
        .output()
        .and_then(|o| o.as_message().ok())
        .map(|m| m.content()[0].clone());
    assert_eq!(text, Some(ContentBlock::Text("via env".into())));
    assert_eq!(server.calls().model(MODEL), 1);
}
