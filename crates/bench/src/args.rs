//! What the command line's options (`cli.rs`) and a section's own options (the fleet's
//! `FleetArgs`) share: the range of a count of runs and the parser of whole numbers.

/// The most runs a count of runs takes (`--runs`, `--pickup-runs`, the managed-instances
/// drains' and the fleet's `--min-runs`): every run of a drain is created before it starts, and
/// 100000 is hours on this machine.
pub const MAX_RUNS: u32 = 100_000;

/// A parser of a whole number from `min` to `max`: anything else (a sign, a fraction, a
/// number out of range) is refused with the range. The option needs `allow_negative_numbers`
/// (or `allow_hyphen_values` for a list) for "-1" to reach it rather than read as a flag.
pub fn whole<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync
where
    T: Copy + std::fmt::Display + Into<i128> + TryFrom<i128> + Send + Sync,
{
    move |given: &str| {
        given
            .trim()
            .parse::<i128>()
            .ok()
            .filter(|n| (min.into()..=max.into()).contains(n))
            .and_then(|n| T::try_from(n).ok())
            .ok_or(format!(
                "expected a whole number from {min} to {max}, got {given:?}"
            ))
    }
}
