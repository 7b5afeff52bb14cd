//! What a partition's `segments/` prefix holds pending for a combining commit, and where
//! this process's own combinable segment stands: the reads that let a committer land
//! other processes' writes without reading them.

use super::{Committer, Queue, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::keys;
use crate::partition::combine::{self, Combinable, Status};
use crate::partition::index::{Entries, Index};
use crate::partition::intent::{self, Intent, Status as IntentStatus};
use crate::partition::{Manifest, SegmentRef};

/// Index objects read to find a segment the manifest no longer remembers.
pub(super) const FOLDED_LOOKUP: usize = 4;

/// Most segments one listing (so one commit) lands.
pub(super) const MAX_LANDING: usize = 256;

/// What a listing of the partition's `segments/` prefix found pending: other processes'
/// combinable segments and intents (this process's own among the intents), oldest first.
#[derive(Debug, Default, Clone)]
pub(crate) struct Listed {
    pub segments: Vec<SegmentRef>,
    pub intents: Vec<Intent>,
}

impl Listed {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.intents.is_empty()
    }
}

impl Committer {
    /// The combinable segments of other processes and the intents still pending in
    /// `state`, listed from the store (one LIST), oldest first; none when the listing
    /// fails. Objects too old to commit safely (garbage collection may take them), older
    /// than the topic, or tagged with another incarnation (an earlier or later topic's of
    /// the same name), are left out.
    pub(super) async fn list_combinable(
        &self,
        q: &Queue,
        state: &Manifest,
        own: Option<&str>,
    ) -> Listed {
        let prefix = keys::segments_prefix(&q.topic, q.partition);
        let Ok(keys) = self
            .store
            .list_after(&prefix, &state.combined_through, MAX_LANDING)
            .await
        else {
            return Listed::default();
        };
        let now = self.clock.now_ms();
        let fresh = |written: u64| {
            now.saturating_sub(written) <= MAX_SEGMENT_AGE_AT_COMMIT_MS
                && written >= q.created_at_ms
        };
        let mut listed = Listed::default();
        for id in keys.iter().filter_map(|k| k.strip_prefix(&prefix)) {
            if Some(id) == own {
                continue;
            }
            if let Some(c) = Combinable::parse(id) {
                if fresh(c.written_ms)
                    && c.belongs_to(&q.tag)
                    && combine::status(state, &c.id) == Status::Pending
                {
                    listed.segments.push(c.to_ref());
                }
            } else if let Some(i) = Intent::parse(id) {
                if fresh(i.written_ms) && intent::status(state, &i.id) == IntentStatus::Pending {
                    listed.intents.push(i);
                }
            }
        }
        listed
    }

    /// The fate of this process's combinable segment `id` in `state`: as
    /// [`combine::status`], except that a segment the manifest no longer remembers is
    /// looked for in the newest index objects (it may have been landed by another process
    /// and folded since), reading at most [`FOLDED_LOOKUP`] of them.
    pub(super) async fn segment_status(&self, q: &Queue, state: &Manifest, id: &str) -> Status {
        let status = combine::status(state, id);
        if status != Status::Unknown {
            return status;
        }
        let mut refs: Vec<_> = state
            .indexes
            .iter()
            .rev()
            .take(FOLDED_LOOKUP)
            .cloned()
            .collect();
        let mut read = 0;
        while let Some(r) = refs.first().cloned() {
            refs.remove(0);
            if read == FOLDED_LOOKUP {
                break;
            }
            read += 1;
            let key = keys::index(&q.topic, q.partition, &r.id);
            let loaded = self
                .caches
                .indexes
                .read_through(&*self.store, &key, Index::decode)
                .await;
            match loaded.ok().flatten().as_deref().map(|i| &i.entries) {
                Some(Entries::Segments(segs)) => {
                    if let Some(s) = segs.iter().find(|s| s.id == id) {
                        return Status::Landed(s.base_offset);
                    }
                }
                // A higher level: its newest children come next.
                Some(Entries::Indexes(children)) => {
                    refs.splice(0..0, children.iter().rev().take(2).cloned());
                }
                None => {}
            }
        }
        Status::Unknown
    }
}
