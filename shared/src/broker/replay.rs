//! Replay: read any retained message by partition and offset, read-only (no lease, no
//! receipt handle), long-polling for an offset not produced yet.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::runtime::Instant;
use bytes::Bytes;

use super::long_poll::Gauge;
use super::read::AtOffset;
use super::{check_partition, Broker, Delivery};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::{Layout, Located, Manifest};
use crate::topic::Topic;

impl Broker {
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
        self.long_poll(name, wait, Gauge::Uncounted, || async move {
            self.with_topic(name, |topic| async move {
                self.replay_once(&topic, partition, offset).await
            })
            .await
        })
        .await
    }

    async fn replay_once(
        &self,
        topic: &Topic,
        partition: u32,
        offset: u64,
    ) -> BrokerResult<Option<Delivery>> {
        check_partition(topic, partition)?;
        let now = self.clock.now_ms();
        let cutoff = now.saturating_sub(topic.settings.retention_ms);
        let key = topic.manifest_key(partition);
        let fresh_for = self.opts.topic_cache;
        let own = self.committer.announced_version(topic, partition);
        let kept = self
            .views
            .get(&key, (topic, own), offset, cutoff, fresh_for);
        let from_view = kept.is_some();
        let (layout, delivery_count) = match kept {
            Some(kept) => kept,
            None => self.read_layout(topic, partition, offset).await?,
        };
        if offset < layout.start_offset {
            return Err(BrokerError::OffsetExpired(offset));
        }
        if offset >= layout.next_offset {
            return Ok(None);
        }
        let read = |layout: Arc<Layout>| async move {
            let mut found = self
                .messages(&topic.name, partition, &layout, &[offset], false)
                .await?;
            // A void segment's offset never held a message; an undecided one not stored
            // yet is not there yet (a replay waiting for it looks again).
            match found.pop().unwrap_or(AtOffset::Gone) {
                AtOffset::Message(m) => Ok(Some(m)),
                AtOffset::Void => Err(BrokerError::MessageNotFound),
                AtOffset::NotYet => Ok(None),
                AtOffset::Gone => Err(BrokerError::OffsetExpired(offset)),
            }
        };
        let mut msg = read(layout).await;
        let mut delivery_count = delivery_count;
        if matches!(msg, Err(BrokerError::OffsetExpired(_))) && from_view {
            // A kept layout may name objects that compaction replaced and garbage
            // collection deleted since: only a current manifest may say "expired".
            self.views.forget(&key);
            let (layout, count) = self.read_layout(topic, partition, offset).await?;
            delivery_count = count;
            if offset < layout.start_offset {
                return Err(BrokerError::OffsetExpired(offset));
            }
            msg = read(layout).await;
        }
        let Some(msg) = msg? else {
            return Ok(None);
        };
        Ok(Some(Delivery {
            topic: topic.name.clone(),
            partition,
            offset,
            key: msg.key,
            payload: Bytes::from(msg.payload),
            receipt_handle: None,
            delivery_count,
            produced_at_ms: msg.produced_at_ms,
            headers: crate::segment::shown(msg.headers),
        }))
    }
}

impl Broker {
    /// Reads the manifest of `partition`, keeps its layout for replays, and answers it
    /// with the delivery count of `offset`.
    async fn read_layout(
        &self,
        topic: &Topic,
        partition: u32,
        offset: u64,
    ) -> BrokerResult<(Arc<Layout>, u32)> {
        let m = self.read_manifest(topic, partition).await?;
        let count = m.leases.get(&offset).map_or(0, |l| l.delivery_count);
        let key = topic.manifest_key(partition);
        Ok((self.views.remember(key, topic, &m), count))
    }
}

/// The partition layouts replays last read, so a replay needs no manifest read when it
/// can be answered from one: for a settled offset always (settled offsets stay settled,
/// segments and index objects are immutable, and retention is a matter of time), and for
/// any offset the layout covers while it is younger than `NARAD_TOPIC_CACHE_MS` (its
/// delivery count is then as of that read, the same staleness topic settings have). A
/// layout older than the newest manifest version this process's committer answered its
/// callers from ([`crate::commit::Committer::announced_version`]) is not used, so a
/// process always sees its own writes.
pub(super) struct Views(Mutex<lru::LruCache<String, View>>);

struct View {
    incarnation: String,
    /// The version of the manifest it was read from.
    version: u64,
    read_at: Instant,
    frontier: u64,
    layout: Arc<Layout>,
    /// Delivery counts of the unsettled offsets that had been delivered.
    delivered: BTreeMap<u64, u32>,
}

/// Partitions whose layout is kept for replays.
const VIEWS: usize = 1024;

impl Default for Views {
    fn default() -> Self {
        let cap = NonZeroUsize::new(VIEWS).unwrap_or(NonZeroUsize::MIN);
        Self(Mutex::new(lru::LruCache::new(cap)))
    }
}

impl Views {
    fn lock(&self) -> MutexGuard<'_, lru::LruCache<String, View>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept layout of `key` and the offset's delivery count, if the layout may
    /// answer for `offset` (see [`Views`]), is not older than `own` (the newest version
    /// this process answered its callers from), and the unit holding the offset is not
    /// older than `cutoff`.
    fn get(
        &self,
        key: &str,
        (topic, own): (&Topic, Option<u64>),
        offset: u64,
        cutoff: u64,
        fresh_for: Duration,
    ) -> Option<(Arc<Layout>, u32)> {
        let mut views = self.lock();
        let v = views.get(key)?;
        if own.is_some_and(|own| own > v.version) {
            views.pop(key);
            return None;
        }
        let recent = v.read_at.elapsed() < fresh_for && offset < v.layout.next_offset;
        if v.incarnation != topic.incarnation || !(offset < v.frontier || recent) {
            return None;
        }
        let newest = match v.layout.locate(offset)? {
            Located::Hot(s) => s.last_produced_ms,
            Located::Indexed(r) => r.last_produced_ms,
        };
        let delivered = v.delivered.get(&offset).copied().unwrap_or(0);
        (newest >= cutoff).then(|| (v.layout.clone(), delivered))
    }

    /// Forgets the layout of `key` (it named objects that are gone, or a repair rewrote
    /// the manifest).
    pub(super) fn forget(&self, key: &str) {
        self.lock().pop(key);
    }

    /// Keeps `m`'s layout for `key`.
    fn remember(&self, key: String, topic: &Topic, m: &Manifest) -> Arc<Layout> {
        let layout = Arc::new(m.layout());
        let view = View {
            incarnation: topic.incarnation.clone(),
            version: m.version,
            read_at: crate::runtime::now(),
            frontier: m.frontier,
            layout: layout.clone(),
            delivered: m
                .leases
                .iter()
                .map(|(o, l)| (*o, l.delivery_count))
                .collect(),
        };
        self.lock().put(key, view);
        layout
    }
}
