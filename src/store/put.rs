//! The API's `PUT` routes with ONE attempt on the wire: `PUT /runs/{id}`, `PUT /runs/{id}/status`
//! and `PUT /steps/{id}`.
//!
//! `ApiRunStore` sends these through its `put_json`, which sends a request again by itself after
//! a transport error or a 5xx, 1, 2 and 4 s later. An update whose answer was lost would then be
//! applied a second time, blindly: a handback's Pending re-sent a second after another worker
//! claimed the run gives the run back while that worker runs it. Here each call is one request,
//! built as `put_json` builds it (the same URL, JSON body, `Authorization: Bearer` with the
//! current worker token of [`crate::credentials`], the body size checked against
//! `MAX_API_BODY_BYTES` first), and its failures are reported in `ApiRunStore`'s words, so that
//! [`super::fault::classify`] reads them the same way. Whether and when it is sent again is
//! [`super::guard::write`]'s decision alone, after reading back what the lost attempt did.

use std::time::Duration;

use bytes::Bytes;
use ironflow_store::MAX_API_BODY_BYTES;
use ironflow_store::error::StoreError;
use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, StatusCode};
use serde::Serialize;

use crate::api::ApiClient;

/// `ApiRunStore`'s own request timeout, kept (every attempt is bounded tighter by its scope).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `PUT <base>/api/v1/internal<path>` with `body` as JSON, once.
///
/// # Errors
///
/// As `ApiRunStore`'s `put_json` words them: `payload too large: ...` (before sending, or on a
/// 413), `worker HTTP error: <cause chain>` when no answer came, `worker HTTP error: PUT <path>
/// failed after 1 attempts: HTTP <status>: <body>` on a 5xx, `worker API error: <body>` on any
/// other refusal.
pub(crate) async fn put_once<B: Serialize>(
    api: &ApiClient,
    path: &str,
    body: &B,
) -> Result<(), StoreError> {
    let bytes =
        Bytes::from(serde_json::to_vec(body).map_err(|e| {
            StoreError::Database(format!("failed to serialize PUT {path} body: {e}"))
        })?);
    let len = bytes.len();
    if len > MAX_API_BODY_BYTES {
        return Err(StoreError::Database(format!(
            "payload too large: PUT {path} is {len} bytes, API limit is {MAX_API_BODY_BYTES} bytes"
        )));
    }
    let url = api.internal(path);
    let sent = api
        .request(Method::PUT, &url)
        .timeout(REQUEST_TIMEOUT)
        .header(CONTENT_TYPE, "application/json")
        .body(bytes)
        .send()
        .await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => {
            return Err(StoreError::Database(format!(
                "worker HTTP error: {}",
                error_chain(&e)
            )));
        }
    };
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return Err(StoreError::Database(format!(
            "payload too large: API rejected PUT {path} of {len} bytes (HTTP 413)"
        )));
    }
    let text = resp.text().await.unwrap_or_default();
    if status.is_server_error() {
        return Err(StoreError::Database(format!(
            "worker HTTP error: PUT {path} failed after 1 attempts: HTTP {status}: {text}"
        )));
    }
    Err(StoreError::Database(format!("worker API error: {text}")))
}

/// `e` with its whole `source()` chain (reqwest's own message is only "error sending request").
fn error_chain(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::credentials::Credentials;
    use crate::settings::WorkerToken;
    use crate::store::fault::{FaultKind, classify};

    /// An HTTP server that answers every request with `status` and counts the requests.
    async fn answering(status: u16) -> (String, Arc<std::sync::atomic::AtomicU32>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = vec![0u8; 65536];
                let _ = conn.read(&mut buf).await;
                let body = r#"{"error":{"code":"DATABASE_ERROR","message":"x"}}"#;
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        (url, count)
    }

    fn client(url: &str) -> ApiClient {
        let credentials = Arc::new(Credentials::new(WorkerToken::new("t"), None));
        ApiClient::new(url, credentials).unwrap()
    }

    #[tokio::test]
    async fn a_server_error_is_one_request_and_classified_as_a_server_fault() {
        let (url, count) = answering(500).await;
        let error = put_once(&client(&url), "/runs/x", &serde_json::json!({}))
            .await
            .unwrap_err();
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
        let fault = classify("PUT /runs/{id}", &error).expect("a fault");
        assert_eq!(fault.kind, FaultKind::Server, "{error}");
    }

    #[tokio::test]
    async fn a_refusal_is_the_api_s_and_a_dead_port_a_connect_fault() {
        let (url, _) = answering(400).await;
        let error = put_once(&client(&url), "/runs/x", &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("worker API error"), "{error}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = put_once(&client(&dead), "/runs/x", &serde_json::json!({}))
            .await
            .unwrap_err();
        let fault = classify("PUT /runs/{id}", &error).expect("a fault");
        assert_eq!(fault.kind, FaultKind::Connect, "{error}");
    }
}
