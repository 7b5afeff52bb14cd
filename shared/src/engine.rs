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

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::clock::{Clock, IdSource};
use crate::commit::{Committer, Grant, NewStored, Op, Outcome};
use crate::keys::{self, InvalidTopic};
use crate::manifest::{self, Manifest, SegmentRef};
use crate::receipt::{Claims, ReceiptError, Receipts};
use crate::segment::{CorruptSegment, Segment, SegmentCache, StoredMessage};
use crate::settings::{InvalidSetting, SettingsInput, TopicSettings};
use crate::store::metered::{MeteredStore, OPS, OUTCOMES};
use crate::store::{DynStore, StoreError};

/// Everything the broker can refuse or fail with. The HTTP edge maps each case to a
/// status and error code in one place (`api::error`).
#[derive(Debug, Clone, thiserror::Error)]
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
    /// The topic was deleted and created again while this request used it; retried once
    /// internally, then reported as busy.
    #[error("the topic changed while the request ran; retry")]
    StaleTopic,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stored data does not decode.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
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
    /// How long topic settings are cached in this process. Settings changed by another
    /// process take up to this long to apply here.
    pub topic_cache: Duration,
    /// How long a group commit waits for more operations to join it.
    pub commit_linger: Duration,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        Self {
            max_message_bytes: 1 << 20,
            max_wait: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            segment_cache_entries: 256,
            topic_cache: Duration::from_secs(1),
            commit_linger: Duration::from_millis(2),
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
    /// Changes each time a topic of this name is created; sorts by creation time.
    pub incarnation: String,
    /// Creation time, wall-clock ms.
    pub created_at_ms: u64,
    /// ETag of the settings object this was read from.
    pub etag: String,
    /// Served from this process's cache (possibly up to `topic_cache` old): a request
    /// that the cached settings refuse is retried against freshly read ones.
    pub from_cache: bool,
}

/// A message to produce.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Target partition; with `None`, by key hash, else round-robin.
    pub partition: Option<u32>,
    /// The message key.
    pub key: Option<String>,
    /// Raw payload.
    pub payload: Bytes,
    /// `Idempotency-Key`: a retry within the topic's dedup window appends nothing and
    /// answers the first produce's partition and offset. Without `partition` or `key`
    /// it also picks the partition (by hash), so retries reach the same partition.
    pub idempotency_key: Option<String>,
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

/// Per-topic wake-ups for long polls in this process.
#[derive(Debug, Default)]
pub struct Wakers(Mutex<HashMap<String, Arc<Notify>>>);

impl Wakers {
    /// The notifier of `topic`.
    pub fn get(&self, topic: &str) -> Arc<Notify> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(topic.to_owned()).or_default().clone()
    }

    /// Wakes every long poll on `topic` in this process.
    pub fn wake(&self, topic: &str) {
        self.get(topic).notify_waiters();
    }
}

/// Most messages one consume may return.
pub const MAX_CONSUME_BATCH: usize = 100;

/// The broker. Cheap to share behind an `Arc`.
pub struct Broker {
    pub(crate) store: DynStore,
    metered: Arc<MeteredStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) ids: Arc<dyn IdSource>,
    receipts: Receipts,
    opts: BrokerOptions,
    wakers: Arc<Wakers>,
    pub(crate) committer: Arc<Committer>,
    segments: Arc<SegmentCache>,
    topics: Mutex<HashMap<String, (Instant, Topic)>>,
    round_robin: AtomicU64,
    waiting: AtomicI64,
    dead_lettered: AtomicU64,
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

/// Locks `m`, recovering from poisoning (every critical section leaves consistent state).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        let metered = MeteredStore::new(store);
        let store: DynStore = metered.clone();
        let receipts = match Receipts::new(receipt_keys) {
            Some(r) => r,
            None => Receipts::new(vec![shared_receipt_key(&*store).await?])
                .ok_or_else(|| BrokerError::Corrupt("no receipt key".into()))?,
        };
        let segments = Arc::new(SegmentCache::new(opts.segment_cache_entries));
        let wakers = Arc::new(Wakers::default());
        let committer = Arc::new(Committer::new(
            store.clone(),
            ids.clone(),
            clock.clone(),
            wakers.clone(),
            segments.clone(),
            opts.commit_linger,
        ));
        Ok(Self {
            store,
            metered,
            clock,
            ids,
            receipts,
            opts,
            wakers,
            committer,
            segments,
            topics: Mutex::new(HashMap::new()),
            round_robin: AtomicU64::new(0),
            waiting: AtomicI64::new(0),
            dead_lettered: AtomicU64::new(0),
        })
    }

    /// Opens the configured store and builds a broker on it with the configured clock,
    /// receipt keys and limits: what `narad serve`, `narad gc` and the Lambda functions
    /// all do at start-up.
    ///
    /// Errors: the store's startup failure (missing bucket, no credentials, no
    /// conditional writes) as [`BrokerError::Store`].
    pub async fn from_config(cfg: &crate::config::Config) -> BrokerResult<Self> {
        let store = crate::store::open(&cfg.store).await?;
        Self::new(
            store,
            cfg.clock(),
            Arc::new(crate::clock::RandomIds),
            cfg.receipt_keys.clone(),
            cfg.broker.clone(),
        )
        .await
    }

    /// The process-level limits.
    pub fn options(&self) -> &BrokerOptions {
        &self.opts
    }

    /// The store this broker runs on (counting requests).
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    // ----- topics -------------------------------------------------------------------

    /// Loads a topic's settings, from this process's short-lived cache when fresh.
    ///
    /// Errors: [`BrokerError::InvalidTopic`], [`BrokerError::TopicNotFound`].
    pub async fn topic(&self, name: &str) -> BrokerResult<Topic> {
        keys::validate_topic(name)?;
        if let Some((at, t)) = lock(&self.topics).get(name) {
            if at.elapsed() < self.opts.topic_cache {
                return Ok(Topic {
                    from_cache: true,
                    ..t.clone()
                });
            }
        }
        self.load_topic(name).await
    }

    /// Reads a topic's settings from the store, refreshing the cache.
    pub(crate) async fn load_topic(&self, name: &str) -> BrokerResult<Topic> {
        keys::validate_topic(name)?;
        let Some(obj) = self.store.get(&keys::topic_settings(name)).await? else {
            lock(&self.topics).remove(name);
            return Err(BrokerError::TopicNotFound);
        };
        let rec: TopicRecord = serde_json::from_slice(&obj.data)
            .map_err(|e| BrokerError::Corrupt(format!("topic {name}: {e}")))?;
        let topic = Topic {
            name: name.to_owned(),
            settings: rec.settings,
            incarnation: rec.incarnation,
            created_at_ms: rec.created_at_ms,
            etag: obj.etag,
            from_cache: false,
        };
        lock(&self.topics).insert(name.to_owned(), (Instant::now(), topic.clone()));
        Ok(topic)
    }

    fn forget_topic(&self, name: &str) {
        lock(&self.topics).remove(name);
    }

    /// Runs `f` with the topic; if the topic turned out stale (deleted and created again
    /// meanwhile), reloads it and runs `f` once more.
    async fn with_topic<T, F, Fut>(&self, name: &str, f: F) -> BrokerResult<T>
    where
        F: Fn(Topic) -> Fut,
        Fut: std::future::Future<Output = BrokerResult<T>>,
    {
        let topic = self.topic(name).await?;
        match f(topic).await {
            Err(BrokerError::StaleTopic) => {
                self.forget_topic(name);
                let topic = self.load_topic(name).await?;
                match f(topic).await {
                    Err(BrokerError::StaleTopic) => Err(BrokerError::Contention),
                    other => other,
                }
            }
            other => other,
        }
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
        not_own_dead_letter_topic(name, &settings)?;
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
                Ok(etag) => {
                    let topic = Topic {
                        name: name.to_owned(),
                        settings: rec.settings,
                        incarnation: rec.incarnation,
                        created_at_ms: rec.created_at_ms,
                        etag,
                        from_cache: false,
                    };
                    lock(&self.topics).insert(name.to_owned(), (Instant::now(), topic.clone()));
                    return Ok((true, topic));
                }
                Err(StoreError::Conflict) => match self.load_topic(name).await {
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
            match self.load_topic(name).await {
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
            let mut topic = self.load_topic(name).await?;
            let settings = input.apply_to(&topic.settings)?;
            not_own_dead_letter_topic(name, &settings)?;
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
                .put_if_match(&keys::topic_settings(name), Bytes::from(body), &topic.etag)
                .await
            {
                Ok(etag) => {
                    topic.settings = settings;
                    topic.etag = etag;
                    lock(&self.topics).insert(name.to_owned(), (Instant::now(), topic.clone()));
                    self.wakers.wake(name);
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
        self.load_topic(name).await?;
        self.forget_topic(name);
        self.store.delete(&keys::topic_settings(name)).await?;
        for key in self.store.list(&keys::topic_prefix(name)).await? {
            self.store.delete(&key).await?;
        }
        self.wakers.wake(name);
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

    pub(crate) async fn read_manifest(
        &self,
        topic: &Topic,
        partition: u32,
    ) -> BrokerResult<Manifest> {
        let key = keys::manifest(&topic.name, partition);
        let snap = manifest::read::<BrokerError>(&*self.store, &key, &topic.incarnation).await?;
        Ok(snap.manifest)
    }

    // ----- produce ------------------------------------------------------------------

    /// Appends one message and answers once the manifest write that makes it visible
    /// has committed. The partition is `msg.partition` if given, else the one its key
    /// hashes to ([`partition_for_key`]), else the one its idempotency key hashes to,
    /// else the next in this process's round-robin.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::NoSuchPartition`],
    /// [`BrokerError::PayloadTooLarge`], [`BrokerError::Contention`], store failures.
    pub async fn produce(&self, name: &str, msg: NewMessage) -> BrokerResult<Produced> {
        let mut r = self.produce_batch(name, vec![msg]).await?;
        r.pop().unwrap_or(Err(BrokerError::Contention))
    }

    /// Appends many messages; one result per message, in order. Messages for one
    /// partition are committed together, in order, with contiguous offsets.
    ///
    /// Errors (whole batch): [`BrokerError::TopicNotFound`]. Per message: as [`Broker::produce`].
    pub async fn produce_batch(
        &self,
        name: &str,
        messages: Vec<NewMessage>,
    ) -> BrokerResult<Vec<BrokerResult<Produced>>> {
        let messages = Arc::new(messages);
        self.with_topic(name, |topic| {
            let messages = messages.clone();
            async move { self.produce_on(&topic, &messages).await }
        })
        .await
    }

    async fn produce_on(
        &self,
        topic: &Topic,
        messages: &[NewMessage],
    ) -> BrokerResult<Vec<BrokerResult<Produced>>> {
        let n = topic.settings.partitions;
        let now = self.clock.now_ms();
        let mut results: Vec<Option<BrokerResult<Produced>>> = vec![None; messages.len()];
        let mut by_partition: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, m) in messages.iter().enumerate() {
            if m.payload.len() > self.opts.max_message_bytes {
                results[i] = Some(Err(BrokerError::PayloadTooLarge(
                    self.opts.max_message_bytes,
                )));
                continue;
            }
            let p = match (m.partition, &m.key) {
                (Some(p), _) if p < n => p,
                // Cached settings may predate a re-creation: check against fresh ones.
                (Some(_), _) if topic.from_cache => return Err(BrokerError::StaleTopic),
                (Some(p), _) => {
                    results[i] = Some(Err(BrokerError::NoSuchPartition(p)));
                    continue;
                }
                (None, Some(k)) => partition_for_key(k, n),
                (None, None) => match &m.idempotency_key {
                    Some(k) => partition_for_key(k, n),
                    None => {
                        (self.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(n)) as u32
                    }
                },
            };
            by_partition.entry(p).or_default().push(i);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (p, idx) in by_partition {
            let stored: Vec<NewStored> = idx
                .iter()
                .map(|&i| NewStored {
                    message: StoredMessage::new(
                        now,
                        messages[i].key.clone(),
                        messages[i].payload.to_vec(),
                    ),
                    idempotency_key: messages[i].idempotency_key.clone(),
                })
                .collect();
            let (committer, topic) = (self.committer.clone(), topic.clone());
            tasks.spawn(async move {
                (
                    p,
                    idx,
                    committer.submit(&topic, p, Op::Produce(stored)).await,
                )
            });
        }
        let mut stale = false;
        while let Some(joined) = tasks.join_next().await {
            let Ok((p, idx, outcome)) = joined else {
                return Err(BrokerError::Contention);
            };
            match outcome {
                Ok(Outcome::Produced(offsets)) => {
                    for (offset, i) in offsets.into_iter().zip(idx) {
                        results[i] = Some(Ok(Produced {
                            partition: p,
                            offset,
                        }));
                    }
                }
                Ok(_) => return Err(BrokerError::Corrupt("unexpected commit outcome".into())),
                Err(e) => {
                    stale |= matches!(e, BrokerError::StaleTopic);
                    for i in idx {
                        results[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        // Nothing of a stale batch was committed; the caller retries it whole.
        if stale && results.iter().all(|r| !matches!(r, Some(Ok(_)))) {
            return Err(BrokerError::StaleTopic);
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(Err(BrokerError::Contention)))
            .collect())
    }

    // ----- consume ------------------------------------------------------------------

    /// Leases up to `max` messages, long-polling up to `wait` (capped by the server).
    /// Empty when nothing turned up in time. With `partition`, only that partition is tried.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::NoSuchPartition`],
    /// [`BrokerError::Contention`], store failures.
    pub async fn consume(
        &self,
        name: &str,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
    ) -> BrokerResult<Vec<Delivery>> {
        let max = max.clamp(1, MAX_CONSUME_BATCH);
        let deadline = Instant::now() + wait.min(self.opts.max_wait);
        let waker = self.wakers.get(name);
        let mut counted = false;
        let result = loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self
                .with_topic(name, |topic| async move {
                    self.lease_once(&topic, partition, max).await
                })
                .await;
            match got {
                Ok(d) if d.is_empty() => {}
                other => break other,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Ok(Vec::new());
            }
            if !counted {
                counted = true;
                self.waiting.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tokio::time::timeout(left.min(self.opts.poll_interval), notified).await;
        };
        if counted {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }

    /// One pass over the partitions, leasing up to `max` messages.
    async fn lease_once(
        &self,
        topic: &Topic,
        partition: Option<u32>,
        max: usize,
    ) -> BrokerResult<Vec<Delivery>> {
        let n = topic.settings.partitions;
        let order: Vec<u32> = match partition {
            Some(p) if p < n => vec![p],
            Some(_) if topic.from_cache => return Err(BrokerError::StaleTopic),
            Some(p) => return Err(BrokerError::NoSuchPartition(p)),
            None => {
                let start =
                    (self.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(n)) as u32;
                (0..n).map(|i| (start + i) % n).collect()
            }
        };
        let mut out = Vec::new();
        for p in order {
            if out.len() >= max {
                break;
            }
            let (grants, dead) = match self
                .committer
                .submit(topic, p, Op::Lease(max - out.len()))
                .await?
            {
                Outcome::Leased { grants, dead } => (grants, dead),
                _ => return Err(BrokerError::Corrupt("unexpected commit outcome".into())),
            };
            for g in dead {
                self.dead_letter(topic, p, g).await;
            }
            for g in grants {
                if let Some(d) = self.deliver(topic, p, g).await? {
                    out.push(d);
                }
            }
        }
        Ok(out)
    }

    /// Moves a parked message to the topic's dead-letter topic, then settles it here.
    /// The produce is idempotent (keyed by topic incarnation, partition and offset), so a
    /// move that fails halfway is simply done again when the message is parked next time;
    /// the message is never dropped.
    async fn dead_letter(&self, topic: &Topic, partition: u32, g: Grant) {
        let moved = async {
            let Some(dlq) = topic.settings.dead_letter_topic.clone() else {
                return Err(BrokerError::Corrupt("no dead_letter_topic".into()));
            };
            if let Some(msg) = self
                .message(&topic.name, partition, &g.segment, g.offset)
                .await?
            {
                let origin = format!(
                    "{}\n{}\n{partition}\n{}",
                    topic.name, topic.incarnation, g.offset
                );
                let digest = Sha256::digest(origin.as_bytes());
                let id: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                let msg = NewMessage {
                    partition: None,
                    key: msg.key,
                    payload: Bytes::from(msg.payload),
                    idempotency_key: Some(format!("dlq-{id}")),
                };
                self.produce(&dlq, msg).await?;
            }
            let op = Op::Settle {
                offset: g.offset,
                lease_id: g.lease_id,
                action: Settle::Ack,
            };
            self.committer.submit(topic, partition, op).await?;
            Ok(())
        }
        .await;
        match moved {
            Ok(()) => {
                self.dead_lettered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(
                topic = %topic.name, partition, offset = g.offset, error = %e,
                "could not move a message to the dead-letter topic; it will be tried again"
            ),
        }
    }

    /// Reads a leased message and signs its handle. `None` if retention removed it
    /// meanwhile (the lease then lapses harmlessly).
    async fn deliver(
        &self,
        topic: &Topic,
        partition: u32,
        g: Grant,
    ) -> BrokerResult<Option<Delivery>> {
        let Some(msg) = self
            .message(&topic.name, partition, &g.segment, g.offset)
            .await?
        else {
            return Ok(None);
        };
        let claims = Claims {
            topic: topic.name.clone(),
            partition,
            offset: g.offset,
            lease_id: g.lease_id,
        };
        Ok(Some(Delivery {
            topic: topic.name.clone(),
            partition,
            offset: g.offset,
            key: msg.key,
            payload: Bytes::from(msg.payload),
            receipt_handle: Some(self.receipts.sign(&claims)),
            delivery_count: g.delivery_count,
            produced_at_ms: msg.produced_at_ms,
        }))
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
        let waker = self.wakers.get(name);
        loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let found = self
                .with_topic(name, |topic| async move {
                    self.replay_once(&topic, partition, offset).await
                })
                .await?;
            if found.is_some() {
                return Ok(found);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let _ = tokio::time::timeout(left.min(self.opts.poll_interval), notified).await;
        }
    }

    async fn replay_once(
        &self,
        topic: &Topic,
        partition: u32,
        offset: u64,
    ) -> BrokerResult<Option<Delivery>> {
        if partition >= topic.settings.partitions {
            if topic.from_cache {
                return Err(BrokerError::StaleTopic);
            }
            return Err(BrokerError::NoSuchPartition(partition));
        }
        let m = self.read_manifest(topic, partition).await?;
        if offset < m.start_offset {
            return Err(BrokerError::OffsetExpired(offset));
        }
        if offset >= m.next_offset {
            return Ok(None);
        }
        let seg = m
            .segment_for(offset)
            .ok_or(BrokerError::OffsetExpired(offset))?;
        let msg = self
            .message(&topic.name, partition, seg, offset)
            .await?
            .ok_or(BrokerError::OffsetExpired(offset))?;
        Ok(Some(Delivery {
            topic: topic.name.clone(),
            partition,
            offset,
            key: msg.key,
            payload: Bytes::from(msg.payload),
            receipt_handle: None,
            delivery_count: m.leases.get(&offset).map_or(0, |l| l.delivery_count),
            produced_at_ms: msg.produced_at_ms,
        }))
    }

    // ----- ack / extend / nack ------------------------------------------------------

    /// Acks, extends or nacks the lease a receipt handle names. The handle is verified
    /// before any storage call.
    ///
    /// Errors: [`BrokerError::Receipt`] (malformed: 400; not ours: 410),
    /// [`BrokerError::LeaseGone`] (410), [`BrokerError::AckedAheadFull`] (503),
    /// [`BrokerError::TopicNotFound`].
    pub async fn settle(&self, name: &str, handle: &str, action: Settle) -> BrokerResult<()> {
        let mut r = self
            .settle_batch(name, &[(handle.to_owned(), action)])
            .await?;
        r.pop().unwrap_or(Err(BrokerError::Contention))
    }

    /// Settles many handles at once; one result per handle, in order. Handles on one
    /// partition share a commit.
    ///
    /// Errors (whole batch): [`BrokerError::InvalidTopic`], [`BrokerError::TopicNotFound`].
    pub async fn settle_batch(
        &self,
        name: &str,
        entries: &[(String, Settle)],
    ) -> BrokerResult<Vec<BrokerResult<()>>> {
        keys::validate_topic(name)?;
        // Signatures first: a forged handle costs no storage call.
        let claims: Vec<Result<Claims, BrokerError>> = entries
            .iter()
            .map(|(h, _)| self.receipts.verify(h, name).map_err(BrokerError::from))
            .collect();
        if claims.iter().all(|c| c.is_err()) {
            return Ok(claims.into_iter().map(|c| c.map(|_| ())).collect());
        }
        let claims = Arc::new(claims);
        self.with_topic(name, |topic| {
            let claims = claims.clone();
            async move { self.settle_on(&topic, entries, &claims).await }
        })
        .await
    }

    async fn settle_on(
        &self,
        topic: &Topic,
        entries: &[(String, Settle)],
        claims: &[Result<Claims, BrokerError>],
    ) -> BrokerResult<Vec<BrokerResult<()>>> {
        let mut tasks = tokio::task::JoinSet::new();
        let mut results: Vec<Option<BrokerResult<()>>> = vec![None; entries.len()];
        for (i, (c, (_, action))) in claims.iter().zip(entries).enumerate() {
            match c {
                Err(e) => results[i] = Some(Err(e.clone())),
                Ok(c) if c.partition >= topic.settings.partitions => {
                    if topic.from_cache {
                        return Err(BrokerError::StaleTopic);
                    }
                    results[i] = Some(Err(BrokerError::LeaseGone))
                }
                Ok(c) => {
                    let (committer, topic) = (self.committer.clone(), topic.clone());
                    let op = Op::Settle {
                        offset: c.offset,
                        lease_id: c.lease_id,
                        action: *action,
                    };
                    let p = c.partition;
                    tasks.spawn(async move { (i, committer.submit(&topic, p, op).await) });
                }
            }
        }
        while let Some(joined) = tasks.join_next().await {
            let Ok((i, r)) = joined else {
                return Err(BrokerError::Contention);
            };
            if matches!(r, Err(BrokerError::StaleTopic)) {
                return Err(BrokerError::StaleTopic);
            }
            results[i] = Some(r.map(|_| ()));
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(Err(BrokerError::Contention)))
            .collect())
    }

    // ----- segments -----------------------------------------------------------------

    /// A whole segment, from the cache or the store; `None` if it is gone.
    pub(crate) async fn load_segment(
        &self,
        topic: &str,
        partition: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Segment>>> {
        let key = keys::segment(topic, partition, id);
        if let Some(s) = self.segments.get(&key) {
            return Ok(Some(s));
        }
        let Some(obj) = self.store.get(&key).await? else {
            return Ok(None);
        };
        let s = Arc::new(Segment::decode(&obj.data)?);
        self.segments.put(key, s.clone());
        Ok(Some(s))
    }

    /// The message at `offset` of segment `seg`; `None` if the segment is gone.
    async fn message(
        &self,
        topic: &str,
        partition: u32,
        seg: &SegmentRef,
        offset: u64,
    ) -> BrokerResult<Option<StoredMessage>> {
        let Some(segment) = self.load_segment(topic, partition, &seg.id).await? else {
            return Ok(None);
        };
        let idx = (offset - seg.base_offset) as usize;
        segment
            .messages
            .get(idx)
            .cloned()
            .map(Some)
            .ok_or_else(|| BrokerError::Corrupt(format!("segment {} has no message {idx}", seg.id)))
    }

    // ----- metrics ------------------------------------------------------------------

    /// Counters in the Prometheus text format: storage requests by operation and outcome,
    /// commits, operations per commit, long-poll waiters.
    pub fn metrics_text(&self) -> String {
        let c = self.metered.counts();
        let s = &self.committer.stats;
        let mut out = String::new();
        out.push_str(
            "# HELP narad_storage_requests_total Storage requests by operation and outcome.\n",
        );
        out.push_str("# TYPE narad_storage_requests_total counter\n");
        for (i, op) in OPS.iter().enumerate() {
            for (j, outcome) in OUTCOMES.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "narad_storage_requests_total{{op=\"{op}\",outcome=\"{outcome}\"}} {}",
                    c.0[i][j]
                );
            }
        }
        let commits = s.commits.load(Ordering::Relaxed);
        let ops = s.committed_ops.load(Ordering::Relaxed);
        let gauges = [
            (
                "narad_commits_total",
                "counter",
                "Manifest writes that landed.",
                commits as f64,
            ),
            (
                "narad_committed_operations_total",
                "counter",
                "Operations carried by those writes.",
                ops as f64,
            ),
            (
                "narad_commit_batches_total",
                "counter",
                "Group-commit batches processed.",
                s.batches.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_conflicts_total",
                "counter",
                "Conditional writes that lost a race (412/409).",
                c.failed_puts() as f64,
            ),
            (
                "narad_operations_per_commit",
                "gauge",
                "Average operations per landed commit.",
                if commits == 0 {
                    0.0
                } else {
                    ops as f64 / commits as f64
                },
            ),
            (
                "narad_long_poll_waiters",
                "gauge",
                "Consumers waiting in a long poll now.",
                self.waiting.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_dead_lettered_total",
                "counter",
                "Messages moved to a dead-letter topic.",
                self.dead_lettered.load(Ordering::Relaxed) as f64,
            ),
        ];
        for (name, kind, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        out
    }
}

fn not_own_dead_letter_topic(name: &str, s: &TopicSettings) -> BrokerResult<()> {
    if s.dead_letter_topic.as_deref() == Some(name) {
        return Err(InvalidSetting("dead_letter_topic must be another topic".into()).into());
    }
    Ok(())
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
