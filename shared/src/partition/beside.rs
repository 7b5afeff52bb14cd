//! Segments written beside the manifest write that names them (fleet level 7,
//! docs/design.md §6 "A segment written beside its manifest write").
//!
//! An ordinary commit writes its segment and then the manifest: two round trips in
//! series. A commit may instead send both at once, naming the segment in
//! [`Manifest::beside`]: *undecided*, not yet known to be stored. Until its fate is
//! decided its offsets are taken by nobody (no lease, no settle, no fold, no compaction);
//! they are not settled, and count as available in the figures (their producers were
//! answered; a lease decides them). The fate is the object at the segment's key, and only
//! that:
//!
//! * the segment: **stored**. Its writer learns it when its PUT succeeds, and answers its
//!   producers only then; any reader learns it by reading the object.
//! * a *void marker* (an object of its own magic bytes): **void**. Written with
//!   `If-None-Match: *` by whoever gives up on a segment: its writer when the PUT failed,
//!   anyone once the id is older than [`DECIDE_AFTER_MS`] and nothing is there. Exactly one
//!   of the segment and the marker is ever stored, so a writer whose PUT lands later gets
//!   a conflict and answers its producers that nothing was stored; a void segment's
//!   offsets hold no message (a delivery that meets the marker settles them).
//! * nothing yet, and younger than [`DECIDE_AFTER_MS`]: **undecided**, look again later.
//!
//! A commit removes the ids it learnt the fate of from [`Manifest::beside`]
//! ([`decide`]); from then on their offsets are ordinary. Who learns a fate:
//!
//! * the writer, when its PUT ends (`Committer::landed_beside`); its next commit decides;
//! * a lease commit, which looks at the undecided segments it would lease from
//!   (`Committer::look_beside`, through the segment cache the delivery reads anyway);
//! * a subscription's batch, which decides them in its own copy of the log only (the log
//!   is the partition's to write);
//! * a waiting consume that found one not stored yet looks again soon ([`next_look`]),
//!   not when the manifest next changes.
//!
//! A void segment's offsets are settled by the delivery that meets them (a consume then
//! leases again), and a replay of one answers 404; a replay of an undecided one not stored
//! yet is "not yet". A rebuild keeps the checkpoint's undecided set and leaves void markers
//! out. Only produces without idempotency keys or delays are written this way: a key is
//! remembered at its offset when the manifest lands, and a retry answered from a void
//! offset would be a lost produce.

use super::Manifest;

/// How long after its id's time a segment written beside its manifest write may still be
/// on its way: an undecided segment older than this, and not stored, is made void.
/// Correctness does not depend on it (the marker and the segment are both written
/// `If-None-Match: *`); it only bounds how long readers wait on a writer that died.
pub(crate) const DECIDE_AFTER_MS: u64 = 10_000;

/// How soon a waiting reader that found an undecided segment not stored yet looks again,
/// at the soonest and at the latest ([`next_look`]).
pub(crate) const LOOK_AGAIN_MS: (u64, u64) = (25, 2_000);

/// What is stored at an undecided segment's key, as a reader found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The segment itself.
    Segment,
    /// The void marker.
    Void,
    /// Nothing.
    Nothing,
}

/// What a reader does about an undecided segment it looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Stored: its offsets are ordinary messages.
    Stored,
    /// Void: its offsets hold no message.
    Void,
    /// Possibly still on its way: leave it undecided and look again soon.
    Wait,
    /// Write the void marker (`If-None-Match: *`) and look again: the marker, or the
    /// segment that beat it, decides.
    MakeVoid,
}

/// What to do about the undecided segment written at `written_ms` (its id's time) when
/// `found` is at its key at `now_ms`.
pub(crate) fn resolve(found: Found, written_ms: u64, now_ms: u64) -> Resolution {
    match found {
        Found::Segment => Resolution::Stored,
        Found::Void => Resolution::Void,
        Found::Nothing if now_ms.saturating_sub(written_ms) >= DECIDE_AFTER_MS => {
            Resolution::MakeVoid
        }
        Found::Nothing => Resolution::Wait,
    }
}

/// When a reader waiting on `m` at `now_ms` should look at its undecided segments again
/// (`None`: there are none): after a quarter of the newest one's age, within
/// [`LOOK_AGAIN_MS`]. A segment on its way is stored within about one round trip of its
/// manifest write, so the first looks come soon; one whose writer died is made void only
/// after [`DECIDE_AFTER_MS`], and meanwhile a waiter looks a few times, not every 25 ms.
pub(crate) fn next_look(m: &Manifest, now_ms: u64) -> Option<u64> {
    let newest = m.beside.iter().filter_map(|id| written_ms(id)).max()?;
    let (soonest, latest) = LOOK_AGAIN_MS;
    let wait = (now_ms.saturating_sub(newest) / 4).clamp(soonest, latest);
    Some(now_ms.saturating_add(wait))
}

/// The time in a segment id, `{ms}-{unique}`.
fn written_ms(id: &str) -> Option<u64> {
    id.split_once('-').and_then(|(t, _)| t.parse().ok())
}

/// The end (exclusive) of the run of offsets of the undecided segment holding `offset`;
/// `None` when `offset` is in no undecided segment.
pub(crate) fn run(m: &Manifest, offset: u64) -> Option<u64> {
    if m.beside.is_empty() {
        return None;
    }
    let s = m.hot_segment_of(offset)?;
    m.beside
        .contains(&s.id)
        .then(|| s.base_offset + u64::from(s.count))
}

/// Names the segment `id`, just placed by this write, as written beside it.
pub(crate) fn name(m: &mut Manifest, id: &str) {
    m.beside.insert(id.to_owned());
}

/// Removes the segments in `decided` (stored or void, as a reader or their writer
/// learnt) from the undecided ones; returns how many were undecided.
pub(crate) fn decide<'a>(m: &mut Manifest, decided: impl IntoIterator<Item = &'a str>) -> usize {
    decided
        .into_iter()
        .filter(|id| m.beside.remove(*id))
        .count()
}

/// Forgets undecided ids no hot segment has any more (retention or a purge dropped them).
pub(crate) fn forget_dropped(m: &mut Manifest) {
    if m.beside.is_empty() {
        return;
    }
    let hot: std::collections::HashSet<&str> = m.segments.iter().map(|s| s.id.as_str()).collect();
    m.beside.retain(|id| hot.contains(id.as_str()));
}

/// How many of the hot segments `run` (the oldest first) precede the first undecided
/// one: what a fold or a compaction may take.
pub(crate) fn decided_prefix(m: &Manifest, run: &[super::SegmentRef]) -> usize {
    run.iter()
        .position(|s| m.beside.contains(&s.id))
        .unwrap_or(run.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::ledger::Ledger;
    use crate::partition::testing::manifest_of;

    #[test]
    fn only_the_object_at_the_key_decides_and_nothing_is_voided_young() {
        use Resolution::*;
        let t = 1_000_000;
        assert_eq!(resolve(Found::Segment, t, t), Stored);
        assert_eq!(resolve(Found::Segment, t, t + 10 * DECIDE_AFTER_MS), Stored);
        assert_eq!(resolve(Found::Void, t, t), Void);
        assert_eq!(resolve(Found::Nothing, t, t), Wait);
        assert_eq!(resolve(Found::Nothing, t, t + DECIDE_AFTER_MS - 1), Wait);
        assert_eq!(resolve(Found::Nothing, t, t + DECIDE_AFTER_MS), MakeVoid);
        // A clock behind the writer's never voids.
        assert_eq!(resolve(Found::Nothing, t, t - 5), Wait);
    }

    #[test]
    fn an_undecided_segment_is_neither_leased_nor_settled_until_decided() {
        // Three segments of 2: offsets 0..6, the middle one undecided.
        let mut m = manifest_of(&[2, 2, 2]);
        let middle = m.segments[1].id.clone();
        name(&mut m, &middle);
        assert_eq!(run(&m, 1), None);
        assert_eq!(run(&m, 2), Some(4));
        assert_eq!(run(&m, 3), Some(4));
        assert_eq!(run(&m, 4), None);
        assert!(!m.is_available(2, 0) && !m.is_available(3, 0));
        assert!(m.is_available(1, 0) && m.is_available(4, 0));
        // Counted available all the same: a lease would look at it.
        assert_eq!(Ledger::available_count(&m, 0), 6);
        assert_eq!(decided_prefix(&m, &m.segments), 1);
        assert_eq!(decide(&mut m, ["other", middle.as_str()]), 1);
        assert!(m.beside.is_empty() && m.is_available(2, 0));
        assert_eq!(Ledger::available_count(&m, 0), 6);
        assert_eq!(decided_prefix(&m, &m.segments), 3);
    }

    #[test]
    fn a_waiter_looks_again_soon_at_a_young_segment_and_seldom_at_an_old_one() {
        let mut m = manifest_of(&[1, 1]);
        assert_eq!(next_look(&m, 5_000), None);
        m.segments[0].id = "0000000001000-a".into();
        m.segments[1].id = "0000000004000-b".into();
        name(&mut m, "0000000001000-a");
        // Only the old one: a quarter of its age.
        assert_eq!(next_look(&m, 5_000), Some(6_000));
        name(&mut m, "0000000004000-b");
        // The newest sets it: just written, the soonest.
        assert_eq!(next_look(&m, 4_000), Some(4_000 + LOOK_AGAIN_MS.0));
        assert_eq!(next_look(&m, 4_400), Some(4_500));
        // Never later than the latest, and a clock behind the writer's looks soon.
        assert_eq!(next_look(&m, 60_000), Some(60_000 + LOOK_AGAIN_MS.1));
        assert_eq!(next_look(&m, 3_000), Some(3_000 + LOOK_AGAIN_MS.0));
    }

    #[test]
    fn a_dropped_segment_leaves_the_undecided_ones() {
        let mut m = manifest_of(&[1, 1]);
        let (a, b) = (m.segments[0].id.clone(), m.segments[1].id.clone());
        name(&mut m, &a);
        name(&mut m, &b);
        m.segments.remove(0);
        forget_dropped(&mut m);
        assert_eq!(m.beside.iter().collect::<Vec<_>>(), vec![&b]);
    }
}
