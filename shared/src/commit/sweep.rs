//! The partition's committer at work while its own queue is empty ([`super::role`]): one
//! listing of the pending combinable segments and intents, and one CAS that lands them
//! all, answering nobody here (their writers read the manifest). The listing is the one
//! made beside the previous commit when there is one ([`super::listing::Ahead`]), so that
//! under load a sweep is one round trip.

use std::sync::atomic::Ordering;

use super::batch::{Committed, Turn, Work};
use super::combine::Ready;
use super::replies::Replies;
use super::wait::Own;
use super::{Committer, Queue, TopicSeen};
use crate::cas::Snapshot;
use crate::partition::batch::Batch;
use crate::partition::{Manifest, Rules};
use crate::store::ETag;

impl Committer {
    /// One sweep from `cache`, under the last batch's rules and topic record. Returns the snapshot to cache and whether it landed
    /// anything.
    pub(super) async fn sweep(
        &self,
        q: &Queue,
        (rules, etag): (Rules, ETag),
        cache: Option<Snapshot<Manifest>>,
    ) -> (Option<Snapshot<Manifest>>, bool) {
        let Some(snap) = cache else {
            return (None, false);
        };
        let listed = match self.take_ahead(q, &snap.value) {
            Some(listed) => listed,
            None => self.list_combinable(q, &snap.value, None).await,
        };
        if listed.is_empty() {
            return (Some(snap), false);
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let ready = Ready {
            own: Own::default(),
            listed,
            snap: snap.clone(),
        };
        let work = Work {
            batch: Batch::new(rules),
            replies: Replies::default(),
            topic: TopicSeen { etag, fresh: false },
        };
        let committed = self.commit(
            q,
            work,
            Some(snap),
            (true, Some(ready)),
            false,
            Turn::default(),
        );
        let (cache, landed) = match committed.await {
            Committed::Done(cache, landed) => (cache, landed),
            // A combining commit never switches.
            Committed::Switched(..) => (None, 0),
        };
        if landed > 0 {
            self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
        }
        (cache, landed > 0)
    }
}
