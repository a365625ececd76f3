//! The encoder against nft itself: for each fixture (`fixtures.rs`), the batch nft sent for
//! the transaction's text (recorded with `fixtures/capture.py`) must be ours, message for
//! message and attribute for attribute. Only what nft picks per run differs and is
//! normalised away: sequence numbers, and the numbers of sets within the batch (compared by
//! the order they first appear in, so that every reference still has to point at the right
//! set). The batch's begin and end are compared too. The one addition of ours, a `numgen`
//! map's digest of its elements in its userdata, is taken out before comparing, and checked
//! on its own.

use std::fmt::Write as _;

use super::batch::{encode, Options};
use super::consts::*;
use super::fixtures::{self, Fixture};
use crate::kube_proxy::nft::objects::Transaction;

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/kube_proxy/nft/netlink/fixtures"
);

fn fixture_file(name: &str, extension: &str) -> String {
    let path = format!("{FIXTURES}/{name}.{extension}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The messages of a batch, each split off by its length.
fn split(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= bytes.len() {
        let len =
            u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        assert!(len >= 16 && at + len <= bytes.len(), "a message's length");
        out.push(bytes[at..at + len].to_vec());
        at += len.next_multiple_of(4);
    }
    assert_eq!(at, bytes.len(), "the batch ends with a whole message");
    out
}

fn hex_to_bytes(line: &str) -> Vec<u8> {
    (0..line.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&line[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Renumbers set ids by first appearance.
#[derive(Default)]
struct Renumber(Vec<u32>);

impl Renumber {
    fn id(&mut self, raw: &[u8]) -> String {
        let id = u32::from_be_bytes(raw.try_into().expect("a 4-byte id"));
        let n = match self.0.iter().position(|x| *x == id) {
            Some(i) => i + 1,
            None => {
                self.0.push(id);
                self.0.len()
            }
        };
        format!("set#{n}")
    }
}

/// Where in a message an attribute is: the message type and the attribute types from the
/// top, with the expression's name where inside one.
fn is_set_id(message_type: u8, path: &[u16], expr: Option<&str>) -> bool {
    match (u16::from(message_type), path) {
        (NFT_MSG_NEWSET, [NFTA_SET_ID]) => true,
        (NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM, [NFTA_SET_ELEM_LIST_SET_ID]) => true,
        (NFT_MSG_NEWRULE, [NFTA_RULE_EXPRESSIONS, NFTA_LIST_ELEM, NFTA_EXPR_DATA, id]) => {
            matches!(
                (expr, *id),
                (Some("lookup"), NFTA_LOOKUP_SET_ID) | (Some("dynset"), NFTA_DYNSET_SET_ID)
            )
        }
        _ => false,
    }
}

/// A message as text, one attribute a line (nested ones indented), with the sequence number
/// left out and set ids renumbered.
fn describe(message: &[u8], ids: &mut Renumber) -> String {
    let kind = u16::from_ne_bytes([message[4], message[5]]);
    let flags = u16::from_ne_bytes([message[6], message[7]]);
    let mut out = format!(
        "message {}:{} flags {flags:#x} family {} res_id {:02x}{:02x}\n",
        kind >> 8,
        kind & 0xff,
        message[16],
        message[18],
        message[19]
    );
    let message_type = (kind & 0xff) as u8;
    let subsystem = kind >> 8;
    attributes(
        &message[20..],
        &mut Vec::new(),
        None,
        if subsystem == NFNL_SUBSYS_NFTABLES {
            message_type
        } else {
            u8::MAX
        },
        ids,
        &mut out,
    );
    out
}

fn attributes(
    mut bytes: &[u8],
    path: &mut Vec<u16>,
    expr: Option<&str>,
    message_type: u8,
    ids: &mut Renumber,
    out: &mut String,
) {
    // The name of the expression these attributes belong to, once read.
    let mut name: Option<String> = expr.map(str::to_owned);
    while bytes.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([bytes[0], bytes[1]]));
        let raw_kind = u16::from_ne_bytes([bytes[2], bytes[3]]);
        assert!(len >= 4 && len <= bytes.len(), "an attribute's length");
        let kind = raw_kind & netlink_packet_core::NLA_TYPE_MASK;
        let value = &bytes[4..len];
        let indent = "  ".repeat(path.len() + 1);
        path.push(kind);
        if raw_kind & netlink_packet_core::NLA_F_NESTED != 0 {
            let _ = writeln!(out, "{indent}{kind} {{");
            attributes(value, path, name.as_deref(), message_type, ids, out);
            let _ = writeln!(out, "{indent}}}");
        } else if is_set_id(message_type, path, name.as_deref()) {
            let _ = writeln!(out, "{indent}{kind}: {}", ids.id(value));
        } else {
            let without;
            let value =
                if u16::from(message_type) == NFT_MSG_NEWSET && path[..] == [NFTA_SET_USERDATA] {
                    without = without_digest(value);
                    &without[..]
                } else {
                    value
                };
            let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
            let _ = writeln!(out, "{indent}{kind}: {hex}");
            if path.len() >= 3 && kind == NFTA_EXPR_NAME && path[path.len() - 2] == NFTA_LIST_ELEM {
                name =
                    Some(String::from_utf8_lossy(value.strip_suffix(&[0]).unwrap_or(value)).into());
            }
        }
        path.pop();
        bytes = &bytes[len.next_multiple_of(4).min(bytes.len())..];
    }
}

/// Set userdata without our digest TLV (nft writes none).
fn without_digest(udata: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = udata;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        if *kind != UDATA_SET_CONTENT_DIGEST {
            out.extend_from_slice(&rest[..2 + len]);
        }
        rest = &tail[len..];
    }
    out.extend_from_slice(rest);
    out
}

fn describe_all(messages: &[Vec<u8>]) -> Vec<String> {
    let mut ids = Renumber::default();
    messages.iter().map(|m| describe(m, &mut ids)).collect()
}

fn ours(tx: &Transaction) -> Vec<Vec<u8>> {
    let batch = encode(
        tx,
        Options {
            ack: false,
            first_sequence: 0,
        },
    )
    .unwrap_or_else(|e| panic!("the encoder refused operation {}: {}", e.index, e.reason));
    split(batch.bytes())
}

fn check(fixture: &Fixture) {
    let text = fixture_file(&fixture.name, "nft");
    assert_eq!(
        fixture.tx.text(),
        text,
        "{}: the fixture's text is not the transaction's rendering (write_fixture_texts, then capture.py)",
        fixture.name
    );
    let theirs: Vec<Vec<u8>> = fixture_file(&fixture.name, "hex")
        .lines()
        .filter(|l| !l.is_empty())
        .map(hex_to_bytes)
        .collect();
    let theirs = describe_all(&theirs);
    let ours = describe_all(&ours(&fixture.tx));
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(
            a, b,
            "{}: message {i} differs from nft's (ours first)",
            fixture.name
        );
    }
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{}: {} messages, nft sent {}",
        fixture.name,
        ours.len(),
        theirs.len()
    );
}

#[test]
fn every_object_and_operation_is_encoded_as_nft_encodes_it() {
    for fixture in fixtures::all()
        .iter()
        .filter(|f| f.name.starts_with("objects"))
    {
        check(fixture);
    }
}

#[test]
fn every_statement_is_encoded_as_nft_encodes_it() {
    for fixture in fixtures::all()
        .iter()
        .filter(|f| f.name.starts_with("statements"))
    {
        check(fixture);
    }
}

#[test]
fn full_and_partial_syncs_are_encoded_as_nft_encodes_them() {
    let all = fixtures::all();
    let syncs: Vec<&Fixture> = all.iter().filter(|f| f.name.contains("sync")).collect();
    assert_eq!(syncs.len(), 4);
    for fixture in syncs {
        check(fixture);
    }
}

#[test]
fn a_numgen_map_carries_the_digest_of_its_elements() {
    use super::{parse, sets};
    let chains = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let digest = |set: &sets::AnonSet| {
        parse::udata(&set.decl.udata, UDATA_SET_CONTENT_DIGEST)
            .expect("a digest")
            .to_vec()
    };
    let a = sets::numgen_vmap(1, &chains(&["endpoint-a", "endpoint-b"]));
    assert_eq!(digest(&a), sets::content_digest(&a.elements));
    // The set's number in the batch does not count; every element's value does.
    let again = sets::numgen_vmap(9, &chains(&["endpoint-a", "endpoint-b"]));
    assert_eq!(digest(&a), digest(&again));
    for other in [
        chains(&["endpoint-a", "endpoint-c"]),
        chains(&["endpoint-b", "endpoint-a"]),
        chains(&["endpoint-a"]),
        chains(&["endpoint-a", "endpoint-b", "endpoint-b"]),
    ] {
        assert_ne!(
            digest(&a),
            digest(&sets::numgen_vmap(1, &other)),
            "{other:?}"
        );
    }
    // Taken out, what is left is what nft writes (the fixtures hold the rest).
    assert_eq!(without_digest(&a.decl.udata).len() + 18, a.decl.udata.len());
}

#[test]
fn the_comparison_sees_a_changed_byte() {
    let all = fixtures::all();
    let fixture = &all[0];
    let mut messages = ours(&fixture.tx);
    let theirs = describe_all(&messages);
    let last = messages[1].len() - 1;
    messages[1][last] ^= 1;
    assert_ne!(describe_all(&messages), theirs);
}

/// Acked batches differ from nft's only in the flag that asks for the acks, on the
/// operations' messages and not on the batch's begin and end.
#[test]
fn acks_are_asked_for_on_every_operation_message() {
    let all = fixtures::all();
    let tx = &all[0].tx;
    let with = encode(
        tx,
        Options {
            ack: true,
            first_sequence: 100,
        },
    )
    .expect("encodes");
    let plain = ours(tx);
    let acked = split(with.bytes());
    assert_eq!(acked.len(), plain.len());
    assert_eq!(with.messages(), plain.len() - 2);
    for (i, (a, p)) in acked.iter().zip(&plain).enumerate() {
        let flags = u16::from_ne_bytes([a[6], a[7]]);
        let plain_flags = u16::from_ne_bytes([p[6], p[7]]);
        let inner = i != 0 && i != plain.len() - 1;
        assert_eq!(
            flags,
            plain_flags
                | if inner {
                    netlink_packet_core::NLM_F_ACK
                } else {
                    0
                }
        );
        assert_eq!(a[16..], p[16..]);
        let seq = u32::from_ne_bytes([a[8], a[9], a[10], a[11]]);
        assert_eq!(seq, 100 + i as u32);
        if inner {
            assert_eq!(with.origin(seq).map(|o| o < tx.len()), Some(true));
        }
    }
}

/// Writes each fixture's text (and setup) into `fixtures/`, for `capture.py` to record
/// nft's batches of: `cargo test --lib write_fixture_texts -- --ignored`.
#[test]
#[ignore]
fn write_fixture_texts() {
    for fixture in fixtures::all() {
        std::fs::write(
            format!("{FIXTURES}/{}.nft", fixture.name),
            fixture.tx.text(),
        )
        .expect("writes");
        if let Some(setup) = &fixture.setup {
            std::fs::write(
                format!("{FIXTURES}/{}.setup.nft", fixture.name),
                setup.text(),
            )
            .expect("writes");
        }
    }
}
