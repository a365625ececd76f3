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

use super::objects::{Object, Transaction, Verb};
use crate::kube_proxy::model::IpFamily;

/// Anonymous sets per stage: large enough that the commits' own cost stays small, small
/// enough that the walk does not dominate (at 10,000 x 10, stages of 250, 500 and 1,000
/// took 7.3, 7.2 and 7.5 s: tests/kube_proxy_netlink.rs, `scale_probe`).
pub const ANONYMOUS_SETS_PER_STAGE: usize = 500;

/// `tx`, which creates its table, as consecutive transactions of at most `per_stage`
/// anonymous sets each (a rule with more than that is a stage of its own; one transaction
/// when it has no more than that), each naming its anonymous sets after the previous ones'.
///
/// The stages are cut as they are asked for, moving the operations out of `tx`: a stage
/// applied and dropped gives its memory back before the next one is built, so the whole
/// transaction is never held twice.
pub fn stages(tx: Transaction, per_stage: usize) -> Stages {
    Stages {
        family: tx.family,
        ops: tx.ops.into_iter().peekable(),
        per_stage: per_stage.max(1),
        named: 0,
        started: false,
    }
}

/// The stages of one transaction, in the order they go in (`stages`).
pub struct Stages {
    family: IpFamily,
    ops: std::iter::Peekable<std::vec::IntoIter<(Verb, Object)>>,
    per_stage: usize,
    /// Anonymous sets named by the stages so far.
    named: u32,
    started: bool,
}

impl Iterator for Stages {
    type Item = Transaction;

    fn next(&mut self) -> Option<Transaction> {
        // An empty transaction is one empty stage.
        if self.started && self.ops.peek().is_none() {
            return None;
        }
        self.started = true;
        let mut stage = Transaction {
            anonymous_names_from: Some(self.named),
            ..Transaction::new(self.family)
        };
        let mut anonymous = 0;
        while let Some((_, object)) = self.ops.peek() {
            let here = match object {
                Object::Rule { rule, .. } => rule.anonymous_sets(),
                _ => 0,
            };
            if anonymous > 0 && anonymous + here > self.per_stage {
                break;
            }
            anonymous += here;
            stage.ops.extend(self.ops.next());
        }
        self.named = self
            .named
            .saturating_add(u32::try_from(anonymous).unwrap_or(u32::MAX));
        Some(stage)
    }
}

#[cfg(test)]
mod tests;
