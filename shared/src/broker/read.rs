//! Reading messages: find an offset's segment (a hot segment of the layout, or through
//! index objects for older offsets, [`crate::objects`]), read segments once per process
//! through byte-bounded caches, several at a time, and read ahead of a consumer far behind its producers (the
//! next segments ride along a read that has to happen anyway) when its consumes follow on
//! from one another in this process ([`Followed`]). A lease's commit is sent together with
//! the read of the segment it will most likely get ([`Broker::read_beside`]), so that
//! delivering it takes no round trip after the commit.
//!
//! Segments and index objects are immutable, so cached copies never go stale; a message
//! whose segment is gone was removed by retention (the caller treats it as expired).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::Broker;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::objects::{fetch_segment, Reader};
use crate::partition::index::{Entries, Index};
use crate::partition::{Layout, SegmentRef};
use crate::segment::{Segment, StoredMessage};

/// What a read found at one offset ([`Broker::messages`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum AtOffset {
    /// The message.
    Message(StoredMessage),
    /// Nothing any more: retention removed it (or the layout read is older than a
    /// compaction whose replaced objects were deleted since).
    Gone,
    /// Nothing, ever: its segment was written beside its manifest write and made void
    /// ([`crate::partition::beside`]).
    Void,
    /// Nothing yet: its segment, written beside its manifest write, is undecided and not
    /// stored yet.
    NotYet,
}

impl AtOffset {
    /// The message, if there is one.
    pub(super) fn message(self) -> Option<StoredMessage> {
        match self {
            AtOffset::Message(m) => Some(m),
            _ => None,
        }
    }
}

/// Segments read ahead of the last one a consume read.
pub(super) const READ_AHEAD_SEGMENTS: usize = 8;
/// Most payload bytes one read-ahead fetches.
pub(super) const READ_AHEAD_BYTES: u64 = 8 << 20;

/// Segments read beside leases' commits at once, at most.
const MAX_READING_BESIDE: usize = 64;

/// Partitions whose last lease this process remembers at most; past this the record
/// starts again (a partition not consumed from since reads ahead once more).
const MAX_FOLLOWED: usize = 4096;

/// Whether this process's consumes of a partition follow on from one another, so that
/// reading ahead of them fetches what this process will deliver next.
///
/// A consume reads ahead only when the first offset it leased is at most one past the
/// last offset this process leased there before (or it leased nothing there before). A
/// client whose requests rotate over K processes (Lambda instances behind one endpoint)
/// sends each process every K-th message: segments read ahead there would be delivered
/// by the other processes, which read them again, so K processes read every segment
/// about K times over. Such a process reads only what it delivers.
#[derive(Debug, Default)]
pub(super) struct Followed(Mutex<HashMap<(String, u32), u64>>);

impl Followed {
    /// Records a lease of `offsets` on `(topic, partition)`; answers whether it follows on
    /// from this process's previous one there.
    pub(super) fn lease(&self, topic: &str, partition: u32, offsets: &[u64]) -> bool {
        let (Some(&lo), Some(&hi)) = (offsets.iter().min(), offsets.iter().max()) else {
            return false;
        };
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_FOLLOWED && !map.contains_key(&(topic.to_owned(), partition)) {
            map.clear();
        }
        let last = map.entry((topic.to_owned(), partition)).or_insert(hi);
        let follows = lo <= last.saturating_add(1);
        *last = (*last).max(hi);
        follows
    }
}

/// Segments this process is reading beside a lease's commit, so that the waiters of one
/// wake-up, which all guess the same segment, read it once.
#[derive(Debug, Default)]
pub(super) struct Beside(Mutex<HashSet<String>>);

impl Beside {
    /// Claims `key` for one read, unless it is claimed already or too many are: the claim
    /// ends when the returned guard drops, also when the consume is cancelled mid-read.
    fn claim(&self, key: &str) -> Option<Claim<'_>> {
        let mut reading = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if reading.len() >= MAX_READING_BESIDE || !reading.insert(key.to_owned()) {
            return None;
        }
        Some(Claim(self, key.to_owned()))
    }
}

/// One claimed read of [`Beside`].
struct Claim<'a>(&'a Beside, String);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut reading = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        reading.remove(&self.1);
    }
}

impl Broker {
    /// Reads `seg` of `topic`'s `partition` into the segment cache unless it is there or
    /// being read already; sent beside a lease's commit with the segment the lease will
    /// most likely get ([`crate::commit::Committer::likely_segment`]), so that delivering
    /// it needs no round trip after the commit. A failure is left to the delivery's own
    /// read.
    pub(super) async fn read_beside(&self, topic: &str, partition: u32, seg: Option<SegmentRef>) {
        let Some(seg) = seg else { return };
        let key = keys::segment(topic, partition, &seg.id);
        if self.segments.contains(&key) {
            return;
        }
        let Some(_claim) = self.reading_beside.claim(&key) else {
            return;
        };
        let _ = fetch_segment(&self.store, &self.segments, key).await;
    }

    /// Reads through this process's caches.
    pub(crate) fn reader(&self) -> Reader<'_> {
        Reader::new(&self.store, &self.segments, &self.indexes)
    }

    /// What is at each of `offsets` ([`AtOffset`]): their segments are read at once,
    /// each once. For a consume (`read_ahead`) that has to read a segment anyway, the
    /// segments after the last one are read in the same go.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub(super) async fn messages(
        &self,
        topic: &str,
        partition: u32,
        layout: &Layout,
        offsets: &[u64],
        read_ahead: bool,
    ) -> BrokerResult<Vec<AtOffset>> {
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
                let Some(seg) = seg else {
                    return Ok(AtOffset::Gone);
                };
                let Some(s) = loaded.get(&seg.id) else {
                    return Ok(if layout.undecided.contains(&seg.id) {
                        AtOffset::NotYet
                    } else {
                        AtOffset::Gone
                    });
                };
                if s.void {
                    return Ok(AtOffset::Void);
                }
                let i = (o - seg.base_offset) as usize;
                s.messages
                    .get(i)
                    .cloned()
                    .map(AtOffset::Message)
                    .ok_or_else(|| {
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
        let mut reads = Vec::new();
        for seg in segments {
            let key = keys::segment(topic, partition, &seg.id);
            if let Some(s) = self.segments.get(&key) {
                out.insert(seg.id, s);
                continue;
            }
            let (store, cache) = (&self.store, &self.segments);
            reads.push(async move { (seg.id, fetch_segment(store, cache, key).await) });
        }
        // Concurrent within this request's task (dropped with it): the reads wait on
        // storage, not on a CPU.
        for (id, r) in futures::future::join_all(reads).await {
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

#[cfg(test)]
mod tests {
    use super::{Beside, Followed};

    #[test]
    fn a_read_beside_is_claimed_once_and_released_when_dropped() {
        let b = Beside::default();
        let first = b.claim("k");
        assert!(first.is_some());
        assert!(b.claim("k").is_none(), "one read of a segment at a time");
        drop(first);
        assert!(
            b.claim("k").is_some(),
            "a dropped (cancelled) read frees its claim"
        );
    }

    #[test]
    fn a_lone_consumer_follows_on_and_a_rotating_one_does_not() {
        let f = Followed::default();
        // First lease: nothing to compare with, so it reads ahead.
        assert!(f.lease("t", 0, &[0]));
        assert!(f.lease("t", 0, &[1]));
        assert!(f.lease("t", 0, &[2, 3, 4]));
        // Leased out of order within one commit (another consumer of this process).
        assert!(f.lease("t", 0, &[4]));
        // A redelivery of an older message follows on too.
        assert!(f.lease("t", 0, &[1]));
        // Other processes took 5..12: this process does not read ahead.
        assert!(!f.lease("t", 0, &[13]));
        assert!(f.lease("t", 0, &[14]));
        // Partitions and topics are apart.
        assert!(f.lease("t", 1, &[100]));
        assert!(f.lease("u", 0, &[50]));
        assert!(!f.lease("t", 1, &[102]));
        // No lease, no read.
        assert!(!f.lease("t", 0, &[]));
    }

    #[test]
    fn every_kth_offset_never_reads_ahead_after_the_first() {
        let f = Followed::default();
        let reads: Vec<bool> = (0..10).map(|i| f.lease("t", 0, &[i * 8])).collect();
        assert_eq!(reads.iter().filter(|&&r| r).count(), 1);
    }

    #[test]
    fn stays_bounded() {
        let f = Followed::default();
        for p in 0..(super::MAX_FOLLOWED as u32 + 10) {
            f.lease("t", p, &[0]);
        }
        assert!(f.0.lock().unwrap().len() <= super::MAX_FOLLOWED);
    }
}
