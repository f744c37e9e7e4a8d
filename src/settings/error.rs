//! What is wrong with the settings: an environment variable's error, and a problem
//! [`Settings::validate`](super::Settings::validate)(super::Settings::validate) finds.

use std::borrow::Cow;

/// A missing, malformed or unusable environment variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required variable is not set (or is empty).
    #[error("environment variable {variable} is not set: expected {expected}")]
    Missing {
        /// The variable's name.
        variable: &'static str,
        /// The expected form.
        expected: &'static str,
    },
    /// A variable is set to something this crate cannot parse, or to a value that cannot
    /// work (out of its bounds, against its rule).
    #[error("environment variable {variable} is invalid: expected {expected}, found {found:?}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// What was expected: the form, the bounds.
        expected: Cow<'static, str>,
        /// The value found (never the value of a secret).
        found: String,
    },
    /// A variable's value cannot work with the others ([`Settings::validate`](super::Settings::validate)).
    #[error("environment variable {variable} cannot work: {reason}")]
    Unusable {
        /// The variable's name.
        variable: &'static str,
        /// Why, with the values involved.
        reason: String,
    },
    /// More than one variable is wrong: each of them, in the order of the table of variables.
    #[error("{} environment variables are wrong: {}", .0.len(), list(.0))]
    Several(Vec<ConfigError>),
}

impl ConfigError {
    /// The variable it names (`""` for [`ConfigError::Several`]).
    pub(super) fn variable(&self) -> &'static str {
        match self {
            Self::Missing { variable, .. }
            | Self::Invalid { variable, .. }
            | Self::Unusable { variable, .. } => variable,
            Self::Several(_) => "",
        }
    }

    /// Each error it holds: itself, or the errors of [`ConfigError::Several`].
    pub(super) fn into_list(self) -> Vec<ConfigError> {
        match self {
            Self::Several(errors) => errors,
            one => vec![one],
        }
    }
}

/// `1) <error>; 2) <error>...`
fn list(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}) {e}", i + 1))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A setting that cannot work, found by [`Settings::validate`](super::Settings::validate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The environment variable of the setting.
    pub variable: &'static str,
    /// The builder method of the setting.
    pub setter: &'static str,
    /// Why it cannot work, with the values involved.
    pub reason: String,
}
