//! The objects a batch writes before its commit: its segment, and (when it combines
//! with other processes) its intents. Each is written once under a unique id; if the
//! commit never lands it, it is an orphan that garbage collection removes.
//!
//! With every segment write the topic record is re-checked (a conditional GET, 304 when
//! unchanged) so that nothing is committed into a topic that was deleted and created
//! again meanwhile: such produces fail with [`BrokerError::StaleTopic`] and the broker
//! retries them against the current topic. For a segment only its own batch commits the
//! check runs beside the write (it costs no round trip), except for an untagged
//! combinable one (below fleet level 4), which is checked first: once written, a process
//! of a new topic of the same name could land it. From level 4 combinable ids carry the
//! incarnation's tag and only its own commits land them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{Committer, Queue, TopicSeen};
use crate::cas::{Invalid, Stored};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::combine::Combinable;
use crate::partition::intent::{Ask, Intent};
use crate::partition::SegmentRef;
use crate::segment::{Segment, StoredMessage};
use crate::store::{ETag, Fetched, StoreError};
use crate::topic::TopicRecord;

impl Committer {
    /// Writes an intent asking `ask` above `after` (what this process knows of
    /// [`crate::partition::Manifest::ids_above`]): one PUT of an empty object, tried twice
    /// when the answer is lost (a conflict on the second try is the first one landing).
    pub(super) async fn write_intent(
        &self,
        q: &Queue,
        after: &str,
        ask: Ask,
    ) -> BrokerResult<Intent> {
        let id = Intent::id(self.clock.now_ms(), after, &self.ids.new_id(), ask);
        let key = keys::segment(&q.topic, q.partition, &id);
        let intent = Intent::parse(&id)
            .ok_or_else(|| BrokerError::Internal(format!("intent id {id} does not parse")))?;
        self.stats.intents.fetch_add(1, Ordering::Relaxed);
        match self.store.put_if_absent(&key, Bytes::new()).await {
            Ok(_) => Ok(intent),
            Err(StoreError::Unavailable(_)) => {
                match self.store.put_if_absent(&key, Bytes::new()).await {
                    Ok(_) | Err(StoreError::Conflict) => Ok(intent),
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the batch's segment, checking meanwhile that the topic is still the one the
    /// producers saw.
    pub(super) async fn write_segment(
        &self,
        q: &Queue,
        topic: &TopicSeen,
        messages: Vec<StoredMessage>,
        combinable_after: Option<&str>,
    ) -> BrokerResult<SegmentRef> {
        let last_produced_ms = messages.iter().map(|m| m.produced_at_ms).max().unwrap_or(0);
        let bytes = messages.iter().map(|m| m.payload.len() as u64).sum();
        let count = messages.len() as u32;
        let seg = Segment { messages };
        let now = self.clock.now_ms();
        let tagged = self.level.get().tags_segments();
        let id = match combinable_after {
            Some(after) if tagged => {
                let unique = self.ids.new_id();
                Combinable::tagged_id(now, after, &unique, (count, bytes), &q.tag)
            }
            Some(after) => Combinable::id(now, after, &self.ids.new_id(), count, bytes),
            None => keys::segment_id(now, &self.ids.new_id()),
        };
        // Written before the commit; if the commit never lands this object is an orphan.
        let key = keys::segment(&q.topic, q.partition, &id);
        let body = seg.encode(self.level.get())?;
        // Checked with every segment write: a process whose cached topic is up to one
        // cache period old must not commit into a topic that was deleted and created
        // again. The check runs beside the write (one round trip, not two; a failed check
        // leaves an orphan), except for an untagged combinable segment (below fleet level
        // 4): once written, a process of a new topic of the same name could land it while
        // this produce is retried there, so it is checked first. A tagged one is landed
        // only by its own incarnation's commits.
        if topic.fresh {
            // Read by the request itself a moment ago: the check would confirm it.
            self.store.put_if_absent(&key, body).await?;
        } else if combinable_after.is_some() && !tagged {
            self.check_topic(q, &topic.etag).await?;
            self.store.put_if_absent(&key, body).await?;
        } else {
            let (checked, put) = tokio::join!(
                self.check_topic(q, &topic.etag),
                self.store.put_if_absent(&key, body)
            );
            checked?;
            put?;
        }
        // Consumers in this process read it from memory.
        self.caches.segments.put(key, Arc::new(seg));
        Ok(SegmentRef {
            id,
            base_offset: 0,
            count,
            last_produced_ms,
            bytes,
        })
    }

    /// Confirms (a conditional GET, 304 when unchanged) that the topic record is still
    /// the incarnation this queue writes for.
    ///
    /// Errors: [`BrokerError::StaleTopic`] when it was deleted or created again.
    async fn check_topic(&self, q: &Queue, topic_etag: &ETag) -> BrokerResult<()> {
        let settings_key = keys::topic_settings(&q.topic);
        let sent = tokio::time::Instant::now();
        match self.store.get_if_changed(&settings_key, topic_etag).await? {
            Fetched::Unchanged => self.topic_checks.unchanged(&q.topic, topic_etag, sent),
            Fetched::Missing => return Err(BrokerError::StaleTopic),
            Fetched::Object(o) => {
                // Settings may have changed (PATCH); only a new incarnation is stale.
                let same = match Option::<TopicRecord>::decode(&o.data, &()) {
                    Ok(Some(rec)) => rec.incarnation == q.incarnation,
                    Err(Invalid::Newer(newer)) => {
                        return Err(BrokerError::UpgradeRequired {
                            object: settings_key,
                            newer,
                        })
                    }
                    Ok(None) | Err(Invalid::Corrupt(_)) | Err(Invalid::Superseded) => false,
                };
                if !same {
                    return Err(BrokerError::StaleTopic);
                }
            }
        }
        Ok(())
    }
}
