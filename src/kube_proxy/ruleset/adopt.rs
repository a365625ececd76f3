//! Adopting the table a previous run left, instead of replacing it.
//!
//! The first sync of a process is a full one, which replaces the table in one transaction:
//! at 10,000 Services that is ~17 s of the kernel's time, nearly all of it for the anonymous
//! maps (their cost grows with the square of their number in one transaction). After a
//! restart the table is normally already right. So the table read back from the kernel
//! (`actual`) is compared with the one the full sync would leave (`expected`: its
//! transaction applied to no table, in the model), and the difference is sent instead,
//! without deleting the table:
//!
//! - a chain missing is added with its rules; a chain whose rules differ is flushed and
//!   written again; a chain not wanted is flushed now, and deleted by a later transaction
//!   (`KernelView`'s stale chains, as a partial sync does);
//! - sets missing are added; sets not wanted are deleted (after the flushes);
//! - elements missing are added, elements not wanted are deleted, and an element whose
//!   value or comment differs is deleted and added again, as a partial sync does. The
//!   elements of dynamic sets (ClientIP affinity, which the kernel fills) are neither
//!   compared nor touched: affinity survives the restart.
//!
//! What only replacing the table can change gives up (the plan stays the full sync): the
//! table's comment, a base chain's type, hook or priority, a set's or map's declaration
//! (type, flags, timeout, comment), anything the reader could not express in the model,
//! and counters no proxy writes. The repair is applied to the model of the kernel's table
//! first; a repair that does not lead to `expected` there gives up too.
//!
//! Pure: no I/O. The plan returned commits the full sync's view (`Plan::reached_by`), so the
//! syncs after it are partial ones, as after a full sync.

use std::collections::BTreeSet;

use super::sync::Plan;
use crate::kube_proxy::nft::netlink::canon;
use crate::kube_proxy::nft::objects::{Key, Object, Transaction, Verdict};
use crate::kube_proxy::nft::rule::{Rule, Stmt};
use crate::kube_proxy::nft::table::{apply, Chain, Set, Table};

/// What was decided about the kernel's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// The kernel holds the table the full sync would write: nothing to send.
    Adopted { chains: usize },
    /// A transaction of `operations` makes the kernel's table the one the full sync would
    /// write.
    Repaired { operations: usize },
    /// The table is replaced, as a full sync does, for this reason.
    Replaced { reason: String },
}

/// Decides about the kernel's table `actual` (and what of it the reader could not express,
/// `unsupported`) given the full sync `full`; returns the plan to run.
pub fn adopt(full: Plan, actual: &Table, unsupported: &[String]) -> (Plan, Adoption) {
    let mut expected = None;
    if let Err(e) = apply(&mut expected, &full.tx) {
        let reason = format!("the full sync does not apply to an empty table: {e}");
        return (full, Adoption::Replaced { reason });
    }
    let Some(expected) = expected else {
        let reason = "the full sync leaves no table".to_owned();
        return (full, Adoption::Replaced { reason });
    };
    match repair(actual, unsupported, &expected) {
        Ok(repair) if repair.tx.is_empty() && repair.stale.is_empty() => {
            let chains = actual.chains.len();
            let tx = Transaction::new(full.tx.family);
            (
                full.reached_by(tx, Vec::new()),
                Adoption::Adopted { chains },
            )
        }
        Ok(repair) => {
            let operations = repair.tx.len();
            (
                full.reached_by(repair.tx, repair.stale),
                Adoption::Repaired { operations },
            )
        }
        Err(reason) => (full, Adoption::Replaced { reason }),
    }
}

/// A transaction that turns one table into another, and the chains it flushed that are to
/// be deleted later.
#[derive(Clone, Debug)]
pub struct Repair {
    pub tx: Transaction,
    pub stale: Vec<String>,
}

/// Whether a set's elements are the kernel's to fill (ClientIP affinity).
fn dynamic(set: &Set) -> bool {
    set.spec.flags.iter().any(|f| f == "dynamic")
}

/// Whether a rule read back from the kernel is the rule wanted.
fn same_rule(actual: &Rule, wanted: &Rule) -> bool {
    let has_addresses = wanted.stmts.iter().any(|s| matches!(s, Stmt::Addr { .. }));
    if has_addresses {
        *actual == canon::rule(wanted)
    } else {
        actual == wanted
    }
}

fn same_rules(actual: &[Rule], wanted: &[Rule]) -> bool {
    actual.len() == wanted.len() && actual.iter().zip(wanted).all(|(a, w)| same_rule(a, w))
}

fn listed(items: &[String]) -> String {
    let mut text = items.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > 3 {
        text.push_str(&format!("; and {} more", items.len() - 3));
    }
    text
}

/// The transaction that makes `actual` into `expected` without deleting the table, or why
/// there is none.
pub fn repair(actual: &Table, unsupported: &[String], expected: &Table) -> Result<Repair, String> {
    if !unsupported.is_empty() {
        return Err(format!(
            "the table holds what the proxy never writes: {}",
            listed(unsupported)
        ));
    }
    if actual.family != expected.family {
        return Err("the table is of another family".into());
    }
    if actual.comment != expected.comment {
        return Err(format!("the table's comment is {:?}", actual.comment));
    }
    if let Some(extra) = actual.counters.difference(&expected.counters).next() {
        return Err(format!("counter {extra} is not the proxy's"));
    }
    let family = expected.family;
    let mut tx = Transaction::new(family);

    // Declarations: what exists must be declared as wanted.
    for (name, want) in &expected.sets {
        match actual.sets.get(name) {
            Some(have) if have.spec != want.spec => {
                return Err(format!("set {name} is declared differently"));
            }
            Some(_) => {}
            None => tx.add(Object::Set {
                name: name.clone(),
                spec: want.spec.clone(),
            }),
        }
    }
    for name in expected.counters.difference(&actual.counters) {
        tx.add(Object::Counter { name: name.clone() });
    }
    for (name, want) in &expected.chains {
        match actual.chains.get(name) {
            Some(have) if have.base != want.base => {
                return Err(format!("base chain {name} is hooked differently"));
            }
            Some(have) if have.comment != want.comment => {
                return Err(format!("chain {name}'s comment is {:?}", have.comment));
            }
            Some(_) => {}
            None => tx.add(Object::Chain {
                name: name.clone(),
                base: want.base,
                comment: want.comment.clone(),
            }),
        }
    }
    let mut stale = Vec::new();
    for (name, have) in &actual.chains {
        if expected.chains.contains_key(name) {
            continue;
        }
        if have.base.is_some() {
            return Err(format!("base chain {name} is not the proxy's"));
        }
        stale.push(name.clone());
    }

    // Rules: a chain is written again whole when any of its rules differs.
    let empty = Chain::default();
    let mut rewrite = Vec::new();
    for (name, want) in &expected.chains {
        let have = actual.chains.get(name);
        if !same_rules(&have.unwrap_or(&empty).rules, &want.rules) {
            if have.is_some_and(|c| !c.rules.is_empty()) {
                tx.flush(Object::chain(name.clone()));
            }
            rewrite.push((name, &want.rules));
        }
    }
    for name in &stale {
        if actual.chains.get(name).is_some_and(|c| !c.rules.is_empty()) {
            tx.flush(Object::chain(name.clone()));
        }
    }
    for (name, rules) in rewrite {
        for rule in rules {
            tx.add_rule(name, rule.clone());
        }
    }

    // Elements: adds (and delete + add for a changed one) first, leftovers last.
    let mut deletes = Vec::new();
    for (name, want) in &expected.sets {
        if dynamic(want) {
            continue;
        }
        let have = actual.sets.get(name);
        for (key, element) in &want.elements {
            let held = have.and_then(|s| s.elements.get(key));
            if held == Some(element) {
                continue;
            }
            if held.is_some() {
                tx.delete(element_object(name, key, None, None));
            }
            tx.add(element_object(
                name,
                key,
                element.value.clone(),
                element.comment.clone(),
            ));
        }
        for key in have.into_iter().flat_map(|s| s.elements.keys()) {
            if !want.elements.contains_key(key) {
                deletes.push(element_object(name, key, None, None));
            }
        }
    }
    for delete in deletes {
        tx.delete(delete);
    }
    for (name, have) in &actual.sets {
        if !expected.sets.contains_key(name) {
            tx.delete(Object::set_named(have.spec.kind, name.clone()));
        }
    }

    check(actual, &tx, &stale, expected)?;
    Ok(Repair { tx, stale })
}

fn element_object(set: &str, key: &Key, value: Option<Verdict>, comment: Option<String>) -> Object {
    Object::Element {
        set: set.to_owned(),
        key: key.clone(),
        value,
        comment,
    }
}

/// The repair applied to the model of the kernel's table must be taken, and leave `expected`
/// but for the stale chains (empty, deleted later) and the dynamic sets' elements (kept).
fn check(
    actual: &Table,
    tx: &Transaction,
    stale: &[String],
    expected: &Table,
) -> Result<(), String> {
    if tx.is_empty() {
        return if stale.is_empty() {
            Ok(())
        } else {
            // Only empty chains to delete: nothing to check but that they are empty.
            let all_empty = stale
                .iter()
                .all(|c| actual.chains.get(c).is_some_and(|c| c.rules.is_empty()));
            all_empty
                .then_some(())
                .ok_or_else(|| "stale chains with rules".to_owned())
        };
    }
    let mut state = Some(actual.clone());
    apply(&mut state, tx).map_err(|e| format!("the repair would be refused ({e})"))?;
    let Some(mut result) = state else {
        return Err("the repair deletes the table".into());
    };
    for name in stale {
        match result.chains.remove(name) {
            Some(chain) if chain.rules.is_empty() => {}
            _ => return Err(format!("stale chain {name} is not left empty")),
        }
    }
    let differs = |what: &str| Err(format!("the repair leaves {what} unlike the full sync's"));
    let names = |t: &Table| t.chains.keys().cloned().collect::<BTreeSet<_>>();
    if names(&result) != names(expected) {
        return differs("the chains");
    }
    for (name, want) in &expected.chains {
        let have = &result.chains[name];
        if have.base != want.base || have.comment != want.comment {
            return differs(&format!("chain {name}"));
        }
        if !same_rules(&have.rules, &want.rules) {
            return differs(&format!("the rules of {name}"));
        }
    }
    if result.sets.len() != expected.sets.len() {
        return differs("the sets");
    }
    for (name, want) in &expected.sets {
        let Some(have) = result.sets.get(name) else {
            return differs(&format!("set {name}"));
        };
        if have.spec != want.spec || (!dynamic(want) && have.elements != want.elements) {
            return differs(&format!("set {name}"));
        }
    }
    if result.counters != expected.counters || result.comment != expected.comment {
        return differs("the table");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
