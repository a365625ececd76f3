//! A family's table as data: what a transaction leaves behind, and what `nft -j list table`
//! shows. The same model is built by applying transactions in memory (with the kernel's
//! checks: an object must exist to be flushed or deleted, everything a rule or element
//! names must exist, nothing referenced may be deleted), and by reading the kernel
//! (`json`); the tracer walks either.

use std::collections::{BTreeMap, BTreeSet};

use super::objects::{
    render_op, BaseChain, Key, Object, SetKind, SetSpec, Transaction, Verb, Verdict,
};
use super::rule::{AddrValue, Rule, Stmt};
use crate::kube_proxy::model::IpFamily;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub base: Option<BaseChain>,
    pub comment: Option<String>,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub value: Option<Verdict>,
    pub comment: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub spec: SetSpec,
    pub elements: BTreeMap<Key, Element>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub family: IpFamily,
    pub comment: Option<String>,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
    pub counters: BTreeSet<String>,
}

/// Why the kernel (or this model of it) refuses a transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}: No such file or directory")]
    NotFound(String),
    #[error("{0}: Device or resource busy")]
    Busy(String),
    #[error("{0}: File exists")]
    Exists(String),
}

impl Table {
    pub fn new(family: IpFamily) -> Table {
        Table {
            family,
            comment: None,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            counters: BTreeSet::new(),
        }
    }

    pub fn rules(&self, chain: &str) -> &[Rule] {
        self.chains
            .get(chain)
            .map(|c| c.rules.as_slice())
            .unwrap_or_default()
    }

    pub fn element(&self, set: &str, key: &Key) -> Option<&Element> {
        self.sets.get(set)?.elements.get(key)
    }

    /// Whether any rule or element names `chain` as a jump or goto target.
    fn chain_referenced(&self, chain: &str) -> bool {
        let in_rules = self.chains.values().flat_map(|c| &c.rules).any(|r| {
            r.stmts.iter().any(|s| match s {
                Stmt::Jump(c) | Stmt::Goto(c) => c == chain,
                Stmt::PickVmap { chains, .. } => chains.iter().any(|t| t == chain),
                _ => false,
            })
        });
        in_rules
            || self.sets.values().flat_map(|s| s.elements.values()).any(
                |e| matches!(&e.value, Some(Verdict::Goto(c) | Verdict::Jump(c)) if c == chain),
            )
    }

    fn set_referenced(&self, set: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.rules)
            .any(|r| referenced_sets(r).any(|s| s == set))
    }

    /// Checks that what a rule names exists.
    fn check_rule_refs(&self, rule: &Rule) -> Result<(), ApplyError> {
        for set in referenced_sets(rule) {
            if !self.sets.contains_key(set) {
                return Err(ApplyError::NotFound(format!("set {set}")));
            }
        }
        for stmt in &rule.stmts {
            let targets: Vec<&String> = match stmt {
                Stmt::Jump(c) | Stmt::Goto(c) => vec![c],
                Stmt::PickVmap { chains, .. } => chains.iter().collect(),
                Stmt::NamedCounter(name) if !self.counters.contains(name) => {
                    return Err(ApplyError::NotFound(format!("counter {name}")));
                }
                _ => vec![],
            };
            for target in targets {
                if !self.chains.contains_key(target) {
                    return Err(ApplyError::NotFound(format!("chain {target}")));
                }
            }
        }
        Ok(())
    }

    /// Renders the table as sorted `add` commands (sets and maps with their elements, chains
    /// with their rules in order): a stable text for tests and diffs.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let family = self.family;
        let mut line = |object: Object| {
            render_op(family, Verb::Add, &object, &mut out);
            out.push('\n');
        };
        line(Object::Table {
            comment: self.comment.clone(),
        });
        for (name, chain) in &self.chains {
            line(Object::Chain {
                name: name.clone(),
                base: chain.base,
                comment: chain.comment.clone(),
            });
        }
        for (name, set) in &self.sets {
            line(Object::Set {
                name: name.clone(),
                spec: set.spec.clone(),
            });
        }
        for name in &self.counters {
            line(Object::Counter { name: name.clone() });
        }
        for (name, chain) in &self.chains {
            for rule in &chain.rules {
                line(Object::Rule {
                    chain: name.clone(),
                    rule: rule.clone(),
                });
            }
        }
        for (name, set) in &self.sets {
            for (key, element) in &set.elements {
                line(Object::Element {
                    set: name.clone(),
                    key: key.clone(),
                    value: element.value.clone(),
                    comment: element.comment.clone(),
                });
            }
        }
        out
    }
}

/// The named sets and maps a rule reads or writes.
pub fn referenced_sets(rule: &Rule) -> impl Iterator<Item = &str> {
    rule.stmts.iter().filter_map(|s| match s {
        Stmt::Addr {
            value: AddrValue::Named(set),
            ..
        }
        | Stmt::HairpinLookup(set)
        | Stmt::UpdateSaddr(set)
        | Stmt::Vmap { map: set, .. } => Some(set.as_str()),
        _ => None,
    })
}

/// Applies a transaction to a family's table (`None`: there is none) as the kernel would:
/// all of it, or nothing and the first error.
pub fn apply(state: &mut Option<Table>, tx: &Transaction) -> Result<(), ApplyError> {
    let mut next = state.clone();
    for (verb, object) in &tx.ops {
        apply_op(&mut next, tx.family, *verb, object)?;
    }
    *state = next;
    Ok(())
}

fn table_mut(state: &mut Option<Table>) -> Result<&mut Table, ApplyError> {
    state
        .as_mut()
        .ok_or_else(|| ApplyError::NotFound("table kube-proxy".into()))
}

fn apply_op(
    state: &mut Option<Table>,
    family: IpFamily,
    verb: Verb,
    object: &Object,
) -> Result<(), ApplyError> {
    match (verb, object) {
        (Verb::Add, Object::Table { comment }) => {
            let table = state.get_or_insert_with(|| Table::new(family));
            if comment.is_some() {
                table.comment.clone_from(comment);
            }
        }
        (Verb::Flush, Object::Table { .. }) => {
            let table = table_mut(state)?;
            table.chains.values_mut().for_each(|c| c.rules.clear());
            table.sets.values_mut().for_each(|s| s.elements.clear());
        }
        (Verb::Delete, Object::Table { .. }) => {
            if state.take().is_none() {
                return Err(ApplyError::NotFound("table kube-proxy".into()));
            }
        }
        (
            Verb::Add,
            Object::Chain {
                name,
                base,
                comment,
            },
        ) => {
            let table = table_mut(state)?;
            let chain = table.chains.entry(name.clone()).or_insert_with(|| Chain {
                base: *base,
                comment: comment.clone(),
                rules: Vec::new(),
            });
            if base.is_some() && chain.base != *base {
                return Err(ApplyError::Exists(format!("chain {name}")));
            }
            if comment.is_some() {
                chain.comment.clone_from(comment);
            }
        }
        (Verb::Flush, Object::Chain { name, .. }) => {
            let table = table_mut(state)?;
            table
                .chains
                .get_mut(name)
                .ok_or_else(|| ApplyError::NotFound(format!("chain {name}")))?
                .rules
                .clear();
        }
        (Verb::Delete, Object::Chain { name, .. }) => {
            let table = table_mut(state)?;
            if !table.chains.contains_key(name) {
                return Err(ApplyError::NotFound(format!("chain {name}")));
            }
            // The kernel deletes a chain with its rules, but not while anything jumps to it.
            table.chains.remove(name);
            if table.chain_referenced(name) {
                return Err(ApplyError::Busy(format!("chain {name}")));
            }
        }
        (Verb::Add, Object::Set { name, spec }) => {
            let table = table_mut(state)?;
            match table.sets.get(name) {
                Some(existing) if existing.spec.kind != spec.kind => {
                    return Err(ApplyError::Exists(format!("set {name}")));
                }
                // The kernel takes a new timeout for an existing set.
                Some(_) if spec.timeout_secs.is_some() => {
                    if let Some(existing) = table.sets.get_mut(name) {
                        existing.spec.timeout_secs = spec.timeout_secs;
                    }
                }
                Some(_) => {}
                None => {
                    table.sets.insert(
                        name.clone(),
                        Set {
                            spec: spec.clone(),
                            elements: BTreeMap::new(),
                        },
                    );
                }
            }
        }
        (Verb::Flush, Object::Set { name, .. }) => {
            let table = table_mut(state)?;
            table
                .sets
                .get_mut(name)
                .ok_or_else(|| ApplyError::NotFound(format!("set {name}")))?
                .elements
                .clear();
        }
        (Verb::Delete, Object::Set { name, .. }) => {
            let table = table_mut(state)?;
            if !table.sets.contains_key(name) {
                return Err(ApplyError::NotFound(format!("set {name}")));
            }
            if table.set_referenced(name) {
                return Err(ApplyError::Busy(format!("set {name}")));
            }
            table.sets.remove(name);
        }
        (Verb::Add, Object::Rule { chain, rule }) => {
            let table = table_mut(state)?;
            table.check_rule_refs(rule)?;
            table
                .chains
                .get_mut(chain)
                .ok_or_else(|| ApplyError::NotFound(format!("chain {chain}")))?
                .rules
                .push(rule.clone());
        }
        (
            Verb::Add,
            Object::Element {
                set,
                key,
                value,
                comment,
            },
        ) => {
            let table = table_mut(state)?;
            if let Some(Verdict::Goto(chain) | Verdict::Jump(chain)) = value {
                if !table.chains.contains_key(chain) {
                    return Err(ApplyError::NotFound(format!("chain {chain}")));
                }
            }
            let target = table
                .sets
                .get_mut(set)
                .ok_or_else(|| ApplyError::NotFound(format!("set {set}")))?;
            match target.elements.get(key) {
                Some(existing) if existing.value != *value => {
                    return Err(ApplyError::Exists(format!("element {key} in {set}")));
                }
                Some(_) => {}
                None => {
                    target.elements.insert(
                        key.clone(),
                        Element {
                            value: value.clone(),
                            comment: comment.clone(),
                        },
                    );
                }
            }
        }
        (Verb::Delete, Object::Element { set, key, .. }) => {
            let table = table_mut(state)?;
            let target = table
                .sets
                .get_mut(set)
                .ok_or_else(|| ApplyError::NotFound(format!("set {set}")))?;
            if target.elements.remove(key).is_none() {
                return Err(ApplyError::NotFound(format!("element {key} in {set}")));
            }
        }
        (Verb::Add, Object::Counter { name }) => {
            table_mut(state)?.counters.insert(name.clone());
        }
        (Verb::Delete, Object::Counter { name }) => {
            let table = table_mut(state)?;
            let used = table
                .chains
                .values()
                .flat_map(|c| &c.rules)
                .any(|r| r.stmts.contains(&Stmt::NamedCounter(name.clone())));
            if used {
                return Err(ApplyError::Busy(format!("counter {name}")));
            }
            if !table.counters.remove(name) {
                return Err(ApplyError::NotFound(format!("counter {name}")));
            }
        }
        (verb, object) => {
            let mut text = String::new();
            render_op(family, verb, object, &mut text);
            return Err(ApplyError::NotFound(format!(
                "unsupported operation {text}"
            )));
        }
    }
    Ok(())
}

/// The kind a named set or map has in a table, for the operations that name one.
pub fn set_kind(table: &Table, name: &str) -> Option<SetKind> {
    table.sets.get(name).map(|s| s.spec.kind)
}

#[cfg(test)]
mod tests;
