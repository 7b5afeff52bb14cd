//! The broker: topics, produce, consume, ack, extend, nack and replay over any [`Store`].
//!
//! The broker keeps no state that matters between requests: every decision is made by
//! reading and conditionally writing objects through [`crate::manifest::update`], so any
//! number of processes (or Lambda instances) may share one store. What it does keep in
//! memory is only an optimisation or a courtesy: a cache of immutable segments, the
//! round-robin cursor, and per-topic wake-ups for long polls in this process.
//!
//! Leases (DESIGN.md §3): a consume picks the lowest available offset at or above the
//! frontier, records a lease whose id is the manifest version of that write and whose
//! deadline is now + `visibility_timeout_ms`, and returns a receipt handle signed over
//! (topic, partition, offset, lease id). Ack, extend and nack verify the handle before
//! any storage call, then require the manifest to still hold a live lease with that id;
//! anything else is [`BrokerError::LeaseGone`] (410). Leases expire lazily: an entry whose
//! deadline has passed is simply available again. Deadlines are wall-clock milliseconds,
//! so processes sharing a store must keep their clocks in step; skew between them
//! shortens or lengthens a lease by the skew.
//!
//! Flow control (DESIGN.md §4): at `max_in_flight_per_partition` live leases consume
//! finds nothing there; an out-of-order ack that would grow the acked-ahead set past
//! `max_acked_ahead_per_partition` fails with [`BrokerError::AckedAheadFull`] (503), and
//! while the set is full consume offers only the frontier message.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::clock::{Clock, IdSource};
use crate::keys::{self, InvalidTopic};
use crate::manifest::{self, Decision, Lease, Manifest, SegmentRef, UpdateError};
use crate::receipt::{Claims, ReceiptError, Receipts};
use crate::segment::{CorruptSegment, Segment, StoredMessage};
use crate::settings::{InvalidSetting, SettingsInput, TopicSettings};
use crate::store::{DynStore, StoreError};

/// Everything the broker can refuse or fail with. The HTTP edge maps each case to a
/// status and error code in one place (`api::error`).
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The topic name is not allowed.
    #[error(transparent)]
    InvalidTopic(#[from] InvalidTopic),
    /// No topic by that name.
    #[error("topic not found")]
    TopicNotFound,
    /// The topic exists with other settings.
    #[error("topic already exists with different settings")]
    TopicConflict,
    /// A setting is unknown or out of range.
    #[error(transparent)]
    InvalidSetting(#[from] InvalidSetting),
    /// A request parameter is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The partition does not exist in this topic.
    #[error("partition {0} does not exist in this topic")]
    NoSuchPartition(u32),
    /// The payload exceeds the configured maximum.
    #[error("payload exceeds the maximum of {0} bytes")]
    PayloadTooLarge(usize),
    /// The receipt handle is malformed or not valid for this topic.
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    /// The lease the handle names is no longer held (acked, expired, nacked, redelivered).
    #[error("the lease for this receipt handle is no longer held")]
    LeaseGone,
    /// The partition's acked-ahead window is full; ack the frontier message first.
    #[error("too many out-of-order acks are outstanding on this partition; retry later")]
    AckedAheadFull,
    /// The replayed offset was deleted by retention.
    #[error("offset {0} has been deleted by retention")]
    OffsetExpired(u64),
    /// Too many concurrent writers on one partition.
    #[error("the partition is busy; retry later")]
    Contention,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stored data does not decode.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
}

impl From<UpdateError<BrokerError>> for BrokerError {
    fn from(e: UpdateError<BrokerError>) -> Self {
        match e {
            UpdateError::Rejected(e) => e,
            UpdateError::Contention => BrokerError::Contention,
            UpdateError::Store(e) => BrokerError::Store(e),
            UpdateError::Corrupt(e) => BrokerError::Corrupt(e),
        }
    }
}

impl From<CorruptSegment> for BrokerError {
    fn from(e: CorruptSegment) -> Self {
        BrokerError::Corrupt(e.to_string())
    }
}

/// Result of a broker call.
pub type BrokerResult<T> = Result<T, BrokerError>;

/// Process-level limits (from [`crate::config::Config`]).
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// Largest payload accepted, in bytes.
    pub max_message_bytes: usize,
    /// Cap on a consume's `wait`.
    pub max_wait: Duration,
    /// How often a long poll re-reads the store for work from other processes.
    pub poll_interval: Duration,
    /// Decoded segments kept in memory.
    pub segment_cache_entries: usize,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        Self {
            max_message_bytes: 1 << 20,
            max_wait: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            segment_cache_entries: 256,
        }
    }
}

/// The stored form of `topic.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TopicRecord {
    settings: TopicSettings,
    incarnation: String,
    created_at_ms: u64,
}

/// A topic as loaded for one request.
#[derive(Debug, Clone)]
pub struct Topic {
    /// The topic name.
    pub name: String,
    /// Its settings.
    pub settings: TopicSettings,
    /// Changes each time a topic of this name is created.
    pub incarnation: String,
    /// Creation time, wall-clock ms.
    pub created_at_ms: u64,
}

/// Where a produced message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Produced {
    /// Partition.
    pub partition: u32,
    /// Offset within the partition.
    pub offset: u64,
}

/// A message handed to a consumer (or read by replay, without a handle).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Topic name.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// Raw payload bytes.
    pub payload: Bytes,
    /// Proof of the lease; `None` for replays.
    pub receipt_handle: Option<String>,
    /// Deliveries so far, this one included (for a replay: of the unsettled message, else 0).
    pub delivery_count: u32,
    /// When the broker accepted it.
    pub produced_at_ms: u64,
}

/// What to do with a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Settle the message forever.
    Ack,
    /// Restart the visibility window from now.
    Extend,
    /// Make the message available again at once.
    Nack,
}

/// One partition's state, for `GET /v1/topics/{topic}`.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionStats {
    /// Partition.
    pub partition: u32,
    /// Oldest retained offset.
    pub start_offset: u64,
    /// Lowest unsettled offset.
    pub frontier: u64,
    /// Offset the next message gets.
    pub next_offset: u64,
    /// Unsettled messages not in flight.
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Offsets acked above the frontier.
    pub acked_ahead: u64,
    /// Retained segment objects.
    pub segments: u64,
    /// Retained payload bytes.
    pub bytes: u64,
    /// Manifest version.
    pub version: u64,
}

/// The broker. Cheap to share behind an `Arc`.
pub struct Broker {
    store: DynStore,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdSource>,
    receipts: Receipts,
    opts: BrokerOptions,
    wakers: Mutex<HashMap<String, Arc<Notify>>>,
    segments: Mutex<lru::LruCache<String, Arc<Segment>>>,
    round_robin: AtomicU64,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("store", &self.store.describe())
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct StoredReceiptKey {
    key_b64: String,
}

impl Broker {
    /// Builds a broker. `receipt_keys` are the configured signing keys (first signs);
    /// when empty, a key is generated once and kept in the store so every process on
    /// that store accepts the others' handles.
    ///
    /// Errors: [`BrokerError::Store`] when the generated key cannot be read or written.
    pub async fn new(
        store: DynStore,
        clock: Arc<dyn Clock>,
        ids: Arc<dyn IdSource>,
        receipt_keys: Vec<Vec<u8>>,
        opts: BrokerOptions,
    ) -> BrokerResult<Self> {
        let receipts = match Receipts::new(receipt_keys) {
            Some(r) => r,
            None => Receipts::new(vec![shared_receipt_key(&*store).await?])
                .ok_or_else(|| BrokerError::Corrupt("no receipt key".into()))?,
        };
        let cap = NonZeroUsize::new(opts.segment_cache_entries.max(1)).unwrap_or(NonZeroUsize::MIN);
        Ok(Self {
            store,
            clock,
            ids,
            receipts,
            opts,
            wakers: Mutex::new(HashMap::new()),
            segments: Mutex::new(lru::LruCache::new(cap)),
            round_robin: AtomicU64::new(0),
        })
    }

    /// The process-level limits.
    pub fn options(&self) -> &BrokerOptions {
        &self.opts
    }

    /// The store this broker runs on.
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    fn waker(&self, topic: &str) -> Arc<Notify> {
        let mut map = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(topic.to_owned()).or_default().clone()
    }

    fn wake(&self, topic: &str) {
        self.waker(topic).notify_waiters();
    }

    // ----- topics -------------------------------------------------------------------

    /// Loads a topic's settings.
    ///
    /// Errors: [`BrokerError::InvalidTopic`], [`BrokerError::TopicNotFound`].
    pub async fn topic(&self, name: &str) -> BrokerResult<Topic> {
        Ok(self.topic_with_etag(name).await?.0)
    }

    async fn topic_with_etag(&self, name: &str) -> BrokerResult<(Topic, String)> {
        keys::validate_topic(name)?;
        let obj = self
            .store
            .get(&keys::topic_settings(name))
            .await?
            .ok_or(BrokerError::TopicNotFound)?;
        let rec: TopicRecord = serde_json::from_slice(&obj.data)
            .map_err(|e| BrokerError::Corrupt(format!("topic {name}: {e}")))?;
        Ok((
            Topic {
                name: name.to_owned(),
                settings: rec.settings,
                incarnation: rec.incarnation,
                created_at_ms: rec.created_at_ms,
            },
            obj.etag,
        ))
    }

    /// Creates a topic. Returns `(true, topic)` when created, `(false, topic)` when it
    /// already existed with the same settings.
    ///
    /// Errors: [`BrokerError::InvalidTopic`], [`BrokerError::InvalidSetting`],
    /// [`BrokerError::TopicConflict`] when it exists with other settings.
    pub async fn create_topic(
        &self,
        name: &str,
        input: &SettingsInput,
    ) -> BrokerResult<(bool, Topic)> {
        keys::validate_topic(name)?;
        let settings = input.to_new()?;
        for _ in 0..3 {
            let rec = TopicRecord {
                settings: settings.clone(),
                incarnation: self.ids.new_id(),
                created_at_ms: self.clock.now_ms(),
            };
            let body = serde_json::to_vec(&rec).map_err(|e| BrokerError::Corrupt(e.to_string()))?;
            match self
                .store
                .put_if_absent(&keys::topic_settings(name), Bytes::from(body))
                .await
            {
                Ok(_) => {
                    let topic = Topic {
                        name: name.to_owned(),
                        settings: rec.settings,
                        incarnation: rec.incarnation,
                        created_at_ms: rec.created_at_ms,
                    };
                    return Ok((true, topic));
                }
                Err(StoreError::Conflict) => match self.topic(name).await {
                    Ok(existing) if existing.settings == settings => return Ok((false, existing)),
                    Ok(_) => return Err(BrokerError::TopicConflict),
                    Err(BrokerError::TopicNotFound) => continue, // deleted meanwhile: try again
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e.into()),
            }
        }
        Err(BrokerError::Contention)
    }

    /// Every topic, sorted by name.
    pub async fn list_topics(&self) -> BrokerResult<Vec<Topic>> {
        let keys = self.store.list(keys::TOPICS_PREFIX).await?;
        let mut out = Vec::new();
        for name in keys.iter().filter_map(|k| keys::topic_of_settings_key(k)) {
            match self.topic(name).await {
                Ok(t) => out.push(t),
                Err(BrokerError::TopicNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Changes the settings that can change.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::InvalidSetting`].
    pub async fn patch_topic(&self, name: &str, input: &SettingsInput) -> BrokerResult<Topic> {
        for _ in 0..manifest::MAX_ATTEMPTS {
            let (mut topic, etag) = self.topic_with_etag(name).await?;
            let settings = input.apply_to(&topic.settings)?;
            if settings == topic.settings {
                return Ok(topic);
            }
            let rec = TopicRecord {
                settings: settings.clone(),
                incarnation: topic.incarnation.clone(),
                created_at_ms: topic.created_at_ms,
            };
            let body = serde_json::to_vec(&rec).map_err(|e| BrokerError::Corrupt(e.to_string()))?;
            match self
                .store
                .put_if_match(&keys::topic_settings(name), Bytes::from(body), &etag)
                .await
            {
                Ok(_) => {
                    topic.settings = settings;
                    self.wake(name);
                    return Ok(topic);
                }
                Err(StoreError::Conflict) => continue,
                Err(StoreError::NotFound) => return Err(BrokerError::TopicNotFound),
                Err(e) => return Err(e.into()),
            }
        }
        Err(BrokerError::Contention)
    }

    /// Deletes a topic and every object under it. The settings object goes first, so
    /// the topic disappears at once; leftovers of an interrupted delete belong to a dead
    /// incarnation and are ignored by a new topic of the same name.
    ///
    /// Errors: [`BrokerError::TopicNotFound`].
    pub async fn delete_topic(&self, name: &str) -> BrokerResult<()> {
        self.topic(name).await?;
        self.store.delete(&keys::topic_settings(name)).await?;
        for key in self.store.list(&keys::topic_prefix(name)).await? {
            self.store.delete(&key).await?;
        }
        self.wake(name);
        Ok(())
    }

    /// Per-partition state of a topic.
    pub async fn partition_stats(&self, topic: &Topic) -> BrokerResult<Vec<PartitionStats>> {
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        for p in 0..topic.settings.partitions {
            let m = self.read_manifest(topic, p).await?;
            let in_flight = m.in_flight(now) as u64;
            let acked = m.acked_ahead.len() as u64;
            out.push(PartitionStats {
                partition: p,
                start_offset: m.start_offset,
                frontier: m.frontier,
                next_offset: m.next_offset,
                available: (m.next_offset - m.frontier).saturating_sub(in_flight + acked),
                in_flight,
                acked_ahead: acked,
                segments: m.segments.len() as u64,
                bytes: m.segments.iter().map(|s| s.bytes).sum(),
                version: m.version,
            });
        }
        Ok(out)
    }

    async fn read_manifest(&self, topic: &Topic, partition: u32) -> BrokerResult<Manifest> {
        let key = keys::manifest(&topic.name, partition);
        let snap = manifest::read::<BrokerError>(&*self.store, &key, &topic.incarnation).await?;
        Ok(snap.manifest)
    }

    // ----- produce ------------------------------------------------------------------

    /// Appends one message. Answers only after the manifest write that makes it
    /// visible has committed.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::NoSuchPartition`],
    /// [`BrokerError::PayloadTooLarge`], [`BrokerError::Contention`], store failures.
    /// The partition is `partition` if given, else the one `key` hashes to
    /// ([`partition_for_key`]), else the next in this process's round-robin.
    pub async fn produce(
        &self,
        name: &str,
        partition: Option<u32>,
        key: Option<String>,
        payload: Bytes,
    ) -> BrokerResult<Produced> {
        if payload.len() > self.opts.max_message_bytes {
            return Err(BrokerError::PayloadTooLarge(self.opts.max_message_bytes));
        }
        let topic = self.topic(name).await?;
        let n = topic.settings.partitions;
        let partition = match (partition, &key) {
            (Some(p), _) if p < n => p,
            (Some(p), _) => return Err(BrokerError::NoSuchPartition(p)),
            (None, Some(k)) => partition_for_key(k, n),
            (None, None) => {
                (self.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(n)) as u32
            }
        };
        let now = self.clock.now_ms();
        let bytes = payload.len() as u64;
        let segment = Arc::new(Segment {
            messages: vec![StoredMessage::new(now, key, payload.to_vec())],
        });
        let seg_id = self.ids.new_id();
        let seg_key = keys::segment(name, partition, &seg_id);
        // Written before the commit; if the commit never lands this object is an orphan.
        self.store
            .put_if_absent(&seg_key, segment.encode()?)
            .await?;
        let retention = topic.settings.retention_ms;
        let mkey = keys::manifest(name, partition);
        let ((offset, dropped), _) =
            manifest::update(&*self.store, &*self.ids, &mkey, &topic.incarnation, |m| {
                let dropped = m.apply_retention(now, retention);
                let base = m.next_offset;
                m.segments.push(SegmentRef {
                    id: seg_id.clone(),
                    base_offset: base,
                    count: 1,
                    last_produced_ms: now,
                    bytes,
                });
                m.next_offset += 1;
                Ok::<_, BrokerError>(Decision::Commit((base, dropped)))
            })
            .await?;
        self.cache_put(seg_key, segment);
        self.delete_segments(name, partition, &dropped).await;
        self.wake(name);
        Ok(Produced { partition, offset })
    }

    // ----- consume ------------------------------------------------------------------

    /// Leases one message, long-polling up to `wait` (capped by the server). `None`
    /// when nothing turned up in time. With `partition`, only that partition is tried.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::NoSuchPartition`],
    /// [`BrokerError::Contention`], store failures.
    pub async fn consume(
        &self,
        name: &str,
        partition: Option<u32>,
        wait: Duration,
    ) -> BrokerResult<Option<Delivery>> {
        let deadline = Instant::now() + wait.min(self.opts.max_wait);
        let waker = self.waker(name);
        loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let topic = self.topic(name).await?;
            let n = topic.settings.partitions;
            let order: Vec<u32> = match partition {
                Some(p) if p < n => vec![p],
                Some(p) => return Err(BrokerError::NoSuchPartition(p)),
                None => {
                    let start =
                        (self.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(n)) as u32;
                    (0..n).map(|i| (start + i) % n).collect()
                }
            };
            for p in order {
                if let Some(d) = self.try_lease(&topic, p).await? {
                    return Ok(Some(d));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let _ = tokio::time::timeout(left.min(self.opts.poll_interval), notified).await;
        }
    }

    /// One attempt to lease a message on one partition.
    async fn try_lease(&self, topic: &Topic, partition: u32) -> BrokerResult<Option<Delivery>> {
        let s = &topic.settings;
        let mkey = keys::manifest(&topic.name, partition);
        // A leased message whose segment vanished (retention raced us) is skipped.
        for _ in 0..4 {
            let now = self.clock.now_ms();
            let ((picked, dropped), _) =
                manifest::update(&*self.store, &*self.ids, &mkey, &topic.incarnation, |m| {
                    let dropped = m.apply_retention(now, s.retention_ms);
                    let Some(offset) = pick(m, now, s) else {
                        return Ok::<_, BrokerError>(if dropped.is_empty() {
                            Decision::Keep((None, dropped))
                        } else {
                            Decision::Commit((None, dropped))
                        });
                    };
                    let version = m.version;
                    let lease = m.leases.entry(offset).or_insert(Lease {
                        lease_id: 0,
                        deadline_ms: 0,
                        delivery_count: 0,
                    });
                    lease.lease_id = version;
                    lease.deadline_ms = now + s.visibility_timeout_ms;
                    lease.delivery_count += 1;
                    let count = lease.delivery_count;
                    let seg = m.segment_for(offset).cloned();
                    Ok(Decision::Commit((
                        Some((offset, version, count, seg)),
                        dropped,
                    )))
                })
                .await?;
            self.delete_segments(&topic.name, partition, &dropped).await;
            let Some((offset, lease_id, delivery_count, Some(seg))) = picked else {
                return Ok(None);
            };
            let Some(msg) = self.message(&topic.name, partition, &seg, offset).await? else {
                continue;
            };
            let handle = self.receipts.sign(&Claims {
                topic: topic.name.clone(),
                partition,
                offset,
                lease_id,
            });
            return Ok(Some(Delivery {
                topic: topic.name.clone(),
                partition,
                offset,
                key: msg.key.clone(),
                payload: Bytes::from(msg.payload.clone()),
                receipt_handle: Some(handle),
                delivery_count,
                produced_at_ms: msg.produced_at_ms,
            }));
        }
        Ok(None)
    }

    /// Reads a retained message without reserving it, long-polling up to `wait` for an
    /// offset not yet produced. `None` when it did not appear in time.
    ///
    /// Errors: [`BrokerError::OffsetExpired`] when retention deleted it,
    /// [`BrokerError::NoSuchPartition`], [`BrokerError::TopicNotFound`].
    pub async fn replay(
        &self,
        name: &str,
        partition: u32,
        offset: u64,
        wait: Duration,
    ) -> BrokerResult<Option<Delivery>> {
        let deadline = Instant::now() + wait.min(self.opts.max_wait);
        let waker = self.waker(name);
        loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let topic = self.topic(name).await?;
            if partition >= topic.settings.partitions {
                return Err(BrokerError::NoSuchPartition(partition));
            }
            let m = self.read_manifest(&topic, partition).await?;
            if offset < m.start_offset {
                return Err(BrokerError::OffsetExpired(offset));
            }
            if offset < m.next_offset {
                let seg = m
                    .segment_for(offset)
                    .ok_or(BrokerError::OffsetExpired(offset))?;
                let msg = self
                    .message(name, partition, seg, offset)
                    .await?
                    .ok_or(BrokerError::OffsetExpired(offset))?;
                return Ok(Some(Delivery {
                    topic: name.to_owned(),
                    partition,
                    offset,
                    key: msg.key.clone(),
                    payload: Bytes::from(msg.payload.clone()),
                    receipt_handle: None,
                    delivery_count: m.leases.get(&offset).map_or(0, |l| l.delivery_count),
                    produced_at_ms: msg.produced_at_ms,
                }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let _ = tokio::time::timeout(left.min(self.opts.poll_interval), notified).await;
        }
    }

    // ----- ack / extend / nack ------------------------------------------------------

    /// Acks, extends or nacks the lease a receipt handle names. The handle is verified
    /// before any storage call.
    ///
    /// Errors: [`BrokerError::Receipt`] (malformed: 400; not ours: 410),
    /// [`BrokerError::LeaseGone`] (410), [`BrokerError::AckedAheadFull`] (503),
    /// [`BrokerError::TopicNotFound`].
    pub async fn settle(&self, name: &str, handle: &str, action: Settle) -> BrokerResult<()> {
        keys::validate_topic(name)?;
        let claims = self.receipts.verify(handle, name)?;
        let topic = self.topic(name).await?;
        if claims.partition >= topic.settings.partitions {
            return Err(BrokerError::LeaseGone);
        }
        let s = &topic.settings;
        let now = self.clock.now_ms();
        let mkey = keys::manifest(name, claims.partition);
        manifest::update(&*self.store, &*self.ids, &mkey, &topic.incarnation, |m| {
            let o = claims.offset;
            let live = m
                .leases
                .get(&o)
                .is_some_and(|l| l.lease_id == claims.lease_id && l.deadline_ms > now);
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
            Ok(Decision::Commit(()))
        })
        .await?;
        if action != Settle::Extend {
            // A nack frees a message; an ack may free in-flight or acked-ahead room.
            self.wake(name);
        }
        Ok(())
    }

    // ----- segments -----------------------------------------------------------------

    fn cache_put(&self, key: String, seg: Arc<Segment>) {
        self.segments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put(key, seg);
    }

    /// The message at `offset` of segment `seg`; `None` if the segment is gone.
    async fn message(
        &self,
        topic: &str,
        partition: u32,
        seg: &SegmentRef,
        offset: u64,
    ) -> BrokerResult<Option<StoredMessage>> {
        let key = keys::segment(topic, partition, &seg.id);
        let cached = self
            .segments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let segment = match cached {
            Some(s) => s,
            None => {
                let Some(obj) = self.store.get(&key).await? else {
                    return Ok(None);
                };
                let s = Arc::new(Segment::decode(&obj.data)?);
                self.cache_put(key, s.clone());
                s
            }
        };
        let idx = (offset - seg.base_offset) as usize;
        segment
            .messages
            .get(idx)
            .cloned()
            .map(Some)
            .ok_or_else(|| BrokerError::Corrupt(format!("segment {} has no message {idx}", seg.id)))
    }

    async fn delete_segments(&self, topic: &str, partition: u32, dropped: &[SegmentRef]) {
        for seg in dropped {
            let key = keys::segment(topic, partition, &seg.id);
            self.segments
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop(&key);
            if let Err(e) = self.store.delete(&key).await {
                // Harmless: the manifest no longer names it; garbage collection retries.
                tracing::warn!(%key, error = %e, "could not delete expired segment");
            }
        }
    }
}

/// The offset a consume should lease now, by the flow-control rules.
fn pick(m: &Manifest, now: u64, s: &TopicSettings) -> Option<u64> {
    if m.in_flight(now) >= s.max_in_flight_per_partition as usize {
        return None;
    }
    if m.acked_ahead.len() >= s.max_acked_ahead_per_partition as usize {
        return m.is_available(m.frontier, now).then_some(m.frontier);
    }
    (m.frontier..m.next_offset).find(|&o| m.is_available(o, now))
}

/// The partition a key maps to: the first 8 bytes of SHA-256(key), big-endian, modulo
/// the partition count. Stable across processes and versions.
pub fn partition_for_key(key: &str, partitions: u32) -> u32 {
    let d = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(first) % u64::from(partitions.max(1))) as u32
}

/// Reads the shared generated receipt key, creating it if no process has yet.
async fn shared_receipt_key(store: &dyn crate::store::Store) -> BrokerResult<Vec<u8>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    for _ in 0..3 {
        if let Some(obj) = store.get(keys::RECEIPT_KEY).await? {
            let rec: StoredReceiptKey = serde_json::from_slice(&obj.data)
                .map_err(|e| BrokerError::Corrupt(format!("receipt key: {e}")))?;
            return b64
                .decode(rec.key_b64)
                .map_err(|e| BrokerError::Corrupt(format!("receipt key: {e}")));
        }
        let mut key = vec![0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        let rec = StoredReceiptKey {
            key_b64: b64.encode(&key),
        };
        let body = serde_json::to_vec(&rec).map_err(|e| BrokerError::Corrupt(e.to_string()))?;
        match store
            .put_if_absent(keys::RECEIPT_KEY, Bytes::from(body))
            .await
        {
            Ok(_) => return Ok(key),
            Err(StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(BrokerError::Contention)
}
