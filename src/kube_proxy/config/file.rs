//! `--config`: upstream's `KubeProxyConfiguration` (YAML or JSON), or our TOML. A file named
//! `*.toml` is TOML; `*.yaml`, `*.yml` and `*.json` are KubeProxyConfiguration; any other
//! name is decided by its content (a top-level `apiVersion` or `kind` means
//! KubeProxyConfiguration).
//!
//! Decoding follows upstream's: strict first; when that fails only on unknown or duplicate
//! fields, the file is read leniently and a warning names each unknown field and its line.
//! A wrong type or malformed YAML stops the start, naming the field and its line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::v1alpha1::{KubeProxyConfiguration, API_VERSION, KIND};
use crate::config::{ConfigError, FileLayer};

/// Whether `--config` names a KubeProxyConfiguration rather than our TOML.
pub fn is_kube_proxy_configuration(path: &Path, text: &str) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => return false,
        Some("yaml" | "yml" | "json") => return true,
        _ => {}
    }
    text.lines().any(|line| {
        let key = line
            .trim_start_matches(['{', ' ', '\t'])
            .trim_start_matches('"');
        // Top level only: YAML's top-level keys start the line (JSON's may be indented).
        let top = !line.starts_with([' ', '\t']) || line.trim_start().starts_with('"');
        top && ["apiVersion", "kind"].iter().any(|name| {
            key.strip_prefix(name)
                .is_some_and(|rest| rest.trim_start_matches('"').trim_start().starts_with(':'))
        })
    })
}

/// Reads a KubeProxyConfiguration file into the options' keys.
pub fn read(path: &Path, text: &str) -> Result<FileLayer, ConfigError> {
    let fail = |message: String| ConfigError::File {
        path: path.to_path_buf(),
        message,
    };
    let (config, mut warnings) = decode(text).map_err(fail)?;
    let (values, more) = config.to_keys();
    warnings.extend(more);
    let warnings = warnings
        .into_iter()
        .map(|w| format!("config file {}: {w}", path.display()))
        .collect();
    Ok(FileLayer { values, warnings })
}

/// Decodes the file as upstream: strict, else lenient with a warning. Errors read as
/// upstream's first words (`failed to decode: ...`) with the field and line added.
pub fn decode(text: &str) -> Result<(KubeProxyConfiguration, Vec<String>), String> {
    // Upstream's lenient decoding keeps the last of repeated keys; its strict one refuses
    // them, which the warning below names.
    let options = serde_saphyr::options! {
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
    };
    let keys: Located = serde_saphyr::from_str_with_options(text, options.clone())
        .map_err(|e| format!("failed to decode: {}", one_line(&e)))?;
    let lines = keys.key_lines();
    let repeated = keys.repeated_keys();
    let mut ignored = Vec::new();
    let config: KubeProxyConfiguration =
        serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
            // serde_ignored writes `?` for an Option it passed through.
            serde_ignored::deserialize(de, |path| {
                ignored.push(path.to_string().replace(".?", "").replace("?.", ""))
            })
        })
        .map_err(|e| {
            let line = e.location().map(|l| l.line()).unwrap_or(0);
            let field = lines
                .iter()
                .filter(|(_, at)| **at <= line)
                .max_by_key(|(path, at)| (**at, path.len()))
                .map(|(path, _)| format!("{path}: "))
                .unwrap_or_default();
            format!("failed to decode: line {line}: {field}{}", message_only(&e))
        })?;
    match config.kind.as_deref() {
        None | Some("") => return Err("failed to decode: Object 'Kind' is missing".into()),
        Some(KIND) => {}
        Some(other) => {
            return Err(format!(
                "failed to decode: no kind {other:?} is registered for version {:?}",
                config.api_version.as_deref().unwrap_or_default()
            ))
        }
    }
    if config.api_version.as_deref() != Some(API_VERSION) {
        return Err(format!(
            "failed to decode: no kind {KIND:?} is registered for version {:?}",
            config.api_version.as_deref().unwrap_or_default()
        ));
    }
    let mut warnings = Vec::new();
    if !ignored.is_empty() || !repeated.is_empty() {
        ignored.sort();
        let mut fields: Vec<String> = ignored
            .iter()
            .map(|path| match lines.get(path) {
                Some(line) => format!("unknown field {path:?} (line {line})"),
                None => format!("unknown field {path:?}"),
            })
            .collect();
        fields.extend(
            repeated
                .iter()
                .map(|(path, line)| format!("key {path:?} already set in map (line {line})")),
        );
        warnings.push(format!(
            "using lenient decoding as strict decoding failed: strict decoding error: {}",
            fields.join(", ")
        ));
    }
    Ok((config, warnings))
}

/// serde-saphyr's message on one line (it may add the position on a line of its own).
fn one_line(error: &serde_saphyr::Error) -> String {
    error
        .to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The error's message without the position serde-saphyr appends (we name the line ourselves).
fn message_only(error: &serde_saphyr::Error) -> String {
    let text = one_line(error);
    match text.find(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The file's mapping keys with their lines, by dotted path (`iptables.syncPeriod`,
/// `logging.vmodule.0.filePattern`), as serde_ignored spells paths.
enum Located {
    Map(Vec<(Spanned<String>, Located)>),
    Seq(Vec<Located>),
    Scalar,
}

impl Located {
    fn key_lines(&self) -> BTreeMap<String, u64> {
        let mut lines = BTreeMap::new();
        self.collect("", &mut lines);
        lines
    }

    /// Keys given twice in one mapping, by path, with the line of the repeat.
    fn repeated_keys(&self) -> Vec<(String, u64)> {
        let mut repeated = Vec::new();
        self.find_repeats("", &mut repeated);
        repeated
    }

    fn find_repeats(&self, prefix: &str, out: &mut Vec<(String, u64)>) {
        let join = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}.{name}")
            }
        };
        match self {
            Located::Map(entries) => {
                for (i, (key, value)) in entries.iter().enumerate() {
                    if entries[..i].iter().any(|(k, _)| k.value == key.value) {
                        out.push((join(&key.value), key.referenced.line()));
                    }
                    value.find_repeats(&join(&key.value), out);
                }
            }
            Located::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    item.find_repeats(&join(&i.to_string()), out);
                }
            }
            Located::Scalar => {}
        }
    }

    fn collect(&self, prefix: &str, lines: &mut BTreeMap<String, u64>) {
        let join = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}.{name}")
            }
        };
        match self {
            Located::Map(entries) => {
                for (key, value) in entries {
                    let path = join(&key.value);
                    lines.insert(path.clone(), key.referenced.line());
                    value.collect(&path, lines);
                }
            }
            Located::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    item.collect(&join(&i.to_string()), lines);
                }
            }
            Located::Scalar => {}
        }
    }
}

impl<'de> Deserialize<'de> for Located {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LocatedVisitor)
    }
}

struct LocatedVisitor;

impl<'de> Visitor<'de> for LocatedVisitor {
    type Value = Located;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Located, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            entries.push((key, map.next_value::<Located>()?));
        }
        Ok(Located::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Located, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Located>()? {
            items.push(item);
        }
        Ok(Located::Seq(items))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_unit<E>(self) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_none<E>(self) -> Result<Located, E> {
        Ok(Located::Scalar)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Located, D::Error> {
        d.deserialize_any(LocatedVisitor)
    }
    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<Located, D::Error> {
        d.deserialize_any(LocatedVisitor)
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Located, A::Error> {
        let (IgnoredAny, _) = data.variant::<IgnoredAny>()?;
        Ok(Located::Scalar)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_format_comes_from_the_name_then_the_content() {
        let toml = "proxy_mode = \"nftables\"\n";
        let yaml = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        let json = "{\n  \"kind\": \"KubeProxyConfiguration\"\n}\n";
        assert!(!is_kube_proxy_configuration(Path::new("a.toml"), yaml));
        assert!(is_kube_proxy_configuration(Path::new("a.yaml"), toml));
        assert!(is_kube_proxy_configuration(Path::new("config.conf"), yaml));
        assert!(is_kube_proxy_configuration(Path::new("config.conf"), json));
        assert!(!is_kube_proxy_configuration(Path::new("config.conf"), toml));
        assert!(!is_kube_proxy_configuration(
            Path::new("config"),
            "[x]\n  kind: 1\n"
        ));
    }

    #[test]
    fn unknown_fields_are_read_leniently_with_their_lines() {
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\niptables:\n  syncPerod: 10s\nbogus: 1\n";
        let (config, warnings) = decode(text).unwrap();
        assert_eq!(config.mode.as_deref(), Some("nftables"));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("unknown field \"iptables.syncPerod\" (line 5)"),
            "{}",
            warnings[0]
        );
        assert!(warnings[0].contains("unknown field \"bogus\" (line 6)"));
    }

    #[test]
    fn a_repeated_key_keeps_the_last_value_with_a_warning() {
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nmode: ipvs\n";
        let (config, warnings) = decode(text).unwrap();
        assert_eq!(config.mode.as_deref(), Some("ipvs"));
        assert!(
            warnings[0]
                .ends_with("strict decoding error: key \"mode\" already set in map (line 4)"),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_wrong_type_names_the_field_and_line() {
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  burst: lots\n";
        let err = decode(text).unwrap_err();
        assert!(
            err.starts_with("failed to decode: line 4: clientConnection.burst: "),
            "{err}"
        );
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconfigSyncPeriod: soon\n";
        let err = decode(text).unwrap_err();
        assert!(err.contains("line 3: configSyncPeriod: "), "{err}");
        assert!(err.contains("time: invalid duration \"soon\""), "{err}");
    }

    #[test]
    fn kind_and_version_are_checked() {
        assert_eq!(
            decode("mode: ipvs\n").unwrap_err(),
            "failed to decode: Object 'Kind' is missing"
        );
        let err =
            decode("apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n")
                .unwrap_err();
        assert!(err.contains("v1beta1"), "{err}");
    }

    #[test]
    fn json_decodes_too() {
        let text = "{\"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\", \"kind\": \"KubeProxyConfiguration\",\n \"mode\": \"ipvs\", \"ipvs\": {\"scheduler\": \"wrr\"}}";
        let (config, warnings) = decode(text).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(config.ipvs.unwrap().scheduler.as_deref(), Some("wrr"));
    }
}
