//! A partition's state: the manifest model, and the pure transitions that change it.
//!
//! A partition's whole mutable state is one object, `topics/{t}/{p}/manifest.json`
//! ([`Manifest`]), kept as a [`crate::cas::Cell`]: every change is a pure function of the
//! manifest applied by the one CAS protocol (docs/design.md §3). The submodules hold the
//! transitions, each a plain function over plain data with its own unit tests:
//!
//! * [`produce`]: plan which messages are new and which are retries (idempotency keys),
//!   then append a segment;
//! * [`settle`]: ack, extend, nack a lease;
//! * [`lease`]: hand out the lowest available offsets (per key, on ordered topics), park
//!   messages for dead-lettering;
//! * [`delay`]: runs of delayed offsets;
//! * [`compact`]: swap runs of segments for merged ones;
//! * [`combine`]: land segments any process may commit, each at most once;
//! * [`beside`]: segments written beside the manifest write that names them, undecided
//!   until their object (or a void marker) is found;
//! * [`intent`]: settles and lease requests any process may commit, each at most once;
//! * [`batch`]: one group commit's operations applied in their fixed order;
//! * [`rebuild`]: a corrupt partition's state again, from a checkpoint and its segments;
//! * [`recent`]: the recent write ids, and what they tell a writer whose answer was lost.
//!
//! Invariants every transition keeps (checked by the tests in [`batch`]):
//! * `version` strictly increases with every committed write, so two different states
//!   never share content (identical bytes could share an ETag on S3: the ABA hazard).
//! * `start_offset <= frontier <= next_offset`; every offset below `frontier` is settled.
//! * `acked_ahead` holds only offsets in `(frontier, next_offset)`; `leases` only offsets
//!   in `[frontier, next_offset)`, never one that is also in `acked_ahead`.
//! * `segments` are ordered by `base_offset`, contiguous, and cover
//!   `[start_offset, next_offset)`.
//!
//! A manifest whose `incarnation` sorts before the topic's is a leftover of a deleted
//! topic of the same name and reads as empty (its version kept, so versions keep
//! climbing). One that sorts after it means the caller's view of the topic is stale:
//! [`Invalid::Superseded`].

pub(crate) mod batch;
pub(crate) mod beside;
pub(crate) mod checkpoint;
pub(crate) mod codec;
pub(crate) mod combine;
pub(crate) mod compact;
pub(crate) mod dedup;
pub(crate) mod delay;
pub(crate) mod index;
pub(crate) mod intent;
pub(crate) mod lease;
pub(crate) mod ledger;
pub(crate) mod produce;
pub(crate) mod rebuild;
pub(crate) mod recent;
pub(crate) mod settle;
pub(crate) mod subscription;

pub(crate) use checkpoint::Checkpoints;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::cas::{Invalid, Stored, WriteFate, WriteMark};
use crate::settings::TopicSettings;

pub(crate) use dedup::{ChunkRef, Dedup};
pub(crate) use delay::Delayed;
pub(crate) use index::IndexRef;
pub(crate) use lease::{Grant, Leased};
pub(crate) use ledger::Ledger;
pub(crate) use settle::{Refused, Settle};

/// The topic settings the transitions obey, copied out of [`TopicSettings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// How long a lease lasts.
    pub visibility_timeout_ms: u64,
    /// Live leases at most.
    pub max_in_flight: u32,
    /// Offsets acked above the frontier at most.
    pub max_acked_ahead: u32,
    /// Deliveries before a message is parked for the dead-letter topic; 0: no limit.
    pub max_deliveries: u32,
    /// Segments whose newest message is older than this leave the partition.
    pub retention_ms: u64,
    /// How long an idempotency key is remembered.
    pub dedup_window_ms: u64,
    /// Per-key ordering ([`lease`]).
    pub ordered: bool,
}

impl From<&TopicSettings> for Rules {
    fn from(s: &TopicSettings) -> Self {
        Self {
            visibility_timeout_ms: s.visibility_timeout_ms,
            max_in_flight: s.max_in_flight_per_partition,
            max_acked_ahead: s.max_acked_ahead_per_partition,
            max_deliveries: s.max_deliveries,
            retention_ms: s.retention_ms,
            dedup_window_ms: s.dedup_window_ms,
            ordered: s.ordering == crate::settings::Ordering::Key,
        }
    }
}

/// The newest manifest format this code reads and writes. Format 1 (no `format` field, no
/// `indexes`), format 2 (no combining fields) and format 3 (no checksum trailer,
/// [`crate::cas::seal_json`]) are read as well and rewritten by the next commit. A version
/// that reads only format 2 refuses format 3 rather than drop `combined_through` (which
/// would let a segment land twice); one that reads only format 3 refuses format 4 at its
/// trailer. Format 5 adds `delayed`, and is written only while the partition holds delayed
/// messages (else format 4, byte for byte): a version that reads only format 4 then refuses
/// the manifest rather than deliver delayed messages early (docs/decisions.md). Format 6
/// adds `decided` and `decided_floor` ([`intent`]), and is written only while they hold
/// something, which only happens at fleet level 3 (docs/upgrades.md): a version that
/// reads only format 5 then refuses the manifest rather than lose the intents' outcomes.
/// Format 7 adds `beside` ([`beside`]), and is written only while it names a segment,
/// which only happens at fleet level 7: a version that reads only format 6 then refuses
/// the manifest rather than lease a message that may never have been stored.
pub(crate) const MANIFEST_FORMAT: u32 = 7;

/// The format written while intents' outcomes are kept and no segment is undecided.
const FORMAT_WITH_INTENTS: u32 = 6;

/// The format written when no message is delayed and no intent decided.
const FORMAT_WITHOUT_DELAYS: u32 = 4;

/// The format written when messages are delayed and no intent decided.
const FORMAT_WITH_DELAYS: u32 = 5;

/// Runs of delayed offsets one partition holds at most: a produce that would need more is
/// refused (429), which bounds the manifest (docs/design.md §6).
pub(crate) const MAX_DELAYED_RUNS: usize = 1000;

fn format_1() -> u32 {
    1
}

/// One immutable segment object and the offsets it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    /// Segment object id (the last part of its key).
    pub id: String,
    /// Offset of the segment's first message.
    pub base_offset: u64,
    /// Number of messages in it.
    pub count: u32,
    /// Produce time of its newest message (retention drops the segment after this).
    pub last_produced_ms: u64,
    /// Payload bytes in it.
    pub bytes: u64,
}

impl SegmentRef {
    /// The ref of segment `id` holding `seg`'s messages, not yet placed (base offset 0).
    pub(crate) fn of(id: String, seg: &crate::segment::Segment) -> Self {
        let messages = &seg.messages;
        SegmentRef {
            id,
            base_offset: 0,
            count: messages.len() as u32,
            last_produced_ms: messages.iter().map(|m| m.produced_at_ms).max().unwrap_or(0),
            bytes: messages.iter().map(|m| m.payload.len() as u64).sum(),
        }
    }
}

/// Delivery state of an unsettled message that has been delivered at least once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    /// The manifest version that granted the current lease; receipt handles carry it.
    pub lease_id: u64,
    /// Wall-clock ms until which the lease is live; at or after it the message is available.
    pub deadline_ms: u64,
    /// How many times the message has been delivered.
    pub delivery_count: u32,
    /// The message's [`lease::key_hash`], recorded when a per-key ordered topic leases
    /// it, so that ordering need not read its segment again (absent: not recorded).
    #[serde(default, rename = "k", skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<u32>,
}

/// A partition's whole mutable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// [`MANIFEST_FORMAT`] (1 when absent: written before formats were numbered).
    #[serde(default = "format_1")]
    pub format: u32,
    /// Strictly increasing with every write.
    pub version: u64,
    /// The topic incarnation this state belongs to.
    pub incarnation: String,
    /// Ids of the last writes, newest last.
    pub recent_writes: VecDeque<String>,
    /// The offset the next produced message gets.
    pub next_offset: u64,
    /// The oldest retained offset.
    pub start_offset: u64,
    /// The lowest unsettled offset.
    pub frontier: u64,
    /// Index objects describing the older retained segments, oldest first, contiguous,
    /// covering `[start_offset, segments[0].base_offset)`.
    #[serde(default)]
    pub indexes: Vec<IndexRef>,
    /// The newest retained segments ("hot") in offset order, up to `next_offset`.
    pub segments: Vec<SegmentRef>,
    /// Delivered, unsettled messages by offset (live or lapsed leases).
    pub leases: BTreeMap<u64, Lease>,
    /// Offsets acked above the frontier.
    pub acked_ahead: BTreeSet<u64>,
    /// Idempotency keys of the newest produces, by [`dedup::key_hash`] (format 1: by key).
    #[serde(default)]
    pub dedup: BTreeMap<String, Dedup>,
    /// Chunk objects holding older remembered keys, oldest first ([`dedup`]).
    #[serde(default)]
    pub dedup_chunks: Vec<ChunkRef>,
    /// Combinable segment ids at or below this are decided: landed or dead ([`combine`]).
    #[serde(default)]
    pub combined_through: String,
    /// The last combinable segments landed, with their base offsets, oldest first.
    #[serde(default)]
    pub landed: VecDeque<(String, u64)>,
    /// The highest id that left `landed`.
    #[serde(default)]
    pub landed_floor: String,
    /// Where its checkpoints stand ([`Checkpoints`]).
    #[serde(default, skip_serializing_if = "Checkpoints::is_none")]
    pub checkpoint: Checkpoints,
    /// Delayed offsets not yet due, ascending and disjoint (format 5; absent when none).
    /// A delayed message is unsettled: it holds the frontier until delivered and acked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delayed: Vec<Delayed>,
    /// The last intents applied, with what each got, oldest first (format 6; absent when
    /// none, [`intent`]).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub decided: VecDeque<(String, intent::Outcome)>,
    /// The highest intent id that left `decided` (format 6; absent when none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub decided_floor: String,
    /// Hot segments written beside the write that named them, not yet known to be stored
    /// (format 7; absent when none, [`beside`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub beside: BTreeSet<String>,
}

impl Manifest {
    /// Whether a write of this incarnation stored this state. False for a partition
    /// nothing was written to and for a deleted topic's leftover read as empty: a write
    /// from such a state creates the incarnation's manifest (the one kind of commit that
    /// must confirm the topic record first, docs/design.md §6).
    pub(crate) fn stored(&self) -> bool {
        !self.recent_writes.is_empty()
    }

    /// The state of a partition nothing has been written to.
    pub(crate) fn empty(incarnation: &str) -> Self {
        Self {
            format: MANIFEST_FORMAT,
            version: 0,
            incarnation: incarnation.to_owned(),
            recent_writes: VecDeque::new(),
            next_offset: 0,
            start_offset: 0,
            frontier: 0,
            indexes: Vec::new(),
            segments: Vec::new(),
            leases: BTreeMap::new(),
            acked_ahead: BTreeSet::new(),
            dedup: BTreeMap::new(),
            dedup_chunks: Vec::new(),
            combined_through: String::new(),
            landed: VecDeque::new(),
            landed_floor: String::new(),
            checkpoint: Checkpoints::default(),
            delayed: Vec::new(),
            decided: VecDeque::new(),
            decided_floor: String::new(),
            beside: BTreeSet::new(),
        }
    }

    /// Marks this write, at `now_ms`, to leave a checkpoint when one is due
    /// ([`Checkpoints::mark`]); true if it does.
    pub(crate) fn mark_checkpoint(&mut self, now_ms: u64, retention_ms: u64) -> bool {
        self.checkpoint.mark(self.version, now_ms, retention_ms)
    }

    /// When this state was marked to leave a checkpoint of itself: `Some(v)`, where `v`
    /// (0: none) is the checkpoint version to delete once it is written.
    pub(crate) fn wants_checkpoint(&self) -> Option<u64> {
        self.checkpoint.wanted(self.version)
    }

    /// A stored manifest (a checkpoint) if it reads and belongs to `incarnation` exactly
    /// ([`Stored::decode`] takes an older incarnation's manifest for an empty one).
    ///
    /// Errors: [`crate::cas::Newer`] when a newer build wrote it.
    pub(crate) fn decode_exact(
        data: &[u8],
        incarnation: &str,
    ) -> Result<Option<Manifest>, crate::cas::Newer> {
        let m = match Manifest::decode(data, &incarnation.to_owned()) {
            Ok(m) => m,
            Err(Invalid::Newer(newer)) => return Err(newer),
            Err(Invalid::Corrupt(_) | Invalid::Superseded) => return Ok(None),
        };
        let exact = || -> Option<bool> {
            let raw: serde_json::Value =
                serde_json::from_slice(crate::cas::open_json(data).ok()?).ok()?;
            Some(raw.get("incarnation")?.as_str()? == incarnation)
        };
        Ok(exact().unwrap_or(false).then_some(m))
    }

    /// Leases still live at `now_ms` ([`Ledger::in_flight`]).
    pub(crate) fn in_flight(&self, now_ms: u64) -> usize {
        Ledger::in_flight(self, now_ms)
    }

    #[cfg(test)]
    /// True when `offset` exists, is unsettled, has no live lease and is not delayed at
    /// `now_ms` ([`Ledger::is_available`]).
    pub(crate) fn is_available(&self, offset: u64, now_ms: u64) -> bool {
        Ledger::is_available(self, offset, now_ms)
    }

    /// Where the retained offset `offset` is described: a hot segment, or an index.
    pub(crate) fn locate(&self, offset: u64) -> Option<Located<'_>> {
        locate(
            (self.start_offset, self.next_offset),
            &self.indexes,
            &self.segments,
            offset,
        )
    }

    /// The average payload size of the segment (or index) holding `offset`: what leasing
    /// it is expected to add to a response; 0 when it is not retained.
    pub(crate) fn message_bytes_estimate(&self, offset: u64) -> u64 {
        match self.locate(offset) {
            Some(Located::Hot(s)) => s.bytes.div_ceil(u64::from(s.count.max(1))),
            Some(Located::Indexed(r)) => r
                .bytes
                .div_ceil(r.end_offset.saturating_sub(r.base_offset).max(1)),
            None => 0,
        }
    }

    #[cfg(test)]
    /// The hot segment holding `offset`, if any.
    pub(crate) fn segment_for(&self, offset: u64) -> Option<&SegmentRef> {
        hot_segment(&self.segments, offset)
    }

    /// Where this state's retained offsets are.
    pub(crate) fn layout(&self) -> Layout {
        Layout {
            start_offset: self.start_offset,
            next_offset: self.next_offset,
            indexes: self.indexes.clone(),
            segments: self.segments.clone(),
            undecided: self.beside.clone(),
        }
    }

    /// Retained segment objects, hot and indexed.
    pub(crate) fn retained_segments(&self) -> u64 {
        self.segments.len() as u64 + self.indexes.iter().map(|r| r.segments).sum::<u64>()
    }

    /// Retained payload bytes, hot and indexed.
    pub(crate) fn retained_bytes(&self) -> u64 {
        let hot: u64 = self.segments.iter().map(|s| s.bytes).sum();
        hot + self.indexes.iter().map(|r| r.bytes).sum::<u64>()
    }

    /// Advances the frontier past every contiguous acked offset.
    pub(crate) fn advance_frontier(&mut self) {
        self.parts_mut().advance_frontier();
    }

    /// The hot segment holding `offset`, if it is one of the manifest's own (not behind
    /// an index object).
    pub(crate) fn hot_segment_of(&self, offset: u64) -> Option<&SegmentRef> {
        hot_segment(&self.segments, offset)
    }

    /// Removes every retained message, available, in flight or acked ahead (a purge):
    /// the partition then starts at `next_offset`, and every outstanding lease is gone.
    pub(crate) fn purge(&mut self) -> Dropped {
        // Retention with a cutoff later than any produce time drops everything.
        self.apply_retention(u64::MAX, 0)
    }

    /// Whether [`Manifest::apply_retention`] would drop anything (without the copy a
    /// trial run on a clone costs).
    pub(crate) fn retention_drops(&self, now_ms: u64, retention_ms: u64) -> bool {
        let cutoff = now_ms.saturating_sub(retention_ms);
        match self.indexes.first() {
            Some(oldest) => oldest.last_produced_ms < cutoff,
            None => self
                .segments
                .first()
                .is_some_and(|s| s.last_produced_ms < cutoff),
        }
    }

    /// Drops the oldest indexes and segments whose newest message is older than
    /// `retention_ms` at `now_ms` (a prefix: everything before the first one still
    /// retained), with every lease and ack below the new start. Returns what was dropped;
    /// the caller deletes the objects after the write commits.
    pub(crate) fn apply_retention(&mut self, now_ms: u64, retention_ms: u64) -> Dropped {
        let cutoff = now_ms.saturating_sub(retention_ms);
        let kept_index = self
            .indexes
            .iter()
            .position(|r| r.last_produced_ms >= cutoff);
        let n = kept_index.unwrap_or(self.indexes.len());
        let indexes: Vec<IndexRef> = self.indexes.drain(..n).collect();
        let segments: Vec<SegmentRef> = if kept_index.is_some() {
            Vec::new()
        } else {
            let kept = self
                .segments
                .iter()
                .position(|s| s.last_produced_ms >= cutoff);
            let n = kept.unwrap_or(self.segments.len());
            self.segments.drain(..n).collect()
        };
        if indexes.is_empty() && segments.is_empty() {
            return Dropped::default();
        }
        self.start_offset = match (self.indexes.first(), self.segments.first()) {
            (Some(r), _) => r.base_offset,
            (None, Some(s)) => s.base_offset,
            (None, None) => self.next_offset,
        };
        let start = self.start_offset;
        self.leases.retain(|o, _| *o >= start);
        self.acked_ahead.retain(|o| *o >= start);
        self.delayed.retain(|d| d.to > start);
        if self.frontier < start {
            self.frontier = start;
        }
        // An ack at the new start is now contiguous with the frontier.
        self.advance_frontier();
        beside::forget_dropped(self);
        Dropped { segments, indexes }
    }
}

/// Where a partition's retained offsets were as of one manifest version: enough to find
/// the segment of any of them, through index objects for the older ones. Segments and
/// index objects are immutable, so a layout stays right for every offset it covers until
/// retention removes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Oldest retained offset.
    pub start_offset: u64,
    /// One past the newest offset.
    pub next_offset: u64,
    /// The manifest's index refs.
    pub indexes: Vec<IndexRef>,
    /// The manifest's hot segments.
    pub segments: Vec<SegmentRef>,
    /// The hot segments written beside their manifest write and not yet decided
    /// ([`Manifest::beside`]): one not stored yet holds nothing *yet*.
    pub undecided: BTreeSet<String>,
}

impl Layout {
    /// As [`Manifest::locate`].
    pub(crate) fn locate(&self, offset: u64) -> Option<Located<'_>> {
        locate(
            (self.start_offset, self.next_offset),
            &self.indexes,
            &self.segments,
            offset,
        )
    }

    /// Up to `n` hot segments after the one holding `offset` (for read-ahead).
    pub(crate) fn hot_after(&self, offset: u64, n: usize) -> &[SegmentRef] {
        let i = self.segments.partition_point(|s| s.base_offset <= offset);
        let end = (i + n).min(self.segments.len());
        &self.segments[i.min(end)..end]
    }
}

fn hot_segment(segments: &[SegmentRef], offset: u64) -> Option<&SegmentRef> {
    let i = segments.partition_point(|s| s.base_offset <= offset);
    let seg = segments.get(i.checked_sub(1)?)?;
    (offset < seg.base_offset + u64::from(seg.count)).then_some(seg)
}

fn locate<'a>(
    (start, next): (u64, u64),
    indexes: &'a [IndexRef],
    segments: &'a [SegmentRef],
    offset: u64,
) -> Option<Located<'a>> {
    if offset < start || offset >= next {
        return None;
    }
    if let Some(seg) = hot_segment(segments, offset) {
        return Some(Located::Hot(seg));
    }
    let i = indexes
        .partition_point(|r| r.base_offset <= offset)
        .checked_sub(1)?;
    let r = &indexes[i];
    r.covers(offset).then_some(Located::Indexed(r))
}

/// Where a retained offset is described ([`Manifest::locate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Located<'a> {
    /// In this hot segment.
    Hot(&'a SegmentRef),
    /// Under this index object.
    Indexed(&'a IndexRef),
}

/// What retention removed from a manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// Hot segments.
    pub segments: Vec<SegmentRef>,
    /// Index objects, with everything under them.
    pub indexes: Vec<IndexRef>,
}

impl Stored for Manifest {
    /// The topic incarnation the caller knows.
    type Context = String;

    fn absent(incarnation: &String) -> Self {
        Manifest::empty(incarnation)
    }

    fn decode(data: &[u8], incarnation: &String) -> Result<Self, Invalid> {
        let mut stored: Manifest = serde_json::from_slice(crate::cas::open_json(data)?)
            .map_err(|e| Invalid::Corrupt(e.to_string()))?;
        if stored.format > MANIFEST_FORMAT {
            return Err(Invalid::Newer(crate::cas::Newer {
                what: "manifest format",
                found: stored.format.into(),
                known: MANIFEST_FORMAT.into(),
            }));
        }
        if stored.format == 1 {
            // Format 1 kept idempotency keys as they were sent, and had no indexes.
            stored.dedup = std::mem::take(&mut stored.dedup)
                .into_iter()
                .map(|(k, d)| (dedup::key_hash(&k), d))
                .collect();
        }
        stored.format = MANIFEST_FORMAT;
        // Left over from a deleted topic of the same name: start afresh.
        let stored_incarnation = stored.incarnation.clone();
        crate::cas::of_generation((&stored_incarnation, incarnation), stored, |old| Manifest {
            version: old.version,
            ..Manifest::empty(incarnation)
        })
    }

    fn encode(&self) -> Result<Bytes, crate::cas::EncodeError> {
        Ok(crate::cas::seal_json(serde_json::to_vec(self)?))
    }

    fn next_write(&mut self) {
        self.version += 1;
    }

    fn stamp(&mut self, write_id: &str) -> Option<WriteMark> {
        // The oldest format that holds this content, so versions that cannot read
        // delays refuse only manifests that have some.
        self.format = if !self.beside.is_empty() {
            MANIFEST_FORMAT
        } else if !self.decided.is_empty() || !self.decided_floor.is_empty() {
            FORMAT_WITH_INTENTS
        } else if self.delayed.is_empty() {
            FORMAT_WITHOUT_DELAYS
        } else {
            FORMAT_WITH_DELAYS
        };
        // Stamped with this build's level: `narad upgrade` tells the writes of builds
        // that cannot read a level by it ([`crate::formats::stamp_write`]).
        Some(recent::record(
            &mut self.recent_writes,
            write_id,
            self.version,
        ))
    }

    fn fate_of(&self, mark: &WriteMark) -> WriteFate {
        recent::fate(&self.recent_writes, self.version, mark)
    }
}

/// Builders shared by the transition tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::intent::{Ask, Intent};
    use super::*;

    /// The intent asking `ask`, written at `t` with unique part `u`.
    pub(crate) fn intent(t: u64, u: &str, ask: Ask) -> Intent {
        Intent::parse(&Intent::id(t, "", u, ask)).expect("a canonical intent id parses")
    }

    /// An ack of `offset` under `lease_id`, as an intent asks it.
    pub(crate) fn ack_ask(offset: u64, lease_id: u64) -> Ask {
        Ask::Settle {
            offset,
            lease_id,
            action: Settle::Ack,
        }
    }

    /// Default topic rules.
    pub(crate) fn rules() -> Rules {
        Rules::from(&TopicSettings::default())
    }

    /// A manifest holding offsets `0..n` in one segment produced at time 0.
    pub(crate) fn manifest_with(n: u64) -> Manifest {
        let mut m = Manifest::empty("i");
        m.segments.push(SegmentRef {
            id: "s0".into(),
            base_offset: 0,
            count: n as u32,
            last_produced_ms: 0,
            bytes: n,
        });
        m.next_offset = n;
        m
    }

    /// A manifest of hot segments `s0`, `s1`, … holding `counts` messages each.
    pub(crate) fn manifest_of(counts: &[u32]) -> Manifest {
        let mut m = Manifest::empty("i");
        for (i, &count) in counts.iter().enumerate() {
            m.segments.push(SegmentRef {
                id: format!("s{i}"),
                base_offset: m.next_offset,
                count,
                last_produced_ms: 0,
                bytes: u64::from(count),
            });
            m.next_offset += u64::from(count);
        }
        m
    }

    /// Leases `offsets` with `lease_id` until `deadline_ms`, as delivered once.
    pub(crate) fn leased(m: &mut Manifest, offsets: &[u64], lease_id: u64, deadline_ms: u64) {
        for &o in offsets {
            m.leases.insert(
                o,
                Lease {
                    lease_id,
                    deadline_ms,
                    delivery_count: 1,
                    key_hash: None,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cas::{Cell, Decision, Pure};
    use crate::clock::SequentialIds;
    use crate::store::memory::MemoryStore;
    use crate::store::Store;

    pub(crate) fn seg(id: &str, base: u64, count: u32, t: u64) -> SegmentRef {
        SegmentRef {
            id: id.into(),
            base_offset: base,
            count,
            last_produced_ms: t,
            bytes: 1,
        }
    }

    #[test]
    fn segment_lookup() {
        let mut m = Manifest::empty("i");
        m.segments = vec![seg("a", 0, 2, 0), seg("b", 2, 3, 0)];
        m.next_offset = 5;
        assert_eq!(m.segment_for(0).map(|s| s.id.as_str()), Some("a"));
        assert_eq!(m.segment_for(1).map(|s| s.id.as_str()), Some("a"));
        assert_eq!(m.segment_for(2).map(|s| s.id.as_str()), Some("b"));
        assert_eq!(m.segment_for(4).map(|s| s.id.as_str()), Some("b"));
        assert!(m.segment_for(5).is_none());
    }

    #[test]
    fn retention_moves_start_and_frontier() {
        let mut m = Manifest::empty("i");
        m.segments = vec![
            seg("a", 0, 2, 100),
            seg("b", 2, 2, 200),
            seg("c", 4, 1, 300),
        ];
        m.next_offset = 5;
        m.leases.insert(
            1,
            Lease {
                lease_id: 1,
                deadline_ms: 9999,
                delivery_count: 1,
                key_hash: None,
            },
        );
        m.acked_ahead.insert(3);
        let dropped = m.apply_retention(1150, 1000);
        assert_eq!(dropped.segments.len(), 1);
        assert_eq!((m.start_offset, m.frontier), (2, 2));
        assert!(m.leases.is_empty());
        let dropped = m.apply_retention(1250, 1000);
        assert_eq!(dropped.segments.len(), 1);
        assert_eq!((m.start_offset, m.frontier), (4, 4));
        assert!(m.acked_ahead.is_empty());
        m.apply_retention(5000, 1000);
        assert_eq!((m.start_offset, m.frontier, m.next_offset), (5, 5, 5));
    }

    #[test]
    fn retention_drops_says_whether_retention_would_drop_anything() {
        let segs = || {
            vec![
                seg("a", 0, 2, 100),
                seg("b", 2, 2, 200),
                seg("c", 4, 1, 300),
            ]
        };
        let mut hot = Manifest::empty("i");
        hot.segments = segs();
        hot.next_offset = 5;
        // The same messages, the first two segments folded into an index object.
        let mut folded = hot.clone();
        folded.indexes = vec![super::index::ref_for_segments("x".into(), &segs()[..2])];
        folded.segments.drain(..2);
        for m in [hot, folded, Manifest::empty("i")] {
            for now in (0..1500).step_by(25) {
                let mut after = m.clone();
                let dropped = after.apply_retention(now, 1000);
                let any = !dropped.segments.is_empty() || !dropped.indexes.is_empty();
                assert_eq!(m.retention_drops(now, 1000), any, "at {now}: {m:?}");
            }
        }
    }

    fn bump(m: &mut Manifest) -> Result<Decision<()>, ()> {
        m.next_offset += 1;
        Ok(Decision::Commit(()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_updates_all_land_with_increasing_versions() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let ids = Arc::new(SequentialIds::default());
        let inc = "i".to_string();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (store, ids, inc) = (store.clone(), ids.clone(), inc.clone());
            tasks.push(tokio::spawn(async move {
                let cell = Cell::<Manifest>::new(&*store, &*ids, "m", &inc);
                for _ in 0..10 {
                    cell.update(Pure(bump)).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let cell = Cell::<Manifest>::new(&*store, &*ids, "m", &inc);
        let snap = cell.read::<()>().await.unwrap();
        assert_eq!(snap.value.next_offset, 80);
        assert_eq!(snap.value.version, 80);
    }

    #[tokio::test]
    async fn other_incarnation_reads_as_empty() {
        let store = MemoryStore::new();
        let ids = SequentialIds::default();
        let (old, new) = ("a-old".to_string(), "b-new".to_string());
        let old_cell = Cell::<Manifest>::new(&store, &ids, "m", &old);
        let new_cell = Cell::<Manifest>::new(&store, &ids, "m", &new);
        old_cell
            .update(Pure(|m: &mut Manifest| {
                m.next_offset = 7;
                Ok::<_, ()>(Decision::Commit(()))
            }))
            .await
            .unwrap();
        let snap = new_cell.read::<()>().await.unwrap();
        assert_eq!(snap.value.next_offset, 0);
        assert_eq!(snap.value.version, 1);
        let (_, m) = new_cell
            .update(Pure(|_: &mut Manifest| Ok::<_, ()>(Decision::Commit(()))))
            .await
            .unwrap();
        let m = m.value;
        assert_eq!(
            (m.version, m.next_offset, m.incarnation.as_str()),
            (2, 0, "b-new")
        );
        // The old incarnation's view is stale now.
        let stale = old_cell.read::<()>().await;
        assert!(matches!(stale, Err(crate::cas::CasError::Superseded)));
    }
}
