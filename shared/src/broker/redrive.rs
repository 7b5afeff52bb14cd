//! Redrive (docs/design.md §4, "Dead letters"): moves dead letters back to the topic they
//! came from, named by their `narad-source-topic` header.
//!
//! Each message is leased from the dead-letter topic like any consumer would, produced to
//! its source topic (to its source partition when that still exists) with an idempotency
//! key derived from where it sits in the dead-letter topic, then acked there. A move that
//! stops halfway leaves the message leased; it comes back after the visibility timeout and
//! the next redrive produces it again, which the source topic's dedup window answers
//! without a second copy. A message that cannot be moved (no origin header, or its source
//! topic is gone) is given back at once and counted as failed.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Broker, Delivery, NewMessage, Settle};
use crate::error::BrokerResult;
use crate::segment::Headers;

/// Most messages one redrive moves.
pub const MAX_REDRIVE: usize = 1000;

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
                for d in batch {
                    let handle = d.receipt_handle.clone().unwrap_or_default();
                    match self.move_back(dlq, d).await {
                        Ok(()) => {
                            self.settle(dlq, &handle, Settle::Ack).await?;
                            out.moved += 1;
                        }
                        Err(why) => {
                            tracing::warn!(topic = dlq, error = %why, "a dead letter was not redriven");
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

    /// Produces one dead letter to its source topic, its origin headers removed.
    async fn move_back(&self, dlq: &str, d: Delivery) -> Result<(), String> {
        let Some(source) = d.headers.get("narad-source-topic").cloned() else {
            return Err("no narad-source-topic header: not a dead letter".into());
        };
        let partition = d
            .headers
            .get("narad-source-partition")
            .and_then(|p| p.parse::<u32>().ok());
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
        let msg = NewMessage {
            partition: partition.filter(|p| *p < src.settings.partitions),
            key: d.key,
            payload: d.payload,
            idempotency_key: Some(format!("redrive-{}", &id[..48])),
            headers,
            delay_ms: 0,
        };
        self.produce(&source, msg)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}
