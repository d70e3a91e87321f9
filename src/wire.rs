//! The one codec for everything nodes send each other.
//!
//! Pure: no I/O, no clock, no async; bytes in, [`Message`] out, and back.
//!
//! A frame is `[version: u8][payload]`: one byte [`WIRE_VERSION`], then the message in
//! bincode 2's standard configuration (little-endian varints; enum variants by index, so
//! variants are only ever appended). A frame is at most [`MAX_FRAME_BYTES`] long, both ways.
//!
//! [`decode`] takes untrusted bytes and never panics. Lengths inside the payload are checked
//! against the frame limit before anything is allocated for them (bincode's `with_limit`),
//! sequences preallocate at most 1 MiB (serde's cautious size hint) and fail at the end of
//! the input, so a hostile frame costs time and memory in proportion to its real size. A
//! frame must be consumed exactly: trailing bytes are an error. What the fields *mean*
//! (whether `from` is the authenticated peer, whether a rule exists, whether a count is
//! plausible) is for the receiver to judge.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use bincode::enc::write::Writer;
use bincode::error::{DecodeError, EncodeError};
use serde::{Deserialize, Serialize};

use crate::counter::{Actor, Delta, Digest};

/// The version byte this node writes and the only one it reads. Version 3: a limit report
/// carries the room the sender holds per slot (`held`) instead of a gap credit. Version 4:
/// a bucket limit's report carries the share the sender holds (`share`) and the tokens it
/// gave back (`returned`). Version 5: the aggregation tree's sums carry `vouch`, and a
/// leaving tree node hands its counts to a carrier ([`Message::TreeHandoff`],
/// [`Message::TreeCarried`]). Version 6: a round frame says whether its sender may hold
/// starters (`open`) and carries its base eras (`eras`), and a bucket limit's report the
/// share of the burst its sender holds (`burst`) and the tokens its bucket lacks (`short`).
/// Version 7: the aggregation tree's sums carry its members' bases (`bases`, `since`, and
/// each entry's `based`). Version 8: a round frame says through which round its sender holds
/// each peer's complete state (`acks`), so a change is repeated only until every peer has it.
pub const WIRE_VERSION: u8 = 8;

/// The largest frame, version byte included: 1 MiB. A delta of one short key with one dot
/// takes ~40 bytes, so a frame holds ~25,000 of them; a digest of one rule takes at most
/// ~36 KiB ([`MAX_DIGEST_BUCKETS`](crate::counter::MAX_DIGEST_BUCKETS)). Larger batches must
/// be split by the sender. It also bounds what one hostile frame can make a node decode.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// bincode's standard configuration, refusing any length that would read past the frame
/// limit.
type Config = Configuration<LittleEndian, Varint, Limit<MAX_FRAME_BYTES>>;

fn config() -> Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Everything one node tells another about counters.
///
/// Append new variants at the end: the variant index is on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// The first message on a connection: who is speaking, and which rules it runs.
    Hello {
        /// The sender.
        from: Actor,
        /// A hash of the sender's global rules, to report peers configured differently.
        rules_hash: u64,
    },
    /// A round's frame: the sender's own counts and demand as of its boundary
    /// (see docs/design.md §2.2 and [`RoundFrame`]).
    Round(RoundFrame),
    /// Anti-entropy: the sender's digest, to be answered with a [`Message::Repair`].
    Digest {
        /// The sender.
        from: Actor,
        /// Its digest ([`Counters::digest`](crate::counter::Counters::digest)).
        digest: Digest,
    },
    /// The answer to a [`Message::Digest`]
    /// ([`Counters::repair_for`](crate::counter::Counters::repair_for)).
    Repair {
        /// The sender.
        from: Actor,
        /// Every slot the digest's owner may lack, with all the sender's dots there.
        entries: Vec<Delta>,
    },
    /// The aggregation tree (`cluster::tree`, design §11): a subtree's sums, from a child to
    /// its parent.
    TreeUp(TreeSums),
    /// The aggregation tree: the whole view's totals of the keys a child's subtree reported,
    /// from a parent to that child.
    TreeDown(TreeSums),
    /// The aggregation tree: a leaving node's admissions in its open slots (`admitted` of
    /// each entry; `round`: the round from which the receiver is asked to report them as
    /// its own), to the member that carries them after it leaves.
    TreeHandoff(TreeSums),
    /// The aggregation tree: the carrier's answer to a [`Message::TreeHandoff`]: it reports
    /// the leaving node's admissions as its own from `round` on.
    TreeCarried {
        /// The carrier.
        from: Actor,
        /// The handoff's round.
        round: u64,
    },
}

impl Message {
    /// Every value [`Message::kind`] returns, in the order of the variants.
    pub const KINDS: [&'static str; 8] = [
        "hello",
        "round",
        "digest",
        "repair",
        "tree_up",
        "tree_down",
        "tree_handoff",
        "tree_carried",
    ];

    /// The message's kind, for metrics: its variant's name in snake case.
    pub fn kind(&self) -> &'static str {
        let i = match self {
            Message::Hello { .. } => 0,
            Message::Round(_) => 1,
            Message::Digest { .. } => 2,
            Message::Repair { .. } => 3,
            Message::TreeUp(_) => 4,
            Message::TreeDown(_) => 5,
            Message::TreeHandoff(_) => 6,
            Message::TreeCarried { .. } => 7,
        };
        Self::KINDS[i]
    }
}

/// Sums over members of the aggregation tree (`cluster::tree`) for one round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSums {
    /// The sender.
    pub from: Actor,
    /// The round number: the boundary's time divided by the round length.
    pub round: u64,
    /// A hash of the sender's view (its members, generations included); a message of
    /// another view is ignored.
    pub view: u64,
    /// How many members' contributions the sums include: the sender's subtree on the way
    /// up; the whole view when a round is complete, on the way down.
    pub members: u64,
    /// The highest round through which any of those members grants nothing (it saw a
    /// member leave, or started): slots such a round could have granted room in are served
    /// from what is held.
    pub freeze: u64,
    /// The earliest round since which any of those members has applied complete rounds
    /// without a gap (`u64::MAX`: none has): a starting member whose previous incarnation
    /// could hold room only in slots such a member saw granted needs no freeze of its own.
    pub vouch: u64,
    /// The latest round from which any of those members has held its current view: a base
    /// claimed in a slot first granted at or after it is counted in every complete round that
    /// could grant there.
    pub since: u64,
    /// Per (rule, slot): the bases those members claim there, unspent or not; in every part.
    pub bases: Vec<TreeBase>,
    /// This message is part `part` (from 0) of `parts`: sums larger than a frame are split,
    /// and count as received when every part is in.
    pub part: u32,
    /// How many parts the sums have (at least 1).
    pub parts: u32,
    /// Per (rule, key, slot), in increasing order.
    pub entries: Vec<TreeEntry>,
}

/// One (rule, key, slot)'s sums in a [`TreeSums`]. Members that did not report the key hold
/// nothing of it and add zero.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// The rule.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The slot (window) number.
    pub slot: u64,
    /// Units admitted in the slot.
    pub admitted: u64,
    /// Room held in the slot: units leased and not yet spent.
    pub held: u64,
    /// Smoothed demand: cost units arriving per round.
    pub demand: u64,
    /// Raw grants asked for: each member's `(target - held)`, before scaling to the free
    /// room.
    pub raw: u64,
    /// Down only: the raw grants of the members before the receiver's subtree in the tree's
    /// pre-order, so each member scales its own interval of `[0, raw)` (0 on the way up).
    pub offset: u64,
    /// The bases of the slot that the reporting members have taken into `admitted` and
    /// `held`: the rest of the [`TreeSums::bases`] is held by members that did not report
    /// the key.
    pub based: u64,
}

/// A (rule, slot)'s bases in a [`TreeSums`]: room every member claims of each key there
/// without reporting it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeBase {
    /// The rule.
    pub rule: String,
    /// The slot (window) number.
    pub slot: u64,
    /// Units, summed over the members.
    pub units: u64,
}

/// What a node publishes at the boundary of round `round`: the inputs every peer needs to
/// compute the same leases and shares at the round's instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundFrame {
    /// The sender's actor; every count in the frame is this actor's own.
    pub from: Actor,
    /// The round number: the boundary's time divided by the round length.
    pub round: u64,
    /// A hash of the sender's view of the cluster (members and which of them it suspects);
    /// nodes whose views differ do not lease in that round.
    pub view: u64,
    /// `Some(n)`: the sender's last instant was consistent with all of its `n` participants
    /// reachable, so it may hold *starters* of keys that instant found idle (each a share of
    /// the limit over `n`); the receivers' next instant charges them to it (design §3.3.1).
    pub open: Option<u32>,
    /// The sender's *base eras*, oldest first, at most two: `(from, n)` says that in every
    /// slot whose first instant is at or after round `from` (until the next era) the sender
    /// holds `⌊C'/n⌋` of every key it publishes no holding for (design §3.3.1, bases). A
    /// slot before the first era is one it has no base in.
    pub eras: Vec<(u64, u32)>,
    /// `None`: `keys` lists every key the sender is active on. `Some(r)`: only the keys whose
    /// counts, demand or holdings changed in rounds `r..=round`, so a receiver that holds the
    /// sender's complete state through round `r - 1` is complete through `round` (a frame or
    /// two lost in between cost nothing).
    pub since: Option<u64>,
    /// This frame is part `part` (from 0) of `parts`: a round's reports are split so that no
    /// frame exceeds [`MAX_FRAME_BYTES`]; the round counts as received when all parts are in.
    pub part: u32,
    /// How many parts the round's frame has (at least 1).
    pub parts: u32,
    /// Peers whose reports the sender is missing (a frame lost beyond what `since` covers):
    /// each should send a full frame next round.
    pub want_full: Vec<String>,
    /// Per key: demand, own counts and holdings.
    pub keys: Vec<KeyReport>,
    /// For each member of the sender's view but the sender, in the order of their node ids:
    /// `round - c` if the sender holds that member's complete state through round `c` (at
    /// most 254), else 255. Read only by a receiver whose view of `round` is the same (the
    /// same members): it then knows which entry is its own.
    pub acks: Vec<u8>,
}

/// One key's inputs in a [`RoundFrame`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyReport {
    /// The rule (must be a global rule of the receiver's, or the report is dropped).
    pub rule: String,
    /// The key.
    pub key: String,
    /// The sender's smoothed demand for the key: cost units arriving per round.
    pub demand: u64,
    /// One entry per limit of the rule, in the rule's order.
    pub limits: Vec<LimitReport>,
}

/// One limit's inputs in a [`KeyReport`]. A windowed limit sends `counts` and `held`; a
/// bucket limit sends `returned`, `share`, `burst` and `short`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitReport {
    /// The sender's own absolute admitted count in each open slot, `(slot, count)`.
    pub counts: Vec<(u64, u64)>,
    /// The room the sender holds, `(slot, units)` per slot: units it may still admit in
    /// that slot, which no other node is allotted until the sender publishes it returned
    /// (design §3.3). Slots in increasing order.
    pub held: Vec<(u64, u64)>,
    /// Bucket limits: the tokens the sender's bucket gave up at its last instant (its share
    /// shrank below its level), in units of `1 / SHARE_ONE` token, for the consistent
    /// nodes to take up in proportion to their shares at this round's instant (design §3.5).
    pub returned: u64,
    /// Bucket limits: the share of the rate the sender holds, out of `SHARE_ONE`; 0 when
    /// it holds the default, one over the number of participants (design §3.5).
    pub share: u64,
    /// Bucket limits: the share of the burst (its bucket's capacity) the sender holds, as
    /// `share`.
    pub burst: u64,
    /// Bucket limits: the whole tokens the sender's bucket lacked of its capacity at the
    /// boundary, rounded down to a 32nd of the burst; 0 when full. With every sender's
    /// capacity it gives the cluster's tokens, which move to the nodes short of their part
    /// (design §3.5).
    pub short: u64,
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The frame has no bytes at all.
    #[error("empty frame")]
    Empty,
    /// The frame's version byte is not [`WIRE_VERSION`] (a peer running another release).
    #[error("frame version {0} is not supported (this node speaks version {WIRE_VERSION})")]
    Version(u8),
    /// The frame is (or would be) longer than [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge(usize),
    /// The payload is not a valid message: truncated, corrupt, or claiming lengths beyond
    /// the frame limit.
    #[error("malformed frame: {0}")]
    Malformed(#[from] DecodeError),
    /// A whole message was decoded before the end of the frame.
    #[error("frame has {0} bytes after the message")]
    TrailingBytes(usize),
    /// The message could not be encoded (not expected for any [`Message`]).
    #[error("cannot encode message: {0}")]
    Encode(#[from] EncodeError),
}

/// Encodes `message` as a frame. Refuses a frame over [`MAX_FRAME_BYTES`] without
/// allocating more than the limit.
pub fn encode(message: &Message) -> Result<Vec<u8>, WireError> {
    let mut frame = Frame {
        bytes: vec![WIRE_VERSION],
        len: 1,
    };
    bincode::serde::encode_into_writer(message, &mut frame, config())?;
    if frame.len > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge(frame.len));
    }
    Ok(frame.bytes)
}

/// Decodes one frame. Never panics, whatever `frame` holds.
pub fn decode(frame: &[u8]) -> Result<Message, WireError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge(frame.len()));
    }
    let (&version, payload) = frame.split_first().ok_or(WireError::Empty)?;
    if version != WIRE_VERSION {
        return Err(WireError::Version(version));
    }
    let (message, read) = bincode::serde::decode_from_slice(payload, config())?;
    match payload.len() - read {
        0 => Ok(message),
        extra => Err(WireError::TrailingBytes(extra)),
    }
}

/// A frame being written: keeps bytes up to the limit and only counts the rest, so an
/// oversized message is measured without being buffered.
struct Frame {
    bytes: Vec<u8>,
    len: usize,
}

impl Writer for Frame {
    fn write(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        self.len = self.len.saturating_add(bytes.len());
        if self.len <= MAX_FRAME_BYTES {
            self.bytes.extend_from_slice(bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::{RuleDigest, SlotId};
    use crdts::Dot;
    use proptest::prelude::*;

    fn actor() -> impl Strategy<Value = Actor> {
        ("[a-z0-9-]{0,12}", any::<u64>()).prop_map(|(node, generation)| Actor { node, generation })
    }

    fn deltas() -> impl Strategy<Value = Vec<Delta>> {
        let slot = (".{0,8}", any::<String>(), any::<u64>()).prop_map(|(rule, key, slot)| SlotId {
            rule,
            key,
            slot,
        });
        let dot = (actor(), any::<u64>()).prop_map(|(a, n)| Dot::new(a, n));
        proptest::collection::vec((slot, proptest::collection::vec(dot, 0..4)), 0..8)
    }

    fn round_frame() -> impl Strategy<Value = RoundFrame> {
        let limit = (
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..3),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..3),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                |(counts, held, returned, share, burst, short)| LimitReport {
                    counts,
                    held,
                    returned,
                    share,
                    burst,
                    short,
                },
            );
        let key = (
            "[a-z]{0,8}",
            any::<String>(),
            any::<u64>(),
            proptest::collection::vec(limit, 0..3),
        )
            .prop_map(|(rule, key, demand, limits)| KeyReport {
                rule,
                key,
                demand,
                limits,
            });
        (
            actor(),
            any::<u64>(),
            (
                any::<u64>(),
                proptest::option::of(any::<u32>()),
                proptest::collection::vec((any::<u64>(), any::<u32>()), 0..3),
            ),
            proptest::option::of(any::<u64>()),
            (any::<u32>(), any::<u32>()),
            proptest::collection::vec(key, 0..6),
        )
            .prop_map(
                |(from, round, (view, open, eras), since, (part, parts), keys)| RoundFrame {
                    from,
                    round,
                    view,
                    open,
                    eras,
                    since,
                    part,
                    parts,
                    want_full: vec!["node-2".into()],
                    keys,
                    acks: vec![0, 255],
                },
            )
    }

    fn tree_sums() -> impl Strategy<Value = TreeSums> {
        let entry =
            ("[a-z]{0,4}", "[a-z0-9]{0,8}", any::<[u64; 7]>()).prop_map(|(rule, key, v)| {
                TreeEntry {
                    rule,
                    key,
                    slot: v[0],
                    admitted: v[1],
                    held: v[2],
                    demand: v[3],
                    raw: v[4],
                    offset: v[5],
                    based: v[6],
                }
            });
        let base = ("[a-z]{0,4}", any::<[u64; 2]>()).prop_map(|(rule, v)| TreeBase {
            rule,
            slot: v[0],
            units: v[1],
        });
        (
            actor(),
            any::<[u64; 6]>(),
            any::<(u32, u32)>(),
            proptest::collection::vec(entry, 0..6),
            proptest::collection::vec(base, 0..3),
        )
            .prop_map(|(from, v, (part, parts), entries, bases)| TreeSums {
                from,
                round: v[0],
                view: v[1],
                members: v[2],
                freeze: v[3],
                vouch: v[4],
                since: v[5],
                bases,
                part,
                parts,
                entries,
            })
    }

    fn message() -> impl Strategy<Value = Message> {
        let digest = proptest::collection::vec(
            ("[a-z]{0,8}", proptest::collection::vec(any::<u64>(), 0..20))
                .prop_map(|(rule, buckets)| RuleDigest { rule, buckets }),
            0..4,
        )
        .prop_map(|rules| Digest { rules });
        prop_oneof![
            (actor(), any::<u64>())
                .prop_map(|(from, rules_hash)| Message::Hello { from, rules_hash }),
            round_frame().prop_map(Message::Round),
            (actor(), digest).prop_map(|(from, digest)| Message::Digest { from, digest }),
            (actor(), deltas()).prop_map(|(from, entries)| Message::Repair { from, entries }),
            tree_sums().prop_map(Message::TreeUp),
            tree_sums().prop_map(Message::TreeDown),
            tree_sums().prop_map(Message::TreeHandoff),
            (actor(), any::<u64>()).prop_map(|(from, round)| Message::TreeCarried { from, round }),
        ]
    }

    fn sample() -> Message {
        Message::Repair {
            from: Actor::new("node-1", 1_700_000_000_000),
            entries: vec![(
                SlotId::new("api", "user-42", 28_333_333),
                vec![
                    Dot::new(Actor::new("node-1", 1_700_000_000_000), 17),
                    Dot::new(Actor::new("node-2", 1_700_000_000_500), 3),
                ],
            )],
        }
    }

    #[test]
    fn a_frame_starts_with_the_version_byte() {
        let frame = encode(&sample()).unwrap();
        assert_eq!(frame[0], WIRE_VERSION);
        assert_eq!(decode(&frame).unwrap(), sample());
    }

    #[test]
    fn every_strict_prefix_of_a_frame_is_refused() {
        let frame = encode(&sample()).unwrap();
        assert!(matches!(decode(&[]), Err(WireError::Empty)));
        for end in 1..frame.len() {
            assert!(
                matches!(decode(&frame[..end]), Err(WireError::Malformed(_))),
                "prefix of {end} bytes"
            );
        }
    }

    #[test]
    fn another_version_is_refused_with_a_clear_error() {
        let mut frame = encode(&sample()).unwrap();
        frame[0] = 3;
        let err = decode(&frame).unwrap_err();
        assert!(matches!(err, WireError::Version(3)));
        assert_eq!(
            err.to_string(),
            "frame version 3 is not supported (this node speaks version 8)"
        );
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut frame = encode(&sample()).unwrap();
        frame.push(0);
        assert!(matches!(decode(&frame), Err(WireError::TrailingBytes(1))));
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        let big = Message::Repair {
            from: Actor::new("n", 1),
            entries: vec![(SlotId::new("r", "k".repeat(MAX_FRAME_BYTES), 0), vec![])],
        };
        assert!(matches!(encode(&big), Err(WireError::TooLarge(n)) if n > MAX_FRAME_BYTES));
        let mut frame = vec![0; MAX_FRAME_BYTES + 1];
        frame[0] = WIRE_VERSION;
        assert!(matches!(decode(&frame), Err(WireError::TooLarge(_))));
    }

    /// `[version][Repair][from: "" , generation 0][entries: 2^60 elements]`, and the same
    /// length claimed by a string: refused at once, without allocating for the claim.
    #[test]
    fn huge_length_prefixes_are_refused_without_allocating() {
        let mut huge = vec![253]; // varint marker: a u64 follows
        huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let deltas = 3; // variant index of Message::Repair
        let started = std::time::Instant::now();

        let mut vec_claim = vec![WIRE_VERSION, deltas, 0, 0];
        vec_claim.extend_from_slice(&huge);
        assert!(matches!(decode(&vec_claim), Err(WireError::Malformed(_))));

        let mut string_claim = vec![WIRE_VERSION, deltas];
        string_claim.extend_from_slice(&huge);
        let err = decode(&string_claim).unwrap_err();
        assert!(
            matches!(err, WireError::Malformed(DecodeError::LimitExceeded)),
            "{err:?}"
        );

        // Nested: one entry whose dot vector claims 2^60 dots.
        let mut nested = vec![WIRE_VERSION, deltas, 0, 0, 1, 1, b'r', 1, b'k', 0];
        nested.extend_from_slice(&huge);
        assert!(matches!(decode(&nested), Err(WireError::Malformed(_))));

        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in message()) {
            let frame = encode(&m).unwrap();
            prop_assert!(frame.len() <= MAX_FRAME_BYTES);
            prop_assert_eq!(decode(&frame).unwrap(), m);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = decode(&bytes);
            let mut framed = vec![WIRE_VERSION];
            framed.extend_from_slice(&bytes);
            let _ = decode(&framed);
        }

        /// Flipping any byte of a valid frame gives an error or some message, never a panic.
        #[test]
        fn corrupted_frames_never_panic(m in message(), at in any::<prop::sample::Index>(), x in 1u8..) {
            let mut frame = encode(&m).unwrap();
            let i = at.index(frame.len());
            frame[i] ^= x;
            let _ = decode(&frame);
        }
    }
}
