//! One batch of the committer: plan, write the segment, one manifest CAS, answer.
//!
//! The manifest write goes through [`crate::cas::Cell::update_cached`] with a
//! [`BatchCommit`] change. Before every attempt its `prepare` plans the produces against
//! the state that attempt starts from (which messages are new, which are retries of
//! remembered idempotency keys) and writes one segment with exactly the new messages;
//! a later attempt reuses that segment unless its plan differs (another writer committed
//! one of the keys meanwhile), in which case it writes a fresh one and the old one is
//! left to garbage collection. `apply` is then the pure
//! [`crate::partition::batch::apply`].
//!
//! With the segment write (beside it, so it costs no round trip, unless the segment is
//! combinable) the topic record is re-checked (a conditional GET, 304 when unchanged) so
//! that nothing is committed into a topic that was deleted and created again meanwhile: such produces fail with [`BrokerError::StaleTopic`] and the broker
//! retries them against the current topic. A segment older than
//! [`super::MAX_SEGMENT_AGE_AT_COMMIT_MS`] is never committed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::combine::{Head, Listed, Own, Ready};
use super::ordering::{self, KEY_ROUNDS};
use super::repair::damaged;
use super::upkeep::Upkeeper;
use super::{lock, Committer, LeaseAnswer, Op, Pending, Queue, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::cas::{Cell, Change, Decision, Invalid, Snapshot, Stored};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::{self, Applied, Batch, Written};
use crate::partition::combine::{self, Combinable, Status};
use crate::partition::intent::{self, Ask, Intent, Status as IntentStatus, MAX_LEASE_ASK};
use crate::partition::lease::Keys;
use crate::partition::produce::{Plan, Unplaced};
use crate::partition::{Layout, Manifest, Rules, SegmentRef};
use crate::segment::{Segment, StoredMessage};
use crate::settings::TopicSettings;
use crate::store::{ETag, Fetched, StoreError};
use crate::topic::TopicRecord;

/// A batch to commit, the callers to answer, and the topic record ETag its producers saw.
pub(super) struct Work {
    pub batch: Batch,
    pub replies: Replies,
    pub topic_etag: ETag,
}

/// The callers of a batch, group by group in the batch's order.
#[derive(Default)]
pub(super) struct Replies {
    produced: Vec<oneshot::Sender<BrokerResult<Vec<u64>>>>,
    settled: Vec<oneshot::Sender<BrokerResult<()>>>,
    leased: Vec<oneshot::Sender<BrokerResult<LeaseAnswer>>>,
    compacted: Vec<oneshot::Sender<BrokerResult<u64>>>,
    purged: Vec<oneshot::Sender<BrokerResult<u64>>>,
}

impl Replies {
    fn len(&self) -> usize {
        self.produced.len()
            + self.settled.len()
            + self.leased.len()
            + self.compacted.len()
            + self.purged.len()
    }

    /// Answers every caller with its own result; leases with the committed `layout`, and
    /// as `shared` when the partition is contended (other processes lease from it too).
    fn answer(
        self,
        applied: Applied,
        refused: Option<&BrokerError>,
        layout: Arc<Layout>,
        shared: bool,
    ) {
        for (tx, r) in self.produced.into_iter().zip(applied.produced) {
            let r = r.map_err(|why| match why {
                Unplaced::DelayedFull => BrokerError::DelayedFull,
                Unplaced::NoSegment => refused.cloned().unwrap_or_else(|| {
                    BrokerError::Internal("a produce found no segment and no refusal".into())
                }),
            });
            let _ = tx.send(r);
        }
        for (tx, r) in self.settled.into_iter().zip(applied.settled) {
            let _ = tx.send(r.map_err(BrokerError::from));
        }
        for (tx, leased) in self.leased.into_iter().zip(applied.leased) {
            let layout = layout.clone();
            let _ = tx.send(Ok(LeaseAnswer {
                leased,
                layout,
                shared,
            }));
        }
        for (tx, r) in self.compacted.into_iter().zip(applied.compacted) {
            let _ = tx.send(Ok(r));
        }
        for (tx, r) in self.purged.into_iter().zip(applied.purged) {
            let _ = tx.send(Ok(r));
        }
    }

    /// Answers a combining batch that other processes' commits decided, as `state`
    /// shows: its produces from its segment's base offset, its settles and leases from
    /// the outcomes of its `own` intents.
    pub(super) fn answer_decided(
        self,
        batch: &Batch,
        base: Option<u64>,
        own: &Own,
        state: &Manifest,
    ) {
        let mut next = base;
        for (tx, msgs) in self.produced.into_iter().zip(&batch.produces) {
            let n = msgs.len() as u64;
            let _ = tx.send(match next {
                Some(b) => {
                    next = Some(b + n);
                    Ok((b..b + n).collect())
                }
                None => Err(BrokerError::Contention),
            });
        }
        answer_intents(self.settled, self.leased, &own.intents, state);
    }

    /// Answers a combining batch this process committed: its produces from `applied`,
    /// its settles and leases from the outcomes of its `own` intents in `state`.
    fn answer_own(
        self,
        applied: Applied,
        refused: Option<&BrokerError>,
        own: &[Intent],
        state: &Manifest,
    ) {
        let layout = Arc::new(state.layout());
        let Self {
            produced,
            settled,
            leased,
            compacted,
            purged,
        } = self;
        let produces = Self {
            produced,
            ..Self::default()
        };
        produces.answer(applied, refused, layout, true);
        answer_intents(settled, leased, own, state);
        // A combining batch holds neither; should one slip in, it is not left hanging.
        let e = BrokerError::Internal("not a combining operation".into());
        Self {
            compacted,
            purged,
            ..Self::default()
        }
        .fail(&e);
    }

    /// Answers every caller with `e`.
    fn fail(self, e: &BrokerError) {
        fn all<T>(txs: Vec<oneshot::Sender<BrokerResult<T>>>, e: &BrokerError) {
            for tx in txs {
                let _ = tx.send(Err(e.clone()));
            }
        }
        all(self.produced, e);
        all(self.settled, e);
        all(self.leased, e);
        all(self.compacted, e);
        all(self.purged, e);
    }
}

/// Answers settles and lease requests from the outcomes `state` records of their intents
/// (`own`: the settles' first, in order, then the lease requests'). One whose outcome is
/// not recorded gets 503 (the outcome unknown). A lease answers only the grants `state`
/// still shows held by it.
fn answer_intents(
    settled: Vec<oneshot::Sender<BrokerResult<()>>>,
    leased: Vec<oneshot::Sender<BrokerResult<LeaseAnswer>>>,
    own: &[Intent],
    state: &Manifest,
) {
    let outcome = |i: Option<&Intent>| match i.map(|i| intent::status(state, &i.id)) {
        Some(IntentStatus::Decided(o)) => Some(o),
        _ => None,
    };
    let n = settled.len();
    for (k, tx) in settled.into_iter().enumerate() {
        let r = outcome(own.get(k))
            .and_then(|o| o.settle_result())
            .map_or(Err(BrokerError::Contention), |r| {
                r.map_err(BrokerError::from)
            });
        let _ = tx.send(r);
    }
    let layout = Arc::new(state.layout());
    for (k, tx) in leased.into_iter().enumerate() {
        let r = match outcome(own.get(n + k)).and_then(|o| o.lease_result()) {
            Some(mut got) => {
                let held = |g: &crate::partition::Grant| {
                    state
                        .leases
                        .get(&g.offset)
                        .is_some_and(|l| l.lease_id == g.lease_id)
                };
                got.grants.retain(held);
                got.dead.retain(held);
                Ok(LeaseAnswer {
                    leased: got,
                    layout: layout.clone(),
                    shared: true,
                })
            }
            None => Err(BrokerError::Contention),
        };
        let _ = tx.send(r);
    }
}

/// Splits queued operations into the pure batch and the callers to answer.
fn split(pending: Vec<Pending>) -> (Batch, Replies, ETag) {
    // Retention and the dedup window follow the first operation's view of the topic.
    let rules = pending
        .first()
        .map_or_else(|| Rules::from(&TopicSettings::default()), |p| p.rules);
    let mut batch = Batch::new(rules);
    let mut replies = Replies::default();
    let mut topic_etag = None;
    for p in pending {
        topic_etag.get_or_insert(p.topic_etag);
        match p.op {
            Op::Produce(msgs, tx) => {
                batch.produces.push(msgs);
                replies.produced.push(tx);
            }
            Op::Settle(op, tx) => {
                batch.settles.push(op);
                replies.settled.push(tx);
            }
            Op::Lease(max, max_bytes, tx) => {
                batch.leases.push(batch::LeaseOp {
                    max,
                    max_bytes,
                    rules: p.rules,
                });
                replies.leased.push(tx);
            }
            Op::Compact(swaps, tx) => {
                batch.swaps.push(swaps);
                replies.compacted.push(tx);
            }
            Op::Purge(tx) => {
                batch.purges += 1;
                replies.purged.push(tx);
            }
        }
    }
    (batch, replies, topic_etag.unwrap_or_else(|| ETag::new("")))
}

/// The manifest change of one batch (see the module documentation).
struct BatchCommit<'a> {
    committer: &'a Committer,
    q: &'a Queue,
    topic_etag: ETag,
    batch: Batch,
    now: u64,
    /// The plan of the current attempt.
    plan: Option<Plan>,
    /// The plan the current segment (or refusal) was made for.
    written_for: Option<Plan>,
    segment: Option<SegmentRef>,
    refused: Option<BrokerError>,
    /// Index objects written for this batch's upkeep.
    upkeeper: Upkeeper,
    /// Offsets of the batch's idempotency keys found in chunk objects.
    spilled: HashMap<String, u64>,
    /// Whether the last `apply` decided to write.
    wrote: bool,
    /// Whether to list and land other processes' combinable segments (the partition is
    /// contended and this batch's produces carry no idempotency keys).
    combining: bool,
    /// Other processes' combinable segments, listed against manifest version `listed_at`.
    foreign: Vec<SegmentRef>,
    /// Intents listed with them.
    intents: Vec<Intent>,
    /// This batch's own intents (its settles and leases, when it combines).
    own: Vec<Intent>,
    listed_at: Option<u64>,
    /// Attempts so far (more than one: another process wrote meanwhile).
    attempts: u32,
    /// Where this batch's segment landed, found in an index object by `prepare`.
    found_at: Option<u64>,
    /// Message keys read for per-key ordering (facts, kept across attempts).
    keys: Keys,
}

impl Change<Manifest> for BatchCommit<'_> {
    type Output = Applied;
    type Error = Infallible;

    async fn prepare(&mut self, snap: &Snapshot<Manifest>) {
        self.attempts += 1;
        let state = &snap.value;
        let own_landed = self.check_own_segment(state).await;
        let produces = &self.batch.produces;
        let spilled = match self
            .committer
            .spilled_keys(self.q, state, self.now, produces)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                // Without the spilled keys no produce can be planned safely: none is made.
                (self.segment, self.refused, self.written_for) = (None, Some(e), None);
                self.spilled = HashMap::new();
                self.plan = Some(Plan::refused(produces));
                return;
            }
        };
        let plan = Plan::new(produces, state, self.now, &|k| spilled.get(k).copied());
        self.spilled = spilled;
        if self.written_for.as_ref() != Some(&plan) {
            (self.segment, self.refused) = (None, None);
            if plan.needs_segment() {
                let messages = plan.new_messages(&self.batch.produces);
                match self
                    .committer
                    .write_segment(
                        self.q,
                        &self.topic_etag,
                        messages,
                        combinable(&self.batch).then_some(state.combined_through.as_str()),
                    )
                    .await
                {
                    Ok(seg) => self.segment = Some(seg),
                    Err(e) => self.refused = Some(e),
                }
            }
            self.written_for = Some(plan.clone());
        }
        // A segment must never be committed after garbage collection could have taken
        // it for an orphan: if this process stalled since writing it, give up on it.
        if let Some(seg) = &self.segment {
            let written = keys::segment_time(&seg.id).unwrap_or(0);
            let age = self.committer.clock.now_ms().saturating_sub(written);
            if age > MAX_SEGMENT_AGE_AT_COMMIT_MS {
                (self.segment, self.refused) = (None, Some(BrokerError::Contention));
            }
        }
        self.plan = Some(plan);
        // Landing other processes' segments is a favour, not this batch's work: a produce
        // batch whose segment another process landed answers at once, and a sweep that lost
        // a race leaves the landing to the process that won it. Either way this attempt
        // lands nothing foreign, so it cannot keep losing races to a busy committer.
        let only_produces = self.batch.produces_only();
        let intents_done = self.check_own_intents(state).await;
        let has_own = !self.batch.produces.is_empty() || !self.own.is_empty();
        let own_done = has_own
            && (own_landed || self.batch.produces.is_empty())
            && intents_done
            && only_produces;
        let sweep = only_produces && !has_own;
        if own_done || (sweep && self.attempts > 1) {
            self.foreign.clear();
            self.intents.clone_from(&self.own);
            self.listed_at = Some(state.version);
        } else if self.combining && self.listed_at != Some(state.version) {
            let own = self.segment.as_ref().map(|s| s.id.as_str());
            let listed = self.committer.list_combinable(self.q, state, own).await;
            self.foreign = listed.segments;
            self.intents = listed.intents;
            self.intents.extend(self.own.iter().cloned());
            self.listed_at = Some(state.version);
        } else if !self.own.is_empty() {
            // Listed by the head against this very state: its own intents go with it.
            for i in &self.own {
                if !self.intents.iter().any(|l| l.id == i.id) {
                    self.intents.push(i.clone());
                }
            }
        }
        // Upkeep rides on produces only (this batch's or other processes' it lands): they
        // are what makes a manifest grow, and a batch of settles or leases may well write
        // nothing.
        if !self.batch.produces.is_empty() || !self.foreign.is_empty() {
            let mut after = state.clone();
            after.apply_retention(self.now, self.batch.rules.retention_ms);
            self.upkeeper.prepare(self.committer, self.q, &after).await;
        }
        let lease_intents = self
            .intents
            .iter()
            .any(|i| matches!(i.ask, Ask::Lease { .. }));
        if self.batch.leases.iter().any(|op| op.rules.ordered)
            || (self.batch.rules.ordered && lease_intents)
        {
            self.read_keys(state).await;
        }
    }

    fn apply(&mut self, m: &mut Manifest) -> Result<Decision<Applied>, Infallible> {
        // `prepare` planned against this state already; planning here only if it did not.
        let plan = self.plan.take().unwrap_or_else(|| {
            let spilled = &self.spilled;
            Plan::new(&self.batch.produces, m, self.now, &|k| {
                spilled.get(k).copied()
            })
        });
        let d = batch::apply(m, self.now, &self.batch, self.written(&plan));
        self.plan = Some(plan);
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

/// True when the batch has produces and none carries an idempotency key or a delay: its
/// segment can be committed by any process ([`crate::partition::combine`]), which knows
/// nothing but the segment.
pub(super) fn combinable(batch: &Batch) -> bool {
    !batch.produces.is_empty()
        && batch
            .produces
            .iter()
            .flatten()
            .all(|m| m.idempotency_key.is_none() && m.delay_ms == 0)
}

impl BatchCommit<'_> {
    /// What this attempt writes, with its produces planned as `plan`.
    fn written<'s>(&'s self, plan: &'s Plan) -> Written<'s> {
        Written {
            plan,
            segment: self.segment.as_ref(),
            found_at: self.found_at,
            foreign: &self.foreign,
            intents: &self.intents,
            upkeep: &self.upkeeper.upkeep,
            keys: &self.keys,
        }
    }

    /// Per-key ordering: runs this attempt's batch on a copy of `state` and reads the keys
    /// its leases stopped at, until they stop nowhere or [`KEY_ROUNDS`] are spent.
    async fn read_keys(&mut self, state: &Manifest) {
        let layout = state.layout();
        for _ in 0..KEY_ROUNDS {
            let Some(plan) = &self.plan else { return };
            let written = self.written(plan);
            let mut probe = state.clone();
            let wants = match batch::apply(&mut probe, self.now, &self.batch, written) {
                Decision::Commit(a) | Decision::Keep(a) => a.wants_key,
            };
            let Some(from) = wants else { return };
            let read = self
                .committer
                .read_keys(self.q, &layout, from, &mut self.keys);
            if !read.await {
                return;
            }
        }
    }

    /// Writes again each of this batch's own intents that `state` shows passed over (it
    /// can never land); returns whether every one is decided in `state`.
    async fn check_own_intents(&mut self, state: &Manifest) -> bool {
        let mut done = true;
        for i in 0..self.own.len() {
            match intent::status(state, &self.own[i].id) {
                IntentStatus::Decided(_) | IntentStatus::Unknown => {}
                IntentStatus::Pending => done = false,
                IntentStatus::Dead => {
                    done = false;
                    let ask = self.own[i].ask;
                    let after = state.combined_through.as_str();
                    if let Ok(again) = self.committer.write_intent(self.q, after, ask).await {
                        self.committer
                            .stats
                            .rewritten
                            .fetch_add(1, Ordering::Relaxed);
                        self.own[i] = again;
                    }
                }
            }
        }
        done
    }

    /// If this batch's combinable segment is dead in `state` (it can never land), forgets
    /// it so that `prepare` writes the messages again under a new id; if its fate can no
    /// longer be told, refuses the batch (503: the outcome is unknown). Returns whether
    /// the segment has landed already.
    async fn check_own_segment(&mut self, state: &Manifest) -> bool {
        let Some(seg) = &self.segment else {
            return false;
        };
        if Combinable::parse(&seg.id).is_none() {
            return false;
        }
        self.found_at = None;
        match self.committer.segment_status(self.q, state, &seg.id).await {
            Status::Dead => (self.segment, self.written_for) = (None, None),
            // Landed, and no longer in the manifest's own memory: apply cannot tell.
            Status::Landed(base) if combine::status(state, &seg.id) == Status::Unknown => {
                self.found_at = Some(base);
                return true;
            }
            Status::Landed(_) => return true,
            Status::Unknown => {
                self.segment = None;
                self.refused = Some(BrokerError::Contention);
            }
            Status::Pending => {}
        }
        false
    }
}

impl Committer {
    /// Runs one batch; returns the manifest snapshot to cache for the next one.
    pub(super) async fn run_batch(
        &self,
        q: &Queue,
        pending: Vec<Pending>,
        mut cache: Option<Snapshot<Manifest>>,
    ) -> Option<Snapshot<Manifest>> {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let (batch, replies, topic_etag) = split(pending);
        // Sweeps commit under the rules of the last batch (retention, and the settles and
        // leases of other processes' intents).
        lock(&q.state).sweep_with = Some((batch.rules, topic_etag.clone()));
        let held = cache.as_ref().map(|s| &s.value);
        let mut combining = self.contended(q) && self.combines(&batch, held);
        let mut head = None;
        if combining {
            match self
                .combine_head(q, &batch, &topic_etag, cache.take())
                .await
            {
                Ok(Head::Decided(snap, base, own)) => {
                    replies.answer_decided(&batch, base, &own, &snap.value);
                    self.wakers.wake(&q.topic);
                    return Some(snap);
                }
                Ok(Head::Commit(h)) => {
                    cache = Some(h.snap.clone());
                    head = Some(h);
                    self.start_sweeping(q);
                }
                Ok(Head::Direct(snap)) => cache = snap,
                Ok(Head::Corrupt(own)) => {
                    let repaired = match self.self_repair(q, &batch.rules).await {
                        true => self.read_manifest(q).await,
                        false => Err(BrokerError::Corrupt(q.key.clone())),
                    };
                    match repaired {
                        Ok(snap) => {
                            cache = Some(snap.clone());
                            head = Some(Ready {
                                own,
                                listed: Listed::default(),
                                snap,
                            });
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
                    combining = false
                }
                Err(e) => {
                    replies.fail(&e);
                    return None;
                }
            }
        }
        let work = Work {
            batch,
            replies,
            topic_etag,
        };
        self.commit(q, work, cache, combining, head).await.0
    }

    /// Commits `work` from `cache`, landing other processes' combinable segments too when
    /// `combining` (those listed in `head`, or listed afresh). Returns the snapshot to
    /// cache and how many foreign segments landed.
    pub(super) async fn commit(
        &self,
        q: &Queue,
        work: Work,
        mut cache: Option<Snapshot<Manifest>>,
        combining: bool,
        head: Option<Ready>,
    ) -> (Option<Snapshot<Manifest>>, usize) {
        let Work {
            batch,
            replies,
            topic_etag,
        } = work;
        let mut change = BatchCommit {
            committer: self,
            q,
            topic_etag,
            batch,
            now: self.clock.now_ms(),
            plan: None,
            written_for: None,
            segment: None,
            refused: None,
            upkeeper: Upkeeper::default(),
            spilled: HashMap::new(),
            wrote: false,
            combining,
            foreign: Vec::new(),
            intents: Vec::new(),
            own: Vec::new(),
            listed_at: None,
            attempts: 0,
            found_at: None,
            // Facts an earlier batch read (offsets never change their message).
            keys: std::mem::take(&mut lock(&q.state).keys),
        };
        if let Some(h) = head {
            (change.segment, change.written_for) = h
                .own
                .segment
                .map_or((None, None), |(s, p)| (Some(s), Some(p)));
            change.foreign = h.listed.segments;
            change.intents = h.listed.intents;
            change.listed_at = Some(h.snap.value.version);
            if !h.own.intents.is_empty() {
                // The batch's settles and leases are intents now: applied as listed ones,
                // answered from what the manifest records of them.
                change.batch.settles.clear();
                change.batch.leases.clear();
                change.own = h.own.intents;
            }
        }
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        // A cache that was out of date last time probably is again (requests of one
        // client rotating over processes): confirm it first, a conditional GET, rather
        // than pay a failed PUT and then the read anyway.
        let refreshed = match cache.as_mut() {
            Some(snap) if lock(&q.state).stale_cache => {
                cell.refresh::<Infallible>(snap).await.is_ok()
            }
            _ => false,
        };
        let mut result = cell.update_cached(&mut cache, &mut change).await;
        if matches!(&result, Err(e) if damaged(e)) && self.self_repair(q, &change.batch.rules).await
        {
            cache = None;
            result = cell.update_cached(&mut cache, &mut change).await;
        }
        // One conflict on a cache not confirmed first is a stale cache, not another
        // writer: only a conflict after a fresh state is a race (a lone client whose
        // requests rotate over processes must not pay for combining).
        let raced = change.attempts > if refreshed { 1 } else { 2 };
        lock(&q.state).stale_cache = change.attempts > 1;
        if raced {
            self.mark_contended(q);
        }
        if change.attempts > 1 && replies.len() == 0 {
            // A sweep lost a race: another process commits; leave the sweeping to it.
            lock(&q.state).sweeping = false;
        }
        let span = tracing::Span::current();
        span.record("attempts", change.attempts);
        let frontier = result.as_ref().ok().map(|(_, snap)| snap.value.frontier);
        ordering::keep_keys(q, std::mem::take(&mut change.keys), frontier);
        match result {
            Ok((mut applied, snap)) => {
                span.record("version", snap.value.version);
                let own = &change.own;
                let foreign_intents = applied
                    .decided
                    .iter()
                    .filter(|(id, _)| !own.iter().any(|o| o.id == *id))
                    .count();
                if change.wrote {
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                    let n = (replies.len() + applied.landed_foreign + foreign_intents) as u64;
                    self.stats.committed_ops.fetch_add(n, Ordering::Relaxed);
                }
                let (dropped, wake) = (std::mem::take(&mut applied.dropped), applied.wake);
                let chunks = std::mem::take(&mut applied.dropped_chunks);
                let landed = if change.wrote {
                    applied.landed_foreign + foreign_intents
                } else {
                    0
                };
                let layout = Arc::new(snap.value.layout());
                if change.own.is_empty() {
                    replies.answer(applied, change.refused.as_ref(), layout, combining);
                } else {
                    replies.answer_own(applied, change.refused.as_ref(), &change.own, &snap.value);
                }
                self.delete_expired(q, dropped, chunks).await;
                if let Some(expired) = snap.value.wants_checkpoint().filter(|_| change.wrote) {
                    self.write_checkpoint(q, &snap.value, expired).await;
                }
                if wake {
                    self.wakers.wake(&q.topic);
                }
                (cache, landed)
            }
            Err(e) => {
                replies.fail(&BrokerError::from(e));
                (None, 0)
            }
        }
    }

    /// Writes the batch's segment, checking meanwhile that the topic is still the one the
    /// producers saw.
    pub(super) async fn write_segment(
        &self,
        q: &Queue,
        topic_etag: &ETag,
        messages: Vec<StoredMessage>,
        combinable_after: Option<&str>,
    ) -> BrokerResult<SegmentRef> {
        let last_produced_ms = messages.iter().map(|m| m.produced_at_ms).max().unwrap_or(0);
        let bytes = messages.iter().map(|m| m.payload.len() as u64).sum();
        let count = messages.len() as u32;
        let seg = Segment { messages };
        let id = match combinable_after {
            Some(after) => {
                Combinable::id(self.clock.now_ms(), after, &self.ids.new_id(), count, bytes)
            }
            None => keys::segment_id(self.clock.now_ms(), &self.ids.new_id()),
        };
        // Written before the commit; if the commit never lands this object is an orphan.
        let key = keys::segment(&q.topic, q.partition, &id);
        let body = seg.encode(self.level.get())?;
        // Checked with every segment write: a process whose cached topic is up to one
        // cache period old must not commit into a topic that was deleted and created
        // again. For a segment only this batch commits, the check runs beside the write
        // (one round trip, not two; a failed check leaves an orphan). A combinable one
        // is checked first: once written, a process of a new topic of the same name could
        // land it while this produce is retried there.
        if combinable_after.is_some() {
            self.check_topic(q, topic_etag).await?;
            self.store.put_if_absent(&key, body).await?;
        } else {
            let (checked, put) = tokio::join!(
                self.check_topic(q, topic_etag),
                self.store.put_if_absent(&key, body)
            );
            checked?;
            put?;
        }
        // Consumers in this process read it from memory.
        self.caches.segments.put(key, Arc::new(seg));
        Ok(SegmentRef {
            id,
            base_offset: 0,
            count,
            last_produced_ms,
            bytes,
        })
    }

    /// Confirms (a conditional GET, 304 when unchanged) that the topic record is still
    /// the incarnation this queue writes for.
    ///
    /// Errors: [`BrokerError::StaleTopic`] when it was deleted or created again.
    async fn check_topic(&self, q: &Queue, topic_etag: &ETag) -> BrokerResult<()> {
        let settings_key = keys::topic_settings(&q.topic);
        match self.store.get_if_changed(&settings_key, topic_etag).await? {
            Fetched::Unchanged => {}
            Fetched::Missing => return Err(BrokerError::StaleTopic),
            Fetched::Object(o) => {
                // Settings may have changed (PATCH); only a new incarnation is stale.
                let same = match Option::<TopicRecord>::decode(&o.data, &()) {
                    Ok(Some(rec)) => rec.incarnation == q.incarnation,
                    Err(Invalid::Newer(newer)) => {
                        return Err(BrokerError::UpgradeRequired {
                            object: settings_key,
                            newer,
                        })
                    }
                    Ok(None) | Err(Invalid::Corrupt(_)) | Err(Invalid::Superseded) => false,
                };
                if !same {
                    return Err(BrokerError::StaleTopic);
                }
            }
        }
        Ok(())
    }
}
