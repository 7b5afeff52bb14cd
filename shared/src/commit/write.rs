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
use crate::dispatch::Kind;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::objects::fetch_segment;
use crate::partition::beside::{self, Found, Resolution};
use crate::partition::combine::Combinable;
use crate::partition::intent::{Ask, Intent};
use crate::partition::{Manifest, SegmentRef};
use crate::runtime::JoinHandle;
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
        let seg = Segment::new(messages);
        let (count, bytes) = (
            seg.messages.len() as u32,
            seg.messages.iter().map(|m| m.payload.len() as u64).sum(),
        );
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
        let seg_ref = SegmentRef::of(id, &seg);
        // Consumers in this process read it from memory.
        self.caches.segments.put(key, Arc::new(seg));
        Ok(seg_ref)
    }

    /// Starts writing the segment of `messages` beside the manifest write that will name
    /// it undecided ([`crate::partition::beside`], fleet level 7): the PUT runs as a task
    /// of its own while the commit goes on, and [`Committer::landed_beside`] waits for it
    /// before anyone is answered. When the broker is stopping the PUT runs here, before the
    /// manifest write, as an ordinary segment's does.
    ///
    /// Errors: [`BrokerError::Internal`] when the segment does not encode (a bug).
    pub(super) async fn write_beside(
        &self,
        q: &Queue,
        messages: Vec<StoredMessage>,
    ) -> BrokerResult<(SegmentRef, BesideWrite)> {
        let seg = Segment::new(messages);
        let id = keys::segment_id(self.clock.now_ms(), &self.ids.new_id());
        let seg_ref = SegmentRef::of(id, &seg);
        let key = keys::segment(&q.topic, q.partition, &seg_ref.id);
        let body = seg.encode(self.level.get())?;
        let (store, k) = (self.store.clone(), key.clone());
        let put = async move { store.put_if_absent(&k, body).await.map(|_| ()) };
        let put = match self.tasks.spawn(Kind::Chore, put) {
            Ok(running) => Put::Running(running),
            Err(put) => Put::Done(put.await),
        };
        let write = BesideWrite {
            key,
            segment: Arc::new(seg),
            put,
        };
        Ok((seg_ref, write))
    }

    /// Waits for the PUT of a segment written beside its manifest write and tells its
    /// fate. A failed PUT is resolved by what is at the key: the segment (it landed all
    /// the same), a void marker (someone gave up on it), or nothing, in which case this
    /// writer gives up on it itself and writes the marker `If-None-Match: *` (a conflict
    /// means the segment beat it). A stored segment is cached for consumers here.
    pub(super) async fn landed_beside(&self, write: BesideWrite) -> BesideFate {
        let BesideWrite { key, segment, put } = write;
        let put = match put {
            Put::Running(h) => h.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the segment write's task ended".into(),
                ))
            }),
            Put::Done(r) => r,
        };
        let fate = match put {
            Ok(()) => BesideFate::Stored,
            Err(e) => self.resolve_beside(&key, e).await,
        };
        if matches!(fate, BesideFate::Stored) {
            self.caches.segments.put(key, segment);
        }
        fate
    }

    /// The fate of the segment at `key`, whose PUT failed with `failed`: its writer
    /// gives up on it unless it is there.
    async fn resolve_beside(&self, key: &str, failed: StoreError) -> BesideFate {
        tracing::warn!(%key, error = %failed, "a segment written beside its manifest write failed: resolving by what is at its key");
        match self.decide_at(key, 0, true).await {
            Ok(Some(Decided::Stored)) => BesideFate::Stored,
            Ok(Some(Decided::Void)) => BesideFate::Void,
            Ok(None) => BesideFate::Unknown(BrokerError::Internal(format!(
                "the writer of segment {key} did not give up on it"
            ))),
            Err(e) => BesideFate::Unknown(e),
        }
    }

    /// Looks at the undecided segments of `state` that `known` does not decide (at most
    /// [`LOOK_AT_MOST`], the oldest first), at once: the ids whose fate it found. One
    /// older than [`beside::DECIDE_AFTER_MS`] with nothing at its key is made void. A
    /// failed read leaves its segment undecided.
    pub(super) async fn look_beside(
        &self,
        (topic, partition): (&str, u32),
        state: &Manifest,
        known: &[String],
    ) -> Vec<String> {
        let looks = state
            .beside
            .iter()
            .filter(|id| !known.contains(id))
            .take(LOOK_AT_MOST)
            .map(|id| async move {
                let key = keys::segment(topic, partition, id);
                let written = keys::segment_time(id).unwrap_or(0);
                match self.decide_at(&key, written, false).await {
                    Ok(Some(_)) => Some(id.clone()),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::debug!(%key, error = %e, "an undecided segment could not be read");
                        None
                    }
                }
            });
        futures::future::join_all(looks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// What decides the segment at `key` (written at `written_ms`), read through the
    /// segment cache: the segment or a void marker; nothing, while it may still be on its
    /// way. With nothing there and `give_up` (its writer, whose PUT failed) or once
    /// [`beside::resolve`] says so, the void marker is written `If-None-Match: *` and the
    /// key read again (the segment may have beaten it).
    ///
    /// Errors: the store's, and [`BrokerError::OutcomeUnknown`] when every try conflicted.
    async fn decide_at(
        &self,
        key: &str,
        written_ms: u64,
        give_up: bool,
    ) -> BrokerResult<Option<Decided>> {
        let marker = Segment::void_marker().encode(self.level.get())?;
        for _ in 0..3 {
            let found =
                match fetch_segment(&self.store, &self.caches.segments, key.to_owned()).await? {
                    Some(s) if s.void => Found::Void,
                    Some(_) => Found::Segment,
                    None => Found::Nothing,
                };
            let now = self.clock.now_ms();
            let resolution = match (found, give_up) {
                (Found::Nothing, true) => Resolution::MakeVoid,
                _ => beside::resolve(found, written_ms, now),
            };
            match resolution {
                Resolution::Stored => return Ok(Some(Decided::Stored)),
                Resolution::Void => return Ok(Some(Decided::Void)),
                Resolution::Wait => return Ok(None),
                Resolution::MakeVoid => match self.store.put_if_absent(key, marker.clone()).await {
                    Ok(_) => return Ok(Some(Decided::Void)),
                    // The segment (or a marker) beat it: read what it is.
                    Err(StoreError::Conflict) => {}
                    Err(e) => return Err(e.into()),
                },
            }
        }
        Err(BrokerError::OutcomeUnknown(format!(
            "the fate of segment {key} could not be read"
        )))
    }

    /// Whether segments may be written beside the manifest write (fleet level 7).
    pub(super) fn writes_beside(&self) -> bool {
        self.level.get().writes_beside()
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

/// A segment being written beside its manifest write ([`Committer::write_beside`]).
pub(super) struct BesideWrite {
    key: String,
    segment: Arc<Segment>,
    put: Put,
}

impl std::fmt::Debug for BesideWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BesideWrite")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Undecided segments a lease commit looks at, at most.
const LOOK_AT_MOST: usize = 8;

/// A decided segment's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decided {
    Stored,
    Void,
}

/// The PUT of a [`BesideWrite`]: running as a task, or done already.
enum Put {
    Running(JoinHandle<Result<(), StoreError>>),
    Done(Result<(), StoreError>),
}

/// What became of a segment written beside its manifest write.
#[derive(Debug, Clone)]
pub(super) enum BesideFate {
    /// Stored: its messages are there, and its producers may be answered.
    Stored,
    /// A void marker is at its key: nothing was stored, and nothing will be.
    Void,
    /// Neither could be told (the store failed): the segment stays undecided for readers
    /// to decide, and its producers hear that the outcome is unknown.
    Unknown(BrokerError),
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
