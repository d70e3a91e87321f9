//! Durations as written in config files: a whole number and a unit, `ms`, `s`, `m`, `h` or `d`.

use crate::limiter::{MILLISECOND, Nanos, SECOND};

const UNITS: [(&str, Nanos); 5] = [
    ("ms", MILLISECOND),
    ("s", SECOND),
    ("m", 60 * SECOND),
    ("h", 3_600 * SECOND),
    ("d", 86_400 * SECOND),
];

/// Parses `"250ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"` (a whole number and one unit) into
/// nanoseconds.
pub fn parse_duration(s: &str) -> Result<Nanos, String> {
    let bad = || {
        format!(
            "\"{s}\" is not a duration: use a whole number and ms, s, m, h or d, e.g. \"250ms\", \"1m\""
        )
    };
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let (_, scale) = UNITS.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    n.checked_mul(*scale)
        .ok_or_else(|| format!("\"{s}\" is too long"))
}

/// Formats nanoseconds in the largest unit that divides them exactly (`"1m"`, `"250ms"`).
pub fn format_duration(n: Nanos) -> String {
    for (unit, scale) in UNITS.iter().rev() {
        if n >= *scale && n.is_multiple_of(*scale) {
            return format!("{}{unit}", n / scale);
        }
    }
    format!("{n}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(250 * MILLISECOND));
        assert_eq!(parse_duration("1s"), Ok(SECOND));
        assert_eq!(parse_duration("1m"), Ok(60 * SECOND));
        assert_eq!(parse_duration("2h"), Ok(7_200 * SECOND));
        assert_eq!(parse_duration("1d"), Ok(86_400 * SECOND));
        assert_eq!(parse_duration("0s"), Ok(0));
    }

    #[test]
    fn durations_reject_what_they_cannot_read() {
        for bad in [
            "",
            "s",
            "1",
            "1.5s",
            "-1s",
            "1 s",
            "1sec",
            "1S",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_format_in_largest_exact_unit() {
        assert_eq!(format_duration(60 * SECOND), "1m");
        assert_eq!(format_duration(90 * SECOND), "90s");
        assert_eq!(format_duration(250 * MILLISECOND), "250ms");
        assert_eq!(format_duration(5), "5ns");
    }
}
