//! The one interface every program's options give the configuration layers (`layers.rs`).

use std::path::{Path, PathBuf};

use figment::value::Dict;

/// A config file in a format of the program's own, read into the layers' keys.
pub struct FileLayer {
    /// Values by key, as the TOML file would give them.
    pub values: Dict,
    /// Problems that do not stop the start (logged once logging is up).
    pub warnings: Vec<String>,
}

/// A program's settings, as every layer spells them: a clap command line whose ids are the
/// TOML keys and, upper-cased behind [`Layered::ENV_PREFIX`], the environment's names. Both
/// programs (the server's `Options`, the agent's `AgentOptions`) load through this one path.
pub trait Layered:
    clap::Parser + serde::Serialize + serde::de::DeserializeOwned + Default + Clone
{
    /// The program's name in usage lines and warnings.
    const PROGRAM: &'static str;
    /// `KONNECTIVITY_SERVER_`: settings from the environment.
    const ENV_PREFIX: &'static str;
    /// The file read when `--config` and `<PREFIX>CONFIG` name none and it exists.
    const DEFAULT_CONFIG_PATH: &'static str;
    /// Upstream's own variable for the program's id (`PROXY_SERVER_ID`) and the key it sets.
    /// Our prefixed variable for the same key overrides it. `("", "")` for a program without
    /// one.
    const ID_VARIABLE: (&'static str, &'static str);
    /// Keys with no built-in default (so not in the defaults' table) that the environment
    /// may still set, and whether each is a bool (else a string).
    const OPTIONAL_KEYS: &'static [(&'static str, bool)];
    /// Variables with the prefix that are upstream's own and not settings (lower-case keys
    /// after the prefix): ignored without a warning.
    const ENV_IGNORED: &'static [&'static str] = &[];

    /// Reads a config file written in a format other than our TOML (kube-proxy's
    /// `KubeProxyConfiguration`), or `None` when it is TOML.
    fn file_layer(_path: &Path, _text: &str) -> Option<Result<FileLayer, ConfigError>> {
        None
    }

    /// `--config`, as given on the command line.
    fn config_flag(&self) -> Option<&PathBuf>;
    /// Copies what is about this invocation rather than the program's settings (the config
    /// path that was read, `--check-config`, `--write-config-to`, ...) from the command line.
    fn take_invocation(&mut self, cli: &Self, config: Option<PathBuf>);
    /// Problems found while loading that do not stop the start.
    fn load_warnings_mut(&mut self) -> &mut Vec<String>;
    /// Arguments that are not flags (ignored, as upstream).
    fn ignored_args(&self) -> &[String];
    /// Program-specific warnings about the merged settings.
    fn after_load(&self, _warnings: &mut Vec<String>) {}
}

/// Why loading a program's configuration layers failed.
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
