//! The types a setting holds ([`Value`]): how each is read from its variable, shown in an error
//! and in the docs, and compared with its row's bounds.

use std::cmp::Ordering;
use std::str::FromStr;
use std::time::Duration;

use super::{MAX_DURATION, WebhookSecret, WorkerToken};
use crate::poison::PoisonMode;

/// How a variable writes a number: its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// No unit: a count, a percentage, a text.
    None,
    /// Whole seconds.
    Secs,
    /// Whole milliseconds.
    Millis,
}

#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the README and setter-doc tests render the table")
)]
impl Unit {
    /// The unit as a setter's documentation names it: ` (seconds)`, ` (milliseconds)` or nothing.
    pub(super) fn doc(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Secs => " (seconds)",
            Unit::Millis => " (milliseconds)",
        }
    }
}

/// Why a variable's text was not parsed.
pub enum Unparsed {
    /// It is not of the value's form: the row says what it accepts (form and bounds).
    Form,
    /// A whole number larger than its type holds: the row says what it accepts, and that the
    /// value is too large.
    TooLarge,
}

/// A type a setting holds.
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the README and setter-doc tests render the table")
)]
pub trait Value: Clone + Send + Sync + 'static {
    /// The form its default takes in a `const` row (`&'static str` for a `String`).
    type Const: Copy + Send + Sync + 'static;
    /// The type of its bounds (`()`: it has none).
    type Bound: Copy + Send + Sync + 'static;

    /// The value of a `const` default.
    fn new(c: Self::Const) -> Self;
    /// The value a variable's text (trimmed, not empty) holds.
    ///
    /// # Errors
    ///
    /// [`Unparsed`] when the text is not of the form.
    fn parse(raw: &str, unit: Unit) -> Result<Self, Unparsed>;
    /// Its form, e.g. `a whole number of seconds`.
    fn form(unit: Unit) -> &'static str;
    /// The value as its variable would write it, for errors and the docs.
    fn show(&self, unit: Unit) -> String;
    /// The value as the README and the setters' docs write a default (texts in backquotes).
    fn doc(&self, unit: Unit) -> String {
        self.show(unit)
    }
    /// How the value compares with a bound (`None`: it has no bounds, or no value).
    fn compare(&self, _bound: &Self::Bound) -> Option<Ordering> {
        None
    }
    /// A bound as its variable would write it.
    fn show_bound(_bound: &Self::Bound, _unit: Unit) -> String {
        String::new()
    }
    /// Whether a bound is only [`MAX_DURATION`], the guard every duration has (the docs leave
    /// it out; errors say it).
    fn is_horizon(_bound: &Self::Bound) -> bool {
        false
    }
}

/// A whole number, and [`Unparsed::TooLarge`] for one its type cannot hold (any number of
/// digits).
fn whole<T: FromStr>(raw: &str) -> Result<T, Unparsed> {
    match raw.parse::<T>() {
        Ok(v) => Ok(v),
        Err(_) if is_whole_number(raw) => Err(Unparsed::TooLarge),
        Err(_) => Err(Unparsed::Form),
    }
}

/// Whether `raw` is a whole number as `str::parse` reads one: digits, after an optional `+`.
fn is_whole_number(raw: &str) -> bool {
    let digits = raw.strip_prefix('+').unwrap_or(raw);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

macro_rules! whole_number {
    ($t:ty) => {
        impl Value for $t {
            type Const = $t;
            type Bound = $t;
            fn new(c: $t) -> Self {
                c
            }
            fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
                whole(raw)
            }
            fn form(_unit: Unit) -> &'static str {
                "a whole number"
            }
            fn show(&self, _unit: Unit) -> String {
                self.to_string()
            }
            fn compare(&self, bound: &$t) -> Option<Ordering> {
                self.partial_cmp(bound)
            }
            fn show_bound(bound: &$t, _unit: Unit) -> String {
                bound.to_string()
            }
        }
    };
}
whole_number!(usize);
whole_number!(u32);

impl Value for Duration {
    type Const = Duration;
    type Bound = Duration;
    fn new(c: Duration) -> Self {
        c
    }
    fn parse(raw: &str, unit: Unit) -> Result<Self, Unparsed> {
        let n = whole::<u64>(raw)?;
        Ok(match unit {
            Unit::Millis => Duration::from_millis(n),
            Unit::Secs | Unit::None => Duration::from_secs(n),
        })
    }
    fn form(unit: Unit) -> &'static str {
        match unit {
            Unit::Millis => "a whole number of milliseconds",
            Unit::Secs | Unit::None => "a whole number of seconds",
        }
    }
    fn show(&self, unit: Unit) -> String {
        let whole = match unit {
            Unit::Millis if self.subsec_nanos().is_multiple_of(1_000_000) => Some(self.as_millis()),
            Unit::Secs | Unit::None if self.subsec_nanos() == 0 => Some(u128::from(self.as_secs())),
            _ => None,
        };
        whole.map_or_else(|| format!("{self:?}"), |n| n.to_string())
    }
    fn compare(&self, bound: &Duration) -> Option<Ordering> {
        self.partial_cmp(bound)
    }
    fn show_bound(bound: &Duration, unit: Unit) -> String {
        bound.show(unit)
    }
    fn is_horizon(bound: &Duration) -> bool {
        *bound == MAX_DURATION
    }
}

impl Value for Option<Duration> {
    type Const = Option<Duration>;
    type Bound = Duration;
    fn new(c: Self::Const) -> Self {
        c
    }
    fn parse(raw: &str, unit: Unit) -> Result<Self, Unparsed> {
        Duration::parse(raw, unit).map(Some)
    }
    fn form(unit: Unit) -> &'static str {
        Duration::form(unit)
    }
    fn show(&self, unit: Unit) -> String {
        self.map_or_else(|| "none".to_string(), |d| d.show(unit))
    }
    fn compare(&self, bound: &Duration) -> Option<Ordering> {
        self.as_ref().and_then(|d| d.partial_cmp(bound))
    }
    fn show_bound(bound: &Duration, unit: Unit) -> String {
        Duration::show_bound(bound, unit)
    }
    fn is_horizon(bound: &Duration) -> bool {
        *bound == MAX_DURATION
    }
}

impl Value for bool {
    type Const = bool;
    type Bound = ();
    fn new(c: bool) -> Self {
        c
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        match raw.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(Unparsed::Form),
        }
    }
    fn form(_unit: Unit) -> &'static str {
        "true or false"
    }
    fn show(&self, _unit: Unit) -> String {
        self.to_string()
    }
    fn doc(&self, _unit: Unit) -> String {
        format!("`{self}`")
    }
}

impl Value for String {
    type Const = &'static str;
    type Bound = ();
    fn new(c: &'static str) -> Self {
        c.to_string()
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        Ok(raw.to_string())
    }
    fn form(_unit: Unit) -> &'static str {
        "a text"
    }
    fn show(&self, _unit: Unit) -> String {
        self.clone()
    }
    fn doc(&self, _unit: Unit) -> String {
        if self.is_empty() {
            "none".to_string()
        } else {
            format!("`{self}`")
        }
    }
}

impl Value for Option<String> {
    type Const = Option<&'static str>;
    type Bound = ();
    fn new(c: Self::Const) -> Self {
        c.map(str::to_string)
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        Ok(Some(raw.to_string()))
    }
    fn form(_unit: Unit) -> &'static str {
        "a text"
    }
    fn show(&self, _unit: Unit) -> String {
        self.clone().unwrap_or_else(|| "none".to_string())
    }
}

impl Value for Vec<String> {
    type Const = &'static [&'static str];
    type Bound = ();
    fn new(c: Self::Const) -> Self {
        c.iter().map(|s| s.to_string()).collect()
    }
    /// Comma-separated.
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        Ok(raw.split(',').map(str::to_string).collect())
    }
    fn form(_unit: Unit) -> &'static str {
        "comma-separated texts"
    }
    fn show(&self, _unit: Unit) -> String {
        if self.is_empty() {
            "none".to_string()
        } else {
            self.join(",")
        }
    }
}

impl Value for PoisonMode {
    type Const = PoisonMode;
    type Bound = ();
    fn new(c: PoisonMode) -> Self {
        c
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        raw.parse().map_err(|_| Unparsed::Form)
    }
    fn form(_unit: Unit) -> &'static str {
        "fail or defer"
    }
    fn show(&self, _unit: Unit) -> String {
        self.as_str().to_string()
    }
    fn doc(&self, _unit: Unit) -> String {
        format!("`{self}`")
    }
}

impl Value for super::FunctionRole {
    type Const = super::FunctionRole;
    type Bound = ();
    fn new(c: super::FunctionRole) -> Self {
        c
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        raw.parse().map_err(|_| Unparsed::Form)
    }
    fn form(_unit: Unit) -> &'static str {
        "worker or webhook-receiver"
    }
    fn show(&self, _unit: Unit) -> String {
        self.as_str().to_string()
    }
    fn doc(&self, _unit: Unit) -> String {
        format!("`{self}`")
    }
}

impl Value for WorkerToken {
    type Const = &'static str;
    type Bound = ();
    fn new(c: &'static str) -> Self {
        WorkerToken::new(c)
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        Ok(WorkerToken::new(raw))
    }
    fn form(_unit: Unit) -> &'static str {
        "a token"
    }
    fn show(&self, _unit: Unit) -> String {
        "***".to_string()
    }
}

impl Value for Option<WebhookSecret> {
    type Const = Option<&'static str>;
    type Bound = ();
    fn new(c: Self::Const) -> Self {
        c.map(WebhookSecret::new)
    }
    fn parse(raw: &str, _unit: Unit) -> Result<Self, Unparsed> {
        Ok(Some(WebhookSecret::new(raw)))
    }
    fn form(_unit: Unit) -> &'static str {
        "a secret"
    }
    fn show(&self, _unit: Unit) -> String {
        self.as_ref().map_or("none", |_| "***").to_string()
    }
}
