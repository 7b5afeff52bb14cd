//! One group commit applied to a manifest, in a fixed order (docs/design.md §6):
//!
//! 1. retention (segments past `retention_ms` leave, with their leases and acks), a purge
//!    (every retained message leaves), then the index upkeep the committer prepared (a
//!    fold, a merge; [`super::index`]);
//! 2. produces, so leases in the same batch can see the new messages: combinable segments
//!    (this batch's and other processes' listed ones) land in id order ([`super::combine`]),
//!    any other segment of this batch is placed after them;
//! 3. settles, which may free in-flight room for the leases, then the listed settle
//!    intents in id order ([`super::intent`]);
//! 4. leases, lowest available offsets first, one cursor for the whole batch, then the
//!    listed lease intents in id order;
//! 5. compaction swaps.
//!
//! Every listed intent still pending in the state the batch starts from is applied, and
//! its outcome recorded in the manifest, whatever it is (a refused settle too: its writer
//! must learn it). Each is applied at its own time when that is later than the batch's
//! ([`Intent::applied_at`]): a commit may list an intent written after it began.
//!
//! [`apply`] is pure: the committer calls it again on every CAS attempt. It answers
//! [`Decision::Keep`] when nothing changed, so such a batch costs no write.

use super::beside;
use super::combine::{self, Combinable, Status};
use super::compact::{self, Swap};
use super::dedup::{self, Spill};
use super::index::{self, Fold, Merge};
use super::intent::{self, Ask, Intent, Outcome};
use super::lease::{self, Cursor, Keys, Leased};
use super::produce::{self, NewStored, Plan, Unplaced};
use super::settle::{self, Refused, Settle};
use super::{ChunkRef, Dropped, Manifest, Rules, SegmentRef};
use crate::cas::Decision;

/// An ack, extend or nack of one lease.
#[derive(Debug, Clone)]
pub(crate) struct SettleOp {
    /// Offset of the leased message.
    pub offset: u64,
    /// Lease id from the receipt handle.
    pub lease_id: u64,
    /// What to do.
    pub action: Settle,
    /// The topic's rules as the caller saw them.
    pub rules: Rules,
}

/// A request for up to `max` leases.
#[derive(Debug, Clone)]
pub(crate) struct LeaseOp {
    /// Most leases wanted (0: none, a commit that only applies retention).
    pub max: usize,
    /// Most payload bytes wanted (estimated; the first lease is granted whatever its size).
    pub max_bytes: u64,
    /// The topic's rules as the caller saw them.
    pub rules: Rules,
}

/// The operations of one batch, grouped by kind; each group keeps arrival order.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    /// Retention and the dedup window for the whole batch.
    pub rules: Rules,
    /// Each produce's messages.
    pub produces: Vec<Vec<NewStored>>,
    /// Settles.
    pub settles: Vec<SettleOp>,
    /// Lease requests.
    pub leases: Vec<LeaseOp>,
    /// Compaction requests.
    pub swaps: Vec<Vec<Swap>>,
    /// Purge requests (one purge serves them all).
    pub purges: usize,
}

impl Batch {
    /// True when the batch holds nothing but produces (maybe none: a sweep).
    pub(crate) fn produces_only(&self) -> bool {
        self.settles.is_empty()
            && self.leases.is_empty()
            && self.swaps.is_empty()
            && self.purges == 0
    }

    /// An empty batch under `rules`.
    pub(crate) fn new(rules: Rules) -> Self {
        Self {
            rules,
            produces: Vec::new(),
            settles: Vec::new(),
            leases: Vec::new(),
            swaps: Vec::new(),
            purges: 0,
        }
    }
}

/// What each operation of a batch got, group by group, in the batch's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Each produce's offsets, or why it has none.
    pub produced: Vec<Result<Vec<u64>, Unplaced>>,
    /// Each settle's result.
    pub settled: Vec<Result<(), Refused>>,
    /// Each lease request's grants.
    pub leased: Vec<Leased>,
    /// Segments replaced by each compaction request.
    pub compacted: Vec<u64>,
    /// Messages each purge request removed (the same for all of a batch).
    pub purged: Vec<u64>,
    /// What retention removed: its objects are deleted after the commit lands.
    pub dropped: Dropped,
    /// Whether the upkeep's fold and merge took effect.
    pub upkept: (bool, bool),
    /// Idempotency-key chunks no longer named (expired, or past the key limit).
    pub dropped_chunks: Vec<ChunkRef>,
    /// Whether long polls should look again (new messages, or messages given back).
    pub wake: bool,
    /// Other processes' segments this batch landed.
    pub landed_foreign: usize,
    /// The listed intents this batch applied, with their outcomes, in id order.
    pub decided: Vec<(String, Outcome)>,
    /// Per-key ordering: the first offset whose key the leases needed and `keys` lacked.
    pub wants_key: Option<u64>,
}

/// Index upkeep prepared for one attempt: index objects already written.
#[derive(Debug, Clone, Default)]
pub(crate) struct Upkeep {
    /// Hot segments to fold into a level-0 index.
    pub fold: Option<Fold>,
    /// Index refs to merge into the next level.
    pub merge: Option<Merge>,
    /// Idempotency keys to spill into a chunk.
    pub spill: Option<Spill>,
}

/// What the batch writes: the produces' plan against `m`, the segment holding its new
/// messages (`None` if its write was refused), other processes' combinable segments to
/// land with it, and the index upkeep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written<'a> {
    /// The produces' plan.
    pub plan: &'a Plan,
    /// The new messages' segment.
    pub segment: Option<&'a SegmentRef>,
    /// Where that segment (combinable) already landed, when the manifest no longer
    /// remembers it and the committer found it in an index object.
    pub found_at: Option<u64>,
    /// Combinable segments other processes wrote, listed from the store.
    pub foreign: &'a [SegmentRef],
    /// Intents listed from the store (this process's own among them).
    pub intents: &'a [Intent],
    /// Index objects written for this attempt.
    pub upkeep: &'a Upkeep,
    /// Message keys read for per-key ordering.
    pub keys: &'a Keys,
    /// What this attempt knows of segments written beside a manifest write.
    pub beside: Beside<'a>,
}

/// What an attempt knows of segments written beside a manifest write ([`beside`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Beside<'a> {
    /// The batch's own segment is being written beside this write: named undecided.
    pub own: bool,
    /// Undecided segments whose fate (stored or void) the committer learnt.
    pub decided: &'a [String],
}

/// Applies `batch` to `m` at `now`, with what was `written` for it.
pub(crate) fn apply(
    m: &mut Manifest,
    now: u64,
    batch: &Batch,
    written: Written<'_>,
) -> Decision<Applied> {
    let Written {
        plan,
        segment,
        found_at,
        foreign,
        intents,
        upkeep,
        keys,
        beside: besides,
    } = written;
    let mut out = Applied {
        dropped: m.apply_retention(now, batch.rules.retention_ms),
        ..Applied::default()
    };
    if batch.purges > 0 {
        let removed = m.next_offset - m.start_offset;
        let purged = m.purge();
        out.dropped.segments.extend(purged.segments);
        out.dropped.indexes.extend(purged.indexes);
        out.purged = vec![removed; batch.purges];
    }
    out.upkept = (
        upkeep.fold.as_ref().is_some_and(|f| index::fold(m, f)),
        upkeep.merge.as_ref().is_some_and(|g| index::merge(m, g)),
    );
    let chunks_before = m.dedup_chunks.clone();
    m.expire_chunks(now);
    // Like expired key chunks, due delays leave with a commit that writes anyway.
    m.expire_delays(now);
    let spilled = upkeep.spill.as_ref().is_some_and(|s| dedup::spill(m, s));
    // Expired key chunks leave with a commit that writes anyway: dropping them alone is
    // not worth a write (and a refused settle must change nothing).
    let mut changed = out.dropped != Dropped::default() || out.upkept != (false, false) || spilled;
    let dedup = batch.rules.dedup_window_ms;
    // Decided by the state the batch starts from: landing segments raises
    // `combined_through`, which must not make a listed intent look passed over.
    let pending = intent::pending(m, intents);
    // Before leasing: what was decided is leased as any message (the segment found
    // stored, or delivered as void and settled then).
    beside::decide(m, besides.decided.iter().map(String::as_str));
    let (base, placed, landed_foreign) = place_segments(m, segment, foreign);
    if let (true, true, Some(seg)) = (placed, besides.own, segment) {
        if Combinable::parse(&seg.id).is_none() {
            beside::name(m, &seg.id);
        }
    }
    let base = base.or(found_at);
    out.landed_foreign = landed_foreign;
    out.produced = produce::append(m, now, dedup, &batch.produces, plan, base);
    if placed {
        changed = true;
        out.wake = true;
    }
    for op in &batch.settles {
        let r = settle::settle(m, now, &op.rules, op.offset, op.lease_id, op.action);
        if r.is_ok() {
            changed = true;
            out.wake |= !matches!(op.action, Settle::Extend | Settle::ExtendFor(_));
        }
        out.settled.push(r);
    }
    for i in &pending {
        if let Ask::Settle {
            offset,
            lease_id,
            action,
        } = i.ask
        {
            let at = i.applied_at(now);
            let r = settle::settle(m, at, &batch.rules, offset, lease_id, action);
            out.wake |= r.is_ok() && !matches!(action, Settle::Extend | Settle::ExtendFor(_));
            out.decided.push((i.id.clone(), Outcome::settled(r)));
        }
    }
    let ordered = batch.rules.ordered || batch.leases.iter().any(|op| op.rules.ordered);
    let mut cursor = Cursor::new(m, now, ordered);
    for op in &batch.leases {
        let got = lease::lease(m, now, &op.rules, (op.max, op.max_bytes), &mut cursor, keys);
        changed |= !got.grants.is_empty() || !got.dead.is_empty();
        out.leased.push(got);
    }
    for i in &pending {
        if let Ask::Lease { max, max_bytes } = i.ask {
            let want = (max as usize, max_bytes);
            // Picked by the cursor begun at `now` (a lapse it has not counted only makes
            // it more careful); the lease runs from the intent's time.
            let got = lease::lease(m, i.applied_at(now), &batch.rules, want, &mut cursor, keys);
            out.decided
                .push((i.id.clone(), Outcome::leased(m.version, &got)));
        }
    }
    out.wants_key = cursor.wants_key;
    if let Some(newest) = pending.last() {
        // Recorded in id order, so that the oldest leave the list first.
        out.decided.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, outcome) in &out.decided {
            intent::record(m, id, outcome.clone());
        }
        if newest.id > m.combined_through {
            m.combined_through.clone_from(&newest.id);
        }
        changed = true;
    }
    for swaps in &batch.swaps {
        let replaced = compact::swap(m, swaps);
        changed |= replaced > 0;
        out.compacted.push(replaced);
    }
    out.dropped_chunks = chunks_before
        .into_iter()
        .filter(|c| !m.dedup_chunks.contains(c))
        .collect();
    if changed {
        m.mark_checkpoint(now, batch.rules.retention_ms);
        Decision::Commit(out)
    } else {
        // Nothing is written, so nothing was dropped.
        out.dropped_chunks.clear();
        Decision::Keep(out)
    }
}

/// Lands the combinable segments (this batch's, if combinable, and `foreign`) in id
/// order, then places this batch's segment if it is not combinable. Returns the base
/// offset of this batch's segment (`None`: none, or it cannot land), whether anything
/// was added, and how many of `foreign` landed.
fn place_segments(
    m: &mut Manifest,
    segment: Option<&SegmentRef>,
    foreign: &[SegmentRef],
) -> (Option<u64>, bool, usize) {
    let mut landing = foreign.to_vec();
    let mut base = None;
    let own = segment.filter(|s| Combinable::parse(&s.id).is_some());
    if let Some(seg) = own {
        match combine::status(m, &seg.id) {
            // Another process committed it already.
            Status::Landed(b) => base = Some(b),
            Status::Pending => landing.push(seg.clone()),
            // The committer writes a dead segment again before it gets here; an unknown
            // one is answered as such.
            Status::Dead | Status::Unknown => {}
        }
    }
    let bases = combine::land(m, &landing);
    let mut placed = bases.iter().any(Option::is_some);
    let landed_foreign = bases[..foreign.len()].iter().flatten().count();
    if let Some(seg) = own {
        if let Some(i) = landing.iter().position(|s| s.id == seg.id) {
            base = bases[i];
        }
    } else if let Some(seg) = segment {
        // Named already (a rebuild took in this batch's segment, written before the
        // manifest was found corrupt): never placed twice.
        if let Some(named) = m.segments.iter().find(|s| s.id == seg.id) {
            base = Some(named.base_offset);
        } else {
            base = Some(produce::place(m, seg));
            placed = true;
        }
    }
    (base, placed, landed_foreign)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::partition::combine::{Combinable, Status};
    use crate::partition::testing::{ack_ask, intent, leased, manifest_with, rules};
    use crate::segment::StoredMessage;

    /// Every invariant of the module documentation of [`crate::partition`].
    fn check_invariants(m: &Manifest) {
        assert!(
            m.start_offset <= m.frontier && m.frontier <= m.next_offset,
            "{m:?}"
        );
        assert!(m
            .acked_ahead
            .iter()
            .all(|&o| o > m.frontier && o < m.next_offset));
        assert!(m
            .leases
            .keys()
            .all(|&o| o >= m.frontier && o < m.next_offset));
        assert!(m.leases.keys().all(|o| !m.acked_ahead.contains(o)));
        assert!(
            m.beside
                .iter()
                .all(|id| m.segments.iter().any(|s| s.id == *id)),
            "undecided segments are hot: {m:?}"
        );
        assert!(
            m.leases.keys().all(|&o| beside::run(m, o).is_none()),
            "nothing undecided is leased: {m:?}"
        );
        assert!(
            m.delayed.windows(2).all(|w| w[0].to <= w[1].from)
                && m.delayed
                    .iter()
                    .all(|d| d.from < d.to && d.to <= m.next_offset),
            "delayed runs ordered, disjoint, within the partition: {m:?}"
        );
        let mut expect = m.start_offset;
        for r in &m.indexes {
            assert_eq!(r.base_offset, expect, "indexes contiguous: {m:?}");
            expect = r.end_offset;
        }
        for s in &m.segments {
            assert_eq!(s.base_offset, expect, "segments contiguous: {m:?}");
            expect += u64::from(s.count);
        }
        assert_eq!(expect, m.next_offset, "segments cover the partition");
    }

    fn produce(n: usize) -> Vec<NewStored> {
        (0..n)
            .map(|_| NewStored {
                message: StoredMessage::new(0, None, b"m".to_vec()),
                idempotency_key: None,
                delay_ms: 0,
            })
            .collect()
    }

    fn segment(count: u32, t: u64) -> SegmentRef {
        SegmentRef {
            id: format!("s{t}-{count}"),
            base_offset: 0,
            count,
            last_produced_ms: t,
            bytes: 1,
        }
    }

    fn run(m: &mut Manifest, now: u64, batch: &Batch) -> Decision<Applied> {
        run_keyed(m, now, batch, &Keys::default())
    }

    /// As [`run`], with the message keys the committer would have read.
    fn run_keyed(m: &mut Manifest, now: u64, batch: &Batch, keys: &Keys) -> Decision<Applied> {
        let plan = Plan::new(&batch.produces, m, now, &|_| None);
        let n = plan.new_messages(&batch.produces).len() as u32;
        // Every other step's segment is combinable, landed through `combine`.
        let seg = (n > 0).then(|| {
            if now.is_multiple_of(20) {
                Combinable::parse(&Combinable::id(now, &m.combined_through, "own", n, 1))
                    .map_or_else(|| segment(n, now), |c| c.to_ref())
            } else {
                segment(n, now)
            }
        });
        m.version += 1;
        let decided: Vec<String> = match now.is_multiple_of(40) {
            true => m.beside.iter().cloned().collect(),
            false => Vec::new(),
        };
        // The committer's upkeep, with the ids it would write.
        let mut after = m.clone();
        after.apply_retention(now, batch.rules.retention_ms);
        let upkeep = Upkeep {
            fold: index::fold_candidate(&after).map(|run| Fold {
                index: index::ref_for_segments(format!("f{now}"), &run),
                run,
            }),
            merge: index::merge_candidate(&after).map(|run| Merge {
                index: index::ref_for_indexes(format!("m{now}"), &run),
                run,
            }),
            spill: None,
        };
        let written = Written {
            plan: &plan,
            segment: seg.as_ref(),
            found_at: None,
            foreign: &[],
            intents: &[],
            upkeep: &upkeep,
            keys,
            // Every third step's ordinary segment is written beside the manifest write,
            // and every fourth (at ten a step) learns the fate of every undecided one.
            beside: Beside {
                own: now.is_multiple_of(3),
                decided: &decided,
            },
        };
        apply(m, now, batch, written)
    }

    fn applied(d: Decision<Applied>) -> Applied {
        match d {
            Decision::Commit(a) | Decision::Keep(a) => a,
        }
    }

    #[test]
    fn leases_in_a_batch_see_its_produces_and_its_settles() {
        let mut m = manifest_with(2);
        let r = Rules {
            max_in_flight: 2,
            ..rules()
        };
        leased(&mut m, &[0, 1], 1, 1000);
        let mut batch = Batch::new(r);
        batch.produces.push(produce(1));
        batch.settles.push(SettleOp {
            offset: 0,
            lease_id: 1,
            action: Settle::Ack,
            rules: r,
        });
        batch.leases.push(LeaseOp {
            max: 5,
            max_bytes: u64::MAX,
            rules: r,
        });
        let a = applied(run(&mut m, 10, &batch));
        assert_eq!(a.produced, vec![Ok(vec![2])]);
        assert_eq!(a.settled, vec![Ok(())]);
        // The ack freed one slot of two; the new message 2 takes it.
        let got: Vec<u64> = a.leased[0].grants.iter().map(|g| g.offset).collect();
        assert_eq!(got, vec![2]);
        assert!(a.wake);
        check_invariants(&m);
    }

    #[test]
    fn a_segment_the_manifest_names_already_is_answered_not_placed_again() {
        // A rebuild took in this batch's segment (written before the damage was found).
        let mut m = manifest_with(2);
        let mut seg = segment(1, 5);
        seg.base_offset = 2;
        m.segments.push(seg.clone());
        m.next_offset = 3;
        let mut batch = Batch::new(rules());
        batch.produces.push(produce(1));
        let plan = Plan::new(&batch.produces, &m, 5, &|_| None);
        let written = Written {
            plan: &plan,
            segment: Some(&seg),
            found_at: None,
            foreign: &[],
            intents: &[],
            upkeep: &Upkeep::default(),
            keys: &Keys::default(),
            beside: Beside::default(),
        };
        let a = applied(apply(&mut m, 5, &batch, written));
        assert_eq!(a.produced, vec![Ok(vec![2])]);
        assert_eq!((m.next_offset, m.segments.len()), (3, 2));
        check_invariants(&m);
    }

    #[test]
    fn a_batch_that_changes_nothing_is_kept() {
        let mut m = manifest_with(1);
        leased(&mut m, &[0], 1, 1000);
        let mut batch = Batch::new(rules());
        batch.leases.push(LeaseOp {
            max: 1,
            max_bytes: u64::MAX,
            rules: rules(),
        });
        batch.settles.push(SettleOp {
            offset: 0,
            lease_id: 99,
            action: Settle::Ack,
            rules: rules(),
        });
        assert!(matches!(run(&mut m, 10, &batch), Decision::Keep(_)));
    }

    #[test]
    fn retention_removes_leased_messages_and_their_handles_go_stale() {
        let mut m = Manifest::empty("i");
        m.segments = vec![segment(2, 100), segment(1, 5000)];
        m.segments[1].base_offset = 2;
        m.next_offset = 3;
        leased(&mut m, &[1, 2], 7, 10_000);
        let r = Rules {
            retention_ms: 1000,
            ..rules()
        };
        let mut batch = Batch::new(r);
        batch.settles.push(SettleOp {
            offset: 1,
            lease_id: 7,
            action: Settle::Ack,
            rules: r,
        });
        let a = applied(run(&mut m, 2000, &batch));
        assert_eq!(a.dropped.segments.len(), 1);
        assert_eq!((m.start_offset, m.frontier), (2, 2));
        assert_eq!(a.settled, vec![Err(Refused::LeaseGone)]);
        assert!(m.leases.contains_key(&2));
        check_invariants(&m);
    }

    #[test]
    fn a_long_backlog_folds_into_indexes_and_every_offset_stays_locatable() {
        let mut m = Manifest::empty("i");
        let r = Rules {
            retention_ms: 40_000,
            ..rules()
        };
        for step in 0..3000u64 {
            let mut batch = Batch::new(r);
            batch.produces.push(produce(1));
            run(&mut m, step * 10, &batch);
            check_invariants(&m);
            assert!(
                m.segments.len() <= index::FOLD_ABOVE + 1,
                "one commit past the fold"
            );
            assert!(m.indexes.len() <= index::MERGE_ABOVE + 2 * index::MERGE_FANOUT);
        }
        // Nothing was consumed: every offset is still unsettled and locatable.
        assert_eq!((m.frontier, m.next_offset), (0, 3000));
        let folded = (index::FOLD_ABOVE + 1 - index::KEEP_HOT) as u64;
        assert!(
            m.indexes.iter().any(|r| r.segments > folded),
            "merges happened"
        );
        for o in 0..3000 {
            assert!(m.locate(o).is_some(), "offset {o}");
        }
        let mut batch = Batch::new(r);
        batch.leases.push(LeaseOp {
            max: 3,
            max_bytes: u64::MAX,
            rules: r,
        });
        let a = applied(run(&mut m, 30_000, &batch));
        let got: Vec<u64> = a.leased[0].grants.iter().map(|g| g.offset).collect();
        assert_eq!(got, vec![0, 1, 2], "indexed messages are leased in order");
        // Retention drops whole indexes, oldest first, and moves the frontier.
        let a = applied(run(&mut m, 60_000, &Batch::new(r)));
        assert!(!a.dropped.indexes.is_empty());
        check_invariants(&m);
        assert!(m.start_offset > 0 && m.frontier == m.start_offset);
        assert!(
            m.leases.is_empty(),
            "the leases below the new start went with it"
        );
    }

    #[test]
    fn random_batches_keep_every_invariant_and_never_double_lease() {
        let mut undecided_seen = 0;
        for seed in 0..50u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = Manifest::empty("i");
            let r = Rules {
                max_in_flight: rng.gen_range(1..6),
                max_acked_ahead: rng.gen_range(1..4),
                visibility_timeout_ms: 50,
                retention_ms: 400,
                ordered: seed % 2 == 0,
                ..rules()
            };
            let mut handles: Vec<(u64, u64)> = Vec::new();
            // Every message's key hash by offset (0: no key), as the committer reads them.
            let mut keys = Keys::default();
            let mut key_of: Vec<u32> = Vec::new();
            for step in 0..60u64 {
                let now = step * 10;
                let mut batch = Batch::new(r);
                if rng.gen_bool(0.5) {
                    let mut msgs = produce(rng.gen_range(1..3));
                    if rng.gen_bool(0.3) {
                        msgs.iter_mut()
                            .for_each(|m| m.delay_ms = rng.gen_range(1..200));
                    }
                    batch.produces.push(msgs);
                }
                for _ in 0..rng.gen_range(0..3) {
                    if let Some(&(offset, lease_id)) = handles.get(rng.gen_range(0..=handles.len()))
                    {
                        let action =
                            [Settle::Ack, Settle::Extend, Settle::Nack][rng.gen_range(0..3)];
                        batch.settles.push(SettleOp {
                            offset,
                            lease_id,
                            action,
                            rules: r,
                        });
                    }
                }
                batch.leases.push(LeaseOp {
                    max: rng.gen_range(0..3),
                    max_bytes: u64::MAX,
                    rules: r,
                });
                let before = m.clone();
                let a = applied(run_keyed(&mut m, now, &batch, &keys));
                for offsets in a.produced.iter().flatten() {
                    for &o in offsets {
                        let k = [0, 1, 2, 3][rng.gen_range(0..4)];
                        assert_eq!(o as usize, key_of.len());
                        key_of.push(k);
                        keys.insert(o, k);
                    }
                }
                let nacked: Vec<u64> = batch
                    .settles
                    .iter()
                    .zip(&a.settled)
                    .filter(|(op, r)| op.action == Settle::Nack && r.is_ok())
                    .map(|(op, _)| op.offset)
                    .collect();
                for g in a.leased.iter().flat_map(|l| &l.grants) {
                    let was_live = before
                        .leases
                        .get(&g.offset)
                        .is_some_and(|l| l.deadline_ms > now);
                    assert!(
                        !was_live || nacked.contains(&g.offset),
                        "seed {seed}: offset {} leased while another lease was live",
                        g.offset
                    );
                    assert!(!before.acked_ahead.contains(&g.offset) && g.offset >= before.frontier);
                    assert!(
                        m.delayed_until(g.offset, now).is_none()
                            && before.delayed_until(g.offset, now).is_none(),
                        "seed {seed}: offset {} leased before its delay was over",
                        g.offset
                    );
                    handles.push((g.offset, g.lease_id));
                }
                check_invariants(&m);
                undecided_seen += usize::from(!m.beside.is_empty());
                if r.ordered {
                    // No two unsettled messages of one key with the later one leased: a
                    // grant never overtakes an earlier unsettled message of its key.
                    for g in a.leased.iter().flat_map(|l| &l.grants) {
                        let k = key_of[g.offset as usize];
                        let overtaken = (m.frontier..g.offset).find(|&o| {
                            k != 0 && key_of[o as usize] == k && !m.acked_ahead.contains(&o)
                        });
                        assert_eq!(overtaken, None, "seed {seed}: {} leased", g.offset);
                    }
                }
                assert!(m.in_flight(now) <= r.max_in_flight as usize, "seed {seed}");
                assert!(
                    m.acked_ahead.len() <= r.max_acked_ahead as usize,
                    "seed {seed}"
                );
            }
        }
        assert!(
            undecided_seen > 100,
            "undecided segments: {undecided_seen} steps"
        );
    }

    /// Writers in many processes write combinable segments; commits land whatever each
    /// one listed, against states that may be stale. Every segment lands at most once,
    /// offsets stay contiguous, and a segment found dead never lands afterwards.
    #[test]
    fn combined_segments_land_at_most_once() {
        for seed in 0..50u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = Manifest::empty("i");
            let mut written: Vec<SegmentRef> = Vec::new();
            let mut landed: std::collections::HashMap<String, u64> = Default::default();
            let mut dead: std::collections::HashSet<String> = Default::default();
            let mut old_states = vec![m.clone()];
            for step in 0..80u64 {
                let now = 1000 + step;
                // A writer writes a segment above the cursor of some state it knows.
                let known = &old_states[rng.gen_range(0..old_states.len())];
                let count = rng.gen_range(1..4);
                let id =
                    Combinable::id(now, &known.combined_through, &format!("w{step}"), count, 1);
                written.push(Combinable::parse(&id).unwrap().to_ref());
                if rng.gen_bool(0.5) {
                    // A commit: its own segment plus what its listing showed.
                    let own = written[rng.gen_range(0..written.len())].clone();
                    let listed: Vec<SegmentRef> = written
                        .iter()
                        .filter(|s| s.id > m.combined_through && rng.gen_bool(0.7))
                        .cloned()
                        .collect();
                    let produces = vec![produce(own.count as usize)];
                    let plan = Plan::new(&produces, &m, now, &|_| None);
                    let mut batch = Batch::new(rules());
                    batch.produces = produces;
                    let upkeep = Upkeep::default();
                    let written_now = Written {
                        plan: &plan,
                        segment: Some(&own),
                        found_at: None,
                        foreign: &listed,
                        intents: &[],
                        upkeep: &upkeep,
                        keys: &Keys::default(),
                        beside: Beside::default(),
                    };
                    m.version += 1;
                    let before = m.clone();
                    let a = applied(apply(&mut m, now, &batch, written_now));
                    check_invariants(&m);
                    for s in listed.iter().chain(std::iter::once(&own)) {
                        match combine::status(&m, &s.id) {
                            Status::Landed(base) => {
                                if let Some(b) = landed.insert(s.id.clone(), base) {
                                    assert_eq!(b, base, "seed {seed}: {} landed twice", s.id);
                                }
                                assert!(!dead.contains(&s.id), "seed {seed}: dead {} landed", s.id);
                            }
                            Status::Dead => {
                                dead.insert(s.id.clone());
                            }
                            Status::Pending | Status::Unknown => {}
                        }
                    }
                    match combine::status(&before, &own.id) {
                        Status::Dead | Status::Unknown => {
                            assert_eq!(a.produced, vec![Err(Unplaced::NoSegment)], "seed {seed}")
                        }
                        _ => assert!(a.produced[0].is_ok(), "seed {seed}"),
                    }
                    old_states.push(m.clone());
                }
            }
            let mut bases: Vec<u64> = landed.values().copied().collect();
            bases.sort_unstable();
            bases.dedup();
            assert_eq!(
                bases.len(),
                landed.len(),
                "seed {seed}: two segments at one offset"
            );
        }
    }

    /// Applies a batch with nothing of its own but `intents` listed.
    fn land_intents(m: &mut Manifest, now: u64, r: Rules, intents: &[Intent]) -> Applied {
        let batch = Batch::new(r);
        let plan = Plan::new(&batch.produces, m, now, &|_| None);
        m.version += 1;
        let written = Written {
            plan: &plan,
            segment: None,
            found_at: None,
            foreign: &[],
            intents,
            upkeep: &Upkeep::default(),
            keys: &Keys::default(),
            beside: Beside::default(),
        };
        applied(apply(m, now, &batch, written))
    }

    #[test]
    fn intents_apply_once_in_id_order_and_record_what_they_got() {
        let mut m = manifest_with(3);
        leased(&mut m, &[0], 1, 1000);
        let r = Rules {
            max_in_flight: 2,
            ..rules()
        };
        let ack = intent(20, "b", ack_ask(0, 1));
        let stale = intent(21, "c", ack_ask(1, 7));
        let lease = intent(
            10,
            "a",
            Ask::Lease {
                max: 5,
                max_bytes: u64::MAX,
            },
        );
        let a = land_intents(&mut m, 50, r, &[lease.clone(), ack.clone(), stale.clone()]);
        // Settles first (the ack frees a slot), then the lease: two slots, offsets 1 and 2.
        let want_lease = Outcome::Leased {
            v: m.version,
            g: vec![(1, 1), (2, 1)],
            d: vec![],
        };
        assert_eq!(
            a.decided,
            vec![
                (lease.id.clone(), want_lease.clone()),
                (ack.id.clone(), Outcome::Done),
                (stale.id.clone(), Outcome::Gone),
            ]
        );
        assert_eq!(m.frontier, 1);
        assert_eq!(m.combined_through, stale.id);
        assert_eq!(
            intent::status(&m, &lease.id),
            intent::Status::Decided(want_lease)
        );
        check_invariants(&m);
        // Listed again by a slow committer: nothing happens twice, nothing is written.
        let before = m.clone();
        let again = land_intents(&mut m, 60, r, &[lease, ack, stale]);
        assert!(again.decided.is_empty());
        assert_eq!(
            (m.leases.clone(), m.frontier),
            (before.leases, before.frontier)
        );
    }

    #[test]
    fn an_ack_intent_whose_lease_lapsed_before_it_landed_is_gone_and_changes_nothing() {
        let mut m = manifest_with(2);
        leased(&mut m, &[0], 1, 1000);
        let late = intent(900, "a", ack_ask(0, 1));
        let a = land_intents(&mut m, 1000, rules(), std::slice::from_ref(&late));
        assert_eq!(a.decided, vec![(late.id, Outcome::Gone)]);
        assert_eq!(m.frontier, 0);
        assert!(m.leases.contains_key(&0) && m.acked_ahead.is_empty());
    }

    #[test]
    fn an_intent_written_after_the_batch_began_runs_its_lease_from_its_own_time() {
        // The batch's clock read 1000; it listed intents written at 1800 and 2000 on a
        // later attempt. Their leases must run a full visibility timeout from then.
        let mut m = manifest_with(2);
        leased(&mut m, &[0], 1, 5000);
        let r = rules();
        let vis = r.visibility_timeout_ms;
        let extend = intent(
            1800,
            "a",
            Ask::Settle {
                offset: 0,
                lease_id: 1,
                action: Settle::Extend,
            },
        );
        let lease = intent(
            2000,
            "b",
            Ask::Lease {
                max: 1,
                max_bytes: u64::MAX,
            },
        );
        let a = land_intents(&mut m, 1000, r, &[extend.clone(), lease.clone()]);
        assert_eq!(a.decided[0], (extend.id, Outcome::Done));
        assert_eq!(m.leases[&0].deadline_ms, 1800 + vis);
        assert_eq!(m.leases[&1].deadline_ms, 2000 + vis);
        // An ack is judged at its own time too: asked after the lease lapsed, it is gone.
        let mut m = manifest_with(1);
        leased(&mut m, &[0], 1, 1500);
        let late = intent(1600, "c", ack_ask(0, 1));
        let a = land_intents(&mut m, 1000, r, std::slice::from_ref(&late));
        assert_eq!(a.decided, vec![(late.id, Outcome::Gone)]);
        // A writer whose clock runs far ahead is held to the bound.
        let mut m = manifest_with(1);
        let ahead = intent(
            1000 + 10 * intent::MAX_LEAD_MS,
            "d",
            Ask::Lease {
                max: 1,
                max_bytes: u64::MAX,
            },
        );
        land_intents(&mut m, 1000, r, std::slice::from_ref(&ahead));
        assert_eq!(m.leases[&0].deadline_ms, 1000 + intent::MAX_LEAD_MS + vis);
        check_invariants(&m);
    }

    #[test]
    fn a_lease_intent_sees_the_segments_landed_with_it() {
        let mut m = manifest_with(0);
        let seg = Combinable::parse(&Combinable::id(30, "", "s", 2, 2))
            .unwrap()
            .to_ref();
        let lease = intent(
            10,
            "a",
            Ask::Lease {
                max: 1,
                max_bytes: 1,
            },
        );
        let batch = Batch::new(rules());
        let plan = Plan::new(&batch.produces, &m, 40, &|_| None);
        m.version += 1;
        let written = Written {
            plan: &plan,
            segment: None,
            found_at: None,
            foreign: std::slice::from_ref(&seg),
            intents: std::slice::from_ref(&lease),
            upkeep: &Upkeep::default(),
            keys: &Keys::default(),
            beside: Beside::default(),
        };
        let a = applied(apply(&mut m, 40, &batch, written));
        assert_eq!(a.landed_foreign, 1);
        let got = a.decided[0].1.lease_result().unwrap();
        assert_eq!(
            got.grants.iter().map(|g| g.offset).collect::<Vec<_>>(),
            vec![0]
        );
        // The intent (id time 10) sorts below the segment: both decided by one write.
        assert_eq!(m.combined_through, seg.id);
        check_invariants(&m);
    }

    /// Processes write intents and segments against states they know, which may be
    /// stale; commits apply whatever each listed. Every intent is applied at most once,
    /// one found dead never lands, an offset whose ack got `Done` is never leased again,
    /// and no two grants of live leases share an offset.
    #[test]
    fn intents_land_at_most_once_against_stale_states() {
        for seed in 0..50u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = manifest_with(0);
            let r = Rules {
                max_in_flight: 4,
                visibility_timeout_ms: 40,
                ..rules()
            };
            let mut states = vec![m.clone()];
            let mut written: Vec<Intent> = Vec::new();
            let mut segs: Vec<SegmentRef> = Vec::new();
            let mut outcomes: std::collections::HashMap<String, Outcome> = Default::default();
            let mut dead: std::collections::HashSet<String> = Default::default();
            let mut acked: std::collections::HashSet<u64> = Default::default();
            for step in 0..120u64 {
                let now = 1000 + step * 3;
                let known = states[rng.gen_range(0..states.len())].clone();
                let u = format!("w{step}");
                match rng.gen_range(0..3) {
                    0 => {
                        let id = Combinable::id(now, &known.combined_through, &u, 1, 1);
                        segs.push(Combinable::parse(&id).unwrap().to_ref());
                    }
                    1 => {
                        let ask = Ask::Lease {
                            max: rng.gen_range(1..3),
                            max_bytes: u64::MAX,
                        };
                        let id = Intent::id(now, &known.combined_through, &u, ask);
                        written.push(Intent::parse(&id).unwrap());
                    }
                    _ => {
                        // Settle a lease some outcome granted (maybe long ago).
                        let granted: Vec<(u64, u64)> = outcomes
                            .values()
                            .filter_map(|o| o.lease_result())
                            .flat_map(|l| l.grants.into_iter().map(|g| (g.offset, g.lease_id)))
                            .collect();
                        if let Some(&(offset, lease_id)) =
                            granted.get(rng.gen_range(0..granted.len().max(1)))
                        {
                            let action =
                                [Settle::Ack, Settle::Nack, Settle::Extend][rng.gen_range(0..3)];
                            let ask = Ask::Settle {
                                offset,
                                lease_id,
                                action,
                            };
                            let id = Intent::id(now, &known.combined_through, &u, ask);
                            written.push(Intent::parse(&id).unwrap());
                        }
                    }
                }
                if rng.gen_bool(0.4) {
                    // Listed after what some state, maybe a stale one, had decided.
                    let after = states[rng.gen_range(0..states.len())]
                        .combined_through
                        .clone();
                    let listed: Vec<Intent> = written
                        .iter()
                        .filter(|i| i.id > after && rng.gen_bool(0.7))
                        .cloned()
                        .collect();
                    let foreign: Vec<SegmentRef> = segs
                        .iter()
                        .filter(|s| s.id > after && rng.gen_bool(0.7))
                        .cloned()
                        .collect();
                    let batch = Batch::new(r);
                    let plan = Plan::new(&batch.produces, &m, now, &|_| None);
                    m.version += 1;
                    let w = Written {
                        plan: &plan,
                        segment: None,
                        found_at: None,
                        foreign: &foreign,
                        intents: &listed,
                        upkeep: &Upkeep::default(),
                        keys: &Keys::default(),
                        beside: Beside::default(),
                    };
                    let a = applied(apply(&mut m, now, &batch, w));
                    check_invariants(&m);
                    assert!(m.in_flight(now) <= r.max_in_flight as usize, "seed {seed}");
                    for (id, o) in &a.decided {
                        assert!(!dead.contains(id), "seed {seed}: dead {id} applied");
                        assert!(
                            outcomes.insert(id.clone(), o.clone()).is_none(),
                            "seed {seed}: {id} applied twice"
                        );
                        if let Some(l) = o.lease_result() {
                            for g in &l.grants {
                                assert!(
                                    !acked.contains(&g.offset),
                                    "seed {seed}: acked {} leased again",
                                    g.offset
                                );
                                let held = m.leases.get(&g.offset).map(|l| l.lease_id);
                                assert_eq!(
                                    held,
                                    Some(g.lease_id),
                                    "seed {seed}: {} granted",
                                    g.offset
                                );
                            }
                        }
                        let i = Intent::parse(id).unwrap();
                        if let (
                            Ask::Settle {
                                offset,
                                action: Settle::Ack,
                                ..
                            },
                            Outcome::Done,
                        ) = (i.ask, o)
                        {
                            acked.insert(offset);
                        }
                    }
                    for i in &written {
                        match intent::status(&m, &i.id) {
                            intent::Status::Dead => {
                                dead.insert(i.id.clone());
                            }
                            intent::Status::Decided(o) => {
                                assert_eq!(outcomes.get(&i.id), Some(&o), "seed {seed}");
                            }
                            intent::Status::Pending | intent::Status::Unknown => {}
                        }
                    }
                    states.push(m.clone());
                }
            }
            assert!(!outcomes.is_empty(), "seed {seed}: something landed");
        }
    }
}
