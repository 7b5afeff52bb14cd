//! Replay: read any retained message by partition and offset, read-only (no lease, no
//! receipt handle), long-polling for an offset not produced yet.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use super::long_poll::Gauge;
use super::{check_partition, Broker, Delivery};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
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
        let key = keys::manifest(&topic.name, partition);
        let (layout, delivery_count) = match self.views.settled(&key, topic, offset, cutoff) {
            // Settled offsets stay settled, and this one is not due for retention yet.
            Some(layout) => (layout, 0),
            None => {
                let m = self.read_manifest(topic, partition).await?;
                let count = m.leases.get(&offset).map_or(0, |l| l.delivery_count);
                (self.views.remember(key, topic, &m), count)
            }
        };
        if offset < layout.start_offset {
            return Err(BrokerError::OffsetExpired(offset));
        }
        if offset >= layout.next_offset {
            return Ok(None);
        }
        let mut found = self
            .messages(&topic.name, partition, &layout, &[offset])
            .await?;
        let msg = found
            .pop()
            .flatten()
            .ok_or(BrokerError::OffsetExpired(offset))?;
        Ok(Some(Delivery {
            topic: topic.name.clone(),
            partition,
            offset,
            key: msg.key,
            payload: Bytes::from(msg.payload),
            receipt_handle: None,
            delivery_count,
            produced_at_ms: msg.produced_at_ms,
        }))
    }
}

/// The partition layouts replays last read, so a replay of a settled, retained offset
/// needs no manifest read: settled offsets stay settled, segments and index objects are
/// immutable, and retention is a matter of time.
pub(super) struct Views(Mutex<lru::LruCache<String, View>>);

struct View {
    incarnation: String,
    frontier: u64,
    layout: Arc<Layout>,
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

    /// The kept layout of `key`, if `offset` was settled in it and the unit holding it
    /// is not older than `cutoff`.
    fn settled(&self, key: &str, topic: &Topic, offset: u64, cutoff: u64) -> Option<Arc<Layout>> {
        let mut views = self.lock();
        let v = views.get(key)?;
        if v.incarnation != topic.incarnation || offset >= v.frontier {
            return None;
        }
        let newest = match v.layout.locate(offset)? {
            Located::Hot(s) => s.last_produced_ms,
            Located::Indexed(r) => r.last_produced_ms,
        };
        (newest >= cutoff).then(|| v.layout.clone())
    }

    /// Keeps `m`'s layout for `key`.
    fn remember(&self, key: String, topic: &Topic, m: &Manifest) -> Arc<Layout> {
        let layout = Arc::new(m.layout());
        let view = View {
            incarnation: topic.incarnation.clone(),
            frontier: m.frontier,
            layout: layout.clone(),
        };
        self.lock().put(key, view);
        layout
    }
}
