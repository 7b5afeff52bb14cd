//! Many processes on one partition: wait for a commit that lands this batch's segment
//! instead of racing it (docs/design.md §6, "Many processes on one partition").
//!
//! Classic Lambda serves one request per instance at a time, so group commit inside a
//! process has nothing to fold, and every instance races every other for the manifest.
//! Once a partition is *contended* here (a batch of this process lost a race, or found
//! other processes' segments pending, within [`CONTENDED_FOR`]), a produce-only batch
//! without idempotency keys goes this way instead:
//!
//! 1. it writes its segment under a combinable id ([`crate::partition::combine`]) above
//!    the `combined_through` it knows (one PUT, as always);
//! 2. unless this process is the partition's committer already (below), it waits
//!    ([`poll_after`]: one and a quarter to one and three quarter store round trips) and
//!    re-reads the manifest with a conditional GET:
//!    *landed*, it answers from the manifest and writes nothing; *dead* (a commit moved
//!    past it without landing it), it writes its messages again under a new id;
//!    *pending*, it waits and reads again, for up to [`MAX_POLLS`] reads;
//! 3. when a read shows the manifest unchanged since the previous one (nobody is
//!    committing), it lists the partition's segments after `combined_through` (one LIST);
//!    if no older pending segment was written within [`ABANDON_MS`] (its writer would take
//!    over first), or after [`MAX_POLLS`] reads in any case, it commits itself: one CAS
//!    landing every pending segment listed, its own among them.
//!
//! A process that committed that way becomes the partition's *committer* for a while: when
//! its queue is empty it keeps *sweeping* (list, and if segments are pending, one CAS that
//! lands them all) until [`IDLE_SWEEPS`] listings in a row find nothing pending or
//! [`MAX_SWEEPS`] rounds have run. The other writers meanwhile see the manifest change and keep waiting, so commits
//! follow one another without racing, each landing whatever arrived meanwhile.
//!
//! Nobody waits for a coordinator: a writer takes over as soon as the manifest stops
//! changing, and a committer that dies simply stops changing it. Nothing is answered
//! before the manifest that holds it is read or written; a segment lands at most once
//! (its id is decided by `combined_through`); so a race costs at worst a failed CAS,
//! never a duplicate or a lost message.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::listing::{Listed, ABANDON_MS};
use super::{lock, Committer, Queue, TopicSeen};
use crate::cas::{Cell, Snapshot};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::Batch;
use crate::partition::combine::Status;
use crate::partition::intent::{self, Ask, Decides, Intent, Status as IntentStatus};
use crate::partition::produce::Plan;
use crate::partition::{Manifest, SegmentRef};

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

/// A combining commit ready to go: the batch's own writes, what the listing found pending
/// besides them, and the manifest it listed against.
pub(crate) struct Ready {
    pub own: Own,
    pub listed: Listed,
    pub snap: Snapshot<Manifest>,
}

/// How a combining batch goes on.
pub(super) enum Head {
    /// Other processes' commits decided every operation, as this snapshot shows (the
    /// segment's base offset, when the batch has one, is the second field).
    Decided(Snapshot<Manifest>, Option<u64>, Own),
    /// This process commits (see [`Ready`]).
    Commit(Ready),
    /// The ordinary path (the manifest does not exist yet), from this snapshot.
    Direct(Option<Snapshot<Manifest>>),
    /// The manifest turned out corrupt after the batch's own objects were written:
    /// repair, then commit them (a rebuild may have taken its segment in already).
    Corrupt(Own),
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
    fn of(batch: &Batch) -> Self {
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
    /// Where this batch's own writes stand in `state` (see [`fate`]).
    async fn own_fate(&self, q: &Queue, state: &Manifest, own: &Own) -> Fate {
        let segment = match &own.segment {
            Some((seg, _)) => Some(self.segment_status(q, state, seg).await),
            None => None,
        };
        let intents: Vec<IntentStatus> = own
            .intents
            .iter()
            .map(|i| intent::status(state, &i.id))
            .collect();
        fate(segment, &intents)
    }

    /// Writes the batch's segment again (deleting the dead one first) and each of its
    /// dead intents again, above `after`.
    async fn rewrite(
        &self,
        q: &Queue,
        batch: &Batch,
        topic: &TopicSeen,
        own: &mut Own,
        (dead_segment, dead_intents): (bool, &[usize]),
        state: &Manifest,
    ) -> BrokerResult<()> {
        self.stats.rewritten.fetch_add(1, Ordering::Relaxed);
        let after = state.ids_above();
        if dead_segment {
            if let Some((seg, plan)) = own.segment.take() {
                // It never lands: deleted before it is written again, so a rebuild from
                // segments (which cannot tell a dead one from a pending one) never finds
                // two copies of these produces.
                let dead = keys::segment(&q.topic, q.partition, &seg.id);
                self.store.delete(&dead).await?;
                let messages = plan.new_messages(&batch.produces);
                let check = self.segment_check(topic, true, !state.stored());
                let seg = self
                    .write_segment(q, topic, messages, Some(after), check)
                    .await?;
                own.segment = Some((seg, plan));
            }
        }
        for &i in dead_intents {
            let ask = own.intents[i].ask;
            own.intents[i] = self.write_intent(q, after, ask).await?;
        }
        Ok(())
    }

    /// Steps 1 to 3 of the module documentation for a combining `batch`, starting from
    /// `cache` (or a fresh read): its segment and intents are written, then it waits for
    /// a commit that decides them all, or commits itself.
    ///
    /// Errors: a write's or the store's failure; [`BrokerError::OutcomeUnknown`] when the
    /// fate of a write can no longer be told (the caller answers 503).
    pub(super) async fn combine_head(
        &self,
        q: &Queue,
        (batch, topic): (&Batch, &TopicSeen),
        cache: Option<Snapshot<Manifest>>,
        written: Option<(SegmentRef, Plan)>,
    ) -> BrokerResult<Head> {
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        let mut snap = match cache {
            Some(s) => s,
            None => {
                let read = cell.read::<BrokerError>().await?;
                // Just read: the commit need not confirm it again.
                lock(&q.state).role.watched(crate::runtime::now());
                read
            }
        };
        if snap.etag.is_none() {
            return Ok(Head::Direct(Some(snap)));
        }
        let started = crate::runtime::now();
        // The partition's committer commits this batch itself, at once: its settles and
        // leases go into that commit as they are, and need no intents.
        let committer = lock(&q.state).role.is_committer();
        let mut own = self
            .write_own(q, (batch, topic), &snap.value, !committer, written)
            .await?;
        // The committer lands what it listed beside its last commit, unless the batch has
        // produces: its own segment, the newest id, would pass over every segment still in
        // flight that such a listing missed, so the listing follows its write.
        let mut listed = (committer && batch.produces.is_empty())
            .then(|| self.take_ahead(q, &snap.value))
            .flatten();
        let round_trip = started.elapsed();
        if !committer {
            let waited = self.wait(q, (batch, topic), &cell, &mut snap, &mut own, round_trip);
            match waited.await? {
                Waited::Decided(base) => {
                    self.stats.landed_by_others.fetch_add(1, Ordering::Relaxed);
                    let n = own.intents.len() as u64;
                    self.stats.intents_by_others.fetch_add(n, Ordering::Relaxed);
                    return Ok(Head::Decided(snap, base, own));
                }
                Waited::Corrupt => return Ok(Head::Corrupt(own)),
                Waited::TakeOver(found) => listed = found,
            }
            self.stats.takeovers.fetch_add(1, Ordering::Relaxed);
        }
        let listed = match listed {
            Some(l) => l,
            None => {
                let own_seg = own.segment.as_ref().map(|(s, _)| s.id.as_str());
                self.list_confirming(q, &cell, &mut snap, own_seg).await
            }
        };
        if listed.segments.len() + listed.intents.len() > own.intents.len() {
            lock(&q.state).role.mark_contended(crate::runtime::now());
        }
        Ok(Head::Commit(Ready { own, listed, snap }))
    }

    /// Step 2 and 3 of the module documentation: waits for a commit that decides `own`
    /// (re-reading `snap`), rewriting what is passed over, until this writer should take
    /// over (with what its last listing found, if it listed) or the manifest turns out
    /// corrupt. `round_trip`: how long the writes took.
    ///
    /// Errors: a rewrite's or a read's failure; [`BrokerError::OutcomeUnknown`] when the
    /// fate of a write can no longer be told.
    async fn wait(
        &self,
        q: &Queue,
        (batch, topic): (&Batch, &TopicSeen),
        cell: &Cell<'_, Manifest>,
        snap: &mut Snapshot<Manifest>,
        own: &mut Own,
        mut round_trip: Duration,
    ) -> BrokerResult<Waited> {
        for round in 0..MAX_POLLS {
            let holds = Holds::of(batch);
            crate::runtime::sleep(poll_after(round_trip, round == 0, holds)).await;
            self.stats.polls.fetch_add(1, Ordering::Relaxed);
            let unchanged = match cell.refresh::<BrokerError>(snap).await {
                Ok(u) => u,
                Err(e) if super::repair::damaged(&e) => return Ok(Waited::Corrupt),
                Err(e) => return Err(e.into()),
            };
            if !unchanged {
                lock(&q.state).role.mark_contended(crate::runtime::now());
            }
            match step(self.own_fate(q, &snap.value, own).await, unchanged) {
                Step::Answer(base) => return Ok(Waited::Decided(base)),
                Step::GiveUp => {
                    let m = &snap.value;
                    tracing::warn!(
                        version = m.version,
                        segment = own.segment.as_ref().map_or("", |(s, _)| s.id.as_str()),
                        intents = own.intents.len(),
                        landed_floor = %m.landed_floor,
                        decided_floor = %m.decided_floor,
                        combined_through = %m.combined_through,
                        hot = m.segments.len(),
                        indexes = m.indexes.len(),
                        round,
                        "a combining write's fate can no longer be told: answered 503"
                    );
                    return Err(BrokerError::OutcomeUnknown(
                        "a combining write's record left the manifest before its writer read it"
                            .into(),
                    ));
                }
                Step::Rewrite(dead_segment, dead_intents) => {
                    let started = crate::runtime::now();
                    let dead = (dead_segment, &dead_intents[..]);
                    self.rewrite(q, batch, topic, own, dead, &snap.value)
                        .await?;
                    round_trip = started.elapsed();
                }
                Step::Consider => {
                    let own_seg = own.segment.as_ref().map(|(s, _)| s.id.as_str());
                    let found = self.list_combinable(q, &snap.value, own_seg).await;
                    if !older_pending(&found, own, self.clock.now_ms()) {
                        return Ok(Waited::TakeOver(Some(found)));
                    }
                }
                Step::Wait => {}
            }
        }
        Ok(Waited::TakeOver(None))
    }

    /// Writes `batch`'s segment (when it has produces, and unless it is `written`
    /// already) and, with `intents`, its intents at once, above [`Manifest::ids_above`]
    /// of `state`.
    async fn write_own(
        &self,
        q: &Queue,
        (batch, topic): (&Batch, &TopicSeen),
        state: &Manifest,
        intents: bool,
        written: Option<(SegmentRef, Plan)>,
    ) -> BrokerResult<Own> {
        let after = state.ids_above();
        let segment = async {
            if batch.produces.is_empty() {
                return Ok(None);
            }
            if written.is_some() {
                return Ok(written);
            }
            let plan = Plan::new(&batch.produces, state, self.clock.now_ms(), &|_| None);
            let messages = plan.new_messages(&batch.produces);
            let check = self.segment_check(topic, true, !state.stored());
            let seg = self
                .write_segment(q, topic, messages, Some(after), check)
                .await?;
            Ok::<_, BrokerError>(Some((seg, plan)))
        };
        let intents = futures::future::try_join_all(
            asks(batch)
                .filter(|_| intents)
                .map(|ask| self.write_intent(q, after, ask)),
        );
        let (segment, intents) = futures::join!(segment, intents);
        Ok(Own {
            segment: segment?,
            intents: intents?,
        })
    }
}

/// The intents a combining batch writes: one per settle, then one per lease request.
pub(super) fn asks(batch: &Batch) -> impl Iterator<Item = Ask> + '_ {
    let settles = batch.settles.iter().map(|op| Ask::Settle {
        offset: op.offset,
        lease_id: op.lease_id,
        action: op.action,
    });
    let leases = batch.leases.iter().map(|op| Ask::Lease {
        max: u32::try_from(op.max).unwrap_or(u32::MAX),
        max_bytes: op.max_bytes,
    });
    settles.chain(leases)
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
enum Waited {
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
