//! Group commit: one segment PUT and one manifest CAS for many operations
//! (docs/design.md §6).
//!
//! Every produce, lease (consume), settle (ack, extend, nack) and compaction swap on a
//! partition goes through the [`Committer`], one typed call each ([`Committer::produce`],
//! [`Committer::lease`], [`Committer::settle`], [`Committer::compact`]). Operations
//! submitted while a commit is in flight queue up; when it lands, one task takes the whole
//! queue (up to [`MAX_BATCH_BYTES`] of payload) and runs it as one batch
//! ([`batch`]): one segment for every new message, one conditional manifest write
//! applying the pure transition [`crate::partition::batch::apply`], and each caller
//! answered only after that write landed, each with its own result (one caller's 410
//! does not fail another's ack).
//!
//! Before taking a batch the committer waits `linger` (default 2 ms, like Kafka's
//! `linger.ms`) so that operations arriving together share a commit even when the store
//! answers faster than clients come back. It lingers only while the partition is busy
//! (the previous batch held more than one operation), so a lone client pays no delay.
//!
//! A caller whose request is cancelled does not cancel its operation: once queued it is
//! committed (a lease granted to a vanished caller simply lapses). Each queue's drain loop
//! is a task of the broker's dispatcher ([`crate::dispatch`]): a stopping broker lets it
//! commit what is queued and then ends it (docs/design.md §6, "Background work and
//! stopping").

mod batch;
mod chore;
mod cold;
mod combine;
mod landing;
mod ledgers;
pub(crate) use summary::{Figures, Summary};
mod listing;
mod ordering;
mod produces;
mod queue;
use queue::{Drained, QueueState};
mod refresh;
pub(crate) use refresh::Refreshed;
mod repair;
mod replies;
mod role;
mod summary;
mod sweep;
#[cfg(test)]
mod tests;
mod upkeep;
mod wait;
pub(crate) mod wake;
mod write;

use crate::dispatch::Dispatcher;
use crate::gate::FleetLevel;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::Instrument;

use crate::cache::Cache;
use crate::cas::Snapshot;
use crate::clock::{Clock, IdSource};
use crate::error::{BrokerError, BrokerResult};
use crate::objects::Reader;
use crate::partition::batch::SettleOp;
use crate::partition::compact::Swap;
use crate::partition::dedup::Chunk;
use crate::partition::index::Index;
use crate::partition::lease;
use crate::partition::produce::NewStored;
use crate::partition::{Layout, Leased, Manifest, Rules, SegmentRef, Settle};
use crate::segment::SegmentCache;
use crate::store::{DynStore, ETag};
use crate::topic::{Group, Topic};

pub(crate) use wake::Wakers;

/// A segment older than this is never committed (garbage collection's grace period is
/// far longer; docs/design.md §7).
pub(crate) const MAX_SEGMENT_AGE_AT_COMMIT_MS: u64 = 5 * 60 * 1000;

/// Payload bytes one commit takes at most (one operation always fits, whatever its size).
pub(crate) const MAX_BATCH_BYTES: usize = 8 << 20;

/// What a lease request got, and where the partition's messages were as of the commit
/// that granted it (to find each granted message's segment, and to read ahead).
#[derive(Debug, Clone)]
pub(crate) struct LeaseAnswer {
    /// The leases granted and the messages parked for dead-lettering.
    pub leased: Leased,
    /// The partition's layout as committed.
    pub layout: Arc<Layout>,
    /// Whether other processes lease from the partition too (the lease was granted
    /// through an intent): reading segments ahead would mostly read their messages.
    pub shared: bool,
}

/// The process's caches of immutable decoded objects, shared by the committer (which
/// caches what it writes) and the broker's readers.
#[derive(Clone)]
pub(crate) struct Caches {
    /// Segments.
    pub segments: Arc<SegmentCache>,
    /// Index objects.
    pub indexes: Arc<Cache<Index>>,
    /// Idempotency-key chunks.
    pub chunks: Arc<Cache<Chunk>>,
}

impl Caches {
    /// Caches of about `bytes` of segments; index objects and key chunks get a quarter
    /// of that more each.
    pub(crate) fn new(bytes: usize) -> Self {
        Self {
            segments: Arc::new(Cache::new(bytes)),
            indexes: Arc::new(Cache::new(bytes / 4)),
            chunks: Arc::new(Cache::new(bytes / 4)),
        }
    }
}

/// A partition as [`Committer::peek`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peek {
    /// No snapshot here.
    Unknown,
    /// Operations queued or committing.
    Busy,
    /// The cached snapshot.
    Known {
        /// Its ETag (`None`: the manifest did not exist).
        etag: Option<ETag>,
        /// See [`lease::quiet_until`].
        quiet_until: Option<u64>,
    },
}

/// The topic record as a batch's callers saw it.
#[derive(Debug, Clone)]
pub(super) struct TopicSeen {
    /// Its ETag.
    pub etag: ETag,
    /// Read from the store by the request itself rather than from the topic cache: a
    /// commit creating the manifest for it need not confirm it again (`commit/write.rs`).
    pub fresh: bool,
}

/// One queued operation with the channel its caller waits on.
enum Op {
    Produce(Vec<NewStored>, oneshot::Sender<BrokerResult<Vec<u64>>>),
    Lease(usize, u64, oneshot::Sender<BrokerResult<LeaseAnswer>>),
    Settle(SettleOp, oneshot::Sender<BrokerResult<()>>),
    Compact(Vec<Swap>, oneshot::Sender<BrokerResult<u64>>),
    Purge(oneshot::Sender<BrokerResult<u64>>),
}

impl Op {
    /// Answers its caller `e`.
    fn fail(self, e: BrokerError) {
        match self {
            Op::Produce(_, tx) => drop(tx.send(Err(e))),
            Op::Lease(_, _, tx) => drop(tx.send(Err(e))),
            Op::Settle(_, tx) => drop(tx.send(Err(e))),
            Op::Compact(_, tx) | Op::Purge(tx) => drop(tx.send(Err(e))),
        }
    }
}

struct Pending {
    op: Op,
    rules: Rules,
    topic: TopicSeen,
    /// The span of the request that queued it (`http::trace`): it learns its commit's id.
    span: tracing::Span,
}

impl Pending {
    fn bytes(&self) -> usize {
        match &self.op {
            Op::Produce(msgs, _) => msgs.iter().map(|m| m.message.payload.len()).sum(),
            _ => 0,
        }
    }
}

/// What only the partition's queue keeps ([`queue::QueueState::more`]).
#[derive(Default)]
struct PartitionMore {
    /// Message keys the last batch read for per-key ordering, at or above the frontier
    /// (facts: the next batch starts from them, and [`Committer::peek`] uses them).
    keys: lease::Keys,
    /// Segments written beside a manifest write whose fate (stored or void) this process
    /// learnt and the manifest may still name undecided: the next commit decides them
    /// ([`crate::partition::beside`]).
    decided: Vec<String>,
    /// The manifest version whose undecided segments a lease commit of this process
    /// looked at last: until one has, a waiting consume does not count the partition
    /// quiet ([`Committer::peek_partition`]).
    looked: Option<u64>,
    /// When this process created the topic ([`Committer::created`]): for
    /// [`CREATED_RECENTLY`] after it, a first commit expects the manifest absent and reads
    /// it with the record confirmed beside (`commit/cold.rs`).
    created: Option<crate::runtime::Instant>,
}

/// How long after a process created a topic its first commit on a partition confirms the
/// record beside its read of the manifest, expecting to create it: a hint, never a read in
/// itself (another process may delete the topic and create it again at once, the Lambda
/// runtime suite does, and a commit that took the creation for a read of the record then
/// created a manifest of the deleted topic).
const CREATED_RECENTLY: Duration = Duration::from_secs(10);

/// One partition's queue.
struct Queue {
    topic: String,
    incarnation: String,
    partition: u32,
    key: String,
    /// Where its combinable segments and intents are listed (`keys::segments_prefix`).
    segments_prefix: String,
    /// The incarnation's tag, which this process's combinable segment ids end in from
    /// fleet level 4 ([`crate::partition::combine::tag`]).
    tag: String,
    /// When the topic was created (segments older than that are an earlier topic's).
    created_at_ms: u64,
    /// Its operations, role and cached manifest ([`queue::QueueState::held`]).
    state: Mutex<QueueState<Queue>>,
    /// What its last commit left to do after answering.
    chore: chore::Chore,
    /// A fold whose index object its chore wrote, for the next commits to apply
    /// ([`upkeep::FoldAhead`]).
    fold_ahead: upkeep::FoldAhead,
    /// The newest manifest version whose state answered this process's callers (0:
    /// none): set before they are answered, so what reads the manifest for this process
    /// (replay's kept layouts) knows its own writes ([`Committer::announced_version`]).
    announced: AtomicU64,
}

impl Queue {
    /// `version` answered callers (it, or a newer one, is stored).
    fn announce(&self, version: u64) {
        self.announced.fetch_max(version, AtomicOrdering::Release);
    }
}

/// The objects the one engine commits: a partition's manifest, and subscriptions' ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Object {
    /// A partition's manifest: the log and the default subscription.
    Manifest,
    /// A named subscription's ledger of one partition.
    Ledger,
}

impl Object {
    /// Its name in logs and errors.
    fn name(self) -> &'static str {
        match self {
            Object::Manifest => "manifest",
            Object::Ledger => "ledger",
        }
    }
}

impl CommitStats {
    /// Intents written on `o`.
    fn intents(&self, o: Object) -> &AtomicU64 {
        match o {
            Object::Manifest => &self.intents,
            Object::Ledger => &self.ledger_intents,
        }
    }

    /// Intents on `o` that other processes' commits decided.
    fn intents_by_others(&self, o: Object) -> &AtomicU64 {
        match o {
            Object::Manifest => &self.intents_by_others,
            Object::Ledger => &self.ledger_intents_by_others,
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct CommitStats {
    /// Manifest writes that landed.
    pub commits: AtomicU64,
    /// Operations answered by those writes.
    pub committed_ops: AtomicU64,
    /// Batches processed (committed or not).
    pub batches: AtomicU64,
    /// Combining batches answered from a commit another process made.
    pub landed_by_others: AtomicU64,
    /// Combining segments written again because a commit passed them over.
    pub rewritten: AtomicU64,
    /// Manifest reads of waiting combining writers.
    pub polls: AtomicU64,
    /// Waiting combining writers that committed themselves (nobody else was).
    pub takeovers: AtomicU64,
    /// Sweeps that landed other processes' segments or intents.
    pub sweeps: AtomicU64,
    /// Ordinary batches that lost races and turned to combining.
    pub switched: AtomicU64,
    /// Looks for other processes' combining writes ([`role::Role::look_due`]).
    pub looks: AtomicU64,
    /// Looks that found some pending.
    pub looks_found: AtomicU64,
    /// Settles and lease requests written as intents.
    pub intents: AtomicU64,
    /// Intents of this process another process's commit applied.
    pub intents_by_others: AtomicU64,
    /// Subscriptions' ledger writes that landed.
    pub ledger_commits: AtomicU64,
    /// Operations carried by those writes (intents landed among them).
    pub ledger_committed_ops: AtomicU64,
    /// Subscriptions' settles and lease requests written as intents.
    pub ledger_intents: AtomicU64,
    /// Ledger intents of this process another process's commit applied.
    pub ledger_intents_by_others: AtomicU64,
}

/// The per-process group committer. Shared behind an `Arc`.
pub(crate) struct Committer {
    caches: Caches,
    linger: Duration,
    /// The fleet level: which formats this process may write ([`crate::gate`]).
    level: FleetLevel,
    store: DynStore,
    ids: Arc<dyn IdSource>,
    clock: Arc<dyn Clock>,
    wakers: Wakers,
    queues: Mutex<HashMap<(String, String, u32), Arc<Queue>>>,
    /// Subscriptions' ledgers' queues.
    ledgers: ledgers::Ledgers,
    /// The last id given to a batch's span ([`commit_span`]).
    next_id: AtomicU64,
    /// The broker's background tasks: drains, chores and cleanups are started there.
    tasks: Arc<Dispatcher>,
    /// Counters.
    pub stats: CommitStats,
}

/// Locks `m`, recovering from poisoning (every critical section leaves consistent state).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for the answer to a queued operation. A drain that ended without answering
/// (the broker stopped, or the task panicked) may have landed it or not: 503, the outcome
/// unknown, never a 500.
async fn answer<T>(rx: oneshot::Receiver<BrokerResult<T>>) -> BrokerResult<T> {
    rx.await.unwrap_or_else(|_| {
        Err(BrokerError::OutcomeUnknown(
            "the commit ended without answering (the process is stopping); whether it was \
             applied is unknown; retry it"
                .into(),
        ))
    })
}

/// One queued settle per (offset, lease id, action), and the receivers of their answers.
fn settle_ops(
    (topic, group): (&Topic, Group<'_>),
    settles: &[(u64, u64, Settle)],
) -> (Vec<Op>, Vec<oneshot::Receiver<BrokerResult<()>>>) {
    let rules = Rules::from(&group.settings(topic));
    let mut ops = Vec::with_capacity(settles.len() + 1);
    let mut answers = Vec::with_capacity(settles.len());
    for &(offset, lease_id, action) in settles {
        let (tx, rx) = oneshot::channel();
        let op = SettleOp {
            offset,
            lease_id,
            action,
            rules,
        };
        ops.push(Op::Settle(op, tx));
        answers.push(rx);
    }
    (ops, answers)
}

impl Committer {
    /// A committer writing through `store`, caching the immutable objects it writes and
    /// reads in `caches`. Each busy batch waits `linger` so that more operations can join
    /// it.
    pub(crate) fn new(
        store: DynStore,
        ids: Arc<dyn IdSource>,
        clock: Arc<dyn Clock>,
        caches: Caches,
        linger: Duration,
        (level, tasks): (FleetLevel, Arc<Dispatcher>),
    ) -> Self {
        Self {
            caches,
            linger,
            level,
            store,
            ids,
            clock,
            wakers: Wakers::default(),
            queues: Mutex::new(HashMap::new()),
            ledgers: ledgers::Ledgers::default(),
            next_id: AtomicU64::new(0),
            tasks,
            stats: CommitStats::default(),
        }
    }

    /// Reads segments and index objects through this process's caches.
    fn reader(&self) -> Reader<'_> {
        Reader::new(&self.store, &self.caches.segments, &self.caches.indexes)
    }

    /// The wake-ups this committer sends after commits that make messages available.
    pub(crate) fn wakers(&self) -> &Wakers {
        &self.wakers
    }

    /// Appends `messages` in order; answers their offsets (a duplicate gets the offset of
    /// its first produce) once the commit landed.
    ///
    /// Errors: [`BrokerError::StaleTopic`] when the topic was re-created, the batch's
    /// storage failure ([`BrokerError::Contention`], [`BrokerError::Store`]).
    pub(crate) async fn produce(
        self: &Arc<Self>,
        topic: &Topic,
        partition: u32,
        messages: Vec<NewStored>,
    ) -> BrokerResult<Vec<u64>> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(topic, partition, [Op::Produce(messages, tx)]);
        answer(rx).await
    }

    /// Leases up to `max` available messages of `group` of about `max_bytes` of payload
    /// at most (the first whatever its size; 0 messages on the default group: a commit
    /// that only applies retention).
    ///
    /// Errors: as [`Committer::produce`].
    pub(crate) async fn lease(
        self: &Arc<Self>,
        (topic, group): (&Topic, Group<'_>),
        partition: u32,
        (max, max_bytes): (usize, u64),
    ) -> BrokerResult<LeaseAnswer> {
        let (tx, rx) = oneshot::channel();
        self.submit(
            (topic, group),
            partition,
            vec![Op::Lease(max, max_bytes, tx)],
        );
        answer(rx).await
    }

    /// Settles `settles` (offset, lease id, action) and then leases up to `max` messages
    /// of about `max_bytes`, queued together so that they share a batch: the settles are
    /// applied first (an ack frees its place in flight for the lease), and they commit
    /// in the lease's commit (when another process commits the partition, their intents
    /// land in its commits). Answers the lease and each settle's result, in order; the
    /// lease is answered when the settles are.
    ///
    /// Errors: as [`Committer::lease`] and [`Committer::settle`], each its own.
    pub(crate) async fn lease_settling(
        self: &Arc<Self>,
        topic: &Topic,
        partition: u32,
        (max, max_bytes): (usize, u64),
        settles: &[(u64, u64, Settle)],
    ) -> (BrokerResult<LeaseAnswer>, Vec<BrokerResult<()>>) {
        let (mut ops, settled) = settle_ops((topic, Group::Default), settles);
        let (tx, leased) = oneshot::channel();
        ops.push(Op::Lease(max, max_bytes, tx));
        self.enqueue(topic, partition, ops);
        let leased = answer(leased).await;
        let mut results = Vec::with_capacity(settled.len());
        for rx in settled {
            results.push(answer(rx).await);
        }
        (leased, results)
    }

    /// Settles `settles` (offset, lease id, action) on one partition, queued together so
    /// that they share a batch (one commit for a batch ack, not the first alone and the
    /// rest in the next); each settle's result, in order.
    ///
    /// Errors: as [`Committer::settle`], each its own.
    pub(crate) async fn settle_many(
        self: &Arc<Self>,
        (topic, group): (&Topic, Group<'_>),
        partition: u32,
        settles: &[(u64, u64, Settle)],
    ) -> Vec<BrokerResult<()>> {
        let (ops, settled) = settle_ops((topic, group), settles);
        self.submit((topic, group), partition, ops);
        let mut results = Vec::with_capacity(settled.len());
        for rx in settled {
            results.push(answer(rx).await);
        }
        results
    }

    #[cfg(test)]
    /// Acks, extends or nacks the lease `lease_id` on `offset`.
    ///
    /// Errors: [`BrokerError::LeaseGone`], [`BrokerError::AckedAheadFull`], and as
    /// [`Committer::produce`].
    pub(crate) async fn settle(
        self: &Arc<Self>,
        topic: &Topic,
        partition: u32,
        offset: u64,
        lease_id: u64,
        action: Settle,
    ) -> BrokerResult<()> {
        let settles = [(offset, lease_id, action)];
        let mut r = self
            .settle_many((topic, Group::Default), partition, &settles)
            .await;
        r.pop()
            .unwrap_or_else(|| Err(BrokerError::Internal("a settle got no result".into())))
    }

    /// Swaps runs of segments for merged ones where the manifest still holds them;
    /// answers how many segments were replaced.
    ///
    /// Errors: as [`Committer::produce`].
    pub(crate) async fn compact(
        self: &Arc<Self>,
        topic: &Topic,
        partition: u32,
        swaps: Vec<Swap>,
    ) -> BrokerResult<u64> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(topic, partition, [Op::Compact(swaps, tx)]);
        answer(rx).await
    }

    /// What this process knows of `group` on a partition without asking the store, for
    /// waiting consumes (`broker/consume.rs`): the default group's as
    /// [`Committer::peek_partition`] says, a named one's as its ledger's queue says
    /// ([`ledgers::Ledgers`]).
    pub(crate) fn peek(&self, (topic, group): (&Topic, Group<'_>), partition: u32) -> Peek {
        match group {
            Group::Default => self.peek_partition(topic, partition),
            Group::Named(name, sub) => {
                let now = self.clock.now_ms();
                self.ledgers.peek(topic, (name, sub), partition, now)
            }
        }
    }

    /// Whether `group`'s queue on `partition` has operations queued or a batch running
    /// in this process (operations arriving now would share its next commit).
    pub(crate) fn busy(&self, (topic, group): (&Topic, Group<'_>), partition: u32) -> bool {
        match group {
            Group::Default => self.peek_partition(topic, partition) == Peek::Busy,
            Group::Named(name, sub) => self.ledgers.busy(topic, (name, sub), partition),
        }
    }

    /// Queues `ops` on `group`'s queue of `partition`.
    fn submit(self: &Arc<Self>, (topic, group): (&Topic, Group<'_>), partition: u32, ops: Vec<Op>) {
        match group {
            Group::Default => self.enqueue(topic, partition, ops),
            Group::Named(name, sub) => {
                self.enqueue_subscription(topic, (name, sub), partition, ops)
            }
        }
    }

    /// The default group's peek: [`Peek::Unknown`] when this process holds no snapshot
    /// (never committed or read here), [`Peek::Busy`] while operations are queued or a
    /// batch is running, else the cached snapshot's ETag and [`lease::quiet_until`] on it
    /// (not quiet while it names undecided segments no lease here looked at yet).
    fn peek_partition(&self, topic: &Topic, partition: u32) -> Peek {
        let key = (topic.name.clone(), topic.incarnation.clone(), partition);
        let Some(queue) = lock(&self.queues).get(&key).cloned() else {
            return Peek::Unknown;
        };
        let st = lock(&queue.state);
        if st.busy() {
            return Peek::Busy;
        }
        match &st.held {
            None => Peek::Unknown,
            Some(snap) => {
                let m = &snap.value;
                // Undecided segments nobody here looked at yet: a lease would look.
                let unlooked = !m.beside.is_empty() && st.more.looked != Some(m.version);
                let now = self.clock.now_ms();
                let rules = Rules::from(&topic.settings);
                Peek::Known {
                    etag: snap.etag.clone(),
                    quiet_until: match unlooked {
                        true => None,
                        false => lease::quiet_until(m, now, &rules, &st.more.keys),
                    },
                }
            }
        }
    }

    /// The segment holding the message a lease of `partition` would most likely get
    /// first, by the copy this process holds ([`lease::first_available`]): `None` when it
    /// holds none, or that copy shows nothing available. No storage request.
    pub(crate) fn likely_segment(&self, topic: &Topic, partition: u32) -> Option<SegmentRef> {
        let key = (topic.name.clone(), topic.incarnation.clone(), partition);
        let queue = lock(&self.queues).get(&key).cloned()?;
        let st = lock(&queue.state);
        let m = &st.held.as_ref()?.value;
        let rules = Rules::from(&topic.settings);
        let offset = lease::first_available(m, self.clock.now_ms(), &rules, &st.more.keys)?;
        m.hot_segment_of(offset).cloned()
    }

    /// The newest version of `partition`'s manifest whose state answered this process's
    /// callers, if it has answered any: a layout read from an older version may lack this
    /// process's own writes. No storage request.
    pub(crate) fn announced_version(&self, topic: &Topic, partition: u32) -> Option<u64> {
        let key = (topic.name.clone(), topic.incarnation.clone(), partition);
        let queue = lock(&self.queues).get(&key)?.clone();
        let v = queue.announced.load(AtomicOrdering::Acquire);
        (v > 0).then_some(v)
    }

    /// The manifest this process's commits or reads of the partition at `at` (topic,
    /// incarnation, partition) left, if it holds one, no batch is using it now, and it is
    /// newer than version `than` (`None`: any); copied only then, since a manifest is
    /// large.
    pub(super) fn cached_manifest_newer(
        &self,
        (topic, incarnation, partition): (&str, &str, u32),
        than: Option<u64>,
    ) -> Option<Snapshot<Manifest>> {
        let key = (topic.to_owned(), incarnation.to_owned(), partition);
        let queue = lock(&self.queues).get(&key)?.clone();
        let st = lock(&queue.state);
        st.held
            .as_ref()
            .filter(|c| than.is_none_or(|v| c.value.version > v))
            .cloned()
    }

    /// Removes every retained message of the partition (available, in flight, acked ahead);
    /// answers how many. Outstanding receipt handles then get 410; new produces continue
    /// from the next offset. The objects are deleted after the commit lands.
    ///
    /// Errors: as [`Committer::produce`].
    pub(crate) async fn purge(
        self: &Arc<Self>,
        (topic, group): (&Topic, Group<'_>),
        partition: u32,
    ) -> BrokerResult<u64> {
        let (tx, rx) = oneshot::channel();
        self.submit((topic, group), partition, vec![Op::Purge(tx)]);
        answer(rx).await
    }

    /// Queues `ops` on the partition's queue, one after another with nothing between
    /// them (a run of settles and leases, which carry no payload, is never split into
    /// two batches: [`batch_len`]), and starts its drain task if none runs.
    fn enqueue(self: &Arc<Self>, topic: &Topic, partition: u32, ops: impl IntoIterator<Item = Op>) {
        let queue = self.queue(topic, partition);
        let pending = ops.into_iter().map(|op| Pending {
            op,
            rules: Rules::from(&topic.settings),
            topic: TopicSeen {
                etag: topic.etag.clone(),
                fresh: !topic.from_cache,
            },
            span: tracing::Span::current(),
        });
        self.enqueue_on(&queue, pending);
    }

    /// Tells this process that it just created `topic`: for [`CREATED_RECENTLY`], a first
    /// commit on one of its partitions confirms the record beside reading the manifest
    /// (probably absent), so that creating the manifest then costs no confirmation before
    /// it. Nothing is assumed: not the manifests absent (a commit that found nothing to
    /// write from a state it did not read would answer from a guess), not the record
    /// current (another process may have deleted the topic and created it again).
    pub(crate) fn created(&self, topic: &Topic) {
        for p in 0..topic.settings.partitions {
            let queue = self.queue(topic, p);
            lock(&queue.state).more.created = Some(crate::runtime::now());
        }
    }

    /// The partition's queue, made on first use.
    fn queue(&self, topic: &Topic, partition: u32) -> Arc<Queue> {
        lock(&self.queues)
            .entry((topic.name.clone(), topic.incarnation.clone(), partition))
            .or_insert_with(|| {
                Arc::new(Queue {
                    topic: topic.name.clone(),
                    incarnation: topic.incarnation.clone(),
                    partition,
                    key: topic.manifest_key(partition),
                    segments_prefix: crate::keys::segments_prefix(&topic.name, partition),
                    tag: crate::partition::combine::tag(&topic.incarnation),
                    created_at_ms: topic.created_at_ms,
                    chore: chore::Chore::default(),
                    fold_ahead: upkeep::FoldAhead::default(),
                    announced: AtomicU64::new(0),
                    state: Mutex::new(QueueState::default()),
                })
            })
            .clone()
    }
}

/// The span one batch (or sweep) of `q` runs in: the id its requests' spans record, and
/// the manifest version it wrote and the attempts it took, once known. At ERROR level,
/// like a request's span (`http::trace`), so that it is there whatever the log filter.
fn commit_span(kind: &'static str, q: &Queue, id: u64, ops: usize) -> tracing::Span {
    tracing::error_span!(
        "commit",
        kind,
        id,
        topic = %q.topic,
        partition = q.partition,
        ops,
        version = tracing::field::Empty,
        attempts = tracing::field::Empty,
    )
}

/// How many queued operations the next batch takes: all, up to [`MAX_BATCH_BYTES`] of
/// payload (at least one).
fn batch_len(pending: &[Pending]) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for p in pending {
        bytes += p.bytes();
        if n > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n
}

impl Drained for Queue {
    const OBJECT: Object = Object::Manifest;
    type Op = Pending;
    type With = (Rules, ETag);
    type Held = Option<Snapshot<Manifest>>;
    type Ahead = listing::Ahead;
    type More = PartitionMore;
    /// The segment of a batch taken ahead, if one was written.
    type Early = Option<produces::EarlySegment>;

    fn state(&self) -> &Mutex<QueueState<Self>> {
        &self.state
    }

    fn key(&self) -> &str {
        &self.key
    }

    fn listing(&self) -> queue::Place<'_> {
        queue::Place {
            prefix: &self.segments_prefix,
            tag: Some(&self.tag),
            created_at_ms: self.created_at_ms,
        }
    }

    /// All, up to [`MAX_BATCH_BYTES`] of payload; sweeps commit under the first
    /// operation's rules and topic record, as the batch does ([`replies::split`]).
    fn take(pending: &[Pending]) -> (usize, (Rules, ETag)) {
        let with = pending
            .first()
            .map(|p| (p.rules, p.topic.etag.clone()))
            .unwrap_or_else(|| {
                (
                    Rules::from(&crate::settings::TopicSettings::default()),
                    ETag::new(""),
                )
            });
        (batch_len(pending), with)
    }

    /// A batch with produces all [`produces::writes_early`] behind a batch of one
    /// operation, while this process commits the partition alone and on a store that
    /// does not pace writes of a key (there the batch is taken when its write may go:
    /// taken earlier it would carry fewer). Not behind a bigger batch: clients that share
    /// commits come back together when answered, and a batch taken ahead of them splits
    /// them into two groups that each pay a segment and a manifest write, for no more
    /// throughput (docs/benchmarks.md, "Taking a batch ahead"). Not at fleet level 7,
    /// where its commit writes the segment beside the manifest write: it ends one round
    /// trip after the commit ahead of it lands, and a segment written ahead one round trip
    /// after its produce arrived, which is later.
    fn takes_ahead(c: &Committer, st: &QueueState<Self>, n: usize) -> bool {
        st.last_batch <= 1
            && !c.writes_beside()
            && c.store.key_write_interval().is_zero()
            && !st.role.contended(crate::runtime::now())
            && produces::writes_early(&st.pending[..n])
    }

    async fn early(c: &Arc<Committer>, q: &Arc<Self>, ops: &[Pending]) -> Self::Early {
        c.write_early(q, ops).await
    }

    async fn run(
        c: &Arc<Committer>,
        q: &Arc<Self>,
        batch: Vec<Pending>,
        (with, cache): (Self::With, Self::Held),
        (early, onward): (Option<Self::Early>, queue::Onward),
    ) -> Self::Held {
        // Batches and sweeps share one id sequence, for the logs.
        let id = c.next_id.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        if batch.is_empty() {
            let span = commit_span("sweep", q, id, 0);
            let (cache, landed) = c.sweep(q, with, cache).instrument(span).await;
            lock(&q.state).role.swept(landed, crate::runtime::now());
            return cache;
        }
        let (batch, cache, cold) = c.start_cold(q, batch, cache, early.is_some()).await;
        let span = commit_span("commit", q, id, batch.len());
        for p in &batch {
            span.follows_from(&p.span);
            p.span.record("commit", id);
        }
        let turn = batch::Turn {
            early: early.flatten(),
            onward,
            cold,
        };
        let started = crate::runtime::now();
        let held = c
            .run_batch(q, batch, cache, turn)
            .instrument(span.clone())
            .await;
        // Per commit, at debug: how long its callers waited for it, from its start.
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        span.in_scope(|| tracing::debug!(ms, "committed"));
        held
    }
}
