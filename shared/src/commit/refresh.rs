//! The idle watch's read of a partition (`broker/watch.rs`, docs/design.md §5 "Idle
//! topics"): one conditional GET of the manifest against the copy this process holds. A
//! manifest that changed replaces that copy, so the lease a waiter then queues starts
//! from the current state and commits at the first try, with no read of its own.

use super::{lock, Committer};
use crate::cas::Cell;
use crate::error::{BrokerError, BrokerResult};
use crate::partition::Manifest;
use crate::store::ETag;
use crate::topic::Topic;

/// What [`Committer::refresh`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refreshed {
    /// The manifest is the copy this process holds: its ETag (`None`: no manifest).
    Current(Option<ETag>),
    /// It changed, and the copy this process holds is now the one read: its ETag
    /// (`None`: the manifest is gone).
    Changed(Option<ETag>),
    /// A batch of this process is committing the partition: it holds the copy, and its
    /// commit wakes this process's waiters if it makes messages available.
    Busy,
}

impl Committer {
    /// Whether `partition`'s manifest changed since the copy this process holds (one
    /// conditional GET; a plain GET when it holds none); a changed one becomes the held
    /// copy unless a batch took the copy meanwhile.
    ///
    /// Errors: the read's failure, [`BrokerError::StaleTopic`] when the manifest belongs
    /// to a newer incarnation of the topic, and [`BrokerError::Corrupt`] or
    /// [`BrokerError::UpgradeRequired`] for a manifest this build cannot read.
    pub(crate) async fn refresh(&self, topic: &Topic, partition: u32) -> BrokerResult<Refreshed> {
        let q = self.queue(topic, partition);
        let held = {
            let st = lock(&q.state);
            if st.running || !st.pending.is_empty() {
                return Ok(Refreshed::Busy);
            }
            st.held.as_ref().map(|c| c.etag.clone())
        };
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        let read = cell.read_unless::<BrokerError>(held.as_ref()).await?;
        let now = crate::runtime::now();
        let mut st = lock(&q.state);
        let Some(fresh) = read else {
            let etag = held.flatten();
            if st.held.as_ref().is_some_and(|c| c.etag == etag) {
                st.role.watched(now);
            }
            return Ok(Refreshed::Current(etag));
        };
        let etag = fresh.etag.clone();
        // Replaced only if no batch holds the copy and none left a newer one meanwhile.
        let newer = st
            .held
            .as_ref()
            .is_none_or(|c| c.value.version < fresh.value.version || c.etag.is_none());
        if !st.running && st.pending.is_empty() && newer {
            st.held = Some(fresh);
            st.role.watched(now);
        }
        Ok(Refreshed::Changed(etag))
    }
}
