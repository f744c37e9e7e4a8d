//! The URLs of the settings (the API, the heartbeat, the wake queue): what each must be, and how
//! the API's is shown in errors.
// A rule takes the row's own type (`&String`, `&Vec<String>`): `Rule<T>` is `fn(&T, ..)`.
#![allow(clippy::ptr_arg)]

use std::borrow::Cow;

use reqwest::Url;

use super::Settings;
use super::rules::Checked;

/// What an `http(s)://` URL must be, in errors.
const HTTP_URL: &str = "an http:// or https:// URL with a host and, if any, a port from 1 to \
                        65535, e.g. https://ironflow.example.com";

/// `url` parsed, when it is an `http://` or `https://` URL with a host, no whitespace and no
/// port 0 (nothing listens there: every request would fail).
fn http_url(url: &str) -> Option<Url> {
    Url::parse(url).ok().filter(|u| {
        !url.contains(char::is_whitespace)
            && matches!(u.scheme(), "http" | "https")
            && u.host_str().is_some_and(|h| !h.is_empty())
            && u.port() != Some(0)
    })
}

/// Whether `url`'s host is loopback (`127.0.0.0/8`, `::1`, `localhost`).
fn is_loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Plain `http://` to a host that is not loopback, without the opt-in.
fn insecure(url: &Url, allow_insecure_http: bool) -> bool {
    url.scheme() == "http" && !is_loopback(url) && !allow_insecure_http
}

/// What `IRONFLOW_API_URL` (or the builder's URL) must be, when it is not: `None` when it is a
/// usable base URL. Plain `http://` carries the worker token in clear text, so it is accepted
/// only to a loopback host (`127.0.0.0/8`, `::1`, `localhost`) or with `allow_insecure_http`
/// (`IRONFLOW_ALLOW_INSECURE_HTTP=true`).
pub fn api_url_problem(url: &str, allow_insecure_http: bool) -> Option<&'static str> {
    let Some(parsed) = http_url(url) else {
        return Some(HTTP_URL);
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Some(
            "a URL without credentials (user:password@): the API authenticates workers by the \
             token in IRONFLOW_WORKER_TOKEN",
        );
    }
    // `Url::query(u)`, not the method form: see `queue_url`.
    if Url::query(&parsed).is_some() || parsed.fragment().is_some() {
        return Some(
            "the API's base URL without a query (?...) or a fragment (#...), e.g. \
             https://ironflow.example.com: the worker appends /api/v1/internal/... to it",
        );
    }
    if insecure(&parsed, allow_insecure_http) {
        return Some(
            "an https:// URL: plain http:// would send the worker token in clear text; it is \
             accepted only to a loopback host, or with IRONFLOW_ALLOW_INSECURE_HTTP=true (an \
             API inside the VPC)",
        );
    }
    None
}

pub(super) fn api_url(url: &String, s: &Settings) -> Checked {
    api_url_problem(url, s.allow_insecure_http).map_or(Ok(()), |e| Err(e.into()))
}

/// The heartbeat URL follows the API URL's rule on plain `http://`: it usually embeds a secret.
pub(super) fn heartbeat_url(url: &Option<String>, s: &Settings) -> Checked {
    let Some(url) = url else { return Ok(()) };
    let Some(parsed) = http_url(url) else {
        return Err(HTTP_URL.into());
    };
    if insecure(&parsed, s.allow_insecure_http) {
        return Err(
            "an https:// URL: plain http:// would send the URL (and the secret it \
                    usually embeds) in clear text; it is accepted only to a loopback host, or \
                    with IRONFLOW_ALLOW_INSECURE_HTTP=true"
                .into(),
        );
    }
    Ok(())
}

/// What `IRONFLOW_WAKE_QUEUE_URL` must be.
const QUEUE_URL: &str = "an SQS queue URL, https://sqs.REGION.amazonaws.com/ACCOUNT/NAME (or \
                         http(s)://HOST[:PORT]/ACCOUNT/NAME at a custom endpoint, a port from 1 \
                         to 65535): a 12-digit account and a name of 1 to 80 of A-Z a-z 0-9 - _";

/// An SQS queue URL: `http(s)://host[:port]/<12-digit account>/<name>`, the name 1 to 80 of
/// `A-Z a-z 0-9 - _`, and not a FIFO queue (`.fifo`): a FIFO queue takes no per-message
/// `DelaySeconds`, which the wake-ups after a handback need.
pub(super) fn queue_url(url: &Option<String>, _: &Settings) -> Checked {
    let Some(url) = url else { return Ok(()) };
    let Some(parsed) = http_url(url) else {
        return Err(QUEUE_URL.into());
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Cow::Borrowed(
            "a queue URL without credentials (user:password@): SQS authenticates the function \
             by its execution role",
        ));
    }
    // `Url::query(u)`, not the method form: tests/template.rs reads that form in src/ as a
    // DynamoDB call (Query) the role must allow.
    if Url::query(&parsed).is_some() {
        return Err(QUEUE_URL.into());
    }
    let segments: Vec<&str> = parsed.path().trim_start_matches('/').split('/').collect();
    let [account, name] = segments.as_slice() else {
        return Err(QUEUE_URL.into());
    };
    if name.ends_with(".fifo") {
        return Err(Cow::Borrowed(
            "a standard SQS queue: a FIFO queue (.fifo) takes no per-message DelaySeconds, which \
             the wake-ups after a handback need",
        ));
    }
    let account_ok = account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit());
    let name_ok = (1..=80).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    if account_ok && name_ok && parsed.fragment().is_none() {
        Ok(())
    } else {
        Err(QUEUE_URL.into())
    }
}

/// `url` with everything before its last `@` masked as `***`, after its scheme when it has one
/// (`https://u:pw@host` → `https://***@host`, `u:pw@host` → `***@host`), for error messages:
/// a malformed URL may still hold a password.
pub fn without_userinfo(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_string();
    };
    let start = url
        .find("://")
        .map(|i| i + 3)
        .filter(|start| *start <= at)
        .unwrap_or(0);
    format!("{}***{}", &url[..start], &url[at..])
}
