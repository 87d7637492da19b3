//! Settings read from the environment, validated where they are read: a value
//! that is not a number of the right kind is an error naming the variable, and
//! a duration longer than [`LONGEST`] is clamped to it (a week is "forever" for
//! a job; much longer ones overflow the time arithmetic of waits and deadlines).

use crate::error::{Error, Result};
use std::time::Duration;

/// The longest wait, timeout or budget a setting may ask for.
pub const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);

/// `text` as a positive, finite number of seconds, clamped to [`LONGEST`];
/// the message says what was expected.
pub fn parse_seconds(text: &str) -> std::result::Result<Duration, String> {
    let s = text
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| format!("`{text}`: expected a positive number of seconds"))?;
    Ok(Duration::try_from_secs_f64(s).map_or(LONGEST, |d| d.min(LONGEST)))
}

/// `text` as a positive whole number of milliseconds, clamped to [`LONGEST`].
pub fn parse_millis(text: &str) -> std::result::Result<u64, String> {
    let ms = text
        .trim()
        .parse::<u128>()
        .ok()
        .filter(|&ms| ms > 0)
        .ok_or_else(|| format!("`{text}`: expected a positive whole number of milliseconds"))?;
    Ok(ms.min(LONGEST.as_millis()) as u64)
}

/// The environment variable `var` through `parse`, or `default` when unset; a
/// value `parse` refuses is an error naming `var`.
pub fn from_env<T>(
    var: &str,
    default: T,
    parse: impl FnOnce(&str) -> std::result::Result<T, String>,
) -> Result<T> {
    match std::env::var(var) {
        Ok(v) => parse(&v).map_err(|message| Error::Argument {
            context: "environment".into(),
            arg: var.into(),
            message,
        }),
        Err(_) => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_values_clamp_and_bad_ones_are_refused() {
        assert_eq!(parse_seconds("1e300"), Ok(LONGEST));
        assert_eq!(parse_seconds(" 2.5 "), Ok(Duration::from_millis(2500)));
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("0").is_err());
        assert_eq!(
            parse_millis("99999999999999999999999"),
            Ok(LONGEST.as_millis() as u64)
        );
        assert_eq!(parse_millis("150"), Ok(150));
        assert!(parse_millis("1.5").is_err());
    }
}
