//! Configuration layers, lowest first: built-in defaults < TOML file < environment < command
//! line. Every layer uses the same keys: the flag names in snake_case (`--agent-port` is
//! `agent_port` in the file and `KONNECTIVITY_SERVER_AGENT_PORT` in the environment).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;

use super::goflag::{check_severity, check_trace_location, check_vmodule, parse_go_bool};
use super::layered::{ConfigError, Layered};
use super::Options;

/// Variables with a program's prefix that are not settings: the config path itself, and the
/// arguments the systemd unit passes on from /etc/default/<program>.
const ENV_NOT_SETTINGS: &[&str] = &["config", "args"];

/// The parsed command line and which settings it gave explicitly.
#[derive(Clone, Debug)]
pub struct CommandLine<O = Options> {
    pub options: O,
    explicit: Dict,
}

impl CommandLine<Options> {
    /// The server's command line: [`CommandLine::parse_as`].
    pub fn parse<I, T>(args: I) -> Result<CommandLine, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        CommandLine::parse_as(args)
    }
}

impl<O: Layered> CommandLine<O> {
    /// Parses a command line as cobra and pflag do: an error reads as theirs do
    /// (`unknown flag: --x`, `invalid argument "v" for "--flag" flag: ...`) followed by the usage.
    pub fn parse_as<I, T>(args: I) -> Result<CommandLine<O>, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let matches = O::command()
            .try_get_matches_from(&args)
            .map_err(go_parse_error::<O>)?;
        // klog's typed flags, checked as klog's Set does. Their defaults are not in the
        // syntax these accept (`:0`), so only values given on the command line are checked.
        type Check = fn(&str) -> Result<(), String>;
        let klog: [(&str, &str, Check); 4] = [
            ("stderrthreshold", "--stderrthreshold", check_severity),
            (
                "alsologtostderrthreshold",
                "--alsologtostderrthreshold",
                check_severity,
            ),
            ("vmodule", "--vmodule", check_vmodule),
            (
                "log_backtrace_at",
                "--log-backtrace-at",
                check_trace_location,
            ),
        ];
        for (id, flag, check) in klog {
            if matches.value_source(id) != Some(ValueSource::CommandLine) {
                continue;
            }
            for value in matches.get_many::<String>(id).into_iter().flatten() {
                if let Err(cause) = check(value) {
                    return Err(usage_error::<O>(
                        clap::error::ErrorKind::ValueValidation,
                        &format!("invalid argument {value:?} for {flag:?} flag: {cause}"),
                    ));
                }
            }
        }
        let mut options = O::from_arg_matches(&matches).map_err(go_parse_error::<O>)?;
        let warning = ignored_arguments_warning::<O>(&args, options.ignored_args());
        *options.load_warnings_mut() = warning.into_iter().collect();
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

/// The usage cobra prints after a command-line error.
fn usage_text<O: Layered>() -> String {
    let mut help = O::command().render_help().to_string();
    if let Some(at) = help.find("Options:\n") {
        help = format!("Flags:\n{}", &help[at + "Options:\n".len()..]);
    }
    format!("Usage:\n  {} [flags]\n\n{}", O::PROGRAM, help.trim_end())
}

/// An error printed as `error: <message>`, then the usage, with an exit code of 1.
fn usage_error<O: Layered>(kind: clap::error::ErrorKind, message: &str) -> clap::Error {
    clap::Error::raw(kind, format!("{message}\n{}\n", usage_text::<O>()))
}

/// Rewords clap's parse errors as pflag words them.
fn go_parse_error<O: Layered>(err: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |kind| match err.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        _ => None,
    };
    // clap names a flag with its value placeholder (`--mode <MODE>`); pflag by its name.
    let flag = context(ContextKind::InvalidArg).map(|arg| {
        let name = arg
            .split([' ', '[', '='])
            .next()
            .unwrap_or_default()
            .to_string();
        if name == "-v" || name == "--v" {
            "-v, --v".to_string()
        } else {
            name
        }
    });
    let message = match (err.kind(), flag) {
        (ErrorKind::UnknownArgument, Some(flag)) => match flag.strip_prefix("--") {
            Some(_) => format!("unknown flag: {flag}"),
            None => {
                let short = flag.trim_start_matches('-');
                let first = short.chars().next().unwrap_or('-');
                format!("unknown shorthand flag: '{first}' in -{short}")
            }
        },
        (ErrorKind::InvalidValue, Some(flag)) if matches!(err.get(ContextKind::InvalidValue), Some(ContextValue::String(v)) if v.is_empty()) =>
        {
            format!("flag needs an argument: {flag}")
        }
        (ErrorKind::InvalidValue | ErrorKind::ValueValidation, Some(flag)) => {
            let value = context(ContextKind::InvalidValue).unwrap_or_default();
            let cause = std::error::Error::source(&err)
                .map(|cause| cause.to_string())
                .unwrap_or_else(|| "invalid value".to_string());
            format!("invalid argument {value:?} for {flag:?} flag: {cause}")
        }
        _ => return err,
    };
    usage_error::<O>(err.kind(), &message)
}

/// Upstream ignores arguments that are not flags without a word; this names them, and says
/// how to give a bool flag a value when one follows such a flag.
fn ignored_arguments_warning<O: Layered>(args: &[OsString], ignored: &[String]) -> Option<String> {
    if ignored.is_empty() {
        return None;
    }
    let mut message = format!(
        "ignoring command-line arguments that are not flags (as upstream does): {}",
        ignored
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let command = O::command();
    for pair in args.windows(2) {
        let (flag, value) = (pair[0].to_string_lossy(), pair[1].to_string_lossy());
        let Some(name) = flag.strip_prefix("--") else {
            continue;
        };
        let takes_optional_value = command.get_arguments().any(|arg| {
            arg.get_long() == Some(name) && arg.get_num_args().is_some_and(|n| n.min_values() == 0)
        });
        if takes_optional_value
            && parse_go_bool(&value).is_some()
            && ignored.contains(&value.to_string())
        {
            message.push_str(&format!(
                "; {flag} {value} sets {flag} to true: write {flag}={value}"
            ));
        }
    }
    Some(message)
}

/// Which file to read: `--config`, else `<PREFIX>CONFIG` (`KONNECTIVITY_SERVER_CONFIG`), else
/// the default path when it exists. An explicit path must exist; an empty one means no file.
pub fn config_path<O: Layered>(cli: &O) -> Result<Option<PathBuf>, ConfigError> {
    let explicit = cli
        .config_flag()
        .cloned()
        .or_else(|| std::env::var_os(format!("{}CONFIG", O::ENV_PREFIX)).map(PathBuf::from));
    match explicit {
        Some(path) if path.as_os_str().is_empty() => Ok(None),
        Some(path) if !path.exists() => Err(ConfigError::MissingFile(path)),
        Some(path) => Ok(Some(path)),
        None => {
            let default = Path::new(O::DEFAULT_CONFIG_PATH);
            Ok(default.exists().then(|| default.to_path_buf()))
        }
    }
}

/// Checks a file on its own first: the toml parser knows lines and columns, so a typo or a
/// wrong type is reported with its key and line, and never falls back to a default.
fn check_file<O: Layered>(path: &Path, text: &str) -> Result<(), ConfigError> {
    toml::from_str::<O>(text)
        .map(|_| ())
        .map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
}

/// Merges every layer into one set of options (not yet validated).
pub fn load<O: Layered>(cli: &CommandLine<O>) -> Result<O, ConfigError> {
    let path = config_path(&cli.options)?;
    let mut figment = Figment::from(Serialized::defaults(O::default()));
    let mut file_warnings = Vec::new();
    if let Some(path) = &path {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.clone(),
            message: e.to_string(),
        })?;
        match O::file_layer(path, &text) {
            Some(layer) => {
                let layer = layer?;
                file_warnings = layer.warnings;
                figment = figment.merge(Serialized::globals(layer.values));
            }
            None => {
                check_file::<O>(path, &text)?;
                figment = figment.merge(Toml::string(&text));
            }
        }
    }
    let (env, mut warnings) = env_layer::<O>(std::env::vars())?;
    warnings.splice(0..0, file_warnings);
    figment = figment
        .merge(Serialized::globals(env))
        .merge(Serialized::globals(cli.explicit.clone()));
    let mut options: O = figment.extract().map_err(|e| {
        ConfigError::Layer(
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    // Settings that are about this invocation, not the program, come from the command line.
    options.take_invocation(&cli.options, path);
    options.after_load(&mut warnings);
    let mut from_cli = cli.options.clone();
    let mut all = std::mem::take(from_cli.load_warnings_mut());
    all.extend(warnings);
    *options.load_warnings_mut() = all;
    Ok(options)
}

/// Settings from the environment: upstream's id variable (`PROXY_SERVER_ID`), then
/// `<PREFIX><KEY>`. Each value is text, typed by its key the way a flag's value is, so
/// `KONNECTIVITY_SERVER_SERVER_ID=12345` stays a string. A value that does not parse is an
/// error naming the variable; an unknown key is returned as a warning.
pub fn env_layer<O: Layered>(
    vars: impl Iterator<Item = (String, String)>,
) -> Result<(Dict, Vec<String>), ConfigError> {
    let (id_variable, id_key) = O::ID_VARIABLE;
    let mut warnings = Vec::new();
    let defaults = Value::serialize(O::default())
        .ok()
        .and_then(|v| v.into_dict())
        .unwrap_or_default();
    let mut vars: Vec<(String, String)> = vars.collect();
    // Upstream's id variable first, so our own prefixed variable overrides it.
    vars.sort_by_key(|(name, _)| name != id_variable);
    let mut layer = Dict::new();
    let mut service_links = Vec::new();
    for (name, raw) in vars {
        let key = if name == id_variable {
            id_key.to_string()
        } else if let Some(key) = name.strip_prefix(O::ENV_PREFIX) {
            key.to_ascii_lowercase()
        } else {
            continue;
        };
        if ENV_NOT_SETTINGS.contains(&key.as_str()) || O::ENV_IGNORED.contains(&key.as_str()) {
            continue;
        }
        if is_service_link::<O>(&key, &raw) && (name != id_variable) {
            service_links.push(name);
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
            None => match O::OPTIONAL_KEYS.iter().find(|(k, _)| *k == key) {
                Some((_, true)) => {
                    Value::from(parse_go_bool(&raw).ok_or_else(|| invalid("boolean"))?)
                }
                Some((_, false)) => Value::from(raw.clone()),
                None => {
                    // Not fatal: deployment tooling sets such variables too (for example
                    // KONNECTIVITY_SERVER_BIN). It is named in a warning at start.
                    warnings.push(format!(
                        "environment variable {name} is not a setting (no key {key:?}); ignoring it"
                    ));
                    continue;
                }
            },
        };
        layer.insert(key, value);
    }
    if !service_links.is_empty() {
        warnings.push(format!(
            "ignoring Kubernetes service-link environment variables, which are not settings (the \
             kubelet sets them for a Service named {program} or {program}-<name> in the pod's \
             namespace; enableServiceLinks: false in the pod spec stops that): {}",
            service_links.join(", "),
            program = O::PROGRAM,
        ));
    }
    Ok((layer, warnings))
}

/// Whether a variable is one the kubelet sets for a Service (docker-link style) rather than
/// a setting: `<SVC>_PORT=tcp://10.96.0.6:8091`, `<SVC>_PORT_8091_TCP[_PROTO|_PORT|_ADDR]`,
/// `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<NAME>]`. A Service named
/// `konnectivity-server-agent` gives `KONNECTIVITY_SERVER_AGENT_PORT`, which is also our
/// `agent_port` key, so the value's shape decides for `_PORT`; the other forms are never keys.
fn is_service_link<O: Layered>(key: &str, value: &str) -> bool {
    if is_link_url(value) {
        return true;
    }
    let service = |suffix: &str| key.starts_with(suffix) || key.contains(&format!("_{suffix}"));
    if service("service_host") || service("service_port") {
        return !is_setting::<O>(key);
    }
    // `..._port_<number>_<proto>` and its `_proto`, `_port`, `_addr` variants.
    let words: Vec<&str> = key.split('_').collect();
    words.windows(3).any(|w| {
        w[0] == "port"
            && !w[1].is_empty()
            && w[1].bytes().all(|b| b.is_ascii_digit())
            && matches!(w[2], "tcp" | "udp" | "sctp")
    }) && !is_setting::<O>(key)
}

/// `tcp://host:port` (or udp, sctp), as the kubelet writes it.
fn is_link_url(value: &str) -> bool {
    let Some((scheme, rest)) = value.split_once("://") else {
        return false;
    };
    if !matches!(scheme, "tcp" | "udp" | "sctp") {
        return false;
    }
    match rest.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains('/')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

fn is_setting<O: Layered>(key: &str) -> bool {
    O::command()
        .get_arguments()
        .any(|arg| arg.get_id().as_str() == key)
}

/// The effective settings as TOML, loadable with `--config`.
pub fn to_toml<O: Layered>(options: &O) -> String {
    toml::to_string(options).expect("options serialize to TOML")
}
