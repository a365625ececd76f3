//! A transaction as one nfnetlink batch: `NFNL_MSG_BATCH_BEGIN`, the messages of each
//! operation in order, `NFNL_MSG_BATCH_END`. An operation is one message, as nft sends one
//! per command, except a rule with `{ ... }` in it, which is preceded by each anonymous
//! set's declaration and elements, as nft sends them. Every message's sequence number is
//! recorded with the operation it came from, so the kernel's answer to any message names
//! the operation.

use std::collections::HashMap;

use super::attr::{comment_udata, Writer};
use super::consts::*;
use super::element::Element;
use super::lower::{self, SetIds};
use super::sets::{self, key_bytes, verdict_value, FamilyInfo};
use super::Unsupported;
use crate::kube_proxy::nft::objects::{ChainType, Hook, Object, Transaction, Verb, TABLE};

use netlink_packet_core::{NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST};

/// A batch ready to send, and which operation each of its messages came from.
#[derive(Debug)]
pub struct Batch {
    bytes: Vec<u8>,
    /// The sequence number of the begin message; message `first + 1 + i` came from the
    /// operation `origins[i]`, and the end message is `first + 1 + origins.len()`.
    first: u32,
    origins: Vec<u32>,
}

impl Batch {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn begin_sequence(&self) -> u32 {
        self.first
    }

    /// The messages between begin and end.
    pub fn messages(&self) -> usize {
        self.origins.len()
    }

    /// The sequence numbers of the messages between begin and end.
    pub fn sequences(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.origins.len()).map(move |i| self.first.wrapping_add(1 + i as u32))
    }

    /// The operation (index into the transaction's operations) a message came from.
    pub fn origin(&self, sequence: u32) -> Option<usize> {
        let i = sequence.wrapping_sub(self.first).checked_sub(1)?;
        self.origins.get(i as usize).map(|op| *op as usize)
    }
}

/// How a batch is written.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Ask the kernel to acknowledge every message (nft itself only hears of failures).
    pub ack: bool,
    /// The begin message's sequence number; the others follow it.
    pub first_sequence: u32,
}

/// Why an operation cannot be written, and which one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeFailure {
    pub index: usize,
    pub reason: Unsupported,
}

/// nft numbers every set a batch declares; lookups and elements name their set by that
/// number too. A named set's number is the one its latest `add` got.
#[derive(Default)]
struct Ids {
    next: u32,
    named: HashMap<String, u32>,
}

impl Ids {
    fn declare(&mut self, name: &str) -> u32 {
        let id = self.fresh();
        self.named.insert(name.to_owned(), id);
        id
    }
}

impl SetIds for Ids {
    fn named(&mut self, name: &str) -> u32 {
        if let Some(id) = self.named.get(name) {
            return *id;
        }
        self.declare(name)
    }

    fn fresh(&mut self) -> u32 {
        self.next += 1;
        self.next
    }
}

struct Encoder {
    w: Writer,
    family: FamilyInfo,
    ack: u16,
    sequence: u32,
    origins: Vec<u32>,
    ids: Ids,
    op: u32,
    /// The next anonymous set's number, where this batch names them (see
    /// `Transaction::anonymous_names_from`).
    anonymous_name: Option<u32>,
}

impl Encoder {
    fn begin(&mut self, kind: u16, flags: u16) -> super::attr::Message {
        self.sequence = self.sequence.wrapping_add(1);
        self.origins.push(self.op);
        self.w.begin(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | flags | self.ack,
            self.sequence,
            self.family.nfproto,
            0,
        )
    }

    fn operation(&mut self, verb: Verb, object: &Object) -> Result<(), Unsupported> {
        match (verb, object) {
            (Verb::Add, Object::Table { comment }) => {
                let m = self.begin(NFT_MSG_NEWTABLE, 0);
                self.w.put_strz(NFTA_TABLE_NAME, TABLE);
                self.w.put_be32(NFTA_TABLE_FLAGS, 0);
                if let Some(comment) = comment {
                    sets::check_comment(comment)?;
                    self.w
                        .put(NFTA_TABLE_USERDATA, comment_udata(comment).bytes());
                }
                self.w.end(m);
            }
            // `flush table`: every rule of the table.
            (Verb::Flush, Object::Table { .. }) => {
                let m = self.begin(NFT_MSG_DELRULE, 0);
                self.w.put_strz(NFTA_RULE_TABLE, TABLE);
                self.w.end(m);
            }
            (Verb::Delete, Object::Table { .. }) => {
                let m = self.begin(NFT_MSG_DELTABLE, 0);
                self.w.put_strz(NFTA_TABLE_NAME, TABLE);
                self.w.end(m);
            }
            (
                Verb::Add,
                Object::Chain {
                    name,
                    base,
                    comment,
                },
            ) => {
                let m = self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE);
                self.w.put_strz(NFTA_CHAIN_TABLE, TABLE);
                self.w.put_strz(NFTA_CHAIN_NAME, name);
                if let Some(base) = base {
                    self.w.put_strz(
                        NFTA_CHAIN_TYPE,
                        match base.kind {
                            ChainType::Filter => "filter",
                            ChainType::Nat => "nat",
                        },
                    );
                    let hook = self.w.nest(NFTA_CHAIN_HOOK);
                    self.w.put_be32(NFTA_HOOK_HOOKNUM, hook_number(base.hook));
                    self.w.put(NFTA_HOOK_PRIORITY, &base.priority.to_be_bytes());
                    self.w.end_nest(hook);
                }
                if let Some(comment) = comment {
                    sets::check_comment(comment)?;
                    self.w
                        .put(NFTA_CHAIN_USERDATA, comment_udata(comment).bytes());
                }
                self.w.end(m);
            }
            // `flush chain`: its rules.
            (Verb::Flush, Object::Chain { name, .. }) => {
                let m = self.begin(NFT_MSG_DELRULE, 0);
                self.w.put_strz(NFTA_RULE_TABLE, TABLE);
                self.w.put_strz(NFTA_RULE_CHAIN, name);
                self.w.end(m);
            }
            (Verb::Delete, Object::Chain { name, .. }) => {
                let m = self.begin(NFT_MSG_DELCHAIN, 0);
                self.w.put_strz(NFTA_CHAIN_TABLE, TABLE);
                self.w.put_strz(NFTA_CHAIN_NAME, name);
                self.w.end(m);
            }
            (Verb::Add, Object::Set { name, spec }) => {
                let id = self.ids.declare(name);
                let decl = sets::named(name, id, spec)?;
                let m = self.begin(NFT_MSG_NEWSET, NLM_F_CREATE);
                decl.write(&mut self.w, TABLE);
                self.w.end(m);
            }
            // `flush set`: every element. libnftnl writes the set's name before the table's.
            (Verb::Flush, Object::Set { name, .. }) => {
                let m = self.begin(NFT_MSG_DELSETELEM, 0);
                self.w.put_strz(NFTA_SET_ELEM_LIST_SET, name);
                self.w.put_strz(NFTA_SET_ELEM_LIST_TABLE, TABLE);
                self.w.end(m);
            }
            (Verb::Delete, Object::Set { name, .. }) => {
                let m = self.begin(NFT_MSG_DELSET, 0);
                self.w.put_strz(NFTA_SET_TABLE, TABLE);
                self.w.put_strz(NFTA_SET_NAME, name);
                self.w.end(m);
            }
            (Verb::Add, Object::Rule { chain, rule }) => {
                let lowered = lower::rule(self.family, rule, &mut self.ids)?;
                if let Some(comment) = &rule.comment {
                    sets::check_comment(comment)?;
                }
                for set in &lowered.anonymous {
                    let m = self.begin(NFT_MSG_NEWSET, NLM_F_CREATE);
                    match self.anonymous_name {
                        Some(n) => {
                            // The set's elements then go by the batch's id alone: a name
                            // would be looked up by a scan of every set of the table.
                            self.anonymous_name = Some(n.wrapping_add(1));
                            let mut decl = set.decl.clone();
                            decl.name = format!("{}{n}", decl.name.trim_end_matches("%d"));
                            decl.write(&mut self.w, TABLE);
                            self.w.end(m);
                            self.elements(
                                NFT_MSG_NEWSETELEM,
                                NLM_F_CREATE,
                                None,
                                Some(set.decl.id),
                                &set.elements,
                            );
                        }
                        None => {
                            set.decl.write(&mut self.w, TABLE);
                            self.w.end(m);
                            self.elements(
                                NFT_MSG_NEWSETELEM,
                                NLM_F_CREATE,
                                Some(&set.decl.name),
                                Some(set.decl.id),
                                &set.elements,
                            );
                        }
                    }
                }
                let m = self.begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
                self.w.put_strz(NFTA_RULE_TABLE, TABLE);
                self.w.put_strz(NFTA_RULE_CHAIN, chain);
                let list = self.w.nest(NFTA_RULE_EXPRESSIONS);
                for expr in &lowered.exprs {
                    expr.write(&mut self.w);
                }
                self.w.end_nest(list);
                if let Some(comment) = &rule.comment {
                    self.w
                        .put(NFTA_RULE_USERDATA, comment_udata(comment).bytes());
                }
                self.w.end(m);
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
                let udata = match comment {
                    Some(comment) => {
                        sets::check_comment(comment)?;
                        Some(comment_udata(comment).bytes().to_vec())
                    }
                    None => None,
                };
                let element = Element {
                    key: key_bytes(key),
                    interval_end: false,
                    value: value.as_ref().map(verdict_value),
                    udata,
                };
                let id = self.ids.named(set);
                self.elements(
                    NFT_MSG_NEWSETELEM,
                    NLM_F_CREATE,
                    Some(set),
                    Some(id),
                    std::slice::from_ref(&element),
                );
            }
            (Verb::Delete, Object::Element { set, key, .. }) => {
                let element = Element {
                    key: key_bytes(key),
                    interval_end: false,
                    value: None,
                    udata: None,
                };
                self.elements(
                    NFT_MSG_DELSETELEM,
                    0,
                    Some(set),
                    None,
                    std::slice::from_ref(&element),
                );
            }
            (Verb::Add, Object::Counter { name }) => {
                let m = self.begin(NFT_MSG_NEWOBJ, NLM_F_CREATE);
                self.w.put_strz(NFTA_OBJ_TABLE, TABLE);
                self.w.put_strz(NFTA_OBJ_NAME, name);
                self.w.put_be32(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
                let data = self.w.nest(NFTA_OBJ_DATA);
                self.w.put_be64(NFTA_COUNTER_BYTES, 0);
                self.w.put_be64(NFTA_COUNTER_PACKETS, 0);
                self.w.end_nest(data);
                self.w.end(m);
            }
            (Verb::Delete, Object::Counter { name }) => {
                let m = self.begin(NFT_MSG_DELOBJ, 0);
                self.w.put_strz(NFTA_OBJ_TABLE, TABLE);
                self.w.put_strz(NFTA_OBJ_NAME, name);
                self.w.put_be32(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
                // nft sends the counter's (empty) data with a delete too.
                let data = self.w.nest(NFTA_OBJ_DATA);
                self.w.end_nest(data);
                self.w.end(m);
            }
            (Verb::Flush | Verb::Delete, Object::Rule { .. })
            | (Verb::Flush, Object::Element { .. } | Object::Counter { .. }) => {
                return Err(Unsupported::Operation(verb_word(verb), object_word(object)));
            }
        }
        Ok(())
    }

    fn elements(
        &mut self,
        kind: u16,
        flags: u16,
        set: Option<&str>,
        id: Option<u32>,
        elements: &[Element],
    ) {
        let m = self.begin(kind, flags);
        self.w.put_strz(NFTA_SET_ELEM_LIST_TABLE, TABLE);
        if let Some(set) = set {
            self.w.put_strz(NFTA_SET_ELEM_LIST_SET, set);
        }
        if let Some(id) = id {
            self.w.put_be32(NFTA_SET_ELEM_LIST_SET_ID, id);
        }
        if !elements.is_empty() {
            let list = self.w.nest(NFTA_SET_ELEM_LIST_ELEMENTS);
            for (i, element) in elements.iter().enumerate() {
                element.write(&mut self.w, u16::try_from(i + 1).unwrap_or(u16::MAX));
            }
            self.w.end_nest(list);
        }
        self.w.end(m);
    }
}

fn hook_number(hook: Hook) -> u32 {
    match hook {
        Hook::Prerouting => NF_INET_PRE_ROUTING,
        Hook::Input => NF_INET_LOCAL_IN,
        Hook::Forward => NF_INET_FORWARD,
        Hook::Output => NF_INET_LOCAL_OUT,
        Hook::Postrouting => NF_INET_POST_ROUTING,
    }
}

fn verb_word(verb: Verb) -> &'static str {
    match verb {
        Verb::Add => "add",
        Verb::Flush => "flush",
        Verb::Delete => "delete",
    }
}

fn object_word(object: &Object) -> &'static str {
    match object {
        Object::Table { .. } => "table",
        Object::Chain { .. } => "chain",
        Object::Set { .. } => "set",
        Object::Rule { .. } => "rule",
        Object::Element { .. } => "element",
        Object::Counter { .. } => "counter",
    }
}

/// Writes `tx` as one batch. Nothing is sent.
pub fn encode(tx: &Transaction, options: Options) -> Result<Batch, EncodeFailure> {
    let family = FamilyInfo::of(tx.family);
    // About 130 bytes an operation on average for a proxy's full sync.
    let mut enc = Encoder {
        w: Writer::with_capacity(256 + tx.ops.len() * 160),
        family,
        ack: if options.ack { NLM_F_ACK } else { 0 },
        sequence: options.first_sequence,
        origins: Vec::with_capacity(tx.ops.len() + 16),
        ids: Ids::default(),
        op: 0,
        anonymous_name: tx.anonymous_names_from,
    };
    // The batch's own messages are for the nftables subsystem, of no family, and are never
    // acknowledged (the kernel answers the begin only when it refuses the whole batch).
    let begin = enc.w.begin(
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        options.first_sequence,
        NFPROTO_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
    );
    enc.w.end(begin);
    for (index, (verb, object)) in tx.ops.iter().enumerate() {
        enc.op = u32::try_from(index).unwrap_or(u32::MAX);
        enc.operation(*verb, object)
            .map_err(|reason| EncodeFailure { index, reason })?;
    }
    let sequence = enc.sequence.wrapping_add(1);
    let end = enc.w.begin(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        sequence,
        NFPROTO_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
    );
    enc.w.end(end);
    Ok(Batch {
        bytes: enc.w.into_bytes(),
        first: options.first_sequence,
        origins: enc.origins,
    })
}
