//! Replay: read any retained message by partition and offset, read-only (no lease, no
//! receipt handle), long-polling for an offset not produced yet.

use std::time::Duration;

use bytes::Bytes;

use super::long_poll::Gauge;
use super::{check_partition, Broker, Delivery};
use crate::error::{BrokerError, BrokerResult};
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
}
