//! One batch of the committer: plan, write the segment, one manifest CAS, answer.
//!
//! The manifest write goes through [`crate::cas::Cell::update_cached`] with a
//! [`BatchCommit`] change. Before every attempt its `prepare` runs the batch's preparers
//! against the state that attempt starts from, each owning its state across attempts:
//! [`Produces`] (the plan and the segment written for it), [`Landing`] (other processes'
//! writes and the batch's own intents, when it combines), the [`Upkeeper`] (index objects
//! and key chunks) and the message keys read for per-key ordering. `apply` is then the
//! pure [`crate::partition::batch::apply`], and every caller is answered from the
//! manifest that landed ([`super::replies`]).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::OptionFuture;
use tracing::Instrument;

use super::cold::ColdStart;
use super::combine::{Head, Ready};
use super::landing::{Landing, Progress};
use super::listing::Listed;
use super::ordering;
use super::produces::{combinable, EarlySegment, Produces};
use super::queue::Onward;
use super::replies::{split, Replies};
use super::role::{Attempts, Confirmed};
use super::upkeep::Upkeeper;
use super::write::BesideFate;
use super::{lock, Committer, Pending, Queue, TopicSeen};
use crate::cas::{Cell, Change, Decision, Snapshot};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::{self, Applied, Batch, Beside, Written};
use crate::partition::combine::Combinable;
use crate::partition::intent::{self, MAX_LEASE_ASK};
use crate::partition::lease::Keys;
use crate::partition::produce::{Plan, Unplaced};
use crate::partition::{Manifest, SegmentRef};
use crate::repair::damaged;
use crate::store::StoreError;

/// A batch to commit, the callers to answer, and the topic record ETag its producers saw.
pub(super) struct Work {
    pub batch: Batch,
    pub replies: Replies,
    pub topic: TopicSeen,
}

/// The manifest change of one batch (see the module documentation).
struct BatchCommit<'a> {
    committer: &'a Committer,
    q: &'a Queue,
    topic: TopicSeen,
    batch: Batch,
    now: u64,
    produces: Produces,
    landing: Landing,
    /// Index objects written for this batch's upkeep.
    upkeeper: Upkeeper,
    /// Message keys read for per-key ordering (facts, kept across attempts).
    keys: Keys,
    /// Whether the last `apply` decided to write.
    wrote: bool,
    /// Attempts so far (more than one: another process wrote meanwhile).
    attempts: u32,
    /// Whether this ordinary batch may turn to combining after [`SWITCH_AFTER`] lost
    /// races ([`Stop::Switch`]).
    may_switch: bool,
    /// Whether it decided to, in the last `prepare`.
    switching: bool,
    /// Why the last `prepare` found the topic record not the one the batch was made for
    /// (it confirms the record before a write that creates the manifest).
    topic_refused: Option<BrokerError>,
    /// Fired once the first attempt is past its segment write: the drain may take the
    /// next batch ahead ([`super::queue`]).
    onward: Onward,
    /// Segments written beside a manifest write whose fate this process learnt: this
    /// commit decides them ([`crate::partition::beside`]).
    decided: Vec<String>,
}

/// What a batch brings to its first commit: when it was taken ahead ([`super::queue`]),
/// the segment it wrote while the batch before it committed, and the word the drain waits
/// for before it takes the next batch ahead; when it was a first batch, how its manifest
/// was read before it was taken ([`super::cold`]). The default: nothing written, nobody
/// waiting, nothing read.
#[derive(Default)]
pub(super) struct Turn {
    pub early: Option<EarlySegment>,
    pub onward: Onward,
    pub cold: Option<ColdStart>,
}

/// Races an ordinary batch that may combine loses before it turns to combining: a process
/// whose cache stays current wins every race at the first try, a round trip ahead of
/// every other, so retrying the same way would lose all [`crate::cas::MAX_ATTEMPTS`].
pub(super) const SWITCH_AFTER: u32 = 2;

/// Why an attempt of a batch stops before its manifest write.
#[derive(Debug, Clone)]
pub(super) enum Stop {
    /// An ordinary batch gives up its manifest write to go the combining way instead
    /// ([`SWITCH_AFTER`]).
    Switch,
    /// The write would create the manifest, and confirming the topic record first
    /// failed: the topic was deleted or created again (every caller gets
    /// [`BrokerError::StaleTopic`] and the broker retries against the current topic), or
    /// the record could not be read.
    Topic(BrokerError),
}

/// Whether a batch that failed with `e` was refused for good, so that no attempt of it
/// landed in a live manifest: the topic record refused the write that would create the
/// manifest (the topic was deleted or created again, or its record could not be read: a
/// refusal only happens where no earlier attempt of the batch landed, since a landed one
/// is found by its write id), or the manifest belongs to a newer incarnation of the topic.
fn abandoned(e: &crate::cas::CasError<Stop>) -> bool {
    matches!(
        e,
        crate::cas::CasError::Rejected(Stop::Topic(_)) | crate::cas::CasError::Superseded
    )
}

impl From<Stop> for BrokerError {
    fn from(stop: Stop) -> Self {
        match stop {
            // Never answered: the batch is committed the combining way instead.
            Stop::Switch => BrokerError::Contention,
            Stop::Topic(e) => e,
        }
    }
}

/// The way [`Committer::run_batch`] commits a batch next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// One CAS of its own (it may switch to combining, [`SWITCH_AFTER`]).
    Ordinary,
    /// The combining way.
    Combine,
}

/// A batch for [`Committer::commit`] after its combining head ([`Committer::head`]).
struct ToCommit {
    work: Work,
    /// The snapshot to commit from.
    cache: Option<Snapshot<Manifest>>,
    /// Whether it still combines (it does not after the manifest was rebuilt).
    combining: bool,
    /// What the head wrote and listed (none: listed afresh when combining).
    head: Option<Ready>,
}

/// How [`Committer::commit`] ended.
pub(super) enum Committed {
    /// Every caller was answered: the snapshot to cache and how many of other processes'
    /// writes the commit landed.
    Done(Option<Snapshot<Manifest>>, usize),
    /// The batch, unanswered, turned to combining ([`Stop::Switch`]), with the combinable
    /// segment it wrote (if it did) and the plan it was written for.
    Switched(Work, Option<(SegmentRef, Plan)>),
}

impl<'a> BatchCommit<'a> {
    /// The change committing `work` for `q`, landing other processes' writes when
    /// `combining` (those `head` listed, or listed afresh), from what `turn` brings.
    fn new(
        (c, q): (&'a Committer, &'a Queue),
        work: Work,
        (combining, head): (bool, Option<Ready>),
        may_switch: bool,
        turn: Turn,
    ) -> Self {
        let Work {
            mut batch, topic, ..
        } = work;
        let (keys, decided) = {
            let mut st = lock(&q.state);
            (std::mem::take(&mut st.more.keys), st.more.decided.clone())
        };
        let (produces, landing) = match head {
            None => (Produces::early(turn.early), Landing::new(combining)),
            Some(h) => {
                if !h.own.intents.is_empty() {
                    // The batch's settles and leases are intents now: applied as listed
                    // ones, answered from what the manifest records of them.
                    batch.settles.clear();
                    batch.leases.clear();
                }
                (
                    Produces::written(h.own.segment),
                    Landing::listed(h.listed, &h.snap.value, h.own.intents),
                )
            }
        };
        Self {
            committer: c,
            q,
            topic,
            batch,
            now: c.clock.now_ms(),
            produces,
            landing,
            upkeeper: Upkeeper::default(),
            // Facts an earlier batch read (offsets never change their message).
            keys,
            decided,
            wrote: false,
            attempts: 0,
            may_switch: may_switch && !combining,
            switching: false,
            topic_refused: None,
            onward: turn.onward,
        }
    }

    /// What this attempt writes, with its produces planned as `plan`.
    fn written<'s>(&'s self, plan: &'s Plan) -> Written<'s> {
        self.written_with(plan, &self.keys)
    }

    /// [`BatchCommit::written`] with the message keys `keys`.
    fn written_with<'s>(&'s self, plan: &'s Plan, keys: &'s Keys) -> Written<'s> {
        Written {
            plan,
            segment: self.produces.segment(),
            found_at: self.produces.found_at(),
            foreign: self.landing.foreign(),
            intents: self.landing.intents(),
            upkeep: &self.upkeeper.upkeep,
            keys,
            beside: Beside {
                own: self.produces.writes_beside(),
                decided: &self.decided,
            },
        }
    }

    /// Whether this attempt, starting from `state`, would create the manifest with
    /// produces in it (its own or other processes') while nothing confirmed the topic
    /// record for it: not the request's own read, not its segment write.
    fn creates_unconfirmed(&self, state: &Manifest) -> bool {
        let lands_produces =
            self.produces.segment().is_some() || !self.landing.foreign().is_empty();
        !state.stored() && lands_produces && !self.topic.fresh && !self.produces.confirmed_topic()
    }

    /// Per-key ordering: runs this attempt's batch on a copy of `state` and reads the keys
    /// its leases stopped at ([`Committer::read_keys_for`]).
    async fn read_keys(&mut self, state: &Manifest) {
        let layout = state.layout();
        let mut keys = std::mem::take(&mut self.keys);
        let me = &*self;
        let wants = |keys: &Keys| {
            let plan = me.produces.plan()?;
            let mut probe = state.clone();
            let written = me.written_with(plan, keys);
            match batch::apply(&mut probe, me.now, &me.batch, written) {
                Decision::Commit(a) | Decision::Keep(a) => a.wants_key,
            }
        };
        let at = (me.q.topic.as_str(), me.q.partition);
        me.committer
            .read_keys_for(at, &layout, &mut keys, wants)
            .await;
        self.keys = keys;
    }
}

impl Change<Manifest> for BatchCommit<'_> {
    type Output = Applied;
    type Error = Stop;

    async fn prepare(&mut self, snap: &Snapshot<Manifest>) {
        self.attempts += 1;
        // Never after a segment write that failed: it may have landed in the store all the
        // same, and a combining commit could land it beside the copy the combining way
        // writes (the ordinary way answers its produces 503 instead: outcome unknown).
        if self.may_switch && self.attempts > SWITCH_AFTER && self.produces.refused().is_none() {
            self.switching = true;
            return;
        }
        let (c, q, state) = (self.committer, self.q, &snap.value);
        let work = (&self.batch, &self.topic);
        let combining = self.landing.combining();
        let segment_landed = self
            .produces
            .prepare(c, q, work, state, self.now, combining)
            .await;
        self.onward.fire();
        let intents_decided = self.landing.check_own_intents(c, q, state).await;
        let progress = Progress {
            produces: !self.batch.produces.is_empty(),
            segment_landed,
            intents: !self.landing.own().is_empty(),
            intents_decided,
            only_produces: self.batch.produces_only(),
            attempt: self.attempts,
        };
        let own_segment = self.produces.segment().map(|s| s.id.clone());
        let own_segment = own_segment.as_deref();
        self.landing
            .prepare(c, q, state, progress, own_segment)
            .await;
        self.topic_refused = None;
        if self.creates_unconfirmed(state) {
            // Deleting a topic deletes its manifests: only a write creating one could
            // land after a delete (docs/design.md §6, `commit/write.rs`).
            self.topic_refused = c.check_topic(q, &self.topic.etag).await.err();
        }
        // Upkeep rides on produces only (this batch's or other processes' it lands): they
        // are what makes a manifest grow, and a batch of settles or leases may well write
        // nothing.
        if !self.batch.produces.is_empty() || !self.landing.foreign().is_empty() {
            let retention = self.batch.rules.retention_ms;
            let retained;
            let after = match state.retention_drops(self.now, retention) {
                false => state,
                true => {
                    let mut m = state.clone();
                    m.apply_retention(self.now, retention);
                    retained = m;
                    &retained
                }
            };
            self.upkeeper.prepare(c, q, after).await;
        }
        if !state.beside.is_empty() && (!self.batch.leases.is_empty() || self.landing.leases()) {
            // Leases take nothing undecided: look at what was written beside its manifest
            // write (the delivery would read the segment anyway).
            let learnt = c
                .look_beside((&q.topic, q.partition), state, &self.decided)
                .await;
            self.decided.extend(learnt);
            lock(&q.state).more.looked = Some(state.version);
        }
        if self.batch.leases.iter().any(|op| op.rules.ordered)
            || (self.batch.rules.ordered && self.landing.leases())
        {
            self.read_keys(state).await;
        }
    }

    fn apply(&mut self, m: &mut Manifest) -> Result<Decision<Applied>, Stop> {
        if self.switching {
            return Err(Stop::Switch);
        }
        if let Some(e) = &self.topic_refused {
            return Err(Stop::Topic(e.clone()));
        }
        // `prepare` planned against this state already; planning here only if it did not.
        let plan = self.produces.take_plan(&self.batch, m, self.now);
        let d = batch::apply(m, self.now, &self.batch, self.written(&plan));
        self.produces.keep_plan(plan);
        self.wrote = matches!(d, Decision::Commit(_));
        Ok(d)
    }
}

/// Settles and lease requests one combining batch writes as intents at most; a bigger
/// batch shares a commit among its own operations already and goes the ordinary way.
pub(super) const MAX_OWN_INTENTS: usize = 8;

impl Committer {
    /// Whether `batch` may go the combining way ([`super::combine`]) when the partition
    /// is contended: its produces (if any) are combinable, it holds no compaction or
    /// purge, and its settles and lease requests (at fleet level 3 and up) are few
    /// enough to be written as intents and not refused already by the state `held`
    /// ([`intent::worth_writing`]).
    pub(super) fn combines(&self, batch: &Batch, held: Option<&Manifest>) -> bool {
        let produces = batch.produces.is_empty() || combinable(batch);
        if !produces || !batch.swaps.is_empty() || batch.purges > 0 {
            return false;
        }
        let asks = batch.settles.len() + batch.leases.len();
        if asks == 0 {
            return !batch.produces.is_empty();
        }
        let now = self.clock.now_ms();
        self.level.get().writes_intents()
            && asks <= MAX_OWN_INTENTS
            && batch
                .leases
                .iter()
                .all(|l| (1..=MAX_LEASE_ASK).contains(&(l.max as u64)))
            && held.is_none_or(|m| {
                super::combine::asks(batch).all(|a| intent::worth_writing(m, now, &batch.rules, a))
            })
    }
}

/// A cache that was out of date last time probably is again (requests of one client
/// rotating over processes): it is confirmed first, a conditional GET, rather than paying a
/// failed PUT and then the read anyway.
async fn confirm_first(
    q: &Queue,
    cell: &Cell<'_, Manifest>,
    cache: Option<&mut Snapshot<Manifest>>,
) -> Confirmed {
    match cache {
        Some(snap)
            if lock(&q.state)
                .role
                .confirm_cache_first(crate::runtime::now()) =>
        {
            match cell.refresh::<Infallible>(snap).await {
                Ok(true) => Confirmed::Unchanged,
                Ok(false) => Confirmed::Changed,
                Err(_) => Confirmed::No,
            }
        }
        _ => Confirmed::No,
    }
}

impl Committer {
    /// Runs one batch, from what `turn` brings when it was taken ahead; returns the
    /// manifest snapshot to cache for the next one. A batch whose segment was written
    /// ahead (an ordinary one) goes the ordinary way first, whatever the contention: it
    /// turns to combining after lost races as any ordinary batch does, deleting that
    /// segment first ([`Committer::commit`]).
    pub(super) async fn run_batch(
        &self,
        q: &Queue,
        pending: Vec<Pending>,
        mut cache: Option<Snapshot<Manifest>>,
        mut turn: Turn,
    ) -> Option<Snapshot<Manifest>> {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let (batch, replies, topic) = split(pending);
        // (Sweeps after it commit under its rules: the drain told the role, `queue.rs`.)
        let contended = lock(&q.state).role.contended(crate::runtime::now());
        let held = cache.as_ref().map(|s| &s.value);
        let combining = turn.early.is_none() && contended && self.combines(&batch, held);
        let mut work = Work {
            batch,
            replies,
            topic,
        };
        let mut next = match combining {
            true => Next::Combine,
            false => Next::Ordinary,
        };
        let mut written = None;
        loop {
            let (c, combining, head) = match next {
                Next::Ordinary => (cache, false, None),
                Next::Combine => {
                    let Some(to) = self.head(q, work, &mut cache, written.take()).await else {
                        return cache;
                    };
                    work = to.work;
                    (to.cache, to.combining, to.head)
                }
            };
            let may_switch = next == Next::Ordinary;
            let first = std::mem::take(&mut turn);
            let committed = self.commit(q, work, c, (combining, head), may_switch, first);
            match committed.await {
                Committed::Done(snap, _) => return snap,
                Committed::Switched(w, segment) => {
                    lock(&q.state).role.mark_contended(crate::runtime::now());
                    self.stats.switched.fetch_add(1, Ordering::Relaxed);
                    (work, cache, next, written) = (w, None, Next::Combine, segment);
                }
            }
        }
    }

    /// Steps 1 to 3 of the combining way ([`super::combine`]) for `work` (whose segment
    /// is `written` already, when it switched), from `cache`: what to commit, or `None`
    /// when every caller was answered (another process's commit decided the batch, or it
    /// failed), with the snapshot to keep in `cache`.
    async fn head(
        &self,
        q: &Queue,
        work: Work,
        cache: &mut Option<Snapshot<Manifest>>,
        written: Option<(SegmentRef, Plan)>,
    ) -> Option<ToCommit> {
        let Work {
            batch,
            replies,
            topic,
        } = work;
        let headed = self.combine_head(q, (&batch, &topic), cache.take(), written);
        let (snap, combining, head) = match headed.await {
            Ok(Head::Decided(snap, base, own)) => {
                q.announce(snap.value.version);
                replies.answer_decided(&batch, base, &own, &snap.value);
                self.wakers.wake(&q.topic);
                *cache = Some(snap);
                return None;
            }
            Ok(Head::Commit(h)) => {
                lock(&q.state).role.become_committer();
                (Some(h.snap.clone()), true, Some(h))
            }
            Ok(Head::Direct(snap)) => (snap, true, None),
            Ok(Head::Corrupt(own)) => {
                let repaired = match self.self_repair(q, &batch.rules).await {
                    true => self.read_manifest(q).await,
                    false => Err(BrokerError::Corrupt(q.key.clone())),
                };
                match repaired {
                    Ok(snap) => {
                        let head = Ready {
                            own,
                            listed: Listed::default(),
                            snap: snap.clone(),
                        };
                        (Some(snap), true, Some(head))
                    }
                    Err(e) => {
                        replies.fail(&e);
                        return None;
                    }
                }
            }
            // The manifest was rebuilt: commit directly, from a fresh read.
            Err(BrokerError::Corrupt(_) | BrokerError::Store(StoreError::Corrupt(_)))
                if self.self_repair(q, &batch.rules).await =>
            {
                (None, false, None)
            }
            Err(e) => {
                replies.fail(&e);
                return None;
            }
        };
        let work = Work {
            batch,
            replies,
            topic,
        };
        Some(ToCommit {
            work,
            cache: snap,
            combining,
            head,
        })
    }

    /// Commits `work` from `cache`, landing other processes' combinable segments and
    /// intents too when `combining` (those listed in `head`, or listed afresh). An
    /// ordinary batch that `may_switch` and could combine turns to combining after
    /// [`SWITCH_AFTER`] lost races, and an ordinary batch of a process that keeps winning
    /// at the first try looks for other processes' combining writes beside its write
    /// ([`super::role::Role::look_due`]). `turn`: what a batch taken ahead brings.
    pub(super) async fn commit(
        &self,
        q: &Queue,
        mut work: Work,
        mut cache: Option<Snapshot<Manifest>>,
        (combining, head): (bool, Option<Ready>),
        may_switch: bool,
        mut turn: Turn,
    ) -> Committed {
        let replies = std::mem::take(&mut work.replies);
        let held = cache.as_ref().map(|s| &s.value);
        let may_switch = may_switch && self.combines(&work.batch, held);
        let cold = turn.cold.take();
        let mut change = BatchCommit::new((self, q), work, (combining, head), may_switch, turn);
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        let (confirmed, read_now) = match cold {
            // Read just now: nothing to confirm.
            Some(start) => (Confirmed::No, start.admit(&mut change.topic)),
            None => (confirm_first(q, &cell, cache.as_mut()).await, false),
        };
        let held = cache.as_ref().map(|s| &s.value);
        // The committer lists ahead beside a combining commit; an ordinary one may look.
        let beside = self.beside(q, held, (combining, !combining));
        let write = async {
            let mut result = cell.update_in_read(&mut cache, &mut change, read_now).await;
            if matches!(&result, Err(e) if damaged(e))
                && self.self_repair(q, &change.batch.rules).await
            {
                cache = None;
                result = cell.update_in(&mut cache, &mut change).await;
            }
            result
        };
        let (result, looked) = futures::join!(write, self.list_beside(q, &beside));
        let attempts = Attempts {
            tries: change.attempts,
            confirmed,
            callers: replies.len() > 0,
        };
        {
            let mut st = lock(&q.state);
            st.role.committed(attempts, crate::runtime::now());
        }
        if let Some(look) = looked {
            self.looked(q, look, cache.as_ref().map(|s| &s.value));
        }
        tracing::Span::current().record("attempts", change.attempts);
        // After `Ok` the state written (or read) is in `cache`, and only there.
        let result = match (result, cache.as_ref()) {
            (Ok(applied), Some(snap)) => Ok((applied, snap)),
            (Ok(_), None) => Err(crate::cas::CasError::Contention),
            (Err(e), _) => Err(e),
        };
        let frontier = result.as_ref().ok().map(|(_, snap)| snap.value.frontier);
        ordering::keep_keys(q, std::mem::take(&mut change.keys), frontier);
        match result {
            Ok((applied, snap)) => {
                let mut applied = applied;
                self.land_beside(&mut change, &mut applied, &snap.value)
                    .await;
                let landed = self.finish(&change, replies, applied, &snap.value).await;
                Committed::Done(cache, landed)
            }
            Err(crate::cas::CasError::Rejected(Stop::Switch)) => {
                let written = match self.drop_ordinary_segment(q, &mut change.produces).await {
                    Ok(written) => written,
                    Err(e) => {
                        replies.fail(&e);
                        return Committed::Done(None, 0);
                    }
                };
                let BatchCommit { batch, topic, .. } = change;
                let work = Work {
                    batch,
                    replies,
                    topic,
                };
                Committed::Switched(work, written)
            }
            Err(e) => {
                if abandoned(&e) {
                    // Nothing will land its segment: delete it now rather than leave it to
                    // garbage collection's grace period.
                    if let Err(d) = self.drop_ordinary_segment(q, &mut change.produces).await {
                        tracing::warn!(error = %d, "could not delete an abandoned segment");
                    }
                }
                if matches!(e, crate::cas::CasError::Contention) {
                    tracing::warn!(
                        attempts = change.attempts,
                        "the manifest write lost every race: answered 503"
                    );
                }
                replies.fail(&BrokerError::from(e));
                Committed::Done(None, 0)
            }
        }
    }

    /// The segment a batch that turns to combining keeps (and the plan it was written
    /// for): a combinable one, which any process's combining commit may land already. An
    /// ordinary batch's segment has an ordinary id that no commit but its own lands: it is
    /// deleted, before the messages are written again under a combinable id, so that a
    /// rebuild from segments never finds two copies. The same for a batch [`abandoned`]
    /// for good.
    ///
    /// Errors: the delete's failure.
    async fn drop_ordinary_segment(
        &self,
        q: &Queue,
        produces: &mut Produces,
    ) -> BrokerResult<Option<(SegmentRef, Plan)>> {
        if let Some(beside) = produces.take_beside() {
            // Deleted once its PUT ended, or it would land after the delete.
            self.landed_beside(beside).await;
        }
        match produces.take_written() {
            Some((seg, _)) if Combinable::parse(&seg.id).is_none() => {
                let key = keys::segment(&q.topic, q.partition, &seg.id);
                self.store.delete(&key).await?;
                Ok(None)
            }
            written => Ok(written),
        }
    }

    /// After `change` landed as `state`: waits for the PUT of its segment if it was
    /// written beside the manifest write, refusing the produces if it was never stored,
    /// and keeps what this process learnt of undecided segments for the next commit
    /// (what `state` no longer names undecided is forgotten). A segment that `state` does
    /// not name (no produce needed it after all) is deleted.
    async fn land_beside(
        &self,
        change: &mut BatchCommit<'_>,
        applied: &mut Applied,
        state: &Manifest,
    ) {
        let q = change.q;
        let mut decided = None;
        if let Some(write) = change.produces.take_beside() {
            let id = change.produces.segment().map(|s| s.id.clone());
            let fate = self.landed_beside(write).await;
            let named = id
                .as_ref()
                .and_then(|id| state.segments.iter().find(|s| s.id == *id));
            let why = match &fate {
                BesideFate::Stored => None,
                BesideFate::Void => Some(BrokerError::Store(StoreError::Unavailable(
                    "the message's segment could not be written, and nothing was stored; retry it"
                        .into(),
                ))),
                BesideFate::Unknown(e) => Some(e.clone()),
            };
            if let (Some(why), Some(seg)) = (why, named) {
                // The produces placed in it were not stored: answered with why, not with
                // their offsets (a duplicate answered from an earlier offset keeps it).
                let held = seg.base_offset..seg.base_offset + u64::from(seg.count);
                for r in &mut applied.produced {
                    if r.as_ref().is_ok_and(|o| o.iter().any(|o| held.contains(o))) {
                        *r = Err(Unplaced::NoSegment);
                    }
                }
                change.produces.refuse(why);
            }
            let named = named.is_some();
            match (named, &fate, id) {
                (true, BesideFate::Stored | BesideFate::Void, Some(id)) => decided = Some(id),
                (false, BesideFate::Stored, Some(id)) => {
                    let key = keys::segment(&q.topic, q.partition, &id);
                    if let Err(e) = self.store.delete(&key).await {
                        tracing::debug!(%key, error = %e, "an unused segment was not deleted");
                    }
                }
                _ => {}
            }
        }
        let mut st = lock(&q.state);
        let kept = &mut st.more.decided;
        for id in &change.decided {
            if !kept.contains(id) {
                kept.push(id.clone());
            }
        }
        kept.retain(|id| state.beside.contains(id));
        kept.extend(decided);
    }

    /// After `change` landed as `state` (or found nothing to write): counts, answers
    /// every caller, starts the deletes of what retention dropped and its checkpoint (the
    /// queue's [`super::chore`]) and wakes idle consumers.
    /// Returns how many of other processes' writes the commit landed.
    async fn finish(
        &self,
        change: &BatchCommit<'_>,
        replies: Replies,
        mut applied: Applied,
        state: &Manifest,
    ) -> usize {
        let q = change.q;
        tracing::Span::current().record("version", state.version);
        // The last commit's checkpoint, written beside this commit, lands before this
        // commit's callers are answered.
        q.chore.done().await;
        let own = change.landing.own();
        let foreign_intents = applied
            .decided
            .iter()
            .filter(|(id, _)| !own.iter().any(|o| o.id == *id))
            .count();
        let landed = match change.wrote {
            true => applied.landed_foreign + foreign_intents,
            false => 0,
        };
        if change.wrote {
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            let n = (replies.len() + landed) as u64;
            self.stats.committed_ops.fetch_add(n, Ordering::Relaxed);
        }
        let (dropped, wake) = (std::mem::take(&mut applied.dropped), applied.wake);
        let chunks = std::mem::take(&mut applied.dropped_chunks);
        let refused = change.produces.refused();
        q.announce(state.version);
        if own.is_empty() {
            let layout = Arc::new(state.layout());
            let shared = change.landing.combining();
            replies.answer(applied, refused, layout, shared);
        } else {
            replies.answer_own(applied, refused, own, state);
        }
        // What retention dropped, the checkpoint and the index object of a fold, beside
        // the next commit (the queue's chore, which that commit waits for before it
        // answers), not before it.
        let deletes = self.expired_deletes(q, dropped, chunks);
        let checkpoint = (state.wants_checkpoint().filter(|_| change.wrote))
            .and_then(|expired| self.checkpoint_write(q, state, expired));
        let fold = self.fold_ahead(q, state);
        if deletes.is_some() || checkpoint.is_some() || fold.is_some() {
            let (deletes, checkpoint, fold) = (
                OptionFuture::from(deletes),
                OptionFuture::from(checkpoint),
                OptionFuture::from(fold),
            );
            let chore = async move {
                futures::join!(deletes, checkpoint, fold);
            };
            q.chore.start(&self.tasks, chore.in_current_span()).await;
        }
        if wake {
            self.wakers.wake(&q.topic);
        }
        landed
    }
}
