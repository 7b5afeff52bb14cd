//! Group commit: one segment PUT and one manifest CAS for many operations.
//!
//! Every produce, lease (consume), ack, extend and nack on a partition goes through
//! [`Committer::submit`]. Operations submitted while a commit is in flight queue up; when
//! it lands, one task takes the whole queue (up to [`MAX_BATCH_BYTES`] of payload) and:
//!
//! 1. writes every queued produce's messages as **one** segment (put-if-absent);
//! 2. applies the operations in a fixed order (produces, then settles, then leases) to
//!    the cached manifest and writes it with **one** conditional PUT
//!    ([`crate::manifest::commit`]: speculative against the cached ETag, re-read only on
//!    conflict; a batch that changes nothing is confirmed with a conditional GET);
//! 3. answers each caller only after that PUT landed, each with its own result: one
//!    caller's 410 does not fail another's ack.
//!
//! Before taking a batch the committer waits `linger` (default 2 ms, like Kafka's
//! `linger.ms`) so that operations arriving together share a commit even when the store
//! answers faster than clients come back. It lingers only while the partition is busy
//! (the previous batch held more than one operation), so a lone client pays no delay.
//!
//! A produce batch also re-checks the topic's settings object (a conditional GET, 304
//! when unchanged) so no message is committed into a topic that was deleted and created
//! again meanwhile; such operations fail with [`BrokerError::StaleTopic`] and the engine
//! retries them against the current topic.
//!
//! A caller whose request is cancelled does not cancel its operation: once queued it is
//! committed (a lease granted to a vanished caller simply lapses).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::clock::{Clock, IdSource};
use crate::engine::{lock, BrokerError, BrokerResult, Settle, Topic, Wakers};
use crate::keys;
use crate::manifest::{self, Decision, Lease, Manifest, SegmentRef, Snapshot, UpdateError};
use crate::segment::{Segment, SegmentCache, StoredMessage};
use crate::settings::TopicSettings;
use crate::store::{DynStore, Fetched};

/// A segment older than this is never committed (garbage collection's grace period,
/// [`crate::gc::DEFAULT_GRACE`], is far longer).
pub const MAX_SEGMENT_AGE_AT_COMMIT_MS: u64 = 5 * 60 * 1000;

/// How long a message parked for dead-lettering stays invisible; if the move does not
/// finish in time it is parked and moved again (the move is idempotent).
pub const DEAD_LETTER_PARK_MS: u64 = 60_000;

/// Payload bytes one commit takes at most (one operation always fits, whatever its size).
pub const MAX_BATCH_BYTES: usize = 8 << 20;

/// One operation on one partition.
#[derive(Debug)]
pub enum Op {
    /// Append messages in order. A message whose idempotency key the partition still
    /// remembers is not appended again: it gets the offset of the first produce.
    Produce(Vec<NewStored>),
    /// Lease up to this many available messages.
    Lease(usize),
    /// Ack, extend or nack the lease `lease_id` on `offset`.
    Settle {
        /// Offset of the leased message.
        offset: u64,
        /// Lease id from the receipt handle.
        lease_id: u64,
        /// What to do.
        action: Settle,
    },
}

/// A message to append, with its optional idempotency key.
#[derive(Debug, Clone)]
pub struct NewStored {
    /// The message.
    pub message: StoredMessage,
    /// `Idempotency-Key`: a retry with the same key within the window appends nothing.
    pub idempotency_key: Option<String>,
}

/// A lease granted by a commit.
#[derive(Debug, Clone)]
pub struct Grant {
    /// Offset leased.
    pub offset: u64,
    /// Lease id (the version of the commit that granted it).
    pub lease_id: u64,
    /// Deliveries so far, this one included.
    pub delivery_count: u32,
    /// The segment that holds the message.
    pub segment: SegmentRef,
}

/// What an operation got.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The offset of each message, in order (a duplicate gets its first offset).
    Produced(Vec<u64>),
    /// Leases granted (possibly none), and messages parked for the dead-letter topic:
    /// delivered `max_deliveries` times without an ack, they are held under a system lease
    /// for [`DEAD_LETTER_PARK_MS`] while the caller moves them.
    Leased {
        /// Messages for the consumer.
        grants: Vec<Grant>,
        /// Messages to move to the dead-letter topic.
        dead: Vec<Grant>,
    },
    /// The settle took effect.
    Settled,
}

struct Pending {
    op: Op,
    settings: TopicSettings,
    topic_etag: String,
    reply: oneshot::Sender<BrokerResult<Outcome>>,
}

impl Pending {
    fn bytes(&self) -> usize {
        match &self.op {
            Op::Produce(msgs) => msgs.iter().map(|m| m.message.payload.len()).sum(),
            _ => 0,
        }
    }
}

#[derive(Default)]
struct QueueState {
    pending: Vec<Pending>,
    running: bool,
    cache: Option<Snapshot>,
    /// Operations in the previous batch: lingering pays only when there is company.
    last_batch: usize,
}

struct Queue {
    topic: String,
    incarnation: String,
    partition: u32,
    key: String,
    state: Mutex<QueueState>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Manifest writes that landed.
    pub commits: AtomicU64,
    /// Operations answered by those writes.
    pub committed_ops: AtomicU64,
    /// Batches processed (committed or not).
    pub batches: AtomicU64,
}

/// The per-process group committer. Shared behind an `Arc`.
pub struct Committer {
    segments: Arc<SegmentCache>,
    linger: std::time::Duration,
    store: DynStore,
    ids: Arc<dyn IdSource>,
    clock: Arc<dyn Clock>,
    wakers: Arc<Wakers>,
    queues: Mutex<HashMap<(String, String, u32), Arc<Queue>>>,
    /// Counters.
    pub stats: CommitStats,
}

impl Committer {
    /// A committer writing through `store`. Each batch waits `linger` after its first
    /// operation arrives so that more can join it (Kafka's `linger.ms`).
    pub fn new(
        store: DynStore,
        ids: Arc<dyn IdSource>,
        clock: Arc<dyn Clock>,
        wakers: Arc<Wakers>,
        segments: Arc<SegmentCache>,
        linger: std::time::Duration,
    ) -> Self {
        Self {
            segments,
            linger,
            store,
            ids,
            clock,
            wakers,
            queues: Mutex::new(HashMap::new()),
            stats: CommitStats::default(),
        }
    }

    /// Queues `op` on `topic`'s `partition` and waits for the commit that carries it.
    ///
    /// Errors: the operation's own refusal ([`BrokerError::LeaseGone`],
    /// [`BrokerError::AckedAheadFull`]), [`BrokerError::StaleTopic`], or the batch's
    /// storage failure ([`BrokerError::Contention`], [`BrokerError::Store`]).
    pub async fn submit(
        self: &Arc<Self>,
        topic: &Topic,
        partition: u32,
        op: Op,
    ) -> BrokerResult<Outcome> {
        let queue = {
            let mut queues = lock(&self.queues);
            queues
                .entry((topic.name.clone(), topic.incarnation.clone(), partition))
                .or_insert_with(|| {
                    Arc::new(Queue {
                        topic: topic.name.clone(),
                        incarnation: topic.incarnation.clone(),
                        partition,
                        key: keys::manifest(&topic.name, partition),
                        state: Mutex::new(QueueState::default()),
                    })
                })
                .clone()
        };
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = lock(&queue.state);
            st.pending.push(Pending {
                op,
                settings: topic.settings.clone(),
                topic_etag: topic.etag.clone(),
                reply: tx,
            });
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.drain(queue).await });
        }
        rx.await.unwrap_or(Err(BrokerError::Contention))
    }

    /// Commits batches until the queue is empty.
    async fn drain(self: Arc<Self>, q: Arc<Queue>) {
        // Should this task ever die mid-batch, the next submit starts a new one.
        struct Running(Arc<Queue>);
        impl Drop for Running {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    lock(&self.0.state).running = false;
                }
            }
        }
        let _running = Running(q.clone());
        loop {
            let busy = lock(&q.state).last_batch > 1;
            if busy && !self.linger.is_zero() {
                tokio::time::sleep(self.linger).await;
            }
            let (batch, cache) = {
                let mut st = lock(&q.state);
                if st.pending.is_empty() {
                    st.running = false;
                    return;
                }
                let mut bytes = 0;
                let mut n = 0;
                for p in &st.pending {
                    bytes += p.bytes();
                    if n > 0 && bytes > MAX_BATCH_BYTES {
                        break;
                    }
                    n += 1;
                }
                let batch: Vec<Pending> = st.pending.drain(..n).collect();
                st.last_batch = batch.len();
                (batch, st.cache.take())
            };
            let cache = self.run_batch(&q, batch, cache).await;
            lock(&q.state).cache = cache;
        }
    }

    async fn run_batch(
        &self,
        q: &Queue,
        batch: Vec<Pending>,
        mut cache: Option<Snapshot>,
    ) -> Option<Snapshot> {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now_ms();
        let mut ops: Vec<(Op, TopicSettings, oneshot::Sender<BrokerResult<Outcome>>)> =
            Vec::with_capacity(batch.len());
        let mut topic_etag = None;
        for p in batch {
            topic_etag.get_or_insert(p.topic_etag);
            ops.push((p.op, p.settings, p.reply));
        }
        let retention = ops.first().map_or(u64::MAX, |o| o.1.retention_ms);
        let dedup_window = ops.first().map_or(0, |o| o.1.dedup_window_ms);

        // Plan every produced message: into the segment, or a known duplicate.
        let mut plan = Plan::new(&ops, cache.as_ref().map(|c| &c.manifest), now);
        let mut result = None;
        for _ in 0..4 {
            // 1. One segment for every new message in the batch.
            let mut segment: Option<SegmentRef> = None;
            let mut refused: Option<BrokerError> = None;
            let fresh = plan.segment_messages(&ops);
            if !fresh.is_empty() {
                match self
                    .write_segment(q, topic_etag.as_deref().unwrap_or(""), fresh)
                    .await
                {
                    Ok(seg) => segment = Some(seg),
                    Err(e) => refused = Some(e),
                }
            }
            // A segment must never be committed after garbage collection could have
            // taken it for an orphan: if this process stalled since writing it, give up.
            if let Some(seg) = &segment {
                let written = keys::segment_time(&seg.id).unwrap_or(0);
                if self.clock.now_ms().saturating_sub(written) > MAX_SEGMENT_AGE_AT_COMMIT_MS {
                    segment = None;
                    refused = Some(BrokerError::Contention);
                }
            }
            // 2. One manifest commit for everything.
            let r = manifest::commit(
                &*self.store,
                &*self.ids,
                &q.key,
                &q.incarnation,
                &mut cache,
                |m| {
                    apply(
                        m,
                        now,
                        retention,
                        dedup_window,
                        &ops,
                        &plan,
                        segment.as_ref(),
                        refused.as_ref(),
                    )
                },
            )
            .await;
            match r {
                // Another writer committed some of our idempotency keys first: those are
                // duplicates now. Rewrite the segment without them and try again.
                Err(UpdateError::Rejected(Abort::Duplicates(found))) => {
                    plan.mark_duplicates(&ops, &found);
                    continue;
                }
                other => {
                    result = Some(other);
                    break;
                }
            }
        }
        let result = result.unwrap_or(Err(UpdateError::Contention));

        // 3. Answer.
        match result {
            Ok(((results, dropped, wake), _)) => {
                let committed = results.iter().any(|r| r.is_ok());
                if committed {
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .committed_ops
                        .fetch_add(results.len() as u64, Ordering::Relaxed);
                }
                for ((_, _, reply), r) in ops.into_iter().zip(results) {
                    let _ = reply.send(r);
                }
                for seg in dropped {
                    let key = keys::segment(&q.topic, q.partition, &seg.id);
                    if let Err(e) = self.store.delete(&key).await {
                        tracing::warn!(%key, error = %e, "could not delete expired segment");
                    }
                }
                if wake {
                    self.wakers.wake(&q.topic);
                }
                cache
            }
            Err(e) => {
                let e = match e {
                    UpdateError::Rejected(Abort::Duplicates(_)) | UpdateError::Contention => {
                        BrokerError::Contention
                    }
                    UpdateError::Superseded => BrokerError::StaleTopic,
                    UpdateError::Store(e) => BrokerError::Store(e),
                    UpdateError::Corrupt(e) => BrokerError::Corrupt(e),
                };
                for (_, _, reply) in ops {
                    let _ = reply.send(Err(e.clone()));
                }
                None
            }
        }
    }

    /// Writes the batch's segment after checking the topic is still the one the
    /// producers saw.
    async fn write_segment(
        &self,
        q: &Queue,
        topic_etag: &str,
        messages: Vec<StoredMessage>,
    ) -> BrokerResult<SegmentRef> {
        match self
            .store
            .get_if_changed(&keys::topic_settings(&q.topic), topic_etag)
            .await?
        {
            Fetched::Unchanged => {}
            Fetched::Missing => return Err(BrokerError::StaleTopic),
            Fetched::Object(o) => {
                // Settings may have changed (PATCH); only a new incarnation is stale.
                let same = serde_json::from_slice::<serde_json::Value>(&o.data)
                    .ok()
                    .and_then(|v| {
                        v.get("incarnation")
                            .and_then(|i| i.as_str())
                            .map(|i| i == q.incarnation)
                    })
                    .unwrap_or(false);
                if !same {
                    return Err(BrokerError::StaleTopic);
                }
            }
        }
        let last_produced_ms = messages.iter().map(|m| m.produced_at_ms).max().unwrap_or(0);
        let bytes = messages.iter().map(|m| m.payload.len() as u64).sum();
        let count = messages.len() as u32;
        let seg = Segment { messages };
        let id = keys::segment_id(self.clock.now_ms(), &self.ids.new_id());
        // Written before the commit; if the commit never lands this object is an orphan.
        let key = keys::segment(&q.topic, q.partition, &id);
        self.store.put_if_absent(&key, seg.encode()?).await?;
        // Consumers in this process read it from memory.
        self.segments.put(key, Arc::new(seg));
        Ok(SegmentRef {
            id,
            base_offset: 0,
            count,
            last_produced_ms,
            bytes,
        })
    }
}

type BatchResult = (Vec<BrokerResult<Outcome>>, Vec<SegmentRef>, bool);

/// Why [`apply`] gave up on an attempt.
#[derive(Debug)]
enum Abort {
    /// These idempotency keys were committed by someone else meanwhile (key, offset).
    Duplicates(Vec<(String, u64)>),
}

/// Where each produced message goes.
#[derive(Debug, Clone)]
enum Slot {
    /// Index into the batch's segment.
    New(usize),
    /// Already committed at this offset.
    Dup(u64),
    /// Same idempotency key as an earlier message of this batch.
    Same(String),
}

/// The per-message plan of a batch's produces.
struct Plan {
    slots: Vec<Vec<Slot>>,
}

impl Plan {
    /// Known duplicates come from the cached manifest (a key there is certainly
    /// committed); repeats within the batch share the first message's offset.
    fn new(
        ops: &[(Op, TopicSettings, oneshot::Sender<BrokerResult<Outcome>>)],
        cached: Option<&Manifest>,
        now: u64,
    ) -> Self {
        let mut seen = std::collections::HashSet::new();
        let mut n = 0;
        let slots = ops
            .iter()
            .map(|(op, _, _)| match op {
                Op::Produce(msgs) => msgs
                    .iter()
                    .map(|m| match &m.idempotency_key {
                        Some(k) => {
                            if let Some(o) = cached.and_then(|c| c.dedup_lookup(k, now)) {
                                Slot::Dup(o)
                            } else if !seen.insert(k.clone()) {
                                Slot::Same(k.clone())
                            } else {
                                n += 1;
                                Slot::New(n - 1)
                            }
                        }
                        None => {
                            n += 1;
                            Slot::New(n - 1)
                        }
                    })
                    .collect(),
                _ => Vec::new(),
            })
            .collect();
        Self { slots }
    }

    /// The messages planned as new, in segment order (renumbering the slots).
    fn segment_messages(
        &mut self,
        ops: &[(Op, TopicSettings, oneshot::Sender<BrokerResult<Outcome>>)],
    ) -> Vec<StoredMessage> {
        let mut out = Vec::new();
        for ((op, _, _), slots) in ops.iter().zip(self.slots.iter_mut()) {
            if let Op::Produce(msgs) = op {
                for (m, slot) in msgs.iter().zip(slots.iter_mut()) {
                    if let Slot::New(i) = slot {
                        *i = out.len();
                        out.push(m.message.clone());
                    }
                }
            }
        }
        out
    }

    /// Turns the planned-new messages with these keys into duplicates of `offset`.
    fn mark_duplicates(
        &mut self,
        ops: &[(Op, TopicSettings, oneshot::Sender<BrokerResult<Outcome>>)],
        found: &[(String, u64)],
    ) {
        let found: HashMap<&str, u64> = found.iter().map(|(k, o)| (k.as_str(), *o)).collect();
        for ((op, _, _), slots) in ops.iter().zip(self.slots.iter_mut()) {
            if let Op::Produce(msgs) = op {
                for (m, slot) in msgs.iter().zip(slots.iter_mut()) {
                    if let (Slot::New(_), Some(o)) = (
                        &slot,
                        m.idempotency_key.as_deref().and_then(|k| found.get(k)),
                    ) {
                        *slot = Slot::Dup(*o);
                    }
                }
            }
        }
    }
}

/// Applies a batch to a manifest copy. Pure: called again on every retry.
#[allow(clippy::too_many_arguments)]
fn apply(
    m: &mut Manifest,
    now: u64,
    retention_ms: u64,
    dedup_window_ms: u64,
    ops: &[(Op, TopicSettings, oneshot::Sender<BrokerResult<Outcome>>)],
    plan: &Plan,
    segment: Option<&SegmentRef>,
    refused: Option<&BrokerError>,
) -> Result<Decision<BatchResult>, Abort> {
    let mut results: Vec<Option<BrokerResult<Outcome>>> = vec![None; ops.len()];
    let dropped = m.apply_retention(now, retention_ms);
    let mut changed = !dropped.is_empty();
    let mut wake = false;

    // Produces first, so leases in the same batch can see the new messages.
    let base = m.next_offset;
    if let Some(seg) = segment {
        // A key this batch writes as new but the manifest already holds: someone else
        // committed it first. Abort so the caller rewrites the segment without it.
        let mut dups = Vec::new();
        for ((op, _, _), slots) in ops.iter().zip(&plan.slots) {
            if let Op::Produce(msgs) = op {
                for (msg, slot) in msgs.iter().zip(slots) {
                    if let (Slot::New(_), Some(k)) = (slot, &msg.idempotency_key) {
                        if let Some(o) = m.dedup_lookup(k, now) {
                            dups.push((k.clone(), o));
                        }
                    }
                }
            }
        }
        if !dups.is_empty() {
            return Err(Abort::Duplicates(dups));
        }
        let mut r = seg.clone();
        r.base_offset = base;
        m.next_offset += u64::from(seg.count);
        m.segments.push(r);
        changed = true;
        wake = true;
    }
    let mut assigned: HashMap<String, u64> = HashMap::new();
    for (i, ((op, _, _), slots)) in ops.iter().zip(&plan.slots).enumerate() {
        let Op::Produce(msgs) = op else { continue };
        if segment.is_none() && slots.iter().any(|s| matches!(s, Slot::New(_))) {
            let e = refused
                .cloned()
                .unwrap_or(BrokerError::Corrupt("produce without a segment".into()));
            results[i] = Some(Err(e));
            continue;
        }
        let mut offsets = Vec::with_capacity(msgs.len());
        for (msg, slot) in msgs.iter().zip(slots) {
            let offset = match slot {
                Slot::New(j) => {
                    let o = base + *j as u64;
                    if let Some(k) = &msg.idempotency_key {
                        m.dedup_insert(k.clone(), o, now + dedup_window_ms, now);
                        assigned.insert(k.clone(), o);
                    }
                    o
                }
                Slot::Dup(o) => *o,
                Slot::Same(k) => {
                    match assigned.get(k).copied().or_else(|| m.dedup_lookup(k, now)) {
                        Some(o) => o,
                        None => {
                            results[i] = Some(Err(BrokerError::Contention));
                            break;
                        }
                    }
                }
            };
            offsets.push(offset);
        }
        if results[i].is_none() {
            results[i] = Some(Ok(Outcome::Produced(offsets)));
        }
    }
    // Then settles, which may free in-flight room for the leases.
    for (i, (op, s, _)) in ops.iter().enumerate() {
        if let Op::Settle {
            offset,
            lease_id,
            action,
        } = op
        {
            let r = settle(m, now, s, *offset, *lease_id, *action);
            if r.is_ok() {
                changed = true;
                wake |= *action != Settle::Extend;
            }
            results[i] = Some(r.map(|()| Outcome::Settled));
        }
    }
    // Then leases, lowest available offsets first. One cursor and one in-flight count
    // serve the whole batch, so a batch costs one pass over the offsets it skips.
    let version = m.version;
    let mut in_flight = m.in_flight(now);
    let mut cursor = m.frontier;
    for (i, (op, s, _)) in ops.iter().enumerate() {
        if let Op::Lease(max) = op {
            let mut grants = Vec::new();
            let mut dead = Vec::new();
            while grants.len() < *max && in_flight < s.max_in_flight_per_partition as usize {
                let offset = if m.acked_ahead.len() >= s.max_acked_ahead_per_partition as usize {
                    // Window full: only the message blocking the frontier may go out.
                    match m.is_available(m.frontier, now) {
                        true => m.frontier,
                        false => break,
                    }
                } else {
                    cursor = cursor.max(m.frontier);
                    while cursor < m.next_offset && !m.is_available(cursor, now) {
                        cursor += 1;
                    }
                    if cursor >= m.next_offset {
                        break;
                    }
                    cursor
                };
                let Some(segment) = m.segment_for(offset).cloned() else {
                    break;
                };
                let delivered = m.leases.get(&offset).map_or(0, |l| l.delivery_count);
                if s.max_deliveries > 0 && delivered >= s.max_deliveries {
                    // Delivered often enough without an ack: park it for the dead-letter
                    // topic instead of delivering it again.
                    if let Some(l) = m.leases.get_mut(&offset) {
                        l.lease_id = version;
                        l.deadline_ms = now + DEAD_LETTER_PARK_MS;
                    }
                    in_flight += 1;
                    dead.push(Grant {
                        offset,
                        lease_id: version,
                        delivery_count: delivered,
                        segment,
                    });
                    continue;
                }
                let lease = m.leases.entry(offset).or_insert(Lease {
                    lease_id: 0,
                    deadline_ms: 0,
                    delivery_count: 0,
                });
                lease.lease_id = version;
                lease.deadline_ms = now + s.visibility_timeout_ms;
                lease.delivery_count += 1;
                in_flight += 1;
                grants.push(Grant {
                    offset,
                    lease_id: version,
                    delivery_count: lease.delivery_count,
                    segment,
                });
            }
            changed |= !grants.is_empty() || !dead.is_empty();
            results[i] = Some(Ok(Outcome::Leased { grants, dead }));
        }
    }
    let results = results
        .into_iter()
        .map(|r| r.unwrap_or(Err(BrokerError::Contention)))
        .collect();
    Ok(if changed {
        Decision::Commit((results, dropped, wake))
    } else {
        Decision::Keep((results, dropped, wake))
    })
}

/// Acks, extends or nacks one lease, by the rules in the engine's documentation.
fn settle(
    m: &mut Manifest,
    now: u64,
    s: &TopicSettings,
    o: u64,
    lease_id: u64,
    action: Settle,
) -> BrokerResult<()> {
    let live = m
        .leases
        .get(&o)
        .is_some_and(|l| l.lease_id == lease_id && l.deadline_ms > now);
    if !live {
        return Err(BrokerError::LeaseGone);
    }
    match action {
        Settle::Ack if o == m.frontier => {
            m.leases.remove(&o);
            m.frontier += 1;
            m.advance_frontier();
        }
        Settle::Ack => {
            if m.acked_ahead.len() >= s.max_acked_ahead_per_partition as usize {
                return Err(BrokerError::AckedAheadFull);
            }
            m.leases.remove(&o);
            m.acked_ahead.insert(o);
        }
        Settle::Extend | Settle::Nack => {
            if let Some(l) = m.leases.get_mut(&o) {
                l.deadline_ms = if action == Settle::Extend {
                    now + s.visibility_timeout_ms
                } else {
                    0
                };
            }
        }
    }
    Ok(())
}

impl From<UpdateError<BrokerError>> for BrokerError {
    fn from(e: UpdateError<BrokerError>) -> Self {
        match e {
            UpdateError::Rejected(e) => e,
            UpdateError::Contention => BrokerError::Contention,
            UpdateError::Superseded => BrokerError::StaleTopic,
            UpdateError::Store(e) => BrokerError::Store(e),
            UpdateError::Corrupt(e) => BrokerError::Corrupt(e),
        }
    }
}
