//! Reading messages: find an offset's segment (a hot segment of the layout, or through
//! index objects for older offsets, [`crate::objects`]), read segments once per process
//! through byte-bounded caches, several at a time, and read ahead of a consumer far behind its producers (the
//! next segments ride along a read that has to happen anyway).
//!
//! Segments and index objects are immutable, so cached copies never go stale; a message
//! whose segment is gone was removed by retention (the caller treats it as expired).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Broker;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::objects::{fetch_segment, Reader};
use crate::partition::index::{Entries, Index};
use crate::partition::{Layout, SegmentRef};
use crate::segment::{Segment, StoredMessage};

/// Segments read ahead of the last one a consume read.
pub const READ_AHEAD_SEGMENTS: usize = 8;
/// Most payload bytes one read-ahead fetches.
pub const READ_AHEAD_BYTES: u64 = 8 << 20;

impl Broker {
    /// Reads through this process's caches.
    pub(crate) fn reader(&self) -> Reader<'_> {
        Reader::new(&self.store, &self.segments, &self.indexes)
    }

    /// A whole segment, from the cache or the store; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub async fn load_segment(
        &self,
        topic: &str,
        partition: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Segment>>> {
        self.reader().segment(topic, partition, id).await
    }

    /// An index object, from the cache or the store; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub async fn load_index(
        &self,
        topic: &str,
        partition: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Index>>> {
        self.reader().index(topic, partition, id).await
    }

    /// The messages at `offsets` (each `None` if retention removed it): their segments
    /// are read at once, each once. For a consume (`read_ahead`) that has to read a
    /// segment anyway, the segments after the last one are read in the same go.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub(super) async fn messages(
        &self,
        topic: &str,
        partition: u32,
        layout: &Layout,
        offsets: &[u64],
        read_ahead: bool,
    ) -> BrokerResult<Vec<Option<StoredMessage>>> {
        let mut located = Vec::with_capacity(offsets.len());
        let mut wanted: BTreeMap<String, SegmentRef> = BTreeMap::new();
        let mut last = None;
        for &o in offsets {
            let found = self
                .reader()
                .segment_of(topic, partition, layout, o)
                .await?;
            if let Some((seg, index)) = &found {
                wanted.insert(seg.id.clone(), seg.clone());
                if last
                    .as_ref()
                    .is_none_or(|(s, _): &(SegmentRef, _)| s.base_offset < seg.base_offset)
                {
                    last = Some((seg.clone(), index.clone()));
                }
            }
            located.push(found.map(|(s, _)| s));
        }
        // Read-ahead rides along a miss: the next segments are fetched together with the
        // ones this call must read anyway, so it adds no round trip (and no task outlives
        // the request).
        let missing = wanted.values().any(|s| {
            !self
                .segments
                .contains(&keys::segment(topic, partition, &s.id))
        });
        if let Some((seg, index)) = last.filter(|_| read_ahead && missing) {
            for s in self.ahead_of(topic, partition, layout, &seg, index.as_deref()) {
                wanted.entry(s.id.clone()).or_insert(s);
            }
        }
        let loaded = self
            .fetch_all(topic, partition, wanted.into_values())
            .await?;
        located
            .into_iter()
            .zip(offsets)
            .map(|(seg, &o)| {
                let Some(seg) = seg else { return Ok(None) };
                let Some(s) = loaded.get(&seg.id) else {
                    return Ok(None);
                };
                let i = (o - seg.base_offset) as usize;
                s.messages.get(i).cloned().map(Some).ok_or_else(|| {
                    BrokerError::Corrupt(format!("segment {} has no message {i}", seg.id))
                })
            })
            .collect()
    }

    /// Reads `segments` concurrently; the ones still there, by id.
    async fn fetch_all(
        &self,
        topic: &str,
        partition: u32,
        segments: impl Iterator<Item = SegmentRef>,
    ) -> BrokerResult<BTreeMap<String, Arc<Segment>>> {
        let mut out = BTreeMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        for seg in segments {
            let key = keys::segment(topic, partition, &seg.id);
            if let Some(s) = self.segments.get(&key) {
                out.insert(seg.id, s);
                continue;
            }
            let (store, cache) = (self.store.clone(), self.segments.clone());
            tasks.spawn(async move { (seg.id, fetch_segment(&store, &cache, key).await) });
        }
        while let Some(joined) = tasks.join_next().await {
            let (id, r) =
                joined.map_err(|e| BrokerError::Internal(format!("segment read: {e}")))?;
            if let Some(s) = r? {
                out.insert(id, s);
            }
        }
        Ok(out)
    }

    /// The segments after `seg` (hot ones from `layout`, or the following entries of its
    /// level-0 `index`) that are not cached yet, within the read-ahead budget.
    fn ahead_of(
        &self,
        topic: &str,
        partition: u32,
        layout: &Layout,
        seg: &SegmentRef,
        index: Option<&Index>,
    ) -> Vec<SegmentRef> {
        let next: &[SegmentRef] = match index.map(|i| &i.entries) {
            Some(Entries::Segments(list)) => {
                let i = list.partition_point(|s| s.base_offset <= seg.base_offset);
                &list[i..(i + READ_AHEAD_SEGMENTS).min(list.len())]
            }
            _ => layout.hot_after(seg.base_offset, READ_AHEAD_SEGMENTS),
        };
        let mut budget = READ_AHEAD_BYTES;
        let mut out = Vec::new();
        for s in next {
            let key = keys::segment(topic, partition, &s.id);
            if budget < s.bytes || self.segments.contains(&key) {
                continue;
            }
            budget -= s.bytes;
            out.push(s.clone());
        }
        out
    }
}
