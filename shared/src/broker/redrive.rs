//! Redrive (docs/design.md §4, "Dead letters"): moves dead letters back to the topic they
//! came from, named by their `narad-source-topic` header, for the subscription they came
//! from alone (`narad-source-subscription`, or the default one without it).
//!
//! Each message is leased from the dead-letter topic like any consumer would, produced to
//! its source topic (to its source partition when that still exists) with an idempotency
//! key derived from where it sits in the dead-letter topic, then acked there. A move that
//! stops halfway leaves the message leased; it comes back after the visibility timeout and
//! the next redrive produces it again, which the source topic's dedup window answers
//! without a second copy. A message that cannot be moved (no origin header, its source
//! topic or subscription is gone) is given back at once and counted as failed.
//!
//! On a topic with named subscriptions a produced message would reach every subscription,
//! so the copy is produced delayed by [`REDRIVE_HOLD_MS`] and cancelled
//! ([`Settle::Cancel`]) for every subscription but its own before the dead letter is
//! acked. A message whose cancels fail counts as failed and is given back: a later redrive
//! within the dedup window finds the same copy and cancels it again. Should none come
//! before the hold ends, the copy reaches the other subscriptions too, once more than
//! they asked (at-least-once).

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::subscriptions::Group;
use super::{Broker, Delivery, NewMessage, Settle};
use crate::error::BrokerResult;
use crate::segment::Headers;

/// Most messages one redrive moves.
pub const MAX_REDRIVE: usize = 1000;

/// How long a redriven message is held (delayed) on a topic with named subscriptions while
/// the redrive cancels it for the subscriptions it is not for.
pub(super) const REDRIVE_HOLD_MS: u64 = 30_000;

/// Where one dead letter went back to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Moved {
    topic: String,
    partition: u32,
    offset: u64,
    /// The subscription it is for (`None`: the default one).
    subscription: Option<String>,
    /// Held for cancels elsewhere (the topic has named subscriptions).
    held: bool,
}

/// What a redrive did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Redriven {
    /// Messages moved back to their source topics.
    pub moved: u64,
    /// Messages left where they were (no origin, or the source topic is gone).
    pub failed: u64,
}

impl Broker {
    /// Moves up to `max` (at most [`MAX_REDRIVE`]) messages of `dlq` back to their source
    /// topics.
    ///
    /// Errors: [`crate::error::BrokerError::TopicNotFound`] for `dlq`, store failures.
    pub async fn redrive(&self, dlq: &str, max: usize) -> BrokerResult<Redriven> {
        let max = max.clamp(1, MAX_REDRIVE);
        let mut out = Redriven::default();
        // Messages that could not move stay leased by this call until it ends, so it does
        // not lease them again; then they are given back.
        let mut unmoved = Vec::new();
        let result = async {
            while ((out.moved + out.failed) as usize) < max {
                let want =
                    (max - (out.moved + out.failed) as usize).min(super::MAX_CONSUME_BATCH);
                let batch = self.consume(dlq, None, Duration::ZERO, want).await?;
                if batch.is_empty() {
                    break;
                }
                let mut moved = Vec::with_capacity(batch.len());
                for d in batch {
                    let handle = d.receipt_handle.clone().unwrap_or_default();
                    match self.move_back(dlq, d).await {
                        Ok(m) => moved.push((handle, m)),
                        Err(why) => {
                            tracing::warn!(topic = dlq, error = %why, "a dead letter was not redriven");
                            unmoved.push(handle);
                            out.failed += 1;
                        }
                    }
                }
                let kept = self.cancel_elsewhere(&moved).await;
                for ((handle, m), kept) in moved.into_iter().zip(kept) {
                    match kept {
                        Ok(()) => {
                            self.settle(dlq, &handle, Settle::Ack).await?;
                            out.moved += 1;
                        }
                        Err(e) => {
                            tracing::warn!(topic = dlq, source = m.topic, error = %e, "a redriven message was not cancelled for the other subscriptions");
                            unmoved.push(handle);
                            out.failed += 1;
                        }
                    }
                }
            }
            Ok::<(), crate::error::BrokerError>(())
        }
        .await;
        for handle in unmoved {
            // A nack that fails leaves the lease to lapse: the message comes back anyway.
            let _ = self.settle(dlq, &handle, Settle::Nack).await;
        }
        result.map(|()| out)
    }

    /// Settles every held message of `moved` for every subscription of its topic but its
    /// own: one settle batch per subscription and partition. One result per message.
    async fn cancel_elsewhere(&self, moved: &[(String, Moved)]) -> Vec<BrokerResult<()>> {
        let mut results: Vec<BrokerResult<()>> = moved.iter().map(|_| Ok(())).collect();
        let mut topics: Vec<&str> = moved
            .iter()
            .filter(|(_, m)| m.held)
            .map(|(_, m)| m.topic.as_str())
            .collect();
        topics.sort_unstable();
        topics.dedup();
        for name in topics {
            let topic = match self.topic(name).await {
                Ok(t) => t,
                Err(e) => {
                    for (r, (_, m)) in results.iter_mut().zip(moved) {
                        if m.held && m.topic == name {
                            *r = Err(e.clone());
                        }
                    }
                    continue;
                }
            };
            let groups = std::iter::once(Group::Default)
                .chain(topic.subscriptions.iter().map(|(n, r)| Group::Named(n, r)));
            let mut batches = Vec::new();
            for g in groups {
                for p in 0..topic.settings.partitions {
                    // Which messages this (subscription, partition) cancels: index in `moved`.
                    let mine: Vec<usize> = moved
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, m))| {
                            m.held
                                && m.topic == name
                                && m.partition == p
                                && m.subscription.as_deref() != g.name()
                        })
                        .map(|(i, _)| i)
                        .collect();
                    if !mine.is_empty() {
                        batches.push((g, p, mine));
                    }
                }
            }
            let done = futures::future::join_all(batches.iter().map(|(g, p, mine)| {
                let cancels: Vec<(u64, u64, Settle)> = mine
                    .iter()
                    .map(|&i| (moved[i].1.offset, 0, Settle::Cancel))
                    .collect();
                let topic = &topic;
                async move { self.settle_in(topic, *g, *p, &cancels).await }
            }))
            .await;
            for ((_, _, mine), got) in batches.iter().zip(done) {
                for (&i, r) in mine.iter().zip(got) {
                    if let Err(e) = r {
                        results[i] = Err(e);
                    }
                }
            }
        }
        results
    }

    /// Produces one dead letter to its source topic, its origin headers removed, held
    /// there when the topic has named subscriptions.
    async fn move_back(&self, dlq: &str, d: Delivery) -> Result<Moved, String> {
        let Some(source) = d.headers.get("narad-source-topic").cloned() else {
            return Err("no narad-source-topic header: not a dead letter".into());
        };
        let partition = d
            .headers
            .get("narad-source-partition")
            .and_then(|p| p.parse::<u32>().ok());
        let subscription = d.headers.get("narad-source-subscription").cloned();
        let dlq_topic = self.topic(dlq).await.map_err(|e| e.to_string())?;
        let origin = format!(
            "{dlq}\n{}\n{}\n{}",
            dlq_topic.incarnation, d.partition, d.offset
        );
        let id: String = Sha256::digest(origin.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let headers: Headers = d
            .headers
            .into_iter()
            .filter(|(k, _)| !k.starts_with("narad-"))
            .collect();
        let src = self.topic(&source).await.map_err(|e| e.to_string())?;
        if let Some(sub) = &subscription {
            if !src.subscriptions.contains_key(sub) {
                return Err(format!("its subscription {sub} of {source} is gone"));
            }
        }
        let held = !src.subscriptions.is_empty();
        let msg = NewMessage {
            partition: partition.filter(|p| *p < src.settings.partitions),
            key: d.key,
            payload: d.payload,
            idempotency_key: Some(format!("redrive-{}", &id[..48])),
            headers,
            delay_ms: if held { REDRIVE_HOLD_MS } else { 0 },
        };
        let at = self
            .produce(&source, msg)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Moved {
            topic: source,
            partition: at.partition,
            offset: at.offset,
            subscription,
            held,
        })
    }
}
