//! FAULT INJECTION, not a stand-in for the API: an HTTP/1.1 reverse proxy in front of the real
//! ironflow API router that injects, per request, the faults a production API has: a server
//! error (a 503 page, or the API's own 500 envelope) without forwarding, a connection reset
//! before forwarding, an answer lost after the API applied the request (the connection is reset
//! instead of answered), latency, and routes that never answer (a black hole).
//!
//! Faults come from a seeded random plan ([`Faults`], reproducible from its seed) and from a
//! queue of exact faults for the next requests of a route ([`FaultProxy::next`]), for tests
//! that need one fault at one place. Every request and fault is counted per route.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One fault for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// Answered with a server error, not forwarded (half the time a load balancer's 503 page,
    /// half the time the API's `DATABASE_ERROR` 500 envelope).
    ServerError,
    /// The connection is reset before the request is forwarded.
    Reset,
    /// The request is forwarded and applied by the API, then the connection is reset instead
    /// of answered.
    LostAnswer,
    /// Forwarded after a delay.
    Delay(Duration),
    /// Never answered (the connection stays open until the client drops it).
    BlackHole,
    /// Answered 422 with the API's validation error envelope, not forwarded: a write the API
    /// refuses (an answer, not a fault).
    Refused,
    /// Forwarded and answered, every lease end in the answer (`lease_expires_at`,
    /// `expires_at`) dated back by this much: what a PostgreSQL store answers from a pooled
    /// connection left inside an older transaction (its `NOW()` is that transaction's start).
    DatedBack(Duration),
    /// Forwarded without its `workflows` query parameter: an API whose claim ignores the
    /// worker's workflow list (an older release, a misconfigured gateway), handing out a run
    /// of any workflow.
    Unfiltered,
}

impl Fault {
    /// The name it is counted under.
    pub fn name(self) -> &'static str {
        match self {
            Self::ServerError => "server_error",
            Self::Reset => "reset",
            Self::LostAnswer => "lost_answer",
            Self::Delay(_) => "delay",
            Self::BlackHole => "black_hole",
            Self::DatedBack(_) => "dated_back",
            Self::Refused => "refused",
            Self::Unfiltered => "unfiltered",
        }
    }
}

/// The random plan: each request (of a route in `routes`, or any when empty) meets each fault
/// with its probability.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Probability of a server error.
    pub server_error: f64,
    /// Probability of a reset before forwarding.
    pub reset: f64,
    /// Probability of a lost answer.
    pub lost_answer: f64,
    /// Probability of a delay, uniformly up to `max_delay`.
    pub delay: f64,
    /// The longest delay.
    pub max_delay: Duration,
    /// Routes (`"PUT /runs/{id}"`, relative to `/api/v1/internal`) the plan applies to; empty:
    /// every route.
    pub routes: Vec<String>,
}

impl Faults {
    /// Every fault kind at `rate` in all (split between them), delays up to `max_delay`.
    pub fn mixed(rate: f64, max_delay: Duration) -> Self {
        Self {
            server_error: rate * 0.3,
            reset: rate * 0.2,
            lost_answer: rate * 0.2,
            delay: rate * 0.3,
            max_delay,
            routes: Vec::new(),
        }
    }
}

/// What the proxy counted.
#[derive(Debug, Clone, Default)]
pub struct FaultStats {
    /// Requests per route.
    pub requests: BTreeMap<String, u64>,
    /// Faults per (route, fault name).
    pub faults: BTreeMap<(String, &'static str), u64>,
}

impl FaultStats {
    /// Faults of `name` over every route.
    pub fn total(&self, name: &str) -> u64 {
        self.faults
            .iter()
            .filter(|((_, n), _)| *n == name)
            .map(|(_, c)| c)
            .sum()
    }

    /// Requests over every route.
    pub fn all_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

struct Control {
    /// Forward one request at a time ([`FaultProxy::one_request_at_a_time`]).
    serial: bool,
    plan: Faults,
    rng: StdRng,
    queued: BTreeMap<String, VecDeque<Fault>>,
    black_holes: Vec<String>,
    /// Requests (`"<METHOD> <path>"`, ids as they are) black-holed once a lost answer was
    /// injected ([`FaultProxy::hold_after_a_lost_answer`]).
    armed_holds: Vec<String>,
    /// Requests black-holed until [`FaultProxy::lift_black_holes`].
    holds: Vec<String>,
    stats: FaultStats,
}

/// The proxy (see the module docs). Stops with the test's runtime.
pub struct FaultProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    control: Arc<Mutex<Control>>,
    /// Turned true to let the held (black-holed) requests go, reset.
    release: watch::Sender<u64>,
}

impl FaultProxy {
    /// A proxy to the API at `upstream` (`http://127.0.0.1:port`), with no fault until told,
    /// its random plan seeded by `seed`.
    pub async fn start(upstream: &str, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let control = Arc::new(Mutex::new(Control {
            serial: false,
            plan: Faults::default(),
            rng: StdRng::seed_from_u64(seed),
            queued: BTreeMap::new(),
            black_holes: Vec::new(),
            armed_holds: Vec::new(),
            holds: Vec::new(),
            stats: FaultStats::default(),
        }));
        let (release, released) = watch::channel(0u64);
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("proxy client");
        let upstream = upstream.trim_end_matches('/').to_string();
        let shared = control.clone();
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kill = Arc::new(AtomicBool::new(false));
                let io = TokioIo::new(Killable {
                    stream,
                    kill: kill.clone(),
                });
                let (control, client, upstream, released, turn) = (
                    shared.clone(),
                    client.clone(),
                    upstream.clone(),
                    released.clone(),
                    turn.clone(),
                );
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (control, client, upstream, kill, released, turn) = (
                            control.clone(),
                            client.clone(),
                            upstream.clone(),
                            kill.clone(),
                            released.clone(),
                            turn.clone(),
                        );
                        async move {
                            let serial = control
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .serial;
                            let _turn = match serial {
                                true => Some(turn.lock().await),
                                false => None,
                            };
                            serve(req, control, client, upstream, kill, released).await
                        }
                    });
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Self {
            addr,
            control,
            release,
        }
    }

    /// The proxy's base URL, for `IRONFLOW_API_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forward one request at a time, each answered before the next is sent: in front of moto,
    /// whose DynamoDB applies a conditional UpdateItem in several unlocked steps (two at once
    /// can see each other's half-written item, where DynamoDB applies each atomically).
    pub fn one_request_at_a_time(&self) {
        self.control().serial = true;
    }

    /// Replace the random plan.
    pub fn set(&self, plan: Faults) {
        self.control().plan = plan;
    }

    /// The next request to `route` (`"PUT /runs/{id}"`) meets `fault` (queued after the ones
    /// already there).
    pub fn next(&self, route: &str, fault: Fault) {
        self.control()
            .queued
            .entry(route.to_string())
            .or_default()
            .push_back(fault);
    }

    /// Requests to `route` get no answer until [`FaultProxy::restore`].
    pub fn black_hole(&self, route: &str) {
        self.control().black_holes.push(route.to_string());
    }

    /// Once the proxy has injected a lost answer, the requests `"<METHOD> <path>"` (the path
    /// relative to the API's root, ids as they are: `"GET /api/v1/internal/runs/<id>"`) get no
    /// answer until [`FaultProxy::lift_black_holes`]: a read-back held until the test has made
    /// happen what it must see.
    pub fn hold_after_a_lost_answer(&self, request: &str) {
        self.control().armed_holds.push(request.to_string());
    }

    /// No more black holes; the requests they hold are reset.
    pub fn lift_black_holes(&self) {
        {
            let mut control = self.control();
            control.black_holes.clear();
            control.holds.clear();
        }
        self.release.send_modify(|n| *n += 1);
    }

    /// No more black holes, no random faults, no queued fault; held requests are reset.
    pub fn restore(&self) {
        {
            let mut control = self.control();
            control.black_holes.clear();
            control.armed_holds.clear();
            control.holds.clear();
            control.queued.clear();
            control.plan = Faults::default();
        }
        self.release.send_modify(|n| *n += 1);
    }

    /// What the proxy counted so far.
    pub fn stats(&self) -> FaultStats {
        self.control().stats.clone()
    }
}

/// `"<METHOD> <path relative to /api/v1/internal, ids as {id}>"`.
pub fn route_of(method: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap_or("");
    let path = path.strip_prefix("/api/v1/internal").unwrap_or(path);
    let segments: Vec<String> = path
        .split('/')
        .map(|s| {
            if uuid::Uuid::parse_str(s).is_ok() {
                "{id}".to_string()
            } else {
                s.to_string()
            }
        })
        .collect();
    format!("{method} {}", segments.join("/"))
}

/// The fault for a request to `route`, if any, counted.
fn decide(control: &Mutex<Control>, route: &str, request: &str) -> Option<Fault> {
    let mut c = control
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *c.stats.requests.entry(route.to_string()).or_default() += 1;
    let fault = if c.black_holes.iter().any(|r| r == route) || c.holds.iter().any(|r| r == request)
    {
        Some(Fault::BlackHole)
    } else if let Some(f) = c.queued.get_mut(route).and_then(VecDeque::pop_front) {
        Some(f)
    } else if c.plan.routes.is_empty() || c.plan.routes.iter().any(|r| r == route) {
        let plan = c.plan.clone();
        let roll: f64 = c.rng.random();
        let mut edge = 0.0;
        let mut pick = None;
        for (p, f) in [
            (plan.server_error, Fault::ServerError),
            (plan.reset, Fault::Reset),
            (plan.lost_answer, Fault::LostAnswer),
        ] {
            edge += p;
            if pick.is_none() && roll < edge {
                pick = Some(f);
            }
        }
        if pick.is_none() && roll < edge + plan.delay {
            let max = plan.max_delay.as_millis().max(1) as u64;
            pick = Some(Fault::Delay(Duration::from_millis(
                c.rng.random_range(1..=max),
            )));
        }
        pick
    } else {
        None
    };
    if fault == Some(Fault::LostAnswer) {
        let armed = std::mem::take(&mut c.armed_holds);
        c.holds.extend(armed);
    }
    if let Some(f) = fault {
        *c.stats
            .faults
            .entry((route.to_string(), f.name()))
            .or_default() += 1;
    }
    fault
}

/// Why the proxy closes a connection instead of answering.
#[derive(Debug)]
struct ProxyError(String);

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProxyError {}

fn proxy_error(e: impl std::fmt::Display) -> ProxyError {
    ProxyError(e.to_string())
}

type Reply = Result<Response<Full<Bytes>>, ProxyError>;

async fn serve(
    req: Request<Incoming>,
    control: Arc<Mutex<Control>>,
    client: reqwest::Client,
    upstream: String,
    kill: Arc<AtomicBool>,
    mut released: watch::Receiver<u64>,
) -> Reply {
    let route = route_of(req.method().as_str(), req.uri().path());
    let request = format!("{} {}", req.method(), req.uri().path());
    let fault = decide(&control, &route, &request);
    let reset = |kill: &AtomicBool| -> Reply {
        kill.store(true, Ordering::SeqCst);
        Err(ProxyError("fault injection: connection reset".into()))
    };
    match fault {
        Some(Fault::ServerError) => {
            let coin: bool = control
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .rng
                .random();
            let (status, body) = if coin {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "<html><body>503 Service Temporarily Unavailable</body></html>".to_string(),
                )
            } else {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    r#"{"error":{"code":"DATABASE_ERROR","message":"fault injection"}}"#
                        .to_string(),
                )
            };
            return Ok(Response::builder()
                .status(status)
                .body(Full::new(Bytes::from(body)))
                .expect("response"));
        }
        Some(Fault::Refused) => {
            return Ok(Response::builder()
                .status(StatusCode::UNPROCESSABLE_ENTITY)
                .body(Full::new(Bytes::from(
                    r#"{"error":{"code":"VALIDATION_ERROR","message":"refused by fault injection"}}"#,
                )))
                .expect("response"));
        }
        Some(Fault::Reset) => return reset(&kill),
        Some(Fault::BlackHole) => {
            let seen = *released.borrow();
            let _ = released.wait_for(|n| *n != seen).await;
            return reset(&kill);
        }
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::LostAnswer | Fault::DatedBack(_) | Fault::Unfiltered) | None => {}
    }
    let req = match fault {
        Some(Fault::Unfiltered) => without_workflow_filter(req),
        _ => req,
    };
    let answer = forward(req, &client, &upstream).await;
    if fault == Some(Fault::LostAnswer) {
        return reset(&kill);
    }
    match (answer, fault) {
        (Ok(response), Some(Fault::DatedBack(by))) => Ok(dated_back(response, by).await),
        (Ok(response), _) => Ok(response),
        (Err(_), _) => reset(&kill),
    }
}

/// `req` without its `workflows` query parameter ([`Fault::Unfiltered`]).
fn without_workflow_filter(req: Request<Incoming>) -> Request<Incoming> {
    let (mut parts, body) = req.into_parts();
    let query: Vec<&str> = parts
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("workflows="))
        .collect();
    let uri = format!("{}?{}", parts.uri.path(), query.join("&"));
    parts.uri = uri.parse().expect("a path and query");
    Request::from_parts(parts, body)
}

async fn forward(req: Request<Incoming>, client: &reqwest::Client, upstream: &str) -> Reply {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(proxy_error)?.to_bytes();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let method =
        reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).map_err(proxy_error)?;
    let mut request = client.request(method, format!("{upstream}{path}"));
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            request = request.header(name.as_str(), value.as_bytes());
        }
    }
    let response = request.body(body).send().await.map_err(proxy_error)?;
    let mut builder = Response::builder().status(response.status().as_u16());
    for (name, value) in response.headers() {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            builder = builder.header(name.as_str(), value.as_bytes());
        }
    }
    let bytes = response.bytes().await.map_err(proxy_error)?;
    builder.body(Full::new(bytes)).map_err(proxy_error)
}

/// `response` with every lease end in its JSON body (`lease_expires_at`, `expires_at`) moved
/// `by` earlier.
async fn dated_back(response: Response<Full<Bytes>>, by: Duration) -> Response<Full<Bytes>> {
    fn walk(value: &mut serde_json::Value, by: chrono::TimeDelta) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    let end = matches!(key.as_str(), "lease_expires_at" | "expires_at");
                    if let (true, Some(at)) = (end, v.as_str())
                        && let Ok(at) = chrono::DateTime::parse_from_rfc3339(at)
                    {
                        *v = serde_json::Value::String((at - by).to_rfc3339());
                    } else {
                        walk(v, by);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| walk(v, by)),
            _ => {}
        }
    }
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(mut json) => {
            walk(
                &mut json,
                chrono::TimeDelta::from_std(by).unwrap_or_default(),
            );
            Bytes::from(json.to_string())
        }
        Err(_) => body,
    };
    Response::from_parts(parts, Full::new(body))
}

/// A client connection that a fault can reset: once `kill` is set, the next write fails and
/// the socket closes with a RST (linger 0).
struct Killable {
    stream: TcpStream,
    kill: Arc<AtomicBool>,
}

impl Killable {
    fn killed(&self) -> bool {
        if self.kill.load(Ordering::SeqCst) {
            #[allow(deprecated)] // a reset is the point here
            let _ = self.stream.set_linger(Some(Duration::ZERO));
            true
        } else {
            false
        }
    }
}

impl AsyncRead for Killable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.killed() {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Killable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.killed() {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.killed() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Drop for Killable {
    fn drop(&mut self) {
        self.killed();
    }
}
