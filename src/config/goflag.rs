//! Go's flag value syntax, as pflag and klog parse it: bools, base-0 integers, klog's levels,
//! severities, `--vmodule` and `--log-backtrace-at`, and comma-separated lists. Both programs'
//! command lines (and their TOML and environment layers) read values through these.

use std::path::PathBuf;

use serde::Deserialize;

/// Go's `strconv.ParseBool`, which pflag uses for bool flags.
pub fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

pub fn go_bool(text: &str) -> Result<bool, String> {
    parse_go_bool(text)
        .ok_or_else(|| format!("strconv.ParseBool: parsing {text:?}: invalid syntax"))
}

/// Go's `strconv.ParseUint(text, 0, 64)` on the text after an optional sign: a base prefix
/// (`0x`, `0o`, `0b`, or a leading `0` for octal) and `_` between digits are accepted.
fn go_base0(func: &str, text: &str, digits_text: &str) -> Result<u64, String> {
    let syntax = || format!("strconv.{func}: parsing {text:?}: invalid syntax");
    let lower = digits_text.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest, true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest, true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    // `_` only between digits (a base prefix counts as one).
    let mut after_digit = prefixed;
    for c in digits.chars() {
        if c == '_' {
            if !after_digit {
                return Err(syntax());
            }
            after_digit = false;
        } else if c.is_ascii_alphanumeric() {
            after_digit = true;
        } else {
            return Err(syntax());
        }
    }
    let digits = digits.replace('_', "");
    if !after_digit || digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(syntax());
    }
    u64::from_str_radix(&digits, radix)
        .map_err(|_| format!("strconv.{func}: parsing {text:?}: value out of range"))
}

/// pflag's int flags: Go's `strconv.ParseInt(text, 0, 64)`.
pub fn go_int(text: &str) -> Result<i64, String> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = go_base0("ParseInt", text, rest)?;
    let value = if negative {
        -(magnitude as i128)
    } else {
        magnitude as i128
    };
    i64::try_from(value)
        .map_err(|_| format!("strconv.ParseInt: parsing {text:?}: value out of range"))
}

/// pflag's uint flags: Go's `strconv.ParseUint(text, 0, 64)` (no sign).
pub fn go_uint(text: &str) -> Result<u64, String> {
    go_base0("ParseUint", text, text)
}

/// pflag's float32 flags, with Go's error wording.
pub fn go_float32(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(value) if value.is_finite() || !text.chars().any(|c| c.is_ascii_digit()) => Ok(value),
        Ok(_) => Err(format!(
            "strconv.ParseFloat: parsing {text:?}: value out of range"
        )),
        Err(_) => Err(format!(
            "strconv.ParseFloat: parsing {text:?}: invalid syntax"
        )),
    }
}

/// klog's `Level`: a base-10 32-bit integer. Negative levels are valid and log like 0.
pub fn go_level(text: &str) -> Result<u32, String> {
    go_int32(text).map(|level| level.max(0) as u32)
}

/// Go's `strconv.ParseInt(text, 10, 32)`, with its error wording.
fn go_int32(text: &str) -> Result<i32, String> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.ParseInt: parsing {text:?}: invalid syntax"
        ));
    }
    text.trim_start_matches('+')
        .parse::<i32>()
        .map_err(|_| format!("strconv.ParseInt: parsing {text:?}: value out of range"))
}

/// A level from the file or the environment: any integer, negative ones counting as 0.
pub fn level<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let level = i64::deserialize(deserializer)?;
    u32::try_from(level.max(0)).map_err(serde::de::Error::custom)
}

/// klog's `severity` flags (`--stderrthreshold`, `--alsologtostderrthreshold`): a severity name
/// in any case, or a 32-bit integer.
pub fn check_severity(text: &str) -> Result<(), String> {
    if ["INFO", "WARNING", "ERROR", "FATAL"].contains(&text.to_ascii_uppercase().as_str()) {
        return Ok(());
    }
    go_int32(text).map(|_| ())
}

/// klog's `--vmodule`: comma-separated `pattern=N`, N a non-negative 32-bit integer.
pub fn check_vmodule(text: &str) -> Result<(), String> {
    const SYNTAX: &str = "syntax error: expect comma-separated list of filename=N";
    for item in text.split(',').filter(|item| !item.is_empty()) {
        let parts: Vec<&str> = item.split('=').collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() {
            return Err(SYNTAX.into());
        }
        match parts[1].parse::<i32>() {
            Err(_) => return Err(SYNTAX.into()),
            Ok(level) if level < 0 => return Err("negative value for vmodule level".into()),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// klog's `--log-backtrace-at`: empty, or `file.go:N` with N > 0.
pub fn check_trace_location(text: &str) -> Result<(), String> {
    const SYNTAX: &str = "syntax error: expect file.go:234";
    if text.is_empty() {
        return Ok(());
    }
    let fields: Vec<&str> = text.split(':').collect();
    if fields.len() != 2 || !fields[0].contains('.') {
        return Err(SYNTAX.into());
    }
    match fields[1].parse::<i64>() {
        Err(_) => Err(SYNTAX.into()),
        Ok(line) if line <= 0 => Err("negative or zero value for level".into()),
        Ok(_) => Ok(()),
    }
}

/// Paths may be empty (`--config=` means "no file"), which clap's own path parser refuses.
pub fn any_path(text: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(text))
}

/// Accepts a list as a TOML array, or as Go's comma-separated string (the environment's form).
pub fn comma_list<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        Text(String),
        Items(Vec<String>),
    }
    Ok(match List::deserialize(deserializer)? {
        List::Text(text) => text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        List::Items(items) => items,
    })
}
