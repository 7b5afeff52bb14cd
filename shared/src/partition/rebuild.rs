//! Rebuilding a partition whose manifest is corrupt or gone (docs/design.md §7), from
//! what survives it: the newest readable checkpoint (a copy of an earlier manifest, written
//! at least every [`super::CHECKPOINT_EVERY`] versions) and the segment objects.
//!
//! What the lost manifest said after the checkpoint is unknown: which segments it
//! committed, which offsets it handed out, which messages were settled. So the rebuilt
//! state assumes the worst in the direction that loses nothing:
//! * every segment the checkpoint does not name (committed after it, or an orphan of a
//!   produce that failed) is delivered: nothing acknowledged is lost, and a produce that
//!   answered an error may be delivered after all (at least once);
//! * every message the checkpoint had not settled is delivered again;
//! * all of them get **fresh offsets**, above every offset the lost manifest can have
//!   handed out (the checkpoint's next offset plus every message it did not name), so no
//!   offset ever names two payloads. Every offset below is retired, settled history
//!   included (the lost range would break the offsets' contiguity): a replay of one is
//!   410 `offset_expired`, and a receipt handle for one is 410 `lease_gone`.
//!
//! Leases and acks ahead are not carried over (the messages come again at once). The
//! checkpoint's delays are, for the messages that move (a segment does not record a delay,
//! so a recovered delayed message comes at once). Idempotency keys are kept too: those the checkpoint remembers (a key whose message moved points
//! to its new offset), and those of every recovered message, read from its
//! [`IDEMPOTENCY_HEADER`], so a producer retrying a produce the lost manifest had committed (or
//! that answered an error) gets that message's new offset, not a second copy.

use std::collections::HashMap;

use serde::Serialize;

use super::combine::Combinable;
use super::{Manifest, SegmentRef};
use crate::segment::{Segment, IDEMPOTENCY_HEADER};

/// How far a rebuilt manifest's version jumps past the checkpoint's: more versions than
/// can have been written since (a checkpoint is at most [`super::CHECKPOINT_EVERY`]
/// versions old when its writes succeed), so versions keep climbing.
pub const VERSION_JUMP: u64 = 1 << 20;

/// What survives of a partition.
#[derive(Debug, Clone, Default)]
pub(crate) struct Evidence {
    /// The newest readable checkpoint of this incarnation, if any.
    pub checkpoint: Option<Manifest>,
    /// The checkpoint's segments holding an offset at or above its frontier, in offset
    /// order, with their base offsets then (hot ones, and ones found through its indexes).
    pub unsettled: Vec<SegmentRef>,
    /// Segments the checkpoint does not name, with their message counts (bases unknown).
    pub unnamed: Vec<SegmentRef>,
    /// One past the highest offset any surviving index object names (for a partition
    /// without a checkpoint).
    pub floor: u64,
    /// Segments that exist but cannot be read: their messages are lost.
    pub unreadable: Vec<String>,
    /// The newest intent id found among the segments ([`super::intent`]; empty: none).
    pub newest_intent: String,
    /// The idempotency keys of the unnamed segments' messages: segment id → (index in
    /// the segment, key, produce time).
    pub keys: HashMap<String, Vec<(u32, String, u64)>>,
}

impl Evidence {
    /// Adds segment `id`, which the checkpoint does not name, and its messages'
    /// idempotency keys. A void marker ([`Segment::void`]) holds none and is left out.
    pub(crate) fn add_unnamed(&mut self, id: String, seg: &Segment) {
        if seg.void {
            return;
        }
        let keys: Vec<(u32, String, u64)> = (0u32..)
            .zip(&seg.messages)
            .filter_map(|(i, m)| {
                let key = m.headers.get(IDEMPOTENCY_HEADER)?;
                Some((i, key.clone(), m.produced_at_ms))
            })
            .collect();
        if !keys.is_empty() {
            self.keys.insert(id.clone(), keys);
        }
        self.unnamed.push(SegmentRef::of(id, seg));
    }
}

/// What a rebuild restores and what it retires.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The checkpoint it started from.
    pub checkpoint_version: Option<u64>,
    /// Offsets `[from, to)` that are no longer readable: the checkpoint's retained ones
    /// (settled history is not kept) and every one the lost manifest may have handed out.
    pub retired: (u64, u64),
    /// Messages the checkpoint had not settled: delivered again, at new offsets.
    pub redelivered: u64,
    /// Messages of segments the checkpoint did not name, at new offsets.
    pub recovered: u64,
    /// How many such segments.
    pub recovered_segments: usize,
    /// Idempotency keys of those messages, remembered again.
    pub recovered_keys: usize,
    /// Unnamed segments left out because each of their messages is a produce that is
    /// there already (see [`lands_twice`]).
    pub duplicate_segments: usize,
    /// Messages of recovered segments that are second copies of a produce that is there
    /// already (their idempotency key remembered): settled at once, never delivered.
    pub duplicates_settled: usize,
    /// The rebuilt partition's offsets `[start, next)`.
    pub offsets: (u64, u64),
    /// Segments left out because they cannot be read (their messages are lost).
    pub unreadable_segments: Vec<String>,
}

/// True when every message of the unnamed segment `s` (whose idempotency keys are `keys`)
/// carries a key `m` already remembers, live when it was produced: each is a produce that
/// is in the partition already (at an offset the checkpoint knows, or in a segment
/// recovered before this one), and `s` is a second copy of it: the orphan of a produce
/// retried with its key, or a combinable segment written again after a commit passed it
/// over. Recovering it too would put one payload at two offsets. A segment with a message
/// without a key is always recovered (nothing tells it apart from a new produce).
fn lands_twice(m: &Manifest, s: &SegmentRef, keys: &[(u32, String, u64)]) -> bool {
    let keyed: std::collections::HashSet<u32> = keys
        .iter()
        .filter(|(i, ..)| *i < s.count)
        .map(|(i, ..)| *i)
        .collect();
    s.count > 0
        && keyed.len() == s.count as usize
        && keys
            .iter()
            .filter(|(i, ..)| *i < s.count)
            .all(|(_, key, at)| m.dedup_lookup(key, *at).is_some())
}

/// The rebuilt manifest of `incarnation` from `ev`, remembering recovered messages'
/// idempotency keys for `dedup_window_ms` from their produce.
pub(crate) fn rebuild(
    incarnation: &str,
    mut ev: Evidence,
    dedup_window_ms: u64,
) -> (Manifest, Report) {
    let ckpt = ev
        .checkpoint
        .take()
        .unwrap_or_else(|| Manifest::empty(incarnation));
    ev.unsettled.sort_by_key(|s| s.base_offset);
    ev.unnamed.sort_by(|a, b| a.id.cmp(&b.id));
    let count = |v: &[SegmentRef]| v.iter().map(|s| u64::from(s.count)).sum::<u64>();
    let recovered = count(&ev.unnamed);
    let bound = ckpt.next_offset.max(ev.floor) + recovered;
    let mut m = Manifest::empty(incarnation);
    m.version = ckpt.version + VERSION_JUMP;
    m.start_offset = bound;
    m.frontier = bound;
    m.next_offset = bound;
    m.dedup = ckpt.dedup.clone();
    m.dedup_chunks = ckpt.dedup_chunks.clone();
    for s in &ev.unsettled {
        // A remembered key of a message that moves follows it (new offsets are all above
        // the old ones, so none is moved twice).
        let (old, new, end) = (
            s.base_offset,
            m.next_offset,
            s.base_offset + u64::from(s.count),
        );
        for d in m.dedup.values_mut() {
            if (old..end).contains(&d.offset) {
                d.offset = new + (d.offset - old);
            }
        }
        // So does a delay (runs stay in offset order: segments and runs are).
        for d in &ckpt.delayed {
            let (lo, hi) = (d.from.max(old), d.to.min(end));
            if lo < hi {
                m.delay(new + (lo - old), new + (hi - old), d.until_ms);
            }
        }
        m.segments.push(SegmentRef {
            base_offset: new,
            ..s.clone()
        });
        m.next_offset += u64::from(s.count);
    }
    // Segments the checkpoint named undecided stay so at their new offsets: the object
    // at each key decides them, as before the rebuild (§6).
    m.beside = ckpt.beside.clone();
    super::beside::forget_dropped(&mut m);
    let mut recovered_keys = 0;
    let mut duplicate_segments = 0;
    let mut duplicates_settled = 0;
    for s in &ev.unnamed {
        if lands_twice(&m, s, ev.keys.get(&s.id).map_or(&[], Vec::as_slice)) {
            duplicate_segments += 1;
            continue;
        }
        let base = m.next_offset;
        for (i, key, at) in ev.keys.get(&s.id).into_iter().flatten() {
            if *i >= s.count {
                continue;
            }
            if m.dedup_lookup(key, *at).is_some() {
                // A second copy of a produce that is there already (a retry's, in a
                // segment with other messages): settled at once, never delivered.
                m.acked_ahead.insert(base + u64::from(*i));
                duplicates_settled += 1;
            } else {
                let expires = at.saturating_add(dedup_window_ms);
                m.dedup_insert(key, base + u64::from(*i), expires, 0);
                recovered_keys += 1;
            }
        }
        m.segments.push(SegmentRef {
            base_offset: base,
            ..s.clone()
        });
        m.next_offset += u64::from(s.count);
    }
    m.advance_frontier();
    // Every combinable segment seen is decided now (landed here): none lands twice.
    let newest = ev
        .unnamed
        .iter()
        .filter(|s| Combinable::parse(&s.id).is_some())
        .map(|s| s.id.clone())
        .max()
        .unwrap_or_default();
    m.combined_through = ckpt
        .combined_through
        .clone()
        .max(newest)
        .max(ev.newest_intent.clone());
    m.landed_floor = m.combined_through.clone();
    // Every intent seen is decided too, its outcome unknown (its writer answers 503):
    // the leases it would settle are retired, and a lease it would take is granted
    // afresh to whoever asks next. Set only where intents were in use, so that a
    // rebuild never writes a format older builds cannot read.
    if !ev.newest_intent.is_empty() || !ckpt.decided_floor.is_empty() || !ckpt.decided.is_empty() {
        m.decided_floor = m.combined_through.clone();
    }
    let report = Report {
        checkpoint_version: (ckpt.version > 0).then_some(ckpt.version),
        retired: (ckpt.start_offset, bound),
        redelivered: count(&ev.unsettled),
        recovered,
        recovered_segments: ev.unnamed.len() - duplicate_segments,
        recovered_keys,
        duplicate_segments,
        duplicates_settled,
        offsets: (m.start_offset, m.next_offset),
        unreadable_segments: std::mem::take(&mut ev.unreadable),
    };
    (m, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{leased, manifest_with};

    fn seg(id: &str, base: u64, count: u32) -> SegmentRef {
        SegmentRef {
            id: id.into(),
            base_offset: base,
            count,
            last_produced_ms: 1,
            bytes: u64::from(count),
        }
    }

    #[test]
    fn unsettled_and_unnamed_messages_get_fresh_offsets_above_any_handed_out() {
        // Checkpoint: offsets 0..10 in two segments, frontier 6, a lease on 7.
        let mut ckpt = manifest_with(0);
        ckpt.segments = vec![seg("a", 0, 5), seg("b", 5, 5)];
        ckpt.next_offset = 10;
        ckpt.frontier = 6;
        ckpt.version = 32;
        leased(&mut ckpt, &[7], 30, 9999);
        let ev = Evidence {
            unsettled: vec![seg("b", 5, 5)],
            unnamed: vec![seg("d", 0, 2), seg("c", 0, 3)],
            checkpoint: Some(ckpt),
            ..Evidence::default()
        };
        let (m, r) = rebuild("i", ev, 1000);
        // 10 offsets known, 5 more may have been handed out for c and d: fresh from 15.
        assert_eq!((m.start_offset, m.frontier, m.next_offset), (15, 15, 25));
        let placed: Vec<(&str, u64)> = m
            .segments
            .iter()
            .map(|s| (s.id.as_str(), s.base_offset))
            .collect();
        assert_eq!(placed, vec![("b", 15), ("c", 20), ("d", 23)]);
        assert!(m.leases.is_empty() && m.acked_ahead.is_empty());
        assert_eq!(m.version, 32 + VERSION_JUMP);
        assert_eq!(
            r,
            Report {
                checkpoint_version: Some(32),
                retired: (0, 15),
                redelivered: 5,
                recovered: 5,
                recovered_segments: 2,
                recovered_keys: 0,
                duplicate_segments: 0,
                duplicates_settled: 0,
                offsets: (15, 25),
                unreadable_segments: Vec::new(),
            }
        );
    }

    #[test]
    fn keys_and_delays_follow_their_messages_and_recovered_keys_are_remembered() {
        // Checkpoint: "early" got offset 2 (settled), "moved" offset 6 (unsettled, in b).
        let mut ckpt = manifest_with(0);
        ckpt.segments = vec![seg("a", 0, 5), seg("b", 5, 5)];
        ckpt.next_offset = 10;
        ckpt.frontier = 6;
        ckpt.dedup_insert("early", 2, 5000, 0);
        ckpt.dedup_insert("moved", 6, 5000, 0);
        // Offsets 4..8 delayed: 4 is in segment a (retired), 5..8 in b, which moves.
        ckpt.delay(4, 8, 9000);
        let mut keys = HashMap::new();
        // c's message 1 was produced with "late" after the checkpoint; 9 is out of range.
        keys.insert(
            "c".to_owned(),
            vec![(1, "late".to_owned(), 700), (9, "bogus".to_owned(), 700)],
        );
        let ev = Evidence {
            unsettled: vec![seg("b", 5, 5)],
            unnamed: vec![seg("c", 0, 3)],
            checkpoint: Some(ckpt),
            keys,
            ..Evidence::default()
        };
        let (m, r) = rebuild("i", ev, 1000);
        // Fresh offsets from 13: b at 13..18, c at 18..21.
        assert_eq!(
            m.dedup_lookup("early", 0),
            Some(2),
            "settled: left as it was"
        );
        assert_eq!(m.dedup_lookup("moved", 0), Some(14), "follows its message");
        assert_eq!(
            m.dedup_lookup("late", 0),
            Some(19),
            "recovered from the segment"
        );
        assert_eq!(m.dedup_lookup("late", 1699), Some(19));
        assert_eq!(m.dedup_lookup("late", 1700), None, "for the dedup window");
        assert_eq!(m.dedup_lookup("bogus", 0), None);
        assert_eq!(r.recovered_keys, 1);
        // b's offsets 5..8 moved to 13..16 with their delay; a's offset 4 is gone.
        assert_eq!(m.delayed_until(13, 0), Some(9000));
        assert_eq!(m.delayed_until(15, 0), Some(9000));
        assert_eq!(m.delayed_until(16, 0), None);
        assert_eq!(m.delayed.len(), 1, "{:?}", m.delayed);
    }

    #[test]
    fn a_second_copy_of_keyed_produces_is_not_recovered_twice() {
        // The checkpoint remembers "k1" at offset 3; after it, "k2" was produced, its
        // commit lost, and produced again in a second segment ("d" holds both again, as a
        // combinable segment written anew would).
        let mut ckpt = manifest_with(0);
        ckpt.segments = vec![seg("a", 0, 5)];
        ckpt.next_offset = 5;
        ckpt.frontier = 5;
        ckpt.dedup_insert("k1", 3, 5000, 0);
        let mut keys = HashMap::new();
        keys.insert("b".to_owned(), vec![(0, "k1".to_owned(), 100)]);
        keys.insert("c".to_owned(), vec![(0, "k2".to_owned(), 200)]);
        keys.insert(
            "d".to_owned(),
            vec![(0, "k2".to_owned(), 200), (1, "k1".to_owned(), 100)],
        );
        // "e" has k2 and a message without a key: it could be a new produce, so it stays.
        keys.insert("e".to_owned(), vec![(0, "k2".to_owned(), 200)]);
        // "f": k1 again, produced after its window ended: a new produce.
        keys.insert("f".to_owned(), vec![(0, "k1".to_owned(), 6000)]);
        let ev = Evidence {
            unnamed: vec![
                seg("b", 0, 1),
                seg("c", 0, 1),
                seg("d", 0, 2),
                seg("e", 0, 2),
                seg("f", 0, 1),
            ],
            checkpoint: Some(ckpt),
            keys,
            ..Evidence::default()
        };
        let (m, r) = rebuild("i", ev, 1000);
        let placed: Vec<(&str, u64)> = m
            .segments
            .iter()
            .map(|s| (s.id.as_str(), s.base_offset))
            .collect();
        // Offsets above all that the lost manifest may have handed out, copies included.
        assert_eq!(m.start_offset, 5 + 7);
        assert_eq!(placed, vec![("c", 12), ("e", 13), ("f", 15)]);
        assert_eq!((r.duplicate_segments, r.recovered_segments), (2, 3));
        assert_eq!(m.dedup_lookup("k2", 0), Some(12), "the first copy's offset");
        // e's copy of k2 (offset 13) is settled at once; its keyless message (14) is not.
        assert_eq!(r.duplicates_settled, 1);
        assert_eq!(m.acked_ahead.iter().copied().collect::<Vec<_>>(), vec![13]);
        assert_eq!(m.frontier, 12);
        assert_eq!(
            m.dedup_lookup("k1", 6000),
            Some(15),
            "a new produce after the window"
        );
    }

    #[test]
    fn an_undecided_segment_stays_undecided_and_a_void_marker_is_no_segment() {
        // Checkpoint: b (offsets 2..4) was written beside its manifest write, undecided.
        let mut ckpt = manifest_with(0);
        ckpt.segments = vec![seg("a", 0, 2), seg("b", 2, 2)];
        ckpt.next_offset = 4;
        ckpt.beside.insert("b".into());
        let mut ev = Evidence {
            unsettled: vec![seg("a", 0, 2), seg("b", 2, 2)],
            checkpoint: Some(ckpt),
            ..Evidence::default()
        };
        ev.add_unnamed("v".into(), &Segment::void_marker());
        let (m, r) = rebuild("i", ev, 1000);
        assert_eq!(r.recovered_segments, 0, "a void marker recovers nothing");
        assert_eq!(m.segments.len(), 2);
        assert_eq!(m.beside.iter().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(
            super::super::beside::run(&m, m.next_offset - 1),
            Some(m.next_offset)
        );
    }

    #[test]
    fn without_a_checkpoint_every_segment_is_delivered_above_the_index_floor() {
        let ev = Evidence {
            unnamed: vec![seg("x", 0, 4)],
            floor: 100,
            ..Evidence::default()
        };
        let (m, r) = rebuild("i", ev, 1000);
        assert_eq!((m.start_offset, m.next_offset), (104, 108));
        assert_eq!(r.checkpoint_version, None);
        assert_eq!(m.version, VERSION_JUMP);
    }

    #[test]
    fn intents_seen_are_decided_with_their_outcome_unknown() {
        use crate::partition::intent::{self, Ask, Intent, Status};
        let mut ckpt = manifest_with(2);
        ckpt.version = 16;
        let ack = Ask::Settle {
            offset: 0,
            lease_id: 3,
            action: super::super::Settle::Ack,
        };
        let id = Intent::id(50, "", "w", ack);
        let ev = Evidence {
            checkpoint: Some(ckpt.clone()),
            newest_intent: id.clone(),
            ..Evidence::default()
        };
        let (m, _) = rebuild("i", ev, 1000);
        assert_eq!(intent::status(&m, &id), Status::Unknown);
        assert_eq!(
            intent::status(&m, &Intent::id(60, "", "w", ack)),
            Status::Pending
        );
        // Where no intent was ever seen, the rebuild writes what older builds read.
        let (m, _) = rebuild(
            "i",
            Evidence {
                checkpoint: Some(ckpt),
                ..Evidence::default()
            },
            1000,
        );
        assert!(m.decided_floor.is_empty() && m.decided.is_empty());
    }
}
