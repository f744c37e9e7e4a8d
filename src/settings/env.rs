//! Reading the settings from the environment: every variable parsed and checked, every problem
//! reported at once, misspelt and non-UTF-8 variables refused.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;

use super::{
    ConfigError, Settings, VARIABLES, Variable, WORKER_TOKEN_VAR, WorkerToken, is_namespace, rules,
    table,
};

impl Settings {
    /// Settings from the process environment (see the README's configuration table).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable that is missing, malformed, not UTF-8 or cannot
    /// work ([`ConfigError::Several`] listing each of them when there are more).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(environment()?)
    }

    /// Settings from any variable lookup (the environment, a map in tests).
    ///
    /// # Errors
    ///
    /// As [`Settings::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup_with_token(lookup, None)
    }

    /// [`Settings::from_lookup`] with the worker token already known (read from Secrets
    /// Manager at cold start); `None` reads `IRONFLOW_WORKER_TOKEN`.
    ///
    /// # Errors
    ///
    /// As [`Settings::from_env`].
    pub fn from_lookup_with_token(
        lookup: impl Fn(&str) -> Option<String>,
        worker_token: Option<WorkerToken>,
    ) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut s = Self::new("", WorkerToken::new(""));
        let namespace_set = get(table::POISON_NAMESPACE.variable).is_some();
        if let Some(function) = get(FUNCTION_NAME_VAR).filter(|_| !namespace_set) {
            s.poison_namespace = function;
        }
        // Every variable is checked, and every problem reported at once: a cold start that fails
        // on a bad environment names all of them in one log line. First each value is parsed,
        // then checked (a rule may depend on a variable further down the table).
        let mut errors = Vec::new();
        let mut parsed = Vec::new();
        for v in VARIABLES.iter().copied() {
            let Some(raw) = get(v.variable()) else {
                continue;
            };
            match v.parse_into(&mut s, &raw) {
                Ok(()) => parsed.push((v, raw)),
                Err(expected) => errors.push(invalid(v, expected, &raw)),
            }
        }
        if let Some(token) = worker_token {
            s.worker_token = token;
        }
        let set: Vec<&'static str> = parsed.iter().map(|(v, _)| v.variable()).collect();
        for (v, raw) in parsed {
            if let Err(expected) = v.check(&s) {
                errors.push(invalid(v, expected, &raw));
            }
        }
        missing(&s, &mut errors);
        without_queue(&s, &set, &mut errors);
        if !namespace_set && !is_namespace(&s.poison_namespace) {
            errors.push(ConfigError::Invalid {
                variable: "AWS_LAMBDA_FUNCTION_NAME (default of IRONFLOW_POISON_NAMESPACE)",
                expected: rules::NAMESPACE_EXPECTED.into(),
                found: s.poison_namespace.clone(),
            });
        }
        // What no single value shows, for the variables that parsed.
        for p in s.validate() {
            if !errors_name(&errors, p.variable) {
                errors.push(ConfigError::Unusable {
                    variable: p.variable,
                    reason: p.reason,
                });
            }
        }
        order(&mut errors);
        match errors.len() {
            0 => Ok(s),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }
}

/// The variable Lambda names the function in (the default of `IRONFLOW_POISON_NAMESPACE`).
const FUNCTION_NAME_VAR: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// The error of `v` set to `raw`, which is not what `expected` says.
fn invalid(v: &Variable, expected: Cow<'static, str>, raw: &str) -> ConfigError {
    ConfigError::Invalid {
        variable: v.variable(),
        expected,
        found: v.found(raw),
    }
}

/// A wake-up variable set without a queue, even to its default: it would be ignored without a
/// word ([`Settings::validate`] sees only values that differ from the defaults, as the builder
/// cannot tell a default from a value set to it).
fn without_queue(s: &Settings, set: &[&str], errors: &mut Vec<ConfigError>) {
    let wake = [
        table::MAX_WAKEUPS_PER_INVOCATION.variable,
        table::WAKE_DELAY.variable,
    ];
    let given: Vec<&str> = wake.into_iter().filter(|v| set.contains(v)).collect();
    if s.wake_queue_url.is_none() && !given.is_empty() {
        errors.push(ConfigError::Unusable {
            variable: table::WAKE_QUEUE_URL.variable,
            reason: format!(
                "{} is set, and applies only to a wake queue: set the queue's URL, or unset it \
                 to send no wake-ups",
                given.join(" and ")
            ),
        });
    }
}

/// The errors of the required variables that are not set.
fn missing(s: &Settings, errors: &mut Vec<ConfigError>) {
    if s.api_url.is_empty() {
        errors.push(ConfigError::Missing {
            variable: table::API_URL.variable,
            expected: "the ironflow API's base URL, e.g. https://ironflow.example.com",
        });
    }
    if s.worker_token.expose().is_empty() && !errors_name(errors, WORKER_TOKEN_VAR) {
        errors.push(ConfigError::Missing {
            variable: WORKER_TOKEN_VAR,
            expected: "the ironflow API's worker token (WORKER_TOKEN on the API), or \
                       IRONFLOW_WORKER_TOKEN_SECRET_ARN naming a Secrets Manager secret that \
                       holds it",
        });
    }
}

/// The process environment's variables of this crate ([`VARIABLES`] and
/// `AWS_LAMBDA_FUNCTION_NAME`), as a lookup for [`Settings::from_lookup`] and the secrets.
///
/// # Errors
///
/// [`ConfigError`] naming each variable set to something that is not valid UTF-8 (read as
/// unset, it would silently become its default: a poison table name the in-memory table).
///
/// A variable whose name is a near miss of one of them (`IRONFLOW_POISON_TABEL`) is refused
/// too, naming the one it misspells: ignored, its setting would silently keep its default.
pub(crate) fn environment() -> Result<impl Fn(&str) -> Option<String> + Clone, ConfigError> {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    let mut errors = misspelt(&names);
    let (values, unreadable) = os_values(|name| std::env::var_os(name));
    errors.extend(unreadable);
    let lookup = move |name: &str| values.get(name).cloned();
    if errors.is_empty() {
        return Ok(lookup);
    }
    // One error names every problem: the values that did read are checked too.
    // (A variable not read for want of UTF-8 is not reported again as missing.)
    if let Err(more) = Settings::from_lookup(lookup.clone()) {
        for e in more.into_list() {
            if !errors_name(&errors, e.variable()) {
                errors.push(e);
            }
        }
    }
    order(&mut errors);
    match errors.len() {
        1 => Err(errors.remove(0)),
        _ => Err(ConfigError::Several(errors)),
    }
}

/// Whether `lookup` holds a non-blank value for `variable` (what the settings read as set).
pub(crate) fn is_set(lookup: impl Fn(&str) -> Option<String>, variable: &str) -> bool {
    lookup(variable).is_some_and(|v| !v.trim().is_empty())
}

/// The errors of the `IRONFLOW_*` names in `names` that are no variable of [`VARIABLES`] but
/// within two edits of one (a misspelling): each names the variable it is closest to.
pub(crate) fn misspelt(names: &[String]) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for name in names.iter().filter(|n| n.starts_with("IRONFLOW_")) {
        if VARIABLES.iter().any(|v| v.variable() == name) {
            continue;
        }
        let closest = VARIABLES
            .iter()
            .map(|v| (edits(name, v.variable()), v.variable()))
            .min();
        if let Some((distance, variable)) = closest.filter(|(d, _)| *d <= 2) {
            errors.push(ConfigError::Unusable {
                variable,
                reason: format!(
                    "{name} is set, and this worker reads no such variable: a misspelling of \
                     {variable} ({distance} letter(s) apart)? Rename it, or {variable} keeps its \
                     default"
                ),
            });
        }
    }
    errors
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions of bytes).
pub(super) fn edits(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// [`environment`] over any lookup of raw values.
///
/// # Errors
///
/// As [`environment`].
#[cfg(test)]
pub(crate) fn os_lookup(
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Result<impl Fn(&str) -> Option<String> + Clone, ConfigError> {
    let (values, mut errors) = os_values(lookup);
    match errors.len() {
        0 => Ok(move |name: &str| values.get(name).cloned()),
        1 => Err(errors.remove(0)),
        _ => Err(ConfigError::Several(errors)),
    }
}

/// The variables of [`VARIABLES`] and `AWS_LAMBDA_FUNCTION_NAME` that `lookup` holds as UTF-8
/// text, and an error naming each one it holds as anything else.
fn os_values(
    lookup: impl Fn(&str) -> Option<OsString>,
) -> (HashMap<&'static str, String>, Vec<ConfigError>) {
    let mut values = HashMap::new();
    let mut errors = Vec::new();
    let names = VARIABLES.iter().map(|v| (v.variable(), Some(*v)));
    for (name, row) in names.chain([(FUNCTION_NAME_VAR, None)]) {
        match lookup(name).map(OsString::into_string) {
            None => {}
            Some(Ok(value)) => {
                values.insert(name, value);
            }
            Some(Err(raw)) => {
                let lossy = raw.to_string_lossy();
                errors.push(ConfigError::Invalid {
                    variable: name,
                    expected: "valid UTF-8 text".into(),
                    found: row.map_or_else(|| lossy.to_string(), |v| v.found(&lossy)),
                });
            }
        }
    }
    (values, errors)
}

/// Whether an error in `errors` concerns `variable`.
fn errors_name(errors: &[ConfigError], variable: &str) -> bool {
    errors.iter().any(|e| match e {
        ConfigError::Missing { variable: v, .. }
        | ConfigError::Invalid { variable: v, .. }
        | ConfigError::Unusable { variable: v, .. } => *v == variable,
        ConfigError::Several(_) => false,
    })
}

/// The position of `variable` in [`VARIABLES`] (after them: anything else).
pub(super) fn position(variable: &str) -> usize {
    VARIABLES
        .iter()
        .position(|v| v.variable() == variable || variable.contains(v.variable()))
        .unwrap_or(usize::MAX)
}

/// Sort `errors` in the order of [`VARIABLES`], the order they are documented in.
fn order(errors: &mut [ConfigError]) {
    errors.sort_by_key(|e| match e {
        ConfigError::Missing { variable, .. }
        | ConfigError::Invalid { variable, .. }
        | ConfigError::Unusable { variable, .. } => position(variable),
        ConfigError::Several(_) => usize::MAX,
    });
}
