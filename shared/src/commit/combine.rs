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
//!    ([`super::wait::poll_after`]: one and a quarter to one and three quarter store
//!    round trips) and re-reads the manifest with a conditional GET:
//!    *landed*, it answers from the manifest and writes nothing; *dead* (a commit moved
//!    past it without landing it), it writes its messages again under a new id;
//!    *pending*, it waits and reads again, for up to [`super::wait::MAX_POLLS`] reads;
//! 3. when a read shows the manifest unchanged since the previous one (nobody is
//!    committing), it lists the partition's segments after `combined_through` (one LIST);
//!    if no older pending segment was written within [`super::listing::ABANDON_MS`] (its
//!    writer would take over first), or after `MAX_POLLS` reads in any case, it commits
//!    itself: one CAS landing every pending segment listed, its own among them.
//!
//! Steps 2 and 3 are the one wait of [`super::wait`], which a subscription's ledger
//! follows too.
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

use super::listing::Listed;
use super::wait::{Holds, Own, Waited, Waits};
use super::{lock, Committer, Object, Queue, TopicSeen};
use crate::cas::{Cell, Snapshot};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::Batch;
use crate::partition::combine::Status;
use crate::partition::intent::{Ask, Decides};
use crate::partition::produce::Plan;
use crate::partition::{Manifest, SegmentRef};

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

impl Committer {
    /// Writes the batch's segment again (deleting the dead one first) and each of its
    /// dead intents again, above `after`.
    async fn rewrite_own(
        &self,
        (q, batch, topic): (&Queue, &Batch, &TopicSeen),
        own: &mut Own,
        (dead_segment, dead_intents): (bool, &[usize]),
        state: &Manifest,
    ) -> BrokerResult<()> {
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
            let w = PartitionWait { q, batch, topic };
            match self
                .wait(&w, (&cell, &mut snap), &mut own, round_trip)
                .await?
            {
                Waited::Decided(base) => return Ok(Head::Decided(snap, base, own)),
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

/// A combining batch of the partition's queue, waiting on the manifest.
struct PartitionWait<'a> {
    q: &'a Queue,
    batch: &'a Batch,
    topic: &'a TopicSeen,
}

impl Waits for PartitionWait<'_> {
    type State = Manifest;
    const OBJECT: Object = Object::Manifest;

    fn holds(&self) -> Holds {
        Holds::of(self.batch)
    }

    fn contended(&self) {
        lock(&self.q.state)
            .role
            .mark_contended(crate::runtime::now());
    }

    async fn segment(&self, c: &Committer, state: &Manifest, own: &Own) -> Option<Status> {
        match &own.segment {
            Some((seg, _)) => Some(c.segment_status(self.q, state, seg).await),
            None => None,
        }
    }

    async fn rewrite(
        &self,
        c: &Committer,
        own: &mut Own,
        dead: (bool, &[usize]),
        state: &Manifest,
    ) -> BrokerResult<()> {
        let work = (self.q, self.batch, self.topic);
        c.rewrite_own(work, own, dead, state).await
    }

    async fn list(&self, c: &Committer, state: &Manifest, own: &Own) -> Listed {
        let own_seg = own.segment.as_ref().map(|(s, _)| s.id.as_str());
        c.list_combinable(self.q, state, own_seg).await
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
