//! Real connections through a node: netagent.py's `probe`, run in the client, the node or a
//! pod namespace, and its answers turned into tokens such as `pod1<-masq` (pod1 answered and
//! saw the node's masquerade address), `pod2:8081<-client`, `REFUSED`, `TIMEOUT`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::node::{
    python, CLIENT_IP, CLIENT_IP6, NODE_IP, NODE_IP6, NODE_POD_SIDE_IP, NODE_POD_SIDE_IP6, PODS,
};

/// Attempts per target. Two endpoints chosen at random both show up in 24 tries except with
/// probability 2^-23; fewer would make a run with many two-endpoint targets flaky.
pub const ATTEMPTS: usize = 24;
/// Seconds before an attempt counts as TIMEOUT.
pub const TIMEOUT_SECS: f64 = 1.5;

/// A probe target: `tcp:10.96.1.1:80`, `udp:[fd00:10:96::1]:53`.
pub fn target(proto: &str, addr: &str, port: u16) -> String {
    if addr.contains(':') {
        format!("{proto}:[{addr}]:{port}")
    } else {
        format!("{proto}:{addr}:{port}")
    }
}

/// A running probe: one process per namespace, all its targets at once.
pub struct Running {
    child: Child,
    what: String,
    side: String,
}

/// `first_alone`: the first attempt to each target runs before the others (for affinity).
pub fn start(side: &str, ns: &str, agent: &Path, first_alone: bool, targets: &[String]) -> Running {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, python()])
        .arg(agent)
        .args([
            "probe",
            &ATTEMPTS.to_string(),
            &TIMEOUT_SECS.to_string(),
            if first_alone { "1" } else { "0" },
        ])
        .args(targets)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("start probe");
    Running {
        child,
        what: format!("probe in {ns}"),
        side: side.to_string(),
    }
}

impl Running {
    /// Each target's answers, as tokens (sorted, duplicates kept).
    pub fn finish(self) -> BTreeMap<String, Vec<String>> {
        let out = self.child.wait_with_output().expect("probe output");
        assert!(
            out.status.success(),
            "{} failed: {}",
            self.what,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut result = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: Value = serde_json::from_str(line).expect("probe JSON line");
            let target = v["target"].as_str().expect("target").to_string();
            let mut answers: Vec<String> = v["answers"]
                .as_array()
                .expect("answers")
                .iter()
                .map(|a| token(a.as_str().expect("answer"), &self.side))
                .collect();
            answers.sort();
            result.insert(target, answers);
        }
        result
    }
}

/// `count` new connections to `target` one after another from namespace `ns` (from address
/// `source` when given), as tokens in the order they were answered: what a scheduler that
/// picks by turn or by the client's address must be judged on (the parallel [`start`] sorts).
pub fn sequence(
    side: &str,
    ns: &str,
    agent: &Path,
    target: &str,
    count: usize,
    source: Option<&str>,
) -> Vec<String> {
    let count = count.to_string();
    let timeout = TIMEOUT_SECS.to_string();
    let mut args = vec![
        "netns",
        "exec",
        ns,
        python(),
        agent.to_str().expect("utf-8 path"),
        "seq",
        &count,
        &timeout,
        target,
    ];
    args.extend(source);
    let out = Command::new("ip")
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("start the sequence probe");
    assert!(
        out.status.success(),
        "sequence probe in {ns} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().expect("one JSON line");
    let v: Value = serde_json::from_str(line).expect("probe JSON line");
    v["answers"]
        .as_array()
        .expect("answers")
        .iter()
        .map(|a| token(a.as_str().expect("answer"), side))
        .collect()
}

/// The name of an address the topology gives, else the address itself.
pub fn who(addr: &str) -> String {
    let addr = addr.strip_prefix("::ffff:").unwrap_or(addr);
    if addr == NODE_POD_SIDE_IP || addr == NODE_POD_SIDE_IP6 {
        return "masq".into();
    }
    if addr == CLIENT_IP || addr == CLIENT_IP6 {
        return "client".into();
    }
    if addr == NODE_IP || addr == NODE_IP6 {
        return "node".into();
    }
    for (name, v4, v6, _) in PODS {
        if addr == v4 || addr == v6 {
            return name.into();
        }
    }
    addr.into()
}

/// "pod1@up 10.244.1.1 8080" → "pod1<-masq"; the port is named only when it is not 8080.
/// An answer from a pod of another side than `side` (the harness sending traffic to the wrong
/// node) becomes "WRONG-SIDE(…)", which no expectation accepts.
pub fn token(answer: &str, side: &str) -> String {
    let parts: Vec<&str> = answer.split_whitespace().collect();
    match parts.as_slice() {
        [tagged, peer, port] => {
            let Some((pod, _)) = tagged.split_once('@').filter(|(_, s)| *s == side) else {
                return format!("WRONG-SIDE({answer})");
            };
            let port = if *port == "8080" {
                String::new()
            } else {
                format!(":{port}")
            };
            format!("{pod}{port}<-{}", who(peer))
        }
        _ => answer.to_string(),
    }
}

/// The distinct tokens of a target's answers.
pub fn distinct(answers: &[String]) -> BTreeSet<String> {
    answers.iter().cloned().collect()
}

/// What a scenario expects from one source to one target.
#[derive(Clone, Debug)]
pub enum Expect {
    /// Exactly these distinct tokens, all of them seen.
    All(Vec<String>),
    /// Every answer the same token, one of these (ClientIP affinity: which endpoint is chosen
    /// first is random).
    OneOf(Vec<String>),
}

impl Expect {
    pub fn check(&self, answers: &[String]) -> Result<(), String> {
        let got = distinct(answers);
        match self {
            Expect::All(want) => {
                let want: BTreeSet<String> = want.iter().cloned().collect();
                if got == want {
                    Ok(())
                } else {
                    Err(format!("expected {want:?}, got {}", summary(answers)))
                }
            }
            Expect::OneOf(options) => {
                if got.len() == 1 && options.iter().any(|o| got.contains(o)) {
                    Ok(())
                } else {
                    Err(format!(
                        "expected every answer to be the same one of {options:?}, got {}",
                        summary(answers)
                    ))
                }
            }
        }
    }

    /// Whether the two sides must show the same distinct tokens (not so for affinity, where
    /// each side picks its endpoint at random).
    pub fn sides_comparable(&self) -> bool {
        matches!(self, Expect::All(_))
    }
}

/// "pod1<-masq ×13, pod2<-masq ×11".
pub fn summary(answers: &[String]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for a in answers {
        *counts.entry(a.as_str()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_tokens() {
        assert_eq!(token("pod1@up 10.244.1.1 8080", "up"), "pod1<-masq");
        assert_eq!(
            token("pod2@rs ::ffff:10.0.0.2 8081", "rs"),
            "pod2:8081<-client"
        );
        assert_eq!(token("pod2@up fd00:10:244:1::2 8080", "up"), "pod2<-pod1");
        assert_eq!(
            token("pod2@rs 10.244.1.2 8080", "up"),
            "WRONG-SIDE(pod2@rs 10.244.1.2 8080)"
        );
        assert_eq!(token("TIMEOUT", "up"), "TIMEOUT");
        assert_eq!(target("tcp", "fd00:10:96::1", 80), "tcp:[fd00:10:96::1]:80");
    }

    #[test]
    fn expectations_fail_on_a_missing_or_extra_answer() {
        let two = vec!["pod1<-masq".to_string(), "pod2<-masq".to_string()];
        let e = Expect::All(two.clone());
        assert!(e.check(&two).is_ok());
        assert!(e.check(&two[..1]).is_err());
        let mut extra = two.clone();
        extra.push("TIMEOUT".into());
        assert!(e.check(&extra).is_err());
        let aff = Expect::OneOf(two.clone());
        assert!(aff.check(&[two[1].clone(), two[1].clone()]).is_ok());
        assert!(aff.check(&two).is_err());
    }
}
