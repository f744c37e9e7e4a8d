//! A stand-in for a Lambda Function URL on loopback: each HTTP request becomes the event Lambda
//! sends a function for it (payload format 2.0: `headers`, `rawQueryString`,
//! `queryStringParameters`, `requestContext.http`, `body`, `isBase64Encoded`), and the
//! function's answer (`statusCode`, `headers`, `body`) becomes the HTTP response. The Function
//! URL protocol is AWS's, with no registry implementation to embed: this small front door is the
//! legitimate peer for local runs and tests, as the benchmark's Runtime API stub is.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::LocalApiError;

/// The function behind the URL: a Function URL event in, its answer out.
pub type UrlHandler =
    Arc<dyn Fn(Value) -> Pin<Box<dyn Future<Output = Value> + Send>> + Send + Sync>;

/// A Function URL front door on `127.0.0.1` (see the module docs). Stops when dropped.
pub struct FunctionUrl {
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl Drop for FunctionUrl {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FunctionUrl {
    /// Serve `handler` on a free loopback port.
    ///
    /// # Errors
    ///
    /// [`LocalApiError::Bind`] when no loopback port can be bound.
    pub async fn start(handler: UrlHandler) -> Result<Self, LocalApiError> {
        let bind_error = |source| LocalApiError::Bind { port: 0, source };
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let app = Router::new().fallback(serve).with_state(handler);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, server })
    }

    /// The URL's base, `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

async fn serve(State(handler): State<UrlHandler>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 6 * 1024 * 1024).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request too large").into_response();
    };
    let event = event(&parts.method, &parts.uri, &parts.headers, &body);
    answer(&handler(event).await)
}

/// The Function URL event of one request.
pub fn event(method: &Method, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Value {
    let header_map: BTreeMap<String, String> = headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let query = uri.query().unwrap_or("");
    // Decoded, as Lambda hands them over.
    let parameters: BTreeMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let (body, base64) = match std::str::from_utf8(body) {
        Ok(text) => (text.to_string(), false),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(body), true),
    };
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": uri.path(),
        "rawQueryString": query,
        "headers": header_map,
        "queryStringParameters": parameters,
        "requestContext": {
            "http": {
                "method": method.as_str(),
                "path": uri.path(),
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or(""),
            },
            "domainName": "localhost",
            "timeEpoch": 0,
        },
        "body": body,
        "isBase64Encoded": base64,
    })
}

/// The HTTP response of a function's answer (`statusCode`, `headers`, `body`); anything else is
/// a 502, as Lambda answers a function whose response it cannot read.
fn answer(function: &Value) -> Response {
    let Some(status) = function
        .get("statusCode")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
    else {
        return (StatusCode::BAD_GATEWAY, function.to_string()).into_response();
    };
    let body = function
        .get("body")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    (status, [("content-type", "application/json")], body).into_response()
}
