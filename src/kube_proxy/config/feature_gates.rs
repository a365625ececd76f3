//! The feature gates upstream kube-proxy v1.37.2 knows (`--feature-gates`, `featureGates`):
//! every gate's default, stage and lock at v1.37, and upstream's rules for setting them.
//! The tables are data dumped from upstream's gate registry (`feature_gates.tsv`: name,
//! default, stage, locked, dependencies; `feature_gates_help.txt`: the `--feature-gates` help
//! lines, verbatim).

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A gate's maturity at v1.37.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

#[derive(Clone, Debug)]
struct Spec {
    default: bool,
    stage: Stage,
    locked: bool,
    /// Gates that must be on while this one is.
    depends_on: Vec<&'static str>,
}

fn known() -> &'static BTreeMap<&'static str, Spec> {
    static KNOWN: OnceLock<BTreeMap<&'static str, Spec>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        include_str!("feature_gates.tsv")
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .filter_map(|line| {
                let mut cols = line.split('\t');
                let name = cols.next()?;
                let default = cols.next()? == "true";
                let stage = match cols.next()? {
                    "ALPHA" => Stage::Alpha,
                    "BETA" => Stage::Beta,
                    "DEPRECATED" => Stage::Deprecated,
                    _ => Stage::Ga,
                };
                let locked = cols.next()? == "true";
                let depends_on = cols
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .collect();
                Some((
                    name,
                    Spec {
                        default,
                        stage,
                        locked,
                        depends_on,
                    },
                ))
            })
            .collect()
    })
}

/// `--feature-gates`' help text, upstream's word for word.
pub fn flag_help() -> String {
    format!(
        "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:\n{}\nThis parameter is ignored if a config file is specified by --config.",
        include_str!("feature_gates_help.txt").trim_end()
    )
}

/// The gates' state: upstream's defaults with the given values over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<String, bool>,
}

impl FeatureGates {
    /// Upstream's `SetFromMap`: an unknown name stops at once; a locked gate set against its
    /// lock is refused; `AllAlpha`/`AllBeta` turn on every alpha or beta gate not named.
    /// Returns the state and the warnings upstream logs (GA and deprecated gates set).
    pub fn from_map(map: &BTreeMap<String, bool>) -> Result<(FeatureGates, Vec<String>), String> {
        let known = known();
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        for (name, value) in map {
            let Some(spec) = known.get(name.as_str()) else {
                return Err(format!("unrecognized feature gate: {name}"));
            };
            if spec.locked && spec.default != *value {
                errors.push(format!(
                    "cannot set feature gate {name} to {value}, feature is locked to {}",
                    spec.default
                ));
                continue;
            }
            match spec.stage {
                Stage::Deprecated => warnings.push(format!(
                    "Warning: setting deprecated feature gate. It will be removed in a future release. featureGate={name:?} value={value}"
                )),
                Stage::Ga if !matches!(name.as_str(), "AllAlpha" | "AllBeta") => warnings.push(format!(
                    "Warning: setting GA feature gate. It will be removed in a future release. featureGate={name:?} value={value}"
                )),
                _ => {}
            }
        }
        let gates = FeatureGates { set: map.clone() };
        if errors.is_empty() {
            // Only once every value was accepted, as upstream: the dependencies.
            for (name, spec) in known {
                if spec.depends_on.is_empty() || !gates.enabled(name) {
                    continue;
                }
                let off: Vec<&str> = spec
                    .depends_on
                    .iter()
                    .copied()
                    .filter(|dep| !gates.enabled(dep))
                    .collect();
                if !off.is_empty() {
                    errors.push(format!(
                        "{name} is enabled, but depends on features that are disabled: [{}]",
                        off.join(" ")
                    ));
                }
            }
        }
        match errors.len() {
            0 => Ok((gates, warnings)),
            1 => Err(errors.remove(0)),
            _ => Err(format!("[{}]", errors.join(", "))),
        }
    }

    /// Whether a gate is on. A name upstream does not know is off.
    pub fn enabled(&self, name: &str) -> bool {
        if let Some(value) = self.set.get(name) {
            return *value;
        }
        let Some(spec) = known().get(name) else {
            return false;
        };
        // AllAlpha / AllBeta give every alpha / beta gate not named their value.
        let all = match spec.stage {
            Stage::Alpha => self.set.get("AllAlpha"),
            Stage::Beta => self.set.get("AllBeta"),
            _ => None,
        };
        all.copied().unwrap_or(spec.default)
    }

    /// The values given (for `featureGates` in the written configuration).
    pub fn given(&self) -> &BTreeMap<String, bool> {
        &self.set
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> Result<(FeatureGates, Vec<String>), String> {
        FeatureGates::from_map(&pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    #[test]
    fn defaults_come_from_upstream() {
        let (g, _) = gates(&[]).unwrap();
        assert!(
            g.enabled("KubeProxyIPVS"),
            "deprecated, on by default in 1.37"
        );
        assert!(!g.enabled("KubeProxyNFTablesLocalhostNodePorts"), "alpha");
        assert!(!g.enabled("NoSuchGate"));
    }

    #[test]
    fn setting_follows_upstreams_rules() {
        let (g, warnings) = gates(&[("KubeProxyNFTablesLocalhostNodePorts", true)]).unwrap();
        assert!(g.enabled("KubeProxyNFTablesLocalhostNodePorts"));
        assert!(warnings.is_empty());
        assert_eq!(
            gates(&[("Nope", true)]).unwrap_err(),
            "unrecognized feature gate: Nope"
        );
        let (g, warnings) = gates(&[("KubeProxyIPVS", false)]).unwrap();
        assert!(!g.enabled("KubeProxyIPVS"));
        assert_eq!(warnings.len(), 1, "a deprecated gate set is warned about");
        let (g, _) = gates(&[
            ("AllAlpha", true),
            ("AllBeta", true),
            ("LoggingAlphaOptions", false),
        ])
        .unwrap();
        assert!(g.enabled("KubeProxyNFTablesLocalhostNodePorts"));
        assert!(!g.enabled("LoggingAlphaOptions"));
        assert_eq!(
            gates(&[("DisableNodeKubeProxyVersion", false)]).unwrap_err(),
            "cannot set feature gate DisableNodeKubeProxyVersion to false, feature is locked to true"
        );
    }

    #[test]
    fn dependencies_are_checked_once_values_are_accepted() {
        assert_eq!(
            gates(&[("PodGroupPreemptionPolicy", true)]).unwrap_err(),
            "PodGroupPreemptionPolicy is enabled, but depends on features that are disabled: [GenericWorkload]"
        );
        assert!(gates(&[
            ("PodGroupPreemptionPolicy", true),
            ("GenericWorkload", true)
        ])
        .is_ok());
        let err = gates(&[("AllAlpha", true)]).unwrap_err();
        assert!(
            err.starts_with('[')
                && err.contains("depends on features that are disabled: [GenericWorkload]"),
            "{err}"
        );
    }

    #[test]
    fn the_help_lists_upstreams_gates() {
        let help = flag_help();
        assert!(help.contains("\nAllAlpha=true|false (ALPHA - default=false)\n"));
        assert!(help.contains(
            "\nKubeProxyNFTablesLocalhostNodePorts=true|false (ALPHA - default=false)\n"
        ));
        assert!(help
            .ends_with("\nThis parameter is ignored if a config file is specified by --config."));
    }
}
