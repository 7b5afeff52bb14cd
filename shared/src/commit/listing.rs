//! What a combining object's prefix holds pending for a commit (the partition's
//! `segments/`: combinable segments and intents; a subscription's ledger prefix: intents),
//! what a commit lists beside its write, and where this process's own combinable segment
//! stands: the reads that let a committer land other processes' writes without reading
//! them. One set of functions for the manifest and the ledgers, over [`Drained`] queues
//! and [`Combined`] states.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::runtime::Instant;

use super::queue::{Drained, Place};
use super::{lock, Committer, Queue, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::cas::{Cell, Snapshot};
use crate::keys;
use crate::partition::combine::{self, Combinable, Status};
use crate::partition::index::{Entries, Index, IndexRef};
use crate::partition::intent::{self, Decides, Intent, Status as IntentStatus};
use crate::partition::subscription::SubscriptionState;
use crate::partition::{Manifest, SegmentRef};

/// Index objects read to find a segment the manifest no longer remembers.
pub(super) const FOLDED_LOOKUP: usize = 4;

/// Most segments one listing (so one commit) lands.
pub(super) const MAX_LANDING: usize = 256;

/// What a listing of the partition's `segments/` prefix found pending: other processes'
/// combinable segments and intents (this process's own among the intents), oldest first.
#[derive(Debug, Default, Clone)]
pub(crate) struct Listed {
    pub segments: Vec<SegmentRef>,
    pub intents: Vec<Intent>,
}

/// A state that decides combining writes: intents ([`Decides`]), and for the manifest
/// combinable segments.
pub(super) trait Combined: Decides {
    /// The fate of the combinable segment `id` here (a ledger lands none).
    fn segment_status(&self, id: &str) -> Status {
        let _ = id;
        Status::Unknown
    }
}

impl Combined for Manifest {
    fn segment_status(&self, id: &str) -> Status {
        combine::status(self, id)
    }
}

impl Combined for SubscriptionState {}

/// A pending segment older than this is not deferred to: its writer may be gone.
pub(super) const ABANDON_MS: u64 = 1000;

/// How far back a look lists ([`look_after`]).
pub(super) const LOOK_BACK_MS: u64 = 2 * ABANDON_MS;

/// The oldest a listing made ahead may be when a sweep or batch takes it: older than that,
/// listing again finds more for the same request.
pub(super) const AHEAD_FOR: Duration = Duration::from_millis(500);

/// A listing the partition's committer made while its last commit was in flight, for the
/// next commit to land from: the committer's cycle is then one round trip, the CAS, with
/// the next listing beside it, rather than a listing and a CAS one after another.
#[derive(Debug)]
pub(super) struct Ahead {
    listed: Listed,
    at: Instant,
}

/// What an ordinary or combining commit lists beside its write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Beside {
    /// Nothing.
    Nothing,
    /// The committer's listing for its next commit ([`Committer::list_ahead`]), after
    /// `combined_through`.
    Ahead(String),
    /// A look for other processes' combining writes ([`super::role::Role::look_due`]), after this id.
    Look(String),
}

/// What a look listed, and when it was sent.
pub(super) struct Looked {
    at: Instant,
    listed: Listed,
}

impl Listed {
    pub(super) fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.intents.is_empty()
    }
}

impl Committer {
    /// What a commit from `state` (the object as held, if at all) lists beside its
    /// write: the committer lists ahead for its next sweep or batch (when `ahead`: a
    /// combining commit of the manifest, any commit of a ledger that combines), and a
    /// commit looks for other processes' combining writes when one is due (when `look`).
    pub(super) fn beside<Q: Drained<Ahead = Ahead>>(
        &self,
        q: &Q,
        state: Option<&impl Decides>,
        (ahead, look): (bool, bool),
    ) -> Beside {
        let Some(state) = state else {
            return Beside::Nothing;
        };
        let role = &lock(q.state()).role;
        if ahead && role.is_committer() {
            Beside::Ahead(state.combined_through().to_owned())
        } else if look && role.look_due(crate::runtime::now()) {
            Beside::Look(look_after(state, self.clock.now_ms()))
        } else {
            Beside::Nothing
        }
    }

    /// Makes the listing `beside` names; a look's result is returned, to be judged
    /// against the state the commit leaves ([`Self::looked`]).
    pub(super) async fn list_beside<Q: Drained<Ahead = Ahead>>(
        &self,
        q: &Q,
        beside: &Beside,
    ) -> Option<Looked> {
        match beside {
            Beside::Ahead(after) => {
                self.list_ahead(q, after).await;
                None
            }
            Beside::Look(after) => Some(Looked {
                at: crate::runtime::now(),
                listed: self.list_after(q, after).await,
            }),
            Beside::Nothing => None,
        }
    }

    /// Records what `look` found against `state`, the object after the commit beside
    /// which it listed: others waiting make it contended here.
    pub(super) fn looked<Q: Drained<Ahead = Ahead>>(
        &self,
        q: &Q,
        look: Looked,
        state: Option<&impl Combined>,
    ) {
        let others = state.is_some_and(|s| others_waiting(&look.listed, s, self.clock.now_ms()));
        lock(q.state()).role.looked(others, look.at);
        self.stats.looks.fetch_add(1, Ordering::Relaxed);
        if others {
            self.stats.looks_found.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The combinable segments of other processes and the intents still pending in
    /// `state`, listed from the store (one LIST), oldest first; none when the listing
    /// fails. Objects too old to commit safely (garbage collection may take them), older
    /// than the topic, or tagged with another incarnation (an earlier or later topic's of
    /// the same name), are left out.
    pub(super) async fn list_combinable(
        &self,
        q: &Queue,
        state: &Manifest,
        own: Option<&str>,
    ) -> Listed {
        let listed = self.list_after(q, &state.combined_through).await;
        self.pending_besides(q, listed, own, state)
    }

    /// What of `listed` is another writer's and still pending in `state`.
    fn pending_besides(
        &self,
        q: &Queue,
        mut listed: Listed,
        own: Option<&str>,
        state: &Manifest,
    ) -> Listed {
        if let Some(own) = own {
            listed.segments.retain(|s| s.id != own);
        }
        self.still_pending(q, listed, state)
    }

    /// Lists the combinable writes pending after `snap` (excluding `own`), and, when the
    /// held copy is likely stale ([`super::role::Role::confirm_cache_first`]), confirms
    /// it with a conditional GET sent beside the LIST: the CAS that follows then needs no
    /// read of its own, so a commit that lists is a write, a LIST and a CAS in a row, not
    /// four round trips. What was listed is filtered against the state confirmed.
    pub(super) async fn list_confirming(
        &self,
        q: &Queue,
        cell: &Cell<'_, Manifest>,
        snap: &mut Snapshot<Manifest>,
        own: Option<&str>,
    ) -> Listed {
        let confirm = lock(&q.state)
            .role
            .confirm_cache_first(crate::runtime::now());
        let after = snap.value.combined_through.clone();
        let read = async {
            match confirm {
                true => cell.refresh::<Infallible>(snap).await.is_ok(),
                false => false,
            }
        };
        let (listed, confirmed) = futures::join!(self.list_after(q, &after), read);
        if confirmed {
            lock(&q.state).role.watched(crate::runtime::now());
        }
        self.pending_besides(q, listed, own, &snap.value)
    }

    /// The combinable segments and intents listed after `after` (one LIST) under `q`'s
    /// place, oldest first, young enough to land (garbage collection never takes one that
    /// still could) and not older than the topic; none when the listing fails.
    /// [`Self::still_pending`] filters them against a state.
    pub(super) async fn list_after<Q: Drained<Ahead = Ahead>>(&self, q: &Q, after: &str) -> Listed {
        let place = q.listing();
        let prefix = place.prefix;
        let Ok(keys) = self.store.list_after(prefix, after, MAX_LANDING).await else {
            return Listed::default();
        };
        let fresh = self.fresh(&place);
        let mut listed = Listed::default();
        for id in keys.iter().filter_map(|k| k.strip_prefix(prefix)) {
            if let Some(c) = Combinable::parse(id) {
                if place.tag.is_some_and(|t| c.belongs_to(t)) && fresh(c.written_ms) {
                    listed.segments.push(c.to_ref());
                }
            } else if let Some(i) = Intent::parse(id).filter(|i| fresh(i.written_ms)) {
                listed.intents.push(i);
            }
        }
        listed
    }

    /// Whether a write made at a time is young enough to commit now and no older than
    /// the topic of `place`.
    fn fresh(&self, place: &Place<'_>) -> impl Fn(u64) -> bool {
        let (now, created) = (self.clock.now_ms(), place.created_at_ms);
        move |written| {
            now.saturating_sub(written) <= MAX_SEGMENT_AGE_AT_COMMIT_MS && written >= created
        }
    }

    /// What of `listed` is still pending in `state` and young enough to commit now: a
    /// listing made before `state` was read (while the commit that wrote it was in
    /// flight) is as good as a fresh one, less what was written since.
    pub(super) fn still_pending<Q: Drained<Ahead = Ahead>>(
        &self,
        q: &Q,
        mut listed: Listed,
        state: &impl Combined,
    ) -> Listed {
        let fresh = self.fresh(&q.listing());
        listed.segments.retain(|s| {
            fresh(s.last_produced_ms) && state.segment_status(&s.id) == Status::Pending
        });
        listed.intents.retain(|i| {
            fresh(i.written_ms) && intent::status(state, &i.id) == IntentStatus::Pending
        });
        listed
    }

    /// Lists after `after` beside a commit in flight, and keeps what it found for the next
    /// commit ([`Self::take_ahead`]).
    pub(super) async fn list_ahead<Q: Drained<Ahead = Ahead>>(&self, q: &Q, after: &str) {
        let listed = self.list_after(q, after).await;
        lock(q.state()).ahead = Some(Ahead {
            listed,
            at: crate::runtime::now(),
        });
    }

    /// What the listing made ahead ([`Self::list_ahead`]) found still pending in `state`,
    /// if one was made within [`AHEAD_FOR`]; it is used once.
    pub(super) fn take_ahead<Q: Drained<Ahead = Ahead>>(
        &self,
        q: &Q,
        state: &impl Combined,
    ) -> Option<Listed> {
        let ahead = lock(q.state()).ahead.take()?;
        (ahead.at.elapsed() < AHEAD_FOR).then(|| self.still_pending(q, ahead.listed, state))
    }

    /// The fate of this process's combinable segment `seg` in `state`: as
    /// [`combine::status`], except that a segment the manifest no longer remembers is
    /// looked for in the index objects that can hold it (their newest message is no older
    /// than the segment), the oldest of those first: segments land in about the order they
    /// are written, so that is where a segment that landed long ago is (a writer whose own
    /// conditional write took seconds on SeaweedFS's lock, say, while dozens landed after
    /// it). At most [`FOLDED_LOOKUP`] index objects are read.
    pub(super) async fn segment_status(
        &self,
        q: &Queue,
        state: &Manifest,
        seg: &SegmentRef,
    ) -> Status {
        let id = seg.id.as_str();
        let status = combine::status(state, id);
        if status != Status::Unknown {
            return status;
        }
        let Some(written) = Combinable::parse(id).map(|c| c.written_ms) else {
            return status;
        };
        // Landed by a combining commit, the segment's ref carries its id's time; landed
        // by its own writer, its messages' produce time, which is earlier.
        let newest = written.min(seg.last_produced_ms);
        let mut refs = candidates(&state.indexes, newest);
        let mut read = 0;
        while !refs.is_empty() && read < FOLDED_LOOKUP {
            let r = refs.remove(0);
            read += 1;
            let key = keys::index(&q.topic, q.partition, &r.id);
            let loaded = self
                .caches
                .indexes
                .read_through(&*self.store, &key, Index::decode)
                .await;
            match loaded.ok().flatten().as_deref().map(|i| &i.entries) {
                Some(Entries::Segments(segs)) => {
                    if let Some(s) = segs.iter().find(|s| s.id == id) {
                        return Status::Landed(s.base_offset);
                    }
                }
                // A higher level: the children that can hold it come next.
                Some(Entries::Indexes(children)) => {
                    refs.splice(0..0, candidates(children, newest));
                }
                None => {}
            }
        }
        Status::Unknown
    }
}

/// Where a look ([`super::role::Role::look_due`]) at `now` lists from in `state`: above
/// what it decided, and no further back than [`LOOK_BACK_MS`] (a combining write older
/// than that has its writer taking over already).
pub(super) fn look_after(state: &impl Decides, now: u64) -> String {
    let floor = keys::segment_id(now.saturating_sub(LOOK_BACK_MS), "");
    state.ids_above().max(floor.as_str()).to_owned()
}

/// Whether a look's listing shows other processes waiting for a combining commit at `now`:
/// a combinable segment or intent written within [`LOOK_BACK_MS`] that `state` (the
/// manifest after the look's own commit) has not decided. Those that commit passed over
/// count too: an ordinary commit lands its own segment above them, so their writers
/// write them again and wait once more.
pub(super) fn others_waiting(listed: &Listed, state: &impl Combined, now: u64) -> bool {
    let recent = |written: u64| now.saturating_sub(written) <= LOOK_BACK_MS;
    let segment = listed.segments.iter().any(|s| {
        recent(s.last_produced_ms)
            && matches!(state.segment_status(&s.id), Status::Pending | Status::Dead)
    });
    segment
        || listed.intents.iter().any(|i| {
            recent(i.written_ms)
                && matches!(
                    intent::status(state, &i.id),
                    IntentStatus::Pending | IntentStatus::Dead
                )
        })
}

/// The index refs of `refs` that can hold a segment written at `written_ms` (their newest
/// message is no older), oldest first.
fn candidates(refs: &[IndexRef], written_ms: u64) -> Vec<IndexRef> {
    let mut out: Vec<IndexRef> = refs
        .iter()
        .filter(|r| r.last_produced_ms >= written_ms)
        .cloned()
        .collect();
    out.sort_by_key(|r| (r.last_produced_ms, r.base_offset));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(id: &str, base: u64, last_ms: u64) -> IndexRef {
        IndexRef {
            id: id.into(),
            level: 0,
            base_offset: base,
            end_offset: base + 16,
            segments: 16,
            last_produced_ms: last_ms,
            bytes: 0,
        }
    }

    #[test]
    fn a_look_counts_recent_writes_the_manifest_has_not_decided() {
        let seg = |at: u64, u: &str| {
            Combinable::parse(&Combinable::id(at, "", u, 1, 1)).map(|c| c.to_ref())
        };
        let (old, mine, passed, waiting) = (
            seg(1_000, "old").unwrap(),
            seg(9_000, "mine").unwrap(),
            seg(9_100, "passed").unwrap(),
            seg(9_500, "waiting").unwrap(),
        );
        let mut m = Manifest::empty("i1");
        let now = 10_000;
        let look = |segments: Vec<SegmentRef>, m: &Manifest| {
            let listed = Listed {
                segments,
                intents: Vec::new(),
            };
            others_waiting(&listed, m, now)
        };
        assert!(!look(vec![old.clone()], &m), "written before the look-back");
        assert!(look(vec![waiting.clone()], &m), "pending");
        combine::land(&mut m, std::slice::from_ref(&mine));
        assert!(!look(vec![mine.clone()], &m), "landed: decided");
        // This process's own commit lands a later segment: the one it passed over is dead,
        // and its writer waits again.
        let mut later = m.clone();
        let above = seg(9_200, "above").unwrap();
        combine::land(&mut later, std::slice::from_ref(&above));
        assert!(look(vec![passed], &later), "passed over");
        assert!(look(vec![mine, waiting], &later));
    }

    #[test]
    fn a_folded_segment_is_looked_for_in_the_oldest_index_that_can_hold_it() {
        let refs = [
            index("a", 0, 1_000),
            index("b", 16, 2_000),
            index("c", 32, 3_000),
            index("d", 48, 4_000),
        ];
        let ids = |v: Vec<IndexRef>| v.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(candidates(&refs, 1_500)), ["b", "c", "d"]);
        assert_eq!(ids(candidates(&refs, 2_000)), ["b", "c", "d"]);
        assert!(candidates(&refs, 4_001).is_empty());
    }

    #[test]
    fn a_look_lists_no_further_back_than_two_seconds() {
        let mut s = SubscriptionState::new(&crate::partition::subscription::Origin {
            id: "s".into(),
            start: 0,
        });
        let now = 1_700_000_010_000;
        assert_eq!(
            look_after(&s, now),
            crate::keys::segment_id(now - LOOK_BACK_MS, "")
        );
        s.combined_through = format!("{:013}-z", now - 10);
        assert_eq!(look_after(&s, now), s.combined_through);
    }
}
