//! Message keys for per-key ordering (`"ordering": "key"`, [`crate::partition::lease`]).
//!
//! The lease pass of an ordered topic needs the key of every unsettled offset it crosses.
//! Leases record theirs; the rest come from segments, read here through the process's
//! caches: the segment holding the offset the pass stopped at and the ones after it (up to
//! [`KEY_READ_SEGMENTS`] at once, concurrently). A batch's `prepare` runs the pure batch
//! on a copy of the state, reads what it asked for, and tries again, at most
//! [`KEY_ROUNDS`] times; whatever it still does not know is not leased this time (never
//! out of order, at worst a consume that finds less).

use crate::objects::fetch_segment;
use crate::partition::index::Entries;
use crate::partition::lease::{key_hash, Keys, MAX_ORDERED_SCAN};
use crate::partition::{Layout, SegmentRef};

use super::{lock, Committer, Queue};

/// Segments read per round.
pub(super) const KEY_READ_SEGMENTS: usize = 16;

/// Rounds of reading keys per commit attempt.
pub(super) const KEY_ROUNDS: usize = 8;

impl Committer {
    /// Per-key ordering for one batch attempt: runs `wants` (the pure batch on a copy of
    /// the state, given the keys known: the offset its lease pass stopped at for want of
    /// a key) and reads what it asks for into `keys`, until it stops nowhere or
    /// [`KEY_ROUNDS`] are spent. The manifest's batches and a ledger's use it alike.
    pub(super) async fn read_keys_for(
        &self,
        at: (&str, u32),
        layout: &Layout,
        keys: &mut Keys,
        mut wants: impl FnMut(&Keys) -> Option<u64>,
    ) {
        for _ in 0..KEY_ROUNDS {
            let Some(from) = wants(keys) else { return };
            if !self.read_keys(at, layout, from, keys).await {
                return;
            }
        }
    }

    /// Adds to `keys` the key hashes of the segment holding `from` per `layout` and of up
    /// to [`KEY_READ_SEGMENTS`] - 1 segments after it. False when nothing could be added
    /// (the offset is not retained, a read failed, or `keys` is as large as a pass needs).
    async fn read_keys(
        &self,
        (topic, partition): (&str, u32),
        layout: &Layout,
        from: u64,
        keys: &mut Keys,
    ) -> bool {
        if keys.len() as u64 > 2 * MAX_ORDERED_SCAN {
            return false;
        }
        let reader = self.reader();
        let found = match reader.segment_of(topic, partition, layout, from).await {
            Ok(Some(found)) => found,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(topic, partition, error = %e,
                    "cannot read message keys for per-key ordering");
                return false;
            }
        };
        let (first, index) = found;
        let next: Vec<SegmentRef> = match index.as_deref().map(|i| &i.entries) {
            Some(Entries::Segments(list)) => {
                let i = list.partition_point(|s| s.base_offset <= first.base_offset);
                list[i..]
                    .iter()
                    .take(KEY_READ_SEGMENTS - 1)
                    .cloned()
                    .collect()
            }
            _ => layout
                .hot_after(first.base_offset, KEY_READ_SEGMENTS - 1)
                .to_vec(),
        };
        let reads = std::iter::once(first).chain(next).map(|seg| {
            let key = crate::keys::segment(topic, partition, &seg.id);
            let (store, cache) = (&self.store, &self.caches.segments);
            async move { (seg, fetch_segment(store, cache, key).await) }
        });
        let mut added = false;
        for (seg, read) in futures::future::join_all(reads).await {
            match read {
                Ok(Some(s)) => {
                    for (i, m) in s.messages.iter().enumerate() {
                        keys.insert(seg.base_offset + i as u64, key_hash(m.key.as_deref()));
                    }
                    added = true;
                }
                // Gone with retention: nothing there to order.
                Ok(None) => {
                    for i in 0..u64::from(seg.count) {
                        keys.insert(seg.base_offset + i, 0);
                    }
                    added = true;
                }
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e,
                        "cannot read message keys for per-key ordering");
                }
            }
        }
        added
    }
}

/// Keeps the message keys a batch read (facts) for the next batch and for
/// [`Committer::peek`]: those at or above `frontier`, within a lease pass's bound.
pub(super) fn keep_keys(q: &Queue, mut keys: Keys, frontier: Option<u64>) {
    if let Some(f) = frontier {
        keys.forget_below(f);
    }
    if keys.len() as u64 > 2 * MAX_ORDERED_SCAN {
        keys = Keys::default();
    }
    lock(&q.state).more.keys = keys;
}
