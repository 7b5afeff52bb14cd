//! The broker: topics, produce, consume, ack, extend, nack and replay over any store.
//!
//! One file per operation: [`topics`] (admin and the per-process topic cache),
//! [`produce`], [`consume`] (leasing), [`replay`], [`settle`] (ack, extend, nack),
//! [`dead_letter`], [`long_poll`], [`read`] (segment reads) and [`metrics`]. Every state
//! change goes to the [`Committer`]; the broker itself keeps no state that matters
//! between requests, so any number of processes (or Lambda instances) may share one
//! store. What it keeps in memory is only an optimisation or a courtesy: a cache of
//! immutable segments, topic settings for up to `topic_cache`, the sticky cursors ([`sticky`]).
//!
//! The rules it serves (leases, receipt handles, flow control) are in
//! docs/design.md §4 and §5 and are implemented by the pure transitions of
//! [`crate::partition`].

pub(crate) mod consume;
mod dead_letter;
mod fan_out;
mod housekeeping;
mod long_poll;
mod metrics;
mod piggyback;
pub(crate) mod produce;
mod read;
mod redrive;
mod replay;
mod settle;
mod sticky;
pub(crate) mod subscriptions;
mod topic_cache;
pub(crate) mod topics;
mod watch;

use crate::cas::CasError;
use crate::dispatch::Dispatcher;
use crate::gate::Gate;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::cache::Cache;
use crate::clock::{Clock, IdSource};
use crate::commit::{Caches, Committer};
use crate::config::{BrokerOptions, Config};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::index::Index;
use crate::receipt::{self, Receipts};
use crate::segment::SegmentCache;
use crate::store::metered::MeteredStore;
use crate::store::DynStore;
use subscriptions::Group;

pub use crate::partition::settle::Settle;
pub use crate::topic::Topic;
pub use consume::{Delivery, MAX_CONSUME_BATCH, MAX_CONSUME_RESPONSE_BYTES};
pub use housekeeping::Housekeeping;
pub use piggyback::AckedConsume;
pub use produce::{NewMessage, Produced};
pub use redrive::{Redriven, MAX_REDRIVE};
pub use topics::{Created, PartitionStats};

/// The broker. Cheap to share behind an `Arc`.
pub struct Broker {
    store: DynStore,
    metered: Arc<MeteredStore>,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdSource>,
    receipts: Receipts,
    gate: Arc<Gate>,
    opts: BrokerOptions,
    committer: Arc<Committer>,
    segments: Arc<SegmentCache>,
    indexes: Arc<Cache<Index>>,
    views: replay::Views,
    topics: Arc<topic_cache::TopicCache>,
    watches: watch::Watches,
    sticky: sticky::Sticky,
    /// Whether consumes here follow on from one another, per partition (read-ahead).
    followed: read::Followed,
    /// Segments being read beside a lease's commit ([`Broker::read_beside`]).
    reading_beside: read::Beside,
    waiting: AtomicI64,
    dead_lettered: AtomicU64,
    /// Every background task this broker started.
    tasks: Arc<Dispatcher>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("store", &self.store.describe())
            .finish()
    }
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
        // A store that limits writes per key (R2) gets them spaced here, for every writer
        // of this process; the meter counts the store's own requests and durations.
        let store: DynStore = crate::store::paced::paced(metered.clone());
        let tasks = Arc::new(Dispatcher::default());
        // First: a process of a build the fleet has left behind must not start at all.
        let gate = Gate::join(store.clone(), &*ids, opts.process_ttl, &tasks).await?;
        let key = match Receipts::new(receipt_keys) {
            Some(r) => Ok(Some(r)),
            None => receipt::shared_key(&*store, &*ids)
                .await
                .map(|k| Receipts::new(vec![k])),
        };
        let receipts = match key {
            Ok(Some(r)) => r,
            Ok(None) => return Err(BrokerError::Internal("no receipt key".into())),
            // A newer build's key: this process serves nothing (every request answers
            // upgrade_required), and never writes over it. The key it holds signs nothing.
            Err(CasError::Newer { key, newer }) => {
                gate.stop(&key, newer);
                Receipts::new(vec![ids.new_id().into_bytes()])
                    .ok_or_else(|| BrokerError::Internal("no receipt key".into()))?
            }
            Err(e) => return Err(e.into()),
        };
        let caches = Caches::new(opts.segment_cache_bytes);
        let (segments, indexes) = (caches.segments.clone(), caches.indexes.clone());
        let committer = Arc::new(Committer::new(
            store.clone(),
            ids.clone(),
            clock.clone(),
            caches,
            opts.commit_linger,
            (gate.level(), tasks.clone()),
        ));
        // Seeded from the id source, so that each process draws its own rounds and a
        // seeded test replays.
        let sticky = sticky::Sticky::new(&ids.new_id());
        Ok(Self {
            store,
            metered,
            clock,
            ids,
            receipts,
            gate,
            topics: Arc::new(topic_cache::TopicCache::new(opts.topic_cache)),
            watches: watch::Watches::new(watch::Intervals {
                each: (opts.watch_active, opts.watch_idle),
                list: (opts.poll_interval, opts.idle_poll_max),
            }),
            opts,
            committer,
            segments,
            indexes,
            views: replay::Views::default(),
            sticky,
            followed: read::Followed::default(),
            reading_beside: read::Beside::default(),
            waiting: AtomicI64::new(0),
            dead_lettered: AtomicU64::new(0),
            tasks,
        })
    }

    /// Stops this broker's background work ([`crate::dispatch`]): gate renewals and topic
    /// refreshes at once; commits already queued get up to `grace` to land and answer
    /// their callers (then they are cut short: their callers get 503, the outcome
    /// unknown). Returns once no task of this broker runs. Call it after the last request
    /// was answered (`narad serve` does, after draining its connections); a request
    /// after it is answered 503.
    pub async fn stop(&self, grace: std::time::Duration) {
        self.tasks.stop(grace).await;
    }

    /// How many background tasks of this broker have not ended (0 once [`Broker::stop`]
    /// returned).
    pub fn background_tasks(&self) -> usize {
        self.tasks.running().values().sum()
    }

    /// Opens the configured store and builds a broker on it with the configured clock,
    /// receipt keys and limits: what `narad serve`, `narad gc` and the Lambda functions
    /// all do at start-up.
    ///
    /// Errors: the store's startup failure (missing bucket, no credentials, no
    /// conditional writes) as [`BrokerError::Store`].
    pub async fn from_config(cfg: &Config) -> BrokerResult<Self> {
        let store = crate::store::open_emulated(&cfg.store, cfg.emulation).await?;
        Self::new(
            store,
            cfg.clock(),
            Arc::new(crate::clock::RandomIds),
            cfg.receipt_keys.clone(),
            cfg.broker.clone(),
        )
        .await
    }

    /// The fleet level this process writes at now ([`crate::gate`]).
    pub fn fleet_level(&self) -> crate::formats::Level {
        self.gate.level().get()
    }

    /// This process's place in the fleet.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The process-level limits.
    pub fn options(&self) -> &BrokerOptions {
        &self.opts
    }

    /// The store this broker runs on, as `narad serve` prints it.
    pub fn store_description(&self) -> String {
        self.store.describe()
    }

    /// The partition of `topic`'s sticky cursor of `kind` for the next `take`
    /// operations ([`sticky`]): it stays while its partition is committing here.
    fn sticky_partition(
        &self,
        kind: sticky::Kind,
        (topic, group): (&Topic, Group<'_>),
        take: u32,
    ) -> u32 {
        let n = topic.settings.partitions;
        self.sticky
            .pick(kind, (&topic.name, group.name()), n, take, |p| {
                self.committer.busy((topic, group), p)
            })
    }

    /// Runs `f` with the topic; if the topic turned out stale (deleted and created again
    /// meanwhile), reloads it and runs `f` once more.
    async fn with_topic<T, F, Fut>(&self, name: &str, f: F) -> BrokerResult<T>
    where
        F: Fn(Topic) -> Fut,
        Fut: std::future::Future<Output = BrokerResult<T>>,
    {
        let topic = self.topic(name).await?;
        self.with_loaded_topic(name, topic, f).await
    }

    /// [`Broker::with_topic`] from a topic already loaded.
    async fn with_loaded_topic<T, F, Fut>(&self, name: &str, topic: Topic, f: F) -> BrokerResult<T>
    where
        F: Fn(Topic) -> Fut,
        Fut: std::future::Future<Output = BrokerResult<T>>,
    {
        match f(topic).await {
            Err(BrokerError::StaleTopic) => {
                self.topics.forget(name);
                let topic = self.load_topic(name).await?;
                match f(topic).await {
                    Err(BrokerError::StaleTopic) => Err(BrokerError::Contention),
                    other => other,
                }
            }
            other => other,
        }
    }
}

/// Checks that `p` is a partition of `topic`. A partition beyond cached settings is
/// reported stale (the topic may have been re-created with more partitions), so it is
/// checked again against fresh ones.
///
/// Errors: [`BrokerError::StaleTopic`], [`BrokerError::NoSuchPartition`].
fn check_partition(topic: &Topic, p: u32) -> BrokerResult<()> {
    if p < topic.settings.partitions {
        Ok(())
    } else if topic.from_cache {
        Err(BrokerError::StaleTopic)
    } else {
        Err(BrokerError::NoSuchPartition(p))
    }
}

/// The partition a key maps to: the first 8 bytes of SHA-256(key), big-endian, modulo
/// the partition count. Stable across processes and versions.
pub fn partition_for_key(key: &str, partitions: u32) -> u32 {
    let d = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(first) % u64::from(partitions.max(1))) as u32
}
