//! One large transaction cut into consecutive ones that, applied in order, leave the table
//! the single one would.
//!
//! The kernel binds each anonymous set (a rule's inline map or set: every Service port's
//! `numgen ... vmap { ... }`) by walking the whole list of the transaction's changes, so
//! one transaction costs in proportion to its anonymous sets times its length: the square
//! of its size. At 10,000 Services x 10 endpoints one transaction keeps the kernel busy
//! for 17 s; in stages of a few hundred anonymous sets, 12 s.
//!
//! Packets meet the stages in between, so this is only for a table nothing relies on yet
//! (the first sync on a node with no table): the last stage is the one that makes it whole.
//! Because the table is new, every set name in it is known, and the stages name their
//! anonymous sets themselves (`Transaction::anonymous_names_from`): the kernel otherwise
//! scans every set of the table to pick a free number for each, another cost that grows
//! with the square of the table (at 10,000 x 10, 12 s of kernel time in stages without it,
//! 7 s with it).

use super::objects::{Object, Transaction};

/// Anonymous sets per stage: large enough that the commits' own cost stays small, small
/// enough that the walk does not dominate (at 10,000 x 10, stages of 250, 500 and 1,000
/// took 7.3, 7.2 and 7.5 s: tests/kube_proxy_netlink.rs, `scale_probe`).
pub const ANONYMOUS_SETS_PER_STAGE: usize = 500;

/// `tx`, which creates its table, in consecutive transactions of at most `per_stage`
/// anonymous sets each (a rule with more than that is a stage of its own; one transaction
/// when it has no more than that), each naming its anonymous sets after the previous ones'.
pub fn stages(tx: Transaction, per_stage: usize) -> Vec<Transaction> {
    let per_stage = per_stage.max(1);
    let family = tx.family;
    let stage_from = |named: u32| Transaction {
        anonymous_names_from: Some(named),
        ..Transaction::new(family)
    };
    let mut out = Vec::new();
    let mut named = 0u32;
    let mut stage = stage_from(named);
    let mut anonymous = 0;
    for (verb, object) in tx.ops {
        let here = match &object {
            Object::Rule { rule, .. } => rule.anonymous_sets(),
            _ => 0,
        };
        if anonymous > 0 && anonymous + here > per_stage {
            named = named.saturating_add(u32::try_from(anonymous).unwrap_or(u32::MAX));
            out.push(std::mem::replace(&mut stage, stage_from(named)));
            anonymous = 0;
        }
        anonymous += here;
        stage.ops.push((verb, object));
    }
    if !stage.is_empty() || out.is_empty() {
        out.push(stage);
    }
    out
}

#[cfg(test)]
mod tests;
