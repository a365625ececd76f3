//! Leftovers of the proxy modes not in use, removed as upstream removes them: at start in
//! nftables mode the iptables and IPVS ones (so a node switched from upstream's iptables mode
//! carries no stale KUBE-* rules), and with `--cleanup` everything, our tables included.
//! Best effort, as upstream: each failure is logged and the rest goes on.
//!
//! Only the chains upstream's kube-proxy owns are touched: kubelet's KUBE-FIREWALL,
//! KUBE-KUBELET-CANARY and anyone else's chains stay.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::model::IpFamily;
use super::nft::exec::Applier;
use super::nft::objects::TABLE;

/// Chains upstream's iptables mode owns, by table.
const NAT_CHAINS: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-PROXY-CANARY",
];
const FILTER_CHAINS: [&str; 6] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
];
/// Per-Service chains of iptables mode (and of ipvs mode's helper chains).
const SERVICE_CHAIN_PREFIXES: [&str; 6] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
    "KUBE-XLB-",
];
/// ipvs mode's own chains.
const IPVS_CHAINS: [&str; 6] = [
    "KUBE-LOAD-BALANCER",
    "KUBE-NODE-PORT",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-FIREWALL-IPVS",
];

fn owned(table: &str, chain: &str) -> bool {
    let fixed: &[&str] = match table {
        "nat" => &NAT_CHAINS,
        "filter" => &FILTER_CHAINS,
        "mangle" => &["KUBE-PROXY-CANARY"],
        _ => &[],
    };
    fixed.contains(&chain)
        || IPVS_CHAINS.contains(&chain)
        || (table == "nat" && SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p)))
}

/// The `iptables-restore --noflush` input that removes what upstream's proxy left in one
/// table of an `iptables-save` dump: the jumps to its chains from other chains, then its
/// chains (flushed, then deleted). `None` when there is nothing.
pub fn iptables_cleanup(table: &str, save: &str) -> Option<String> {
    let chains: Vec<&str> = save
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| owned(table, c))
        .collect();
    if chains.is_empty() {
        return None;
    }
    let mut out = format!("*{table}\n");
    for line in save.lines() {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let mut words = rule.split_whitespace();
        let Some(from) = words.next() else { continue };
        if owned(table, from) {
            continue;
        }
        let target = rule
            .split_whitespace()
            .skip_while(|w| *w != "-j" && *w != "-g")
            .nth(1);
        if target.is_some_and(|t| chains.contains(&t)) {
            out.push_str(&format!("-D {rule}\n"));
        }
    }
    for chain in &chains {
        out.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for chain in &chains {
        out.push_str(&format!("-X {chain}\n"));
    }
    out.push_str("COMMIT\n");
    Some(out)
}

async fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn restore(program: &str, input: &str) -> Result<(), String> {
    let mut child = Command::new(program)
        .args(["--noflush", "--counters"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Removes upstream's iptables leftovers in both families. Returns whether all went well.
pub async fn iptables_leftovers() -> bool {
    let mut ok = true;
    for (save, restore_cmd) in [
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ] {
        for table in ["nat", "filter", "mangle"] {
            let Some(dump) = output(save, &["-t", table]).await else {
                continue;
            };
            let Some(input) = iptables_cleanup(table, &dump) else {
                continue;
            };
            if let Err(e) = restore(restore_cmd, &input).await {
                tracing::error!(error = %e, table, "Failed to execute iptables-restore");
                ok = false;
            }
        }
    }
    ok
}

/// Removes ipvs mode's leftovers: the virtual servers outside `exclude`, and its dummy
/// interface. Nothing when the kernel has no IPVS.
pub async fn ipvs_leftovers(exclude: &[ipnet::IpNet]) -> bool {
    if !std::path::Path::new("/proc/net/ip_vs").exists() {
        return true;
    }
    let mut ok = true;
    if let Some(list) = output("ipvsadm", &["-Sn"]).await {
        for line in list.lines() {
            // "-A -t 10.96.0.1:443 -s rr"
            let words: Vec<&str> = line.split_whitespace().collect();
            let (Some(kind), Some(addr)) = (words.get(1), words.get(2)) else {
                continue;
            };
            if words.first() != Some(&"-A") {
                continue;
            }
            let ip = addr
                .rsplit_once(':')
                .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
                .and_then(|h| h.parse::<std::net::IpAddr>().ok());
            if ip.is_some_and(|ip| exclude.iter().any(|c| c.contains(&ip))) {
                continue;
            }
            if output("ipvsadm", &["-D", kind, addr]).await.is_none() {
                ok = false;
            }
        }
    }
    let _ = output("ip", &["link", "del", "kube-ipvs0"]).await;
    ok
}

/// Deletes our table of each family (gone already: fine).
pub async fn nftables_tables(nft: &Applier) -> bool {
    let mut ok = true;
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut tx = super::nft::objects::Transaction::new(family);
        tx.add(super::nft::objects::Object::Table { comment: None });
        tx.delete(super::nft::objects::Object::Table { comment: None });
        if let Err(e) = nft.run(&tx).await {
            tracing::error!(error = %e, family = family.nft(), table = TABLE, "Failed to delete the nftables table");
            ok = false;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-ABC - [0:0]
:KUBE-SEP-DEF - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-ABC
-A KUBE-SVC-ABC -j KUBE-SEP-DEF
COMMIT
";

    #[test]
    fn only_upstreams_chains_and_the_jumps_to_them_go() {
        let input = iptables_cleanup("nat", SAVE).expect("something to remove");
        assert!(input.starts_with("*nat\n"));
        assert!(input.contains(
            "-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(input.contains("-D POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n"));
        assert!(
            !input.contains("MASQUERADE"),
            "another rule of POSTROUTING stays"
        );
        assert!(
            !input.contains("-D KUBE-SERVICES"),
            "rules inside our chains go with them"
        );
        for chain in [
            "KUBE-SERVICES",
            "KUBE-POSTROUTING",
            "KUBE-SVC-ABC",
            "KUBE-SEP-DEF",
        ] {
            assert!(input.contains(&format!("-X {chain}\n")), "{chain}");
        }
        assert!(
            !input.contains("KUBE-KUBELET-CANARY"),
            "kubelet's chain stays"
        );
        assert!(input.ends_with("COMMIT\n"));
        assert_eq!(
            iptables_cleanup("filter", "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"),
            None
        );
    }
}
