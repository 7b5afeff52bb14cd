//! The objects a batch writes before its commit: its segment, and (when it combines
//! with other processes) its intents. Each is written once under a unique id; if the
//! commit never lands it, it is an orphan that garbage collection removes.
//!
//! Nothing may be committed into a topic that was deleted, or deleted and created again,
//! after the producers read its record (up to one cache period before). A commit to this
//! incarnation's existing manifest needs no check for that: deleting a topic deletes its
//! manifests after its record, so such a write lands before the delete ends or not at
//! all (its conditional PUT fails), and a new incarnation's manifest refuses it
//! ([`crate::cas::Invalid::Superseded`]). Only a write that *creates* the incarnation's
//! manifest (none exists, or a deleted topic's leftover) confirms the record first
//! ([`topic_check`]): beside the segment write planned against such a state, or, for a
//! batch whose segment was planned against an existing manifest, just before its CAS
//! ([`super::batch`]). A conditional GET, 304 when unchanged; a failed check answers
//! [`BrokerError::StaleTopic`] and the broker retries against the current topic. An
//! untagged combinable segment (below fleet level 4) is checked before it is written,
//! whatever the state: once written, a process of a new topic of the same name could
//! land it.

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
    /// Writes the intent asking `ask` under `prefix` (a partition's `segments/`, or a
    /// ledger's own), its id above `after`: an empty object, written once (a write whose
    /// answer was lost is sent again, and a conflict then says the first landed).
    ///
    /// Errors: the store's.
    pub(super) async fn put_intent(
        &self,
        prefix: &str,
        after: &str,
        ask: Ask,
    ) -> BrokerResult<Intent> {
        let id = Intent::id(self.clock.now_ms(), after, &self.ids.new_id(), ask);
        let intent = Intent::parse(&id)
            .ok_or_else(|| BrokerError::Internal(format!("intent id {id} does not parse")))?;
        let key = format!("{prefix}{id}");
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

    /// Writes the batch's segment, confirming the topic record as `check` says.
    pub(super) async fn write_segment(
        &self,
        q: &Queue,
        topic: &TopicSeen,
        messages: Vec<StoredMessage>,
        combinable_after: Option<&str>,
        check: TopicCheck,
    ) -> BrokerResult<SegmentRef> {
        let last_produced_ms = messages.iter().map(|m| m.produced_at_ms).max().unwrap_or(0);
        let bytes = messages.iter().map(|m| m.payload.len() as u64).sum();
        let count = messages.len() as u32;
        let seg = Segment { messages };
        let now = self.clock.now_ms();
        let id = match combinable_after {
            Some(after) if self.tags_segments() => {
                let unique = self.ids.new_id();
                Combinable::tagged_id(now, after, &unique, (count, bytes), &q.tag)
            }
            Some(after) => Combinable::id(now, after, &self.ids.new_id(), count, bytes),
            None => keys::segment_id(now, &self.ids.new_id()),
        };
        // Written before the commit; if the commit never lands this object is an orphan.
        let key = keys::segment(&q.topic, q.partition, &id);
        let body = seg.encode(self.level.get())?;
        match check {
            TopicCheck::Read | TopicCheck::NotNeeded => {
                self.store.put_if_absent(&key, body).await?;
            }
            TopicCheck::First => {
                self.check_topic(q, &topic.etag).await?;
                self.store.put_if_absent(&key, body).await?;
            }
            TopicCheck::Beside => {
                let (checked, put) = tokio::join!(
                    self.check_topic(q, &topic.etag),
                    self.store.put_if_absent(&key, body)
                );
                checked?;
                put?;
            }
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

    /// Whether combinable segment ids carry their topic incarnation's tag (fleet level 4).
    pub(super) fn tags_segments(&self) -> bool {
        self.level.get().tags_segments()
    }

    /// How a segment write for `topic` confirms the record ([`topic_check`]).
    pub(super) fn segment_check(
        &self,
        topic: &TopicSeen,
        combinable: bool,
        creates: bool,
    ) -> TopicCheck {
        let untagged = combinable && !self.tags_segments();
        topic_check(topic.fresh, untagged, creates)
    }

    /// Confirms (a conditional GET, 304 when unchanged) that the topic record is still
    /// the incarnation this queue writes for.
    ///
    /// Errors: [`BrokerError::StaleTopic`] when it was deleted or created again.
    pub(super) async fn check_topic(&self, q: &Queue, topic_etag: &ETag) -> BrokerResult<()> {
        let settings_key = keys::topic_settings(&q.topic);
        match self.store.get_if_changed(&settings_key, topic_etag).await? {
            Fetched::Unchanged => {}
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

/// How a segment write confirms its topic record (the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TopicCheck {
    /// The request read the record itself a moment ago: a check would confirm it.
    Read,
    /// The write goes to this incarnation's existing manifest: nothing to confirm.
    NotNeeded,
    /// Beside the segment write (one round trip, not two; a failed check leaves an
    /// orphan).
    Beside,
    /// Before the segment write: an untagged combinable segment, which a process of a new
    /// topic of the same name could land once written.
    First,
}

impl TopicCheck {
    /// Whether the record is confirmed for the commit that follows (or was just read).
    pub(super) fn confirms(self) -> bool {
        self != TopicCheck::NotNeeded
    }
}

/// How a segment write confirms the topic record: `fresh` when the request read it
/// itself, `untagged` for a combinable segment without its incarnation's tag (below fleet
/// level 4), `creates` when the state it was planned against is no manifest of this
/// incarnation yet ([`crate::partition::Manifest::stored`]).
pub(super) fn topic_check(fresh: bool, untagged: bool, creates: bool) -> TopicCheck {
    match (fresh, untagged, creates) {
        (true, _, _) => TopicCheck::Read,
        (false, true, _) => TopicCheck::First,
        (false, false, true) => TopicCheck::Beside,
        (false, false, false) => TopicCheck::NotNeeded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_that_may_create_the_manifest_confirms_the_topic() {
        use TopicCheck::*;
        // An existing manifest of this incarnation: the CAS itself fails if the topic
        // was deleted meanwhile.
        assert_eq!(topic_check(false, false, false), NotNeeded);
        assert!(!NotNeeded.confirms());
        // Creating it: nothing else would notice a deleted topic.
        assert_eq!(topic_check(false, false, true), Beside);
        // Untagged combinable: checked first, whatever the state.
        assert_eq!(topic_check(false, true, false), First);
        assert_eq!(topic_check(false, true, true), First);
        // Read by the request itself.
        for (u, c) in [(false, false), (false, true), (true, false), (true, true)] {
            assert_eq!(topic_check(true, u, c), Read);
            assert!(Read.confirms());
        }
        assert!(Beside.confirms() && First.confirms());
    }
}
