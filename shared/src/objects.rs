//! Reading the immutable objects of a partition (segments and index objects) through
//! the process's byte-bounded caches: the one read path the broker (deliveries, replay,
//! maintenance) and the committer (message keys for per-key ordering) share.
//!
//! Segments and index objects are immutable, so a cached copy never goes stale; one that
//! is gone was removed by retention (the caller decides what that means). A stored object
//! that does not decode is [`BrokerError::Corrupt`]; one a newer build wrote is
//! [`BrokerError::UpgradeRequired`].

use std::sync::Arc;

use crate::cache::Cache;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::index::{Found, Index};
use crate::partition::{Layout, Located, SegmentRef};
use crate::segment::{Segment, SegmentCache};
use crate::store::DynStore;

/// Reads one segment through `cache`; `None` if it is gone.
///
/// Errors: store failures, [`BrokerError::Corrupt`].
pub(crate) async fn fetch_segment(
    store: &DynStore,
    cache: &SegmentCache,
    key: String,
) -> BrokerResult<Option<Arc<Segment>>> {
    Ok(cache.read_through(&**store, &key, Segment::decode).await?)
}

/// A store and the caches to read its immutable objects through.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    store: &'a DynStore,
    segments: &'a SegmentCache,
    indexes: &'a Cache<Index>,
}

impl<'a> Reader<'a> {
    /// Reads from `store` through these caches.
    pub(crate) fn new(
        store: &'a DynStore,
        segments: &'a SegmentCache,
        indexes: &'a Cache<Index>,
    ) -> Self {
        Self {
            store,
            segments,
            indexes,
        }
    }

    /// A whole segment; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub(crate) async fn segment(
        &self,
        topic: &str,
        partition: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Segment>>> {
        let key = keys::segment(topic, partition, id);
        fetch_segment(self.store, self.segments, key).await
    }

    /// An index object; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub(crate) async fn index(
        &self,
        topic: &str,
        partition: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Index>>> {
        let key = keys::index(topic, partition, id);
        Ok(self
            .indexes
            .read_through(&**self.store, &key, Index::decode)
            .await?)
    }

    /// The segment holding `offset` per `layout` (through index objects for older
    /// offsets), with the level-0 index it was found in, if any; `None` if it is gone.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub(crate) async fn segment_of(
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
            let Some(loaded) = self.index(topic, partition, &index.id).await? else {
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
}
