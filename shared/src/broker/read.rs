//! Reading messages: find an offset's segment (a hot segment of the layout, or through
//! index objects for older offsets), read segments once per process through byte-bounded
//! caches, several at a time, and read ahead of a consumer far behind its producers (the
//! next segments ride along a read that has to happen anyway).
//!
//! Segments and index objects are immutable, so cached copies never go stale; a message
//! whose segment is gone was removed by retention (the caller treats it as expired).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Broker;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::index::{Entries, Found, Index};
use crate::partition::{Layout, Located, SegmentRef};
use crate::segment::{Segment, SegmentCache, StoredMessage};
use crate::store::DynStore;

/// Segments read ahead of the last one a consume read.
pub const READ_AHEAD_SEGMENTS: usize = 8;
/// Most payload bytes one read-ahead fetches.
pub const READ_AHEAD_BYTES: u64 = 8 << 20;

/// Reads one segment through the cache; `None` if it is gone.
async fn fetch_segment(
    store: &DynStore,
    cache: &SegmentCache,
    key: String,
) -> BrokerResult<Option<Arc<Segment>>> {
    let decode = |d: &[u8]| Segment::decode(d).map_err(|e| e.to_string());
    Ok(cache.read_through(&**store, &key, decode).await?)
}

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
        fetch_segment(&self.store, &self.segments, key).await
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
        let key = keys::index(topic, partition, id);
        Ok(self
            .indexes
            .read_through(&*self.store, &key, Index::decode)
            .await?)
    }

    /// The segment holding `offset` per `layout` (through index objects for older
    /// offsets), with the level-0 index it was found in, if any; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub async fn segment_of(
        &self,
        topic: &str,
        partition: u32,
        layout: &Layout,
        offset: u64,
    ) -> BrokerResult<Option<(SegmentRef, Option<Arc<Index>>)>> {
        let mut index = match layout.locate(offset) {
            None => return Ok(None),
            Some(Located::Hot(s)) => return Ok(Some((s.clone(), None))),
            Some(Located::Indexed(r)) => r.clone(),
        };
        loop {
            let Some(loaded) = self.load_index(topic, partition, &index.id).await? else {
                return Ok(None);
            };
            match loaded.find(offset) {
                Some(Found::Segment(s)) => return Ok(Some((s.clone(), Some(loaded.clone())))),
                Some(Found::Index(r)) => index = r.clone(),
                None => {
                    return Err(BrokerError::Corrupt(format!(
                        "index {} does not cover offset {offset}",
                        index.id
                    )))
                }
            }
        }
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
            let found = self.segment_of(topic, partition, layout, o).await?;
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
