//! The enum-like settings, each parsed once from its text into its type, with the message
//! that refuses a bad value.

use std::collections::BTreeMap;

use super::ValidationError;

/// The frontend protocol (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Grpc,
    HttpConnect,
}

impl Mode {
    /// The text `--mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Grpc => "grpc",
            Mode::HttpConnect => "http-connect",
        }
    }

    /// `--mode`, refused in upstream's words.
    pub fn parse(text: &str) -> Result<Mode, ValidationError> {
        match text {
            "grpc" => Ok(Mode::Grpc),
            "http-connect" => Ok(Mode::HttpConnect),
            other => Err(ValidationError(format!(
                "mode must be set to either 'grpc' or 'http-connect' not {other:?}"
            ))),
        }
    }
}

/// How an agent is picked for a dial (`--proxy-strategies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Default,
    DestHost,
    DefaultRoute,
}

impl Strategy {
    /// The name used on the command line and in the `proxy_strategy` metric label.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::DestHost => "destHost",
            Strategy::DefaultRoute => "defaultRoute",
        }
    }
}

/// Parses `--proxy-strategies` as upstream: comma separated, empty items skipped, names
/// case-sensitive, duplicates kept.
pub fn parse_proxy_strategies(text: &str) -> Result<Vec<Strategy>, String> {
    let mut strategies = Vec::new();
    for item in text.split(',').filter(|item| !item.is_empty()) {
        strategies.push(match item {
            "default" => Strategy::Default,
            "destHost" => Strategy::DestHost,
            "defaultRoute" => Strategy::DefaultRoute,
            other => return Err(format!("unknown proxy strategy: {other}")),
        });
    }
    if strategies.is_empty() {
        return Err("proxy strategies cannot be empty".to_string());
    }
    Ok(strategies)
}

/// The TLS versions `--tls-min-version` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

pub fn parse_tls_version(text: &str) -> Result<TlsVersion, String> {
    Ok(match text {
        "VersionTLS10" => TlsVersion::Tls10,
        "VersionTLS11" => TlsVersion::Tls11,
        "VersionTLS12" | "" => TlsVersion::Tls12,
        "VersionTLS13" => TlsVersion::Tls13,
        other => return Err(format!(
            "unsupported TLS version {other:?}, supported values are: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
        )),
    })
}

/// Parses `k=v,k2=v2` lease labels as upstream: pairs trimmed of whitespace.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    if text.trim().is_empty() {
        return Err("empty string provided".into());
    }
    text.split(',')
        .map(|pair| match pair.trim().split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("invalid label format: {pair}")),
        })
        .collect()
}

/// Where logs go (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// journald when systemd connected our output to the journal, else stderr.
    Auto,
    Journald,
    Stderr,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Auto => "auto",
            LogFormat::Journald => "journald",
            LogFormat::Stderr => "stderr",
        }
    }
}

/// The flag's and the config key's value; the error is what follows the flag's or key's
/// name in the message that refuses it.
impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text {
            "auto" => Ok(LogFormat::Auto),
            "journald" => Ok(LogFormat::Journald),
            "stderr" => Ok(LogFormat::Stderr),
            other => Err(format!(
                "must be one of auto, journald, stderr, not {other:?}"
            )),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for LogFormat {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for LogFormat {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn log_format_round_trips_and_names_what_it_takes() {
        for format in [LogFormat::Auto, LogFormat::Journald, LogFormat::Stderr] {
            assert_eq!(format.to_string().parse::<LogFormat>().unwrap(), format);
        }
        assert_eq!(
            "Stderr".parse::<LogFormat>().unwrap_err(),
            "must be one of auto, journald, stderr, not \"Stderr\""
        );
    }

    #[test]
    fn mode_is_refused_in_upstreams_words() {
        assert_eq!(Mode::parse("http-connect").unwrap(), Mode::HttpConnect);
        assert_eq!(
            Mode::parse("tcp").unwrap_err().0,
            "mode must be set to either 'grpc' or 'http-connect' not \"tcp\""
        );
    }
}
