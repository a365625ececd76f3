//! In iptables and ipvs modes, upstream accepts the traffic it forwards in the iptables filter
//! table's FORWARD chain (its KUBE-FORWARD chain), so Services and NodePorts keep working on a
//! node whose FORWARD policy is DROP (as Docker sets it). Our rules are nftables rules, whose
//! accept cannot override a drop in iptables' own chain, so in those modes we add the same
//! chain to the iptables filter table (of each family, through iptables-restore, whichever
//! backend the node's iptables uses): accept what our rules marked for masquerade, and the
//! rest of connections already accepted; drop conntrack-INVALID packets unless
//! nf_conntrack_tcp_be_liberal is set, as upstream does.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const CHAIN: &str = "KUBE-FORWARD";
const JUMP_COMMENT: &str = "kubernetes forwarding rules";

/// The `iptables-restore --noflush` input for the chain (written whole each time).
pub fn restore_input(mark: u32, tcp_be_liberal: bool) -> String {
    let mut out = format!("*filter\n:{CHAIN} - [0:0]\n");
    if !tcp_be_liberal {
        out.push_str(&format!(
            "-A {CHAIN} -m conntrack --ctstate INVALID -j DROP\n"
        ));
    }
    out.push_str(&format!(
        "-A {CHAIN} -m comment --comment \"{JUMP_COMMENT}\" -m mark --mark {mark:#x}/{mark:#x} -j ACCEPT\n"
    ));
    out.push_str(&format!(
        "-A {CHAIN} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
    ));
    out.push_str("COMMIT\n");
    out
}

async fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
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

/// Ensures the chain and the jump to it at the top of FORWARD, in each family whose iptables
/// is installed. Returns whether all went well (a node without iptables: nothing to do).
pub async fn ensure(mark: u32, tcp_be_liberal: bool) -> bool {
    let mut ok = true;
    for (iptables, restore) in [
        ("iptables", "iptables-restore"),
        ("ip6tables", "ip6tables-restore"),
    ] {
        if run(iptables, &["-w", "-L", "-n", "-t", "filter"], None)
            .await
            .is_err()
        {
            continue;
        }
        if let Err(e) = run(
            restore,
            &["-w", "--noflush"],
            Some(&restore_input(mark, tcp_be_liberal)),
        )
        .await
        {
            tracing::error!(error = %e, "Failed to write the {CHAIN} chain");
            ok = false;
            continue;
        }
        let jump = [
            "FORWARD",
            "-m",
            "comment",
            "--comment",
            JUMP_COMMENT,
            "-j",
            CHAIN,
        ];
        let mut check = vec!["-w", "-t", "filter", "-C"];
        check.extend(jump);
        if run(iptables, &check, None).await.is_ok() {
            continue;
        }
        let mut insert = vec!["-w", "-t", "filter", "-I"];
        insert.extend(jump);
        if let Err(e) = run(iptables, &insert, None).await {
            tracing::error!(error = %e, "Failed to jump to the {CHAIN} chain from FORWARD");
            ok = false;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_upstreams() {
        let input = restore_input(1 << 14, false);
        assert_eq!(
            input,
            "*filter\n:KUBE-FORWARD - [0:0]\n\
             -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
             -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
             -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
             COMMIT\n"
        );
        assert!(!restore_input(1 << 14, true).contains("INVALID"));
    }
}
