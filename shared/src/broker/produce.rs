//! Produce: route each message to a partition and hand each partition's messages to the
//! committer as one operation (docs/design.md §6).
//!
//! The partition is the message's `partition` if given, else the one its key hashes to
//! ([`super::partition_for_key`]), else the one its idempotency key hashes to (so
//! retries reach the same partition), else the partition of this process's sticky
//! cursor ([`super::sticky`]): every such message of one request goes there, and so do
//! other requests' while it is committing. Messages for one partition commit together, in
//! order, with contiguous offsets.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use super::fan_out::Slots;
use super::sticky::Kind;
use super::subscriptions::Group;
use super::{check_partition, partition_for_key, Broker};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::produce::NewStored;
use crate::segment::{Headers, StoredMessage, IDEMPOTENCY_HEADER};
use crate::topic::Topic;

/// A message to produce.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Target partition; with `None`, by key hash, else the sticky cursor's.
    pub partition: Option<u32>,
    /// The message key.
    pub key: Option<String>,
    /// Raw payload.
    pub payload: Bytes,
    /// `Idempotency-Key`: a retry within the topic's dedup window appends nothing and
    /// answers the first produce's partition and offset. Without `partition` or `key`
    /// it also picks the partition (by hash), so retries reach the same partition.
    pub idempotency_key: Option<String>,
    /// Headers, returned on consume and replay.
    pub headers: Headers,
    /// Not delivered before this many ms from its commit (0: at once).
    pub delay_ms: u64,
}

/// Where a produced message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Produced {
    /// Partition.
    pub partition: u32,
    /// Offset within the partition.
    pub offset: u64,
}

/// The headers `m` is stored with: its own, plus its idempotency key as
/// [`IDEMPOTENCY_HEADER`] (which a rebuilt partition reads back, docs/design.md §7).
fn stored_headers(m: &NewMessage) -> Headers {
    let mut headers = m.headers.clone();
    if let Some(k) = &m.idempotency_key {
        headers.insert(IDEMPOTENCY_HEADER.to_owned(), k.clone());
    }
    headers
}

/// One result per message of a batch, in order.
type Results = Vec<BrokerResult<Produced>>;

impl Broker {
    /// Appends one message and answers once the manifest write that makes it visible
    /// has committed.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::NoSuchPartition`],
    /// [`BrokerError::PayloadTooLarge`], [`BrokerError::Contention`], store failures.
    pub async fn produce(&self, name: &str, msg: NewMessage) -> BrokerResult<Produced> {
        let mut r = self.produce_batch(name, vec![msg]).await?;
        r.pop()
            .unwrap_or_else(|| Err(BrokerError::Internal("a produce got no result".into())))
    }

    /// Appends many messages; one result per message, in order.
    ///
    /// Errors (whole batch): [`BrokerError::TopicNotFound`]. Per message: as
    /// [`Broker::produce`].
    pub async fn produce_batch(
        &self,
        name: &str,
        messages: Vec<NewMessage>,
    ) -> BrokerResult<Results> {
        let messages = Arc::new(messages);
        let topic = self.topic(name).await?;
        self.with_loaded_topic(name, topic, |topic| {
            let messages = messages.clone();
            async move { self.produce_on(&topic, &messages).await }
        })
        .await
    }

    /// The partition of each message (by index), or its refusal in `results`.
    fn route(
        &self,
        topic: &Topic,
        messages: &[NewMessage],
        results: &mut Slots<Produced>,
    ) -> BrokerResult<BTreeMap<u32, Vec<usize>>> {
        let n = topic.settings.partitions;
        let loose = messages
            .iter()
            .filter(|m| m.partition.is_none() && m.key.is_none() && m.idempotency_key.is_none())
            .count();
        let sticky = (loose > 0).then(|| {
            let take = u32::try_from(loose).unwrap_or(u32::MAX);
            self.sticky_partition(Kind::Produce, (topic, Group::Default), take)
        });
        let mut by_partition: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, m) in messages.iter().enumerate() {
            let max = self.opts.max_message_bytes;
            let p = if m.payload.len() > max {
                Err(BrokerError::PayloadTooLarge(max))
            } else if let Some(p) = m.partition {
                check_partition(topic, p).map(|()| p)
            } else if let Some(k) = m.key.as_ref().or(m.idempotency_key.as_ref()) {
                Ok(partition_for_key(k, n))
            } else {
                Ok(sticky.unwrap_or(0))
            };
            match p {
                Ok(p) => by_partition.entry(p).or_default().push(i),
                // Cached settings may predate a re-creation: the batch is checked again.
                Err(BrokerError::StaleTopic) => return Err(BrokerError::StaleTopic),
                Err(e) => results.set(i, Err(e)),
            }
        }
        Ok(by_partition)
    }

    async fn produce_on(&self, topic: &Topic, messages: &[NewMessage]) -> BrokerResult<Results> {
        let now = self.clock.now_ms();
        let mut results = Slots::new(messages.len());
        let by_partition = self.route(topic, messages, &mut results)?;
        let submit = |p: u32, idx: &[usize]| {
            let stored: Vec<NewStored> = idx
                .iter()
                .map(|&i| NewStored {
                    message: StoredMessage::new(
                        now,
                        messages[i].key.clone(),
                        messages[i].payload.to_vec(),
                    )
                    .with_headers(stored_headers(&messages[i])),
                    idempotency_key: messages[i].idempotency_key.clone(),
                    delay_ms: messages[i].delay_ms,
                })
                .collect();
            let n = idx.len();
            async move {
                match self.committer.produce(topic, p, stored).await {
                    Ok(offsets) => offsets
                        .into_iter()
                        .map(|offset| {
                            tracing::debug!(partition = p, offset, "produced");
                            Ok(Produced {
                                partition: p,
                                offset,
                            })
                        })
                        .collect(),
                    Err(e) => vec![Err(e); n],
                }
            }
        };
        results.fan_out(by_partition, submit).await;
        // Nothing of a stale batch was committed; the caller retries it whole.
        if results.any_err(|e| matches!(e, BrokerError::StaleTopic)) && !results.any_ok() {
            return Err(BrokerError::StaleTopic);
        }
        Ok(results.finish("a message"))
    }
}
