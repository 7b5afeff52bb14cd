//! Dead letters (docs/design.md §4): a message delivered `max_deliveries` times without an
//! ack is parked by the lease transition, then moved here: produced to the topic's
//! `dead_letter_topic` with an idempotency key derived from (topic, incarnation,
//! partition, offset), then acked under its system lease. A move that fails halfway is
//! done again the next time the message is parked; the message is never dropped.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::read::AtOffset;
use super::subscriptions::Group;
use super::{Broker, NewMessage, Settle};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::{Grant, Layout};
use crate::topic::Topic;

/// RFC 3339 with milliseconds, as the API shows times.
fn rfc3339_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

impl Broker {
    /// Moves a parked message to the dead-letter topic, then settles it here. Failures
    /// are logged; the message stays parked and is moved again later.
    pub(super) async fn dead_letter(
        &self,
        topic: &Topic,
        group: Group<'_>,
        partition: u32,
        layout: &Layout,
        g: Grant,
    ) {
        match self
            .move_dead_letter(topic, group, partition, layout, &g)
            .await
        {
            Ok(()) => {
                self.dead_lettered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(
                topic = %topic.name, partition, offset = g.offset, error = %e,
                "could not move a message to the dead-letter topic; it will be tried again"
            ),
        }
    }

    async fn move_dead_letter(
        &self,
        topic: &Topic,
        group: Group<'_>,
        partition: u32,
        layout: &Layout,
        g: &Grant,
    ) -> BrokerResult<()> {
        let Some(dlq) = group.settings(topic).dead_letter_topic else {
            return Err(BrokerError::Internal(
                "a message was parked for a topic with no dead_letter_topic".into(),
            ));
        };
        let mut found = self
            .messages(&topic.name, partition, layout, &[g.offset], false)
            .await?;
        if let Some(msg) = found.pop().and_then(AtOffset::message) {
            let mut origin = format!(
                "{}\n{}\n{partition}\n{}",
                topic.name, topic.incarnation, g.offset
            );
            // Each subscription's dead letter is its own message.
            if let Group::Named(name, rec) = group {
                origin.push_str(&format!("\n{name}\n{}", rec.id));
            }
            let digest = Sha256::digest(origin.as_bytes());
            let id: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            // Where it came from, as headers (the `narad-` names are reserved for these).
            let mut headers = crate::segment::shown(msg.headers);
            let origin = [
                ("narad-source-topic", topic.name.clone()),
                ("narad-source-partition", partition.to_string()),
                ("narad-source-offset", g.offset.to_string()),
                ("narad-delivery-count", g.delivery_count.to_string()),
                ("narad-produced-at", rfc3339_ms(msg.produced_at_ms)),
                ("narad-dead-lettered-at", rfc3339_ms(self.clock.now_ms())),
            ];
            for (k, v) in origin {
                headers.insert(k.to_owned(), v);
            }
            if let Group::Named(name, _) = group {
                headers.insert("narad-source-subscription".to_owned(), name.to_owned());
            }
            let msg = NewMessage {
                partition: None,
                key: msg.key,
                payload: Bytes::from(msg.payload),
                idempotency_key: Some(format!("dlq-{id}")),
                headers,
                delay_ms: 0,
            };
            self.produce(&dlq, msg).await?;
        }
        let ack = [(g.offset, g.lease_id, Settle::Ack)];
        let mut done = self.settle_in(topic, group, partition, &ack).await;
        done.pop().unwrap_or(Ok(()))?;
        Ok(())
    }
}
