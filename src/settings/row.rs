//! A setting's row ([`Setting`]): its variable, builder method, meaning, typed default,
//! bounds and rule, which drive the parsing of its variable, the check of its value (from the
//! environment or a builder method alike), its default in [`Settings::new`], the README's
//! configuration table and the line its builder method's documentation carries.

use std::borrow::Cow;
use std::cmp::Ordering;

use super::Settings;
use super::value::{Unit, Unparsed, Value};

/// What an error shows of a refused value.
#[derive(Clone, Copy)]
pub enum Shown {
    /// The value as it is.
    Raw,
    /// The value through a mask (e.g. a URL without its `user:password@`).
    Masked(fn(&str) -> String),
    /// Nothing but this note: the value is, or may be, a secret.
    Hidden(&'static str),
}

/// A rule a value must follow beyond its bounds, with the other settings at hand (a URL's
/// `http://` depends on `IRONFLOW_ALLOW_INSECURE_HTTP`): `Err` says what was expected.
pub type Rule<T> = fn(&T, &Settings) -> Result<(), Cow<'static, str>>;

/// Where a setting lives in [`Settings`] (built by the `field!` macro of the table).
pub struct Access<T> {
    pub(super) get: fn(&Settings) -> &T,
    pub(super) set: fn(&mut Settings) -> &mut T,
}

/// One setting: everything about it, written once. See the module documentation of
/// [`crate::settings`] for how to add one.
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the README and setter-doc tests render the table")
)]
pub struct Setting<T: Value> {
    /// Its environment variable, e.g. `IRONFLOW_CONCURRENCY`.
    pub variable: &'static str,
    /// The [`LambdaWorkerBuilder`](crate::LambdaWorkerBuilder) method that sets it (`new` for
    /// the URL and the token, which the builder takes as arguments).
    pub setter: &'static str,
    /// What it sets, as the README's configuration table says it (Markdown).
    pub meaning: &'static str,
    /// The unit its variable writes numbers in.
    pub unit: Unit,
    /// Its default, the value of [`Settings::new`].
    pub default: T::Const,
    /// The README's text for the default when it is not a value (`required`, a default taken
    /// from another variable...).
    pub default_doc: Option<&'static str>,
    /// The smallest value accepted, if any.
    pub min: Option<T::Bound>,
    /// The largest value accepted, if any.
    pub max: Option<T::Bound>,
    /// A rule beyond the bounds, if any.
    pub rule: Option<Rule<T>>,
    /// What an error shows of a refused value.
    pub shown: Shown,
    pub(super) access: Access<T>,
}

#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the README and setter-doc tests render the table")
)]
impl<T: Value> Setting<T> {
    /// Its default value.
    pub fn default_value(&self) -> T {
        T::new(self.default)
    }

    fn bound(&self, b: &T::Bound) -> String {
        let unit = match self.unit {
            Unit::None => "",
            Unit::Secs => " s",
            Unit::Millis => " ms",
        };
        format!("{}{unit}", T::show_bound(b, self.unit))
    }

    /// What its variable must hold: its form and bounds, e.g. `a whole number from 1 to 10`.
    fn accepted(&self) -> Cow<'static, str> {
        let form = T::form(self.unit);
        let plain = |b: &T::Bound| T::show_bound(b, self.unit);
        match (&self.min, &self.max) {
            (Some(lo), Some(hi)) => format!("{form} from {} to {}", plain(lo), plain(hi)).into(),
            (Some(lo), None) if plain(lo) == "0" => format!("{form} (0 or more)").into(),
            (Some(lo), None) if plain(lo) == "1" => format!("{form} greater than 0").into(),
            (Some(lo), None) => format!("{form} of at least {}", plain(lo)).into(),
            (None, Some(hi)) => format!("{form} of at most {}", plain(hi)).into(),
            (None, None) => form.into(),
        }
    }

    /// Whether `value` is within the bounds and follows the rule.
    fn check_value(&self, value: &T, s: &Settings) -> Result<(), Cow<'static, str>> {
        let below = self
            .min
            .is_some_and(|lo| value.compare(&lo) == Some(Ordering::Less));
        let above = self
            .max
            .is_some_and(|hi| value.compare(&hi) == Some(Ordering::Greater));
        if below || above {
            return Err(self.accepted());
        }
        self.rule.map_or(Ok(()), |rule| rule(value, s))
    }
}

/// A row of [`VARIABLES`](super::VARIABLES), whatever the type of its value.
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the README and setter-doc tests render the table")
)]
pub trait Entry: Sync {
    /// Its environment variable.
    fn variable(&self) -> &'static str;
    /// The builder method that sets it.
    fn setter(&self) -> &'static str;
    /// What it sets (Markdown).
    fn meaning(&self) -> &'static str;
    /// Its default, as the README's table and the setter's documentation write it.
    fn default_text(&self) -> String;
    /// Its bounds, e.g. `1 to 3600 s` or `≥ 1`, if it has any.
    fn bounds_text(&self) -> Option<String>;
    /// The meaning cell of the README's table: the meaning, then `; ` and the bounds.
    fn readme_meaning(&self) -> String {
        let meaning = self
            .meaning()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        match self.bounds_text() {
            Some(bounds) => format!("{meaning}; {bounds}"),
            None => meaning,
        }
    }
    /// The line its builder method's documentation carries, e.g. ``Variable
    /// `IRONFLOW_CONCURRENCY`; default 2; ≥ 1.``
    fn doc_line(&self) -> String;
    /// Parse `raw` (trimmed, not empty) into `s`; `Err` says what was expected.
    ///
    /// # Errors
    ///
    /// The expected form, when `raw` is not of it.
    fn parse_into(&self, s: &mut Settings, raw: &str) -> Result<(), Cow<'static, str>>;
    /// Check its value in `s` (bounds and rule); `Err` says what was expected.
    ///
    /// # Errors
    ///
    /// What was expected, when the value is not accepted.
    fn check(&self, s: &Settings) -> Result<(), Cow<'static, str>>;
    /// What an error shows of the variable's text `raw`.
    fn found(&self, raw: &str) -> String;
    /// What an error shows of its value in `s`: quoted, or the note that hides it.
    fn current(&self, s: &Settings) -> String;
}

impl<T: Value> Entry for Setting<T> {
    fn variable(&self) -> &'static str {
        self.variable
    }
    fn setter(&self) -> &'static str {
        self.setter
    }
    fn meaning(&self) -> &'static str {
        self.meaning
    }
    fn default_text(&self) -> String {
        self.default_doc
            .map_or_else(|| self.default_value().doc(self.unit), str::to_string)
    }
    fn bounds_text(&self) -> Option<String> {
        let max = self.max.filter(|hi| !T::is_horizon(hi));
        match (&self.min, &max) {
            (Some(lo), Some(hi)) => Some(format!("{} to {}", self.bound(lo), self.bound(hi))),
            (Some(lo), None) => Some(format!("≥ {}", self.bound(lo))),
            (None, Some(hi)) => Some(format!("≤ {}", self.bound(hi))),
            (None, None) => None,
        }
    }
    fn doc_line(&self) -> String {
        let bounds = self
            .bounds_text()
            .map(|b| format!("; {b}"))
            .unwrap_or_default();
        format!(
            "Variable `{}`{}; default {}{bounds}.",
            self.variable,
            self.unit.doc(),
            self.default_text()
        )
    }
    fn parse_into(&self, s: &mut Settings, raw: &str) -> Result<(), Cow<'static, str>> {
        match T::parse(raw, self.unit) {
            Ok(value) => {
                *(self.access.set)(s) = value;
                Ok(())
            }
            Err(Unparsed::Form) => Err(self.accepted()),
            Err(Unparsed::TooLarge) => {
                Err(format!("{}: this value is too large to be read", self.accepted()).into())
            }
        }
    }
    fn check(&self, s: &Settings) -> Result<(), Cow<'static, str>> {
        self.check_value((self.access.get)(s), s)
    }
    fn found(&self, raw: &str) -> String {
        match self.shown {
            Shown::Raw => cut(raw),
            Shown::Masked(mask) => cut(&mask(raw)),
            Shown::Hidden(note) => note.to_string(),
        }
    }
    fn current(&self, s: &Settings) -> String {
        match self.shown {
            Shown::Hidden(note) => note.to_string(),
            _ => format!("{:?}", self.found(&(self.access.get)(s).show(self.unit))),
        }
    }
}

/// The longest part of a refused value an error shows, in characters: a 100 kB value is named
/// by its start and its length, not echoed whole.
const SHOWN_MAX: usize = 120;

/// `value` as an error shows it: whole, or its first [`SHOWN_MAX`] characters and its length.
fn cut(value: &str) -> String {
    if value.chars().count() <= SHOWN_MAX {
        return value.to_string();
    }
    let start: String = value.chars().take(SHOWN_MAX).collect();
    format!("{start}… ({} bytes in all)", value.len())
}
