//! The API's base URL: what it must be, and how it is shown in errors.

/// What `IRONFLOW_API_URL` (or the builder's URL) must be, when it is not: `None` when it is a
/// usable base URL. Plain `http://` carries the worker token in clear text, so it is accepted
/// only to a loopback host (`127.0.0.0/8`, `::1`, `localhost`) or with `allow_insecure_http`
/// (`IRONFLOW_ALLOW_INSECURE_HTTP=true`).
pub fn api_url_problem(url: &str, allow_insecure_http: bool) -> Option<&'static str> {
    let parsed = reqwest::Url::parse(url).ok();
    let Some(parsed) = parsed.filter(|u| {
        !url.contains(char::is_whitespace) && matches!(u.scheme(), "http" | "https") && u.has_host()
    }) else {
        return Some(
            "an http:// or https:// URL with a host and, if any, a port from 1 to 65535, e.g. \
             https://ironflow.example.com",
        );
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Some(
            "a URL without credentials (user:password@): the API authenticates workers by the \
             token in IRONFLOW_WORKER_TOKEN",
        );
    }
    let host = parsed.host_str().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if parsed.scheme() == "http" && !loopback && !allow_insecure_http {
        return Some(
            "an https:// URL: plain http:// would send the worker token in clear text; it is \
             accepted only to a loopback host, or with IRONFLOW_ALLOW_INSECURE_HTTP=true (an \
             API inside the VPC)",
        );
    }
    None
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
