//! Go's `time.Duration` syntax, because operators pass `--keepalive-time=1h30m` and upstream's
//! messages print durations the Go way (`-1s`, `1h0m0s`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A signed duration in nanoseconds, parsed and printed exactly as Go does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct GoDuration(pub i64);

/// Go's `time.ParseDuration` error, in its words (`time: invalid duration "x"`,
/// `time: missing unit in duration "5"`, `time: unknown unit "d" in duration "1d"`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ParseDurationError(String);

impl GoDuration {
    pub const fn from_secs(secs: i64) -> Self {
        GoDuration(secs * 1_000_000_000)
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The non-negative value as a std Duration; negative values (rejected by validation) map to zero.
    pub fn to_std(self) -> Duration {
        Duration::from_nanos(self.0.max(0) as u64)
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        GoDuration(d.as_nanos().min(i64::MAX as u128) as i64)
    }
}

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

impl FromStr for GoDuration {
    type Err = ParseDurationError;

    /// Go's `time.ParseDuration`, step for step: `[-+]`, then `number unit` pairs, where a
    /// number is digits with an optional fraction (`1.5`, `.5`, `1.`).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseDurationError(format!("time: invalid duration {input:?}"));
        let (negative, mut rest) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            _ => (false, input),
        };
        if rest == "0" {
            return Ok(GoDuration(0));
        }
        if rest.is_empty() {
            return Err(invalid());
        }
        let digits = |text: &str| {
            text.find(|c: char| !c.is_ascii_digit())
                .unwrap_or(text.len())
        };
        let mut total: f64 = 0.0;
        while !rest.is_empty() {
            if !rest.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
                return Err(invalid());
            }
            let whole_len = digits(rest);
            let whole = &rest[..whole_len];
            rest = &rest[whole_len..];
            let mut fraction = "";
            if let Some(after) = rest.strip_prefix('.') {
                let len = digits(after);
                fraction = &after[..len];
                rest = &after[len..];
            }
            if whole.is_empty() && fraction.is_empty() {
                return Err(invalid());
            }
            let unit_len = rest
                .find(|c: char| c == '.' || c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            if unit.is_empty() {
                return Err(ParseDurationError(format!(
                    "time: missing unit in duration {input:?}"
                )));
            }
            let scale = unit_nanos(unit).ok_or_else(|| {
                ParseDurationError(format!("time: unknown unit {unit:?} in duration {input:?}"))
            })?;
            rest = &rest[unit_len..];
            let value: f64 = format!("{}.{fraction}0", if whole.is_empty() { "0" } else { whole })
                .parse()
                .map_err(|_| invalid())?;
            total += value * scale as f64;
        }
        if total > i64::MAX as f64 {
            return Err(invalid());
        }
        let nanos = total.round() as i64;
        Ok(GoDuration(if negative { -nanos } else { nanos }))
    }
}

/// Prints `value` (an integer number of `unit`s scaled by 10^digits) with trailing zeros trimmed.
fn push_fraction(out: &mut String, whole: u64, fraction: u64, digits: u32) {
    out.push_str(&whole.to_string());
    if fraction > 0 {
        let text = format!("{:0width$}", fraction, width = digits as usize);
        out.push('.');
        out.push_str(text.trim_end_matches('0'));
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        if self.0 < 0 {
            out.push('-');
        }
        let nanos = self.0.unsigned_abs();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000 {
            out.push_str(&format!("{nanos}ns"));
        } else if nanos < 1_000_000 {
            push_fraction(&mut out, nanos / 1_000, nanos % 1_000, 3);
            out.push_str("µs");
        } else if nanos < 1_000_000_000 {
            push_fraction(&mut out, nanos / 1_000_000, nanos % 1_000_000, 6);
            out.push_str("ms");
        } else {
            let hours = nanos / 3_600_000_000_000;
            let minutes = (nanos / 60_000_000_000) % 60;
            let seconds_nanos = nanos % 60_000_000_000;
            if hours > 0 {
                out.push_str(&format!("{hours}h"));
            }
            if hours > 0 || minutes > 0 {
                out.push_str(&format!("{minutes}m"));
            }
            push_fraction(
                &mut out,
                seconds_nanos / 1_000_000_000,
                seconds_nanos % 1_000_000_000,
                9,
            );
            out.push('s');
        }
        f.write_str(&out)
    }
}

impl serde::Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let cases = [
            ("0", 0),
            ("90s", 90_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("-1s", -1_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("300ms", 300_000_000),
            ("2h45m10.5s", 9_910_500_000_000),
            ("10us", 10_000),
            ("10µs", 10_000),
            ("+5m", 300_000_000_000),
        ];
        for (text, nanos) in cases {
            assert_eq!(text.parse::<GoDuration>(), Ok(GoDuration(nanos)), "{text}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for text in ["", "1", "s", "1x", "1.2.3s", "-", "1h 30m", ".s"] {
            assert!(text.parse::<GoDuration>().is_err(), "{text:?} should fail");
        }
    }

    #[test]
    fn refuses_in_gos_words() {
        let cases = [
            ("", "time: invalid duration \"\""),
            ("abc", "time: invalid duration \"abc\""),
            ("5", "time: missing unit in duration \"5\""),
            ("1.2.3s", "time: missing unit in duration \"1.2.3s\""),
            ("1d", "time: unknown unit \"d\" in duration \"1d\""),
            (".s", "time: invalid duration \".s\""),
        ];
        for (text, message) in cases {
            let err = text.parse::<GoDuration>().unwrap_err();
            assert_eq!(err.to_string(), message, "{text:?}");
        }
        assert_eq!("1.s".parse::<GoDuration>(), Ok(GoDuration(1_000_000_000)));
        assert_eq!(".5s".parse::<GoDuration>(), Ok(GoDuration(500_000_000)));
    }

    #[test]
    fn prints_like_go() {
        let cases = [
            (0, "0s"),
            (3_600_000_000_000, "1h0m0s"),
            (-1_000_000_000, "-1s"),
            (1_500_000_000, "1.5s"),
            (500_000_000, "500ms"),
            (1_500, "1.5µs"),
            (120_000_000_000, "2m0s"),
            (5_400_000_000_000, "1h30m0s"),
            (42, "42ns"),
        ];
        for (nanos, text) in cases {
            assert_eq!(GoDuration(nanos).to_string(), text);
        }
    }
}
