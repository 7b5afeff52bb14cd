//! How a combining batch waits for its writes to be decided, on any object that combines
//! (the partition's manifest, a subscription's ledger): steps 2 and 3 of
//! [`super::combine`]'s protocol, written once. The object says what the batch's own
//! writes are there and how to write them again ([`Waits`]); the steps themselves are
//! plain functions ([`fate`], [`step`], [`older_pending`], [`poll_after`]).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::listing::{Combined, Listed, ABANDON_MS};
use super::queue::Drained;
use super::{Committer, Object};
use crate::cas::{Cell, Snapshot, Stored};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::batch::Batch;
use crate::partition::combine::Status;
use crate::partition::intent::{self, Ask, Decides, Intent, Status as IntentStatus};
use crate::partition::produce::Plan;
use crate::partition::SegmentRef;

/// Manifest reads a waiting writer makes before it commits itself.
pub(super) const MAX_POLLS: u32 = 6;

/// A combining batch's own writes: its segment with the plan it was written for (when it
/// has produces) and one intent per settle and lease request, settles first, each in the
/// batch's order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Own {
    pub segment: Option<(SegmentRef, Plan)>,
    pub intents: Vec<Intent>,
}

/// What a waiting writer's batch holds, which decides how soon it reads the manifest
/// first ([`poll_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// A combinable segment (with or without intents).
    Produces,
    /// Intents only: settles and lease requests.
    IntentsOnly,
}

impl Holds {
    pub(super) fn of(batch: &Batch) -> Self {
        if batch.produces.is_empty() {
            Self::IntentsOnly
        } else {
            Self::Produces
        }
    }
}

/// How long to wait before reading the manifest, in store round trips (measured by this
/// writer's own PUT); a read sent then reads the manifest most of a round trip later.
/// First, how long the committer takes to land a write it can see, guessed from what
/// this writer's batch holds, since the committer's own batches are mostly of the same
/// kind under the same load:
/// - settles and leases: one and a quarter. The committer lands intents with the
///   listing it made beside its previous CAS (`Ahead`), so a write is landed by the CAS
///   after the first listing sent once it was visible: within two round trips of its
///   writer's PUT returning, one of which the read itself takes.
/// - produces: one and three quarters. A committer's own produce batch lists only after
///   its segment write (a listing made earlier would let its segment pass over those in
///   flight), a round trip more per cycle. Reading earlier there found writes pending
///   and unchanged manifests, and the takeovers that followed passed over others'
///   segments (8 x 1 on the file store + 20 ms: 0.14 rewrites per produce instead of
///   0.03, 67 msg/s instead of 76).
///
/// Then one round trip, the committer's cycle.
pub(super) fn poll_after(round_trip: Duration, first: bool, holds: Holds) -> Duration {
    let d = match (first, holds) {
        (false, _) => round_trip,
        (true, Holds::IntentsOnly) => round_trip * 5 / 4,
        (true, Holds::Produces) => round_trip * 7 / 4,
    };
    d.clamp(Duration::from_millis(1), Duration::from_secs(1))
}

impl Committer {
    /// Steps 2 and 3 of the module documentation, on the partition's manifest or a
    /// ledger (`w`): waits for a commit that decides `own` (re-reading `snap` through
    /// `cell`), rewriting what is passed over, until this writer should take over (with
    /// what its last listing found, if it listed) or the object turns out corrupt.
    /// `round_trip`: how long the writes took.
    ///
    /// Errors: a rewrite's or a read's failure; [`BrokerError::OutcomeUnknown`] when the
    /// fate of a write can no longer be told.
    pub(super) async fn wait<W: Waits>(
        &self,
        w: &W,
        (cell, snap): (&Cell<'_, W::State>, &mut Snapshot<W::State>),
        own: &mut Own,
        mut round_trip: Duration,
    ) -> BrokerResult<Waited> {
        for round in 0..MAX_POLLS {
            crate::runtime::sleep(poll_after(round_trip, round == 0, w.holds())).await;
            self.stats.polls.fetch_add(1, Ordering::Relaxed);
            let unchanged = match cell.refresh::<BrokerError>(snap).await {
                Ok(u) => u,
                Err(e) if crate::repair::damaged(&e) => return Ok(Waited::Corrupt),
                Err(e) => return Err(e.into()),
            };
            if !unchanged {
                w.contended();
            }
            let segment = w.segment(self, &snap.value, own).await;
            let intents: Vec<IntentStatus> = own
                .intents
                .iter()
                .map(|i| intent::status(&snap.value, &i.id))
                .collect();
            match step(fate(segment, &intents), unchanged) {
                Step::Answer(base) => {
                    self.stats.landed_by_others.fetch_add(1, Ordering::Relaxed);
                    let n = own.intents.len() as u64;
                    let by_others = self.stats.intents_by_others(W::OBJECT);
                    by_others.fetch_add(n, Ordering::Relaxed);
                    return Ok(Waited::Decided(base));
                }
                Step::GiveUp => {
                    let m = &snap.value;
                    tracing::warn!(
                        object = W::OBJECT.name(),
                        segment = own.segment.as_ref().map_or("", |(s, _)| s.id.as_str()),
                        intents = own.intents.len(),
                        decided_floor = %m.decided_floor(),
                        combined_through = %m.combined_through(),
                        round,
                        "a combining write's fate can no longer be told: answered 503"
                    );
                    return Err(BrokerError::OutcomeUnknown(format!(
                        "a combining write's record left the {} before its writer read it",
                        W::OBJECT.name()
                    )));
                }
                Step::Rewrite(dead_segment, dead_intents) => {
                    let started = crate::runtime::now();
                    self.stats.rewritten.fetch_add(1, Ordering::Relaxed);
                    let dead = (dead_segment, &dead_intents[..]);
                    w.rewrite(self, own, dead, &snap.value).await?;
                    round_trip = started.elapsed();
                }
                Step::Consider => {
                    let found = w.list(self, &snap.value, own).await;
                    if !older_pending(&found, own, self.clock.now_ms()) {
                        return Ok(Waited::TakeOver(Some(found)));
                    }
                }
                Step::Wait => {}
            }
        }
        Ok(Waited::TakeOver(None))
    }

    /// Writes the intent asking `ask` on `q`'s object (the partition's or a ledger's),
    /// its id above `after` (what this process knows of [`Decides::ids_above`]).
    ///
    /// Errors: the write's.
    pub(super) async fn write_intent<Q: Drained>(
        &self,
        q: &Q,
        after: &str,
        ask: Ask,
    ) -> BrokerResult<Intent> {
        self.stats
            .intents(Q::OBJECT)
            .fetch_add(1, Ordering::Relaxed);
        self.put_intent(q.listing().prefix, after, ask).await
    }
}

/// The object a combining batch waits on ([`Committer::wait`]), and what it does about
/// the batch's own writes there: the partition's manifest ([`PartitionWait`]) or a
/// subscription's ledger (`ledgers/combine.rs`).
pub(super) trait Waits: Sync {
    /// The object's state.
    type State: Combined + Stored;
    /// Which object it is (for the counters).
    const OBJECT: Object;
    /// What the batch holds, which decides how soon it reads first.
    fn holds(&self) -> Holds;
    /// Records that the object changed while the batch waited.
    fn contended(&self);
    /// Where the batch's own segment stands in `state` (`None`: it has none; a ledger
    /// lands no segments).
    fn segment(
        &self,
        c: &Committer,
        state: &Self::State,
        own: &Own,
    ) -> impl Future<Output = Option<Status>> + Send;
    /// Writes again what `state` passed over (the segment when `dead.0`, and the intents
    /// at `dead.1`), above its ids.
    fn rewrite(
        &self,
        c: &Committer,
        own: &mut Own,
        dead: (bool, &[usize]),
        state: &Self::State,
    ) -> impl Future<Output = BrokerResult<()>> + Send;
    /// What a listing finds pending beside `state`, besides `own`.
    fn list(
        &self,
        c: &Committer,
        state: &Self::State,
        own: &Own,
    ) -> impl Future<Output = Listed> + Send;
}

/// Where a combining batch's own writes stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fate {
    /// Every one was decided (the segment, if any, at this base offset).
    Decided(Option<u64>),
    /// Some are pending; these were passed over and must be written again.
    Waiting {
        dead_segment: bool,
        dead_intents: Vec<usize>,
    },
    /// The fate of one can no longer be told.
    Unknown,
}

/// The [`Fate`] of a batch whose segment has `segment` status (`None`: no segment) and
/// whose intents have `intents`.
pub(super) fn fate(segment: Option<Status>, intents: &[IntentStatus]) -> Fate {
    let mut dead_segment = false;
    let mut waiting = false;
    let mut base = None;
    match segment {
        Some(Status::Landed(b)) => base = Some(b),
        Some(Status::Pending) => waiting = true,
        Some(Status::Dead) => dead_segment = true,
        Some(Status::Unknown) => return Fate::Unknown,
        None => {}
    }
    let mut dead_intents = Vec::new();
    for (i, s) in intents.iter().enumerate() {
        match s {
            IntentStatus::Decided(_) => {}
            IntentStatus::Pending => waiting = true,
            IntentStatus::Dead => dead_intents.push(i),
            IntentStatus::Unknown => return Fate::Unknown,
        }
    }
    if waiting || dead_segment || !dead_intents.is_empty() {
        Fate::Waiting {
            dead_segment,
            dead_intents,
        }
    } else {
        Fate::Decided(base)
    }
}

/// How a waiting writer's wait ended.
pub(super) enum Waited {
    /// Another process's commit decided every write (the segment at this base offset).
    Decided(Option<u64>),
    /// This writer commits, landing what its last listing found if it listed.
    TakeOver(Option<Listed>),
    /// The manifest turned out corrupt.
    Corrupt,
}

/// What a waiting writer does after a read of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Every write is decided: answer (the segment at this base offset).
    Answer(Option<u64>),
    /// The fate of a write can no longer be told: answer 503.
    GiveUp,
    /// Write these again, then wait: the segment (when `true`) and these intents were
    /// passed over.
    Rewrite(bool, Vec<usize>),
    /// Nobody committed since the last read: list, and take over unless an older
    /// writer would.
    Consider,
    /// Another process is committing: wait and read again.
    Wait,
}

/// The [`Step`] after a read that showed `fate`, the manifest `unchanged` since the last.
pub(super) fn step(fate: Fate, unchanged: bool) -> Step {
    match fate {
        Fate::Decided(base) => Step::Answer(base),
        Fate::Unknown => Step::GiveUp,
        Fate::Waiting {
            dead_segment,
            dead_intents,
        } if dead_segment || !dead_intents.is_empty() => Step::Rewrite(dead_segment, dead_intents),
        Fate::Waiting { .. } if unchanged => Step::Consider,
        Fate::Waiting { .. } => Step::Wait,
    }
}

/// Whether `found` holds another process's pending write older than every one of `own`
/// and written within [`ABANDON_MS`] of `now`: its writer takes over first.
pub(super) fn older_pending(found: &Listed, own: &Own, now: u64) -> bool {
    let oldest_own = own
        .segment
        .iter()
        .map(|(s, _)| s.id.as_str())
        .chain(own.intents.iter().map(|i| i.id.as_str()))
        .min()
        .unwrap_or("");
    let mine = |id: &str| own.intents.iter().any(|i| i.id == id);
    let recent = |t: u64| now.saturating_sub(t) < ABANDON_MS;
    found
        .segments
        .iter()
        .map(|s| (s.id.as_str(), s.last_produced_ms))
        .chain(found.intents.iter().map(|i| (i.id.as_str(), i.written_ms)))
        .any(|(id, t)| id < oldest_own && !mine(id) && recent(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::intent::Outcome;

    #[test]
    fn settles_and_leases_read_sooner_than_produces_then_every_round_trip() {
        let rt = Duration::from_millis(20);
        let ms = |first, holds| poll_after(rt, first, holds).as_millis();
        assert_eq!(ms(true, Holds::IntentsOnly), 25);
        assert_eq!(ms(true, Holds::Produces), 35);
        assert_eq!(ms(false, Holds::IntentsOnly), 20);
        assert_eq!(ms(false, Holds::Produces), 20);
        // A store that answers at once is still read no more than every millisecond, and
        // a slow one at least every second.
        assert_eq!(
            poll_after(Duration::ZERO, true, Holds::IntentsOnly).as_millis(),
            1
        );
        assert_eq!(
            poll_after(Duration::from_secs(3), false, Holds::Produces).as_secs(),
            1
        );
    }

    #[test]
    fn a_batch_is_decided_only_when_all_its_writes_are() {
        let done = IntentStatus::Decided(Outcome::Done);
        assert_eq!(fate(None, std::slice::from_ref(&done)), Fate::Decided(None));
        assert_eq!(
            fate(Some(Status::Landed(7)), std::slice::from_ref(&done)),
            Fate::Decided(Some(7))
        );
        assert_eq!(
            fate(
                Some(Status::Landed(7)),
                &[done.clone(), IntentStatus::Pending]
            ),
            Fate::Waiting {
                dead_segment: false,
                dead_intents: vec![]
            }
        );
        assert_eq!(
            fate(Some(Status::Dead), &[IntentStatus::Dead, done.clone()]),
            Fate::Waiting {
                dead_segment: true,
                dead_intents: vec![0]
            }
        );
        assert_eq!(
            fate(Some(Status::Pending), &[IntentStatus::Unknown]),
            Fate::Unknown
        );
        assert_eq!(fate(Some(Status::Unknown), &[done]), Fate::Unknown);
    }

    #[test]
    fn a_waiting_writer_answers_rewrites_considers_or_waits() {
        let waiting = |dead_segment, dead_intents| Fate::Waiting {
            dead_segment,
            dead_intents,
        };
        assert_eq!(step(Fate::Decided(Some(3)), false), Step::Answer(Some(3)));
        assert_eq!(step(Fate::Unknown, true), Step::GiveUp);
        // Passed over: written again, whether or not anyone is committing.
        assert_eq!(
            step(waiting(true, vec![]), true),
            Step::Rewrite(true, vec![])
        );
        assert_eq!(
            step(waiting(false, vec![1]), false),
            Step::Rewrite(false, vec![1])
        );
        // Pending: take over only when nobody committed since the last read.
        assert_eq!(step(waiting(false, vec![]), true), Step::Consider);
        assert_eq!(step(waiting(false, vec![]), false), Step::Wait);
    }

    #[test]
    fn only_an_older_recent_write_of_another_process_is_deferred_to() {
        let ask = Ask::Lease {
            max: 1,
            max_bytes: 1,
        };
        let at = |t: u64, u: &str| Intent::parse(&Intent::id(t, "", u, ask)).unwrap();
        let own = Own {
            segment: None,
            intents: vec![at(5_000, "me")],
        };
        let found = |i: Intent| Listed {
            segments: vec![],
            intents: vec![i],
        };
        assert!(older_pending(&found(at(4_900, "them")), &own, 5_100));
        // Quiet for longer than ABANDON_MS: maybe gone.
        assert!(!older_pending(&found(at(3_000, "them")), &own, 5_100));
        // Younger than ours, or ours.
        assert!(!older_pending(&found(at(5_001, "them")), &own, 5_100));
        assert!(!older_pending(&found(own.intents[0].clone()), &own, 5_100));
    }
}
