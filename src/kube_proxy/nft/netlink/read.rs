//! One family's `kube-proxy` table read back from the kernel, into the table's model: the
//! same `Table` that `nft -j list table` gives (`json`), without the `nft` program, and with
//! what nft 1.0.6's JSON leaves out (table and chain comments, a set's `dynamic` flag).
//!
//! The table, its chains, sets (named and anonymous), every set's elements, its counters and
//! its rules are asked for one kind at a time (`NLM_F_DUMP` requests, filtered to the table
//! where the kernel can filter), and put together here; rules are read back into statements
//! (`unlower`). The ruleset's generation is asked for before and after: when anything
//! changed the ruleset meanwhile, the table is read again (a few times at most).
//!
//! The kernel's answers are read with bounded sizes: a dump larger than any table the proxy
//! writes is refused rather than held.
//!
//! Elements are asked for one set at a time, and the kernel finds each set by walking the
//! table's list of sets: at 10,000 Service ports, 10,000 requests of half a millisecond of
//! kernel time each. A `numgen` map that this program wrote carries a digest of its
//! elements (`sets::content_digest`); given the transaction the proxy wants, a map whose
//! digest is one of that transaction's maps' takes its elements from there, unasked.
//! Anonymous maps are constant once their rule holds them, so the digest stays true.

use std::collections::{BTreeMap, HashMap};
use std::io;

use netlink_packet_core::{
    NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};

use super::attr::Writer;
use super::consts::*;
use super::decode::{self, RawElement, RawSet};
use super::lower::{self, SetIds};
use super::parse::{self, Malformed, Message};
use super::sets::{ContentDigest, FamilyInfo};
use super::socket::{NfSocket, SocketError};
use super::unexpr::{self, Item};
use super::unlower::{self, Anonymous};
use crate::kube_proxy::model::IpFamily;
use crate::kube_proxy::nft::objects::{Object, SetKind, Transaction, Verb, TABLE};
use crate::kube_proxy::nft::rule::Rule;
use crate::kube_proxy::nft::table::{Element, Set, Table};

/// More than the answers for any table the proxy writes (about 60 MB at 10,000 Services of
/// 10 endpoints each).
const MAX_BYTES: usize = 2 << 30;
/// More chains, rules, sets and elements together than any table the proxy writes holds.
const MAX_OBJECTS: usize = 20_000_000;
/// How many times the table is read again when the ruleset changed while it was read.
const ATTEMPTS: usize = 4;

/// A table read back, and what of it the model cannot hold.
#[derive(Clone, Debug)]
pub struct Listing {
    pub table: Table,
    /// What the kernel's table holds that no proxy writes and the model cannot express (a
    /// chain's drop policy, a set flag, an element expression...), one line each. A table
    /// with any is not the proxy's as it stands.
    pub unsupported: Vec<String>,
    pub stats: ReadStats,
}

/// What reading took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    pub requests: usize,
    pub messages: usize,
    pub bytes: usize,
    pub chains: usize,
    pub rules: usize,
    pub sets: usize,
    pub anonymous_sets: usize,
    /// Anonymous maps that carry a digest of their elements (written by this program).
    pub digests: usize,
    /// Of those, the maps whose elements were known by their digest, not asked for.
    pub known_maps: usize,
    pub elements: usize,
    /// Reads begun again because the ruleset changed meanwhile.
    pub retries: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("the kernel refused to list {what}: {source}")]
    Refused { what: String, source: io::Error },
    #[error("the kernel's answer listing {what} is malformed: {source}")]
    Malformed {
        what: String,
        #[source]
        source: Malformed,
    },
    #[error("the kernel did not answer the request for {0}")]
    Silent(String),
    #[error("the table is larger than {limit} {unit}")]
    TooLarge { limit: usize, unit: &'static str },
    #[error("the ruleset changed each of the {0} times the table was read")]
    Changing(usize),
}

/// The ruleset changed under a dump (or between the generations asked for).
struct Interrupted;

enum Failure {
    Error(ReadError),
    Interrupted,
}

impl From<ReadError> for Failure {
    fn from(e: ReadError) -> Failure {
        Failure::Error(e)
    }
}

impl From<Interrupted> for Failure {
    fn from(_: Interrupted) -> Failure {
        Failure::Interrupted
    }
}

/// Reads `family`'s table; None when there is none. `wanted`, the transaction the reader
/// would write, names the maps whose elements need not be asked for.
pub fn read(
    socket: &mut NfSocket,
    family: IpFamily,
    first_sequence: u32,
    wanted: Option<&Transaction>,
) -> Result<Option<Listing>, ReadError> {
    let mut reader = Reader {
        socket,
        family,
        sequence: first_sequence,
        stats: ReadStats::default(),
        objects: 0,
        wanted,
        known: None,
    };
    for attempt in 0..ATTEMPTS {
        reader.stats.retries = attempt;
        let before = reader.generation()?;
        match reader.once() {
            Ok(listing) => {
                if reader.generation()? == before {
                    return Ok(listing.map(|mut l| {
                        l.stats = reader.stats;
                        l
                    }));
                }
            }
            Err(Failure::Error(e)) => return Err(e),
            Err(Failure::Interrupted) => {}
        }
        reader.objects = 0;
    }
    Err(ReadError::Changing(ATTEMPTS))
}

struct Reader<'a> {
    socket: &'a mut NfSocket,
    family: IpFamily,
    sequence: u32,
    stats: ReadStats,
    objects: usize,
    wanted: Option<&'a Transaction>,
    /// `wanted`'s maps by digest, made when the first map with a digest is read.
    known: Option<HashMap<ContentDigest, Vec<RawElement>>>,
}

/// The `numgen` maps `tx` writes, each one's elements as the kernel would answer them, by
/// their digest.
fn known_maps(tx: &Transaction) -> HashMap<ContentDigest, Vec<RawElement>> {
    /// Lowering a rule alone: set ids do not matter here.
    struct NoIds;
    impl SetIds for NoIds {
        fn named(&mut self, _: &str) -> u32 {
            0
        }
        fn fresh(&mut self) -> u32 {
            0
        }
    }
    let family = FamilyInfo::of(tx.family);
    let mut out = HashMap::new();
    for (verb, object) in &tx.ops {
        let (Verb::Add, Object::Rule { rule, .. }) = (verb, object) else {
            continue;
        };
        if rule.anonymous_sets() == 0 {
            continue;
        }
        let Ok(lowered) = lower::rule(family, rule, &mut NoIds) else {
            continue;
        };
        for set in lowered.anonymous {
            // The digest the map's declaration carries, as written: not computed again.
            let Some(digest) = parse::udata(&set.decl.udata, UDATA_SET_CONTENT_DIGEST)
                .and_then(|d| ContentDigest::try_from(d).ok())
            else {
                continue;
            };
            let elements = set
                .elements
                .iter()
                .map(|e| {
                    let udata = e.udata.as_deref().unwrap_or_default();
                    RawElement {
                        key: e.key.clone(),
                        value: e.value.clone(),
                        interval_end: e.interval_end,
                        open: parse::udata_u32(udata, UDATA_SET_ELEM_FLAGS)
                            .is_some_and(|f| f & UDATA_SET_ELEM_F_INTERVAL_OPEN != 0),
                        comment: parse::udata_comment(udata, UDATA_SET_ELEM_COMMENT),
                        odd: None,
                    }
                })
                .collect();
            out.insert(digest, elements);
        }
    }
    out
}

fn malformed(what: &str) -> impl Fn(Malformed) -> ReadError + '_ {
    move |source| ReadError::Malformed {
        what: what.to_owned(),
        source,
    }
}

impl Reader<'_> {
    /// Sends one request and hands every answer message to `each`: the object a get asked
    /// for, or every part of a dump until its end.
    fn request(
        &mut self,
        kind: u16,
        dump: bool,
        what: &str,
        attributes: impl FnOnce(&mut Writer),
        mut each: impl FnMut(&Message<'_>) -> Result<(), ReadError>,
    ) -> Result<(), Failure> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let family = if kind == NFT_MSG_GETGEN {
            NFPROTO_UNSPEC
        } else {
            FamilyInfo::of(self.family).nfproto
        };
        let mut w = Writer::with_capacity(128);
        let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        let m = w.begin(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            flags,
            sequence,
            family,
            0,
        );
        attributes(&mut w);
        w.end(m);
        self.socket
            .send_request(&w.into_bytes())
            .map_err(ReadError::from)?;
        self.stats.requests += 1;
        let mut answered = false;
        loop {
            let Some(datagram) = self.socket.next_datagram().map_err(ReadError::from)? else {
                return Err(ReadError::Silent(what.to_owned()).into());
            };
            self.stats.bytes += datagram.len();
            if self.stats.bytes > MAX_BYTES {
                return Err(ReadError::TooLarge {
                    limit: MAX_BYTES,
                    unit: "bytes",
                }
                .into());
            }
            for message in parse::messages(datagram).map_err(malformed(what))? {
                // An answer to another request (one given up on) is not this one's.
                if message.sequence != sequence {
                    continue;
                }
                self.stats.messages += 1;
                match message.kind {
                    NLMSG_NOOP => {}
                    NLMSG_ERROR | NLMSG_DONE => {
                        let errno = parse::errno(&message).map_err(malformed(what))?;
                        if errno != 0 {
                            return Err(ReadError::Refused {
                                what: what.to_owned(),
                                source: io::Error::from_raw_os_error(errno),
                            }
                            .into());
                        }
                        // A dump's end, or the ack that follows a get's answer.
                        if message.kind == NLMSG_DONE || answered || !dump {
                            return Ok(());
                        }
                    }
                    _ => {
                        if message.flags & NLM_F_DUMP_INTR != 0 {
                            return Err(Interrupted.into());
                        }
                        answered = true;
                        each(&message)?;
                    }
                }
            }
        }
    }

    fn count(&mut self, n: usize) -> Result<(), ReadError> {
        self.objects += n;
        if self.objects > MAX_OBJECTS {
            return Err(ReadError::TooLarge {
                limit: MAX_OBJECTS,
                unit: "objects",
            });
        }
        Ok(())
    }

    /// The ruleset's generation: it changes with every transaction the kernel takes.
    fn generation(&mut self) -> Result<u32, ReadError> {
        let mut id = None;
        let got = self.request(
            NFT_MSG_GETGEN,
            false,
            "the generation",
            |_| {},
            |m| {
                if m.kind & 0xff == NFT_MSG_NEWGEN {
                    let attrs = m.attributes().and_then(|a| a.table("generation"));
                    id = attrs
                        .and_then(|t| t.need_be32(NFTA_GEN_ID))
                        .map(Some)
                        .map_err(malformed("the generation"))?;
                }
                Ok(())
            },
        );
        match got {
            Ok(()) => id.ok_or_else(|| ReadError::Silent("the generation".into())),
            Err(Failure::Error(e)) => Err(e),
            Err(Failure::Interrupted) => Err(ReadError::Silent("the generation".into())),
        }
    }

    fn once(&mut self) -> Result<Option<Listing>, Failure> {
        let mut unsupported = Vec::new();
        let mut table = Table::new(self.family);

        // The table itself: absent is no error.
        let mut found = None;
        let got = self.request(
            NFT_MSG_GETTABLE,
            false,
            "the table",
            |w| w.put_strz(NFTA_TABLE_NAME, TABLE),
            |m| {
                let t = m
                    .attributes()
                    .and_then(|a| a.table("table"))
                    .and_then(|t| decode::table(&t))
                    .map_err(malformed("the table"))?;
                found = Some(t);
                Ok(())
            },
        );
        match got {
            Err(Failure::Error(ReadError::Refused { source, .. }))
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                return Ok(None)
            }
            other => other?,
        }
        let Some(raw) = found else {
            return Err(ReadError::Silent("the table".into()).into());
        };
        table.comment = raw.comment;
        if raw.flags != 0 {
            unsupported.push(format!("table flags {:#x}", raw.flags));
        }

        // Chains: the kernel dumps every table's of the family.
        let mut chains = Vec::new();
        self.request(
            NFT_MSG_GETCHAIN,
            true,
            "chains",
            |_| {},
            |m| {
                let t = m.attributes().and_then(|a| a.table("chain"));
                chains.push(
                    t.and_then(|t| decode::chain(&t))
                        .map_err(malformed("chains"))?,
                );
                Ok(())
            },
        )?;
        chains.retain(|c| c.table == TABLE);
        self.count(chains.len())?;
        self.stats.chains = chains.len();
        for c in chains {
            unsupported.extend(c.odd);
            table.chains.insert(c.name, c.chain);
        }

        // Sets and maps, anonymous ones included.
        let mut sets: Vec<RawSet> = Vec::new();
        self.request(
            NFT_MSG_GETSET,
            true,
            "sets",
            |w| w.put_strz(NFTA_SET_TABLE, TABLE),
            |m| {
                let t = m.attributes().and_then(|a| a.table("set"));
                sets.push(t.and_then(|t| decode::set(&t)).map_err(malformed("sets"))?);
                Ok(())
            },
        )?;
        self.count(sets.len())?;
        let mut anonymous = HashMap::new();
        for set in sets {
            if set.anonymous() && set.digest.is_some() {
                self.stats.digests += 1;
            }
            let known = match (set.anonymous(), set.digest, self.wanted) {
                (true, Some(digest), Some(wanted)) => self
                    .known
                    .get_or_insert_with(|| known_maps(wanted))
                    .get(&digest)
                    .cloned(),
                _ => None,
            };
            let elements = match known {
                Some(elements) => {
                    self.stats.known_maps += 1;
                    self.count(elements.len())?;
                    self.stats.elements += elements.len();
                    elements
                }
                None => self.elements(&set.name)?,
            };
            if set.anonymous() {
                self.stats.anonymous_sets += 1;
                anonymous.insert(set.name.clone(), Anonymous { set, elements });
            } else {
                self.stats.sets += 1;
                let named = named_set(&set, elements, &mut unsupported);
                table.sets.insert(set.name, named);
            }
        }

        let mut objects = Vec::new();
        self.request(
            NFT_MSG_GETOBJ,
            true,
            "objects",
            |w| w.put_strz(NFTA_OBJ_TABLE, TABLE),
            |m| {
                let t = m.attributes().and_then(|a| a.table("object"));
                objects.push(
                    t.and_then(|t| decode::object(&t))
                        .map_err(malformed("objects"))?,
                );
                Ok(())
            },
        )?;
        for (name, kind) in objects {
            if kind == NFT_OBJECT_COUNTER {
                table.counters.insert(name);
            } else {
                unsupported.push(format!("object {name} of type {kind}"));
            }
        }

        let family = FamilyInfo::of(self.family);
        let mut rules: Vec<(String, Rule)> = Vec::new();
        let mut budget = MAX_OBJECTS.saturating_sub(self.objects);
        self.request(
            NFT_MSG_GETRULE,
            true,
            "rules",
            |w| w.put_strz(NFTA_RULE_TABLE, TABLE),
            |m| {
                budget = budget.checked_sub(1).ok_or(ReadError::TooLarge {
                    limit: MAX_OBJECTS,
                    unit: "objects",
                })?;
                rules.push(rule(m, family, &anonymous).map_err(malformed("rules"))?);
                Ok(())
            },
        )?;
        self.count(rules.len())?;
        self.stats.rules = rules.len();
        for (chain, rule) in rules {
            match table.chains.get_mut(&chain) {
                Some(c) => c.rules.push(rule),
                None => unsupported.push(format!("a rule of chain {chain}, which is not listed")),
            }
        }
        Ok(Some(Listing {
            table,
            unsupported,
            stats: ReadStats::default(),
        }))
    }

    /// Every element of one set.
    fn elements(&mut self, set: &str) -> Result<Vec<RawElement>, Failure> {
        let mut out = Vec::new();
        let what = format!("the elements of {set}");
        let mut budget = MAX_OBJECTS.saturating_sub(self.objects);
        self.request(
            NFT_MSG_GETSETELEM,
            true,
            &what,
            |w| {
                w.put_strz(NFTA_SET_ELEM_LIST_TABLE, TABLE);
                w.put_strz(NFTA_SET_ELEM_LIST_SET, set);
            },
            |m| {
                let t = m.attributes().and_then(|a| a.table("set elements"));
                let (_, elements) = t
                    .and_then(|t| decode::elements(&t))
                    .map_err(malformed(&what))?;
                budget = budget
                    .checked_sub(elements.len())
                    .ok_or(ReadError::TooLarge {
                        limit: MAX_OBJECTS,
                        unit: "objects",
                    })?;
                out.extend(elements);
                Ok(())
            },
        )?;
        self.count(out.len())?;
        self.stats.elements += out.len();
        Ok(out)
    }
}

/// A named set or map and its elements, in the model.
fn named_set(set: &RawSet, elements: Vec<RawElement>, unsupported: &mut Vec<String>) -> Set {
    let (spec, odd) = set.spec();
    unsupported.extend(odd);
    let fields = decode::fields(set.key_type);
    let mut out = BTreeMap::new();
    let mut bad = 0;
    for e in elements {
        let key = decode::key(&fields, &e.key);
        let value = match (&e.value, spec.kind) {
            (None, SetKind::Set) => Some(None),
            (Some(v), SetKind::Map) => decode::verdict(v).map(Some),
            _ => None,
        };
        match (key, value) {
            (Some(key), Some(value)) if e.odd.is_none() && !e.interval_end => {
                out.insert(
                    key,
                    Element {
                        value,
                        comment: e.comment,
                    },
                );
            }
            _ => bad += 1,
        }
    }
    if bad > 0 {
        unsupported.push(format!(
            "set {}: {bad} elements the proxy never writes",
            set.name
        ));
    }
    Set {
        spec,
        elements: out,
    }
}

/// A `NEWRULE` message: its chain, and the rule.
fn rule(
    m: &Message<'_>,
    family: FamilyInfo,
    anonymous: &HashMap<String, Anonymous>,
) -> Result<(String, Rule), Malformed> {
    let t = m.attributes()?.table("rule")?;
    let chain = t.need_str(NFTA_RULE_CHAIN)?.to_owned();
    let items: Vec<Item> = match t.nest(NFTA_RULE_EXPRESSIONS) {
        Some(list) => unexpr::expressions(list)?,
        None => Vec::new(),
    };
    let comment = t
        .get(NFTA_RULE_USERDATA)
        .and_then(|u| parse::udata_comment(u, UDATA_COMMENT));
    Ok((
        chain,
        Rule {
            stmts: unlower::statements(family, &items, anonymous),
            comment,
        },
    ))
}
