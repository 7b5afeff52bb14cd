//! Reading messages out of segments, through this process's cache of decoded segments
//! (segments are immutable, so a cached copy never goes stale).

use std::sync::Arc;

use super::Broker;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::SegmentRef;
use crate::segment::{Segment, StoredMessage};

impl Broker {
    /// A whole segment, from the cache or the store; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub async fn load_segment(
        &self,
        topic: &str,
        partition: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Segment>>> {
        let key = keys::segment(topic, partition, id);
        if let Some(s) = self.segments.get(&key) {
            return Ok(Some(s));
        }
        let Some(obj) = self.store.get(&key).await? else {
            return Ok(None);
        };
        let s = Arc::new(Segment::decode(&obj.data)?);
        self.segments.put(key, s.clone());
        Ok(Some(s))
    }

    /// The message at `offset` of segment `seg`; `None` if the segment is gone.
    pub(super) async fn message(
        &self,
        topic: &str,
        partition: u32,
        seg: &SegmentRef,
        offset: u64,
    ) -> BrokerResult<Option<StoredMessage>> {
        let Some(segment) = self.load_segment(topic, partition, &seg.id).await? else {
            return Ok(None);
        };
        let idx = (offset - seg.base_offset) as usize;
        segment
            .messages
            .get(idx)
            .cloned()
            .map(Some)
            .ok_or_else(|| BrokerError::Corrupt(format!("segment {} has no message {idx}", seg.id)))
    }
}
