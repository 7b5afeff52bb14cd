//! Consume: lease up to `max` messages, long-polling for them (docs/design.md §4, §5).
//!
//! One pass tries the partitions in round-robin order from a rotating start (or only the
//! one asked for), asking each partition's committer for the leases still wanted. A
//! lease's message is read (from the segment cache when this process wrote or read it)
//! and its receipt handle signed over (topic, partition, offset, lease id). Messages
//! parked for dead-lettering go to [`Broker::dead_letter`] instead of the consumer.

use std::time::Duration;

use bytes::Bytes;

use super::long_poll::Gauge;
use super::{check_partition, Broker};
use crate::error::BrokerResult;
use crate::partition::{Grant, Layout};
use crate::receipt::Claims;
use crate::topic::Topic;

/// Most messages one consume may return.
pub const MAX_CONSUME_BATCH: usize = 100;

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

impl Broker {
    /// Leases up to `max` messages, long-polling up to `wait` (capped by the server).
    /// Empty when nothing turned up in time. With `partition`, only that partition is tried.
    ///
    /// Errors: [`crate::error::BrokerError::TopicNotFound`],
    /// [`crate::error::BrokerError::NoSuchPartition`],
    /// [`crate::error::BrokerError::Contention`], store failures.
    pub async fn consume(
        &self,
        name: &str,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
    ) -> BrokerResult<Vec<Delivery>> {
        let max = max.clamp(1, MAX_CONSUME_BATCH);
        let found = self
            .long_poll(name, wait, Gauge::Counted, || async move {
                let got = self
                    .with_topic(name, |topic| async move {
                        self.lease_once(&topic, partition, max).await
                    })
                    .await?;
                Ok((!got.is_empty()).then_some(got))
            })
            .await?;
        Ok(found.unwrap_or_default())
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
            Some(p) => {
                check_partition(topic, p)?;
                vec![p]
            }
            None => {
                let start = self.next_round_robin(n);
                (0..n).map(|i| (start + i) % n).collect()
            }
        };
        let mut out = Vec::new();
        for p in order {
            if out.len() >= max {
                break;
            }
            let answer = self.committer.lease(topic, p, max - out.len()).await?;
            self.changed(topic, p);
            for g in answer.leased.dead {
                self.dead_letter(topic, p, &answer.layout, g).await;
            }
            let grants = answer.leased.grants;
            out.extend(self.deliver(topic, p, &answer.layout, grants).await?);
        }
        Ok(out)
    }

    /// Reads the leased messages and signs their handles. A message retention removed
    /// meanwhile is left out (its lease then lapses harmlessly).
    async fn deliver(
        &self,
        topic: &Topic,
        partition: u32,
        layout: &Layout,
        grants: Vec<Grant>,
    ) -> BrokerResult<Vec<Delivery>> {
        let offsets: Vec<u64> = grants.iter().map(|g| g.offset).collect();
        let messages = self
            .messages(&topic.name, partition, layout, &offsets, true)
            .await?;
        let mut out = Vec::with_capacity(grants.len());
        for (g, msg) in grants.into_iter().zip(messages) {
            let Some(msg) = msg else { continue };
            let claims = Claims {
                topic: topic.name.clone(),
                incarnation: crate::receipt::incarnation_tag(&topic.incarnation),
                partition,
                offset: g.offset,
                lease_id: g.lease_id,
            };
            out.push(Delivery {
                topic: topic.name.clone(),
                partition,
                offset: g.offset,
                key: msg.key,
                payload: Bytes::from(msg.payload),
                receipt_handle: Some(self.receipts.sign(&claims)),
                delivery_count: g.delivery_count,
                produced_at_ms: msg.produced_at_ms,
            });
        }
        Ok(out)
    }
}
