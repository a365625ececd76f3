//! Configuration layers, lowest first: built-in defaults < TOML file < environment < command
//! line. Every layer uses the same keys: the flag names in snake_case (`--agent-port` is
//! `agent_port` in the file and `KONNECTIVITY_SERVER_AGENT_PORT` in the environment).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;
use serde::Deserialize;

use super::Options;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/konnectivity/server.toml";
pub const ENV_PREFIX: &str = "KONNECTIVITY_SERVER_";
/// Variables with our prefix that are not settings: the config path itself, and the
/// arguments the systemd unit passes on from /etc/default/konnectivity-server.
const ENV_NOT_SETTINGS: &[&str] = &["config", "args"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("environment variable {name}: {message}")]
    Env { name: String, message: String },
    #[error("{0}")]
    Layer(String),
}

/// The parsed command line and which settings it gave explicitly.
#[derive(Clone, Debug)]
pub struct CommandLine {
    pub options: Options,
    explicit: Dict,
}

impl CommandLine {
    pub fn parse<I, T>(args: I) -> Result<CommandLine, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Options::command().try_get_matches_from(args)?;
        let options = Options::from_arg_matches(&matches)?;
        let all = Value::serialize(&options)
            .ok()
            .and_then(|v| v.into_dict())
            .unwrap_or_default();
        let explicit = all
            .into_iter()
            .filter(|(key, _)| {
                matches.ids().any(|id| id.as_str() == key)
                    && matches.value_source(key) == Some(ValueSource::CommandLine)
            })
            .collect();
        Ok(CommandLine { options, explicit })
    }

    /// The settings given on the command line, by key.
    pub fn explicit_keys(&self) -> impl Iterator<Item = &str> {
        self.explicit.keys().map(String::as_str)
    }
}

/// Which file to read: `--config`, else `KONNECTIVITY_SERVER_CONFIG`, else the default path
/// when it exists. An explicit path must exist; an empty one means no file.
pub fn config_path(cli: &Options) -> Result<Option<PathBuf>, ConfigError> {
    let explicit = cli
        .config
        .clone()
        .or_else(|| std::env::var_os(format!("{ENV_PREFIX}CONFIG")).map(PathBuf::from));
    match explicit {
        Some(path) if path.as_os_str().is_empty() => Ok(None),
        Some(path) if !path.exists() => Err(ConfigError::MissingFile(path)),
        Some(path) => Ok(Some(path)),
        None => {
            let default = Path::new(DEFAULT_CONFIG_PATH);
            Ok(default.exists().then(|| default.to_path_buf()))
        }
    }
}

/// Checks a file on its own first: the toml parser knows lines and columns, so a typo or a
/// wrong type is reported with its key and line, and never falls back to a default.
fn check_file(path: &Path, text: &str) -> Result<(), ConfigError> {
    toml::from_str::<Options>(text)
        .map(|_| ())
        .map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
}

/// Merges every layer into one set of options (not yet validated).
pub fn load(cli: &CommandLine) -> Result<Options, ConfigError> {
    let path = config_path(&cli.options)?;
    let mut figment = Figment::from(Serialized::defaults(Options::default()));
    if let Some(path) = &path {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.clone(),
            message: e.to_string(),
        })?;
        check_file(path, &text)?;
        figment = figment.merge(Toml::string(&text));
    }
    let (env, warnings) = env_layer(std::env::vars())?;
    figment = figment
        .merge(Serialized::globals(env))
        .merge(Serialized::globals(cli.explicit.clone()));
    let mut options: Options = figment.extract().map_err(|e| {
        ConfigError::Layer(
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    // Settings that are about this invocation, not the server, come from the command line.
    options.version = cli.options.version;
    options.config = path;
    options.check_config = cli.options.check_config;
    options.write_config_to = cli.options.write_config_to.clone();
    options.dev = cli.options.dev;
    options.dev_state_dir = cli.options.dev_state_dir.clone();
    options.load_warnings = warnings;
    Ok(options)
}

/// Go's `strconv.ParseBool`, which pflag uses for bool flags.
fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Settings from the environment: `PROXY_SERVER_ID` (as upstream), then
/// `KONNECTIVITY_SERVER_<KEY>`. Each value is text, typed by its key the way a flag's value
/// is, so `KONNECTIVITY_SERVER_SERVER_ID=12345` stays a string. A value that does not parse is
/// an error naming the variable; an unknown key is returned as a warning.
pub fn env_layer(
    vars: impl Iterator<Item = (String, String)>,
) -> Result<(Dict, Vec<String>), ConfigError> {
    let mut warnings = Vec::new();
    let defaults = Value::serialize(Options::default())
        .ok()
        .and_then(|v| v.into_dict())
        .unwrap_or_default();
    let mut vars: Vec<(String, String)> = vars.collect();
    // PROXY_SERVER_ID first, so our own prefixed variable overrides it.
    vars.sort_by_key(|(name, _)| name != "PROXY_SERVER_ID");
    let mut layer = Dict::new();
    for (name, raw) in vars {
        let key = if name == "PROXY_SERVER_ID" {
            "server_id".to_string()
        } else if let Some(key) = name.strip_prefix(ENV_PREFIX) {
            key.to_ascii_lowercase()
        } else {
            continue;
        };
        if ENV_NOT_SETTINGS.contains(&key.as_str()) {
            continue;
        }
        let invalid = |what: &str| ConfigError::Env {
            name: name.clone(),
            message: format!("invalid {what} {raw:?} for {key}"),
        };
        let value = match defaults.get(&key) {
            Some(Value::Bool(..)) => {
                Value::from(parse_go_bool(&raw).ok_or_else(|| invalid("boolean"))?)
            }
            Some(Value::Num(..)) => match raw.parse::<i64>() {
                Ok(n) => Value::from(n),
                Err(_) => Value::from(raw.parse::<f64>().map_err(|_| invalid("number"))?),
            },
            Some(Value::Array(..)) => Value::from(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect::<Vec<_>>(),
            ),
            Some(_) => Value::from(raw.clone()),
            None if key == "server_id" => Value::from(raw.clone()),
            None if key == "warn_on_channel_limit" => {
                Value::from(parse_go_bool(&raw).ok_or_else(|| invalid("boolean"))?)
            }
            None => {
                // Not fatal: deployment tooling sets such variables too (for example
                // KONNECTIVITY_SERVER_BIN). It is named in a warning at start.
                warnings.push(format!(
                    "environment variable {name} is not a setting (no key {key:?}); ignoring it"
                ));
                continue;
            }
        };
        layer.insert(key, value);
    }
    Ok((layer, warnings))
}

/// The effective settings as TOML, loadable with `--config`.
pub fn to_toml(options: &Options) -> String {
    toml::to_string(options).expect("options serialize to TOML")
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
