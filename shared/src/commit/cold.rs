//! A partition's first batch in this process (its queue holds no manifest from a batch
//! before it: a new process, a Lambda instance's first request, or after an error): the
//! manifest is read before the batch is taken, so that what queues during that read rides
//! in the same commit instead of waiting for it and then for a commit of its own.
//!
//! The read has to happen anyway (a commit with nothing held reads first), so the first
//! caller pays nothing for it. Behind a store that answers in 20 ms, 32 clients starting
//! together were a commit of one produce (a read, then the write: two round trips) and a
//! commit of the other 31 after it: those 31 waited three round trips, which set a 2,000
//! message run's p99 (docs/benchmarks.md).
//!
//! When this process created the topic a moment ago ([`super::Committer::created`]), the
//! manifest is probably absent and the commit would create it: the topic record is
//! confirmed beside the read, so the creation needs no confirmation before it
//! (`commit/write.rs`, [`super::write::TopicCheck::Read`]).

use std::convert::Infallible;

use futures::future::OptionFuture;

use super::{lock, Committer, Pending, Queue, TopicSeen, CREATED_RECENTLY, MAX_BATCH_BYTES};
use crate::cas::{Cell, Snapshot};
use crate::partition::Manifest;
use crate::store::ETag;

/// How a first batch's manifest was read before the batch was taken
/// ([`Committer::start_cold`]).
#[derive(Debug)]
pub(super) struct ColdStart {
    /// No operation joined the batch after the read started: the read is as fresh as a
    /// commit's own first read (a batch that writes nothing answers from it). Otherwise
    /// it is taken as a cache, confirmed before such an answer.
    fresh: bool,
    /// The topic record's ETag that was confirmed current beside the read, if one was.
    confirmed: Option<ETag>,
}

impl ColdStart {
    /// What the batch's commit makes of the read: a record confirmed beside it counts as
    /// the request's own read of `topic`. Returns whether the read is as fresh as the
    /// commit's own ([`crate::cas::Cell::update_in_read`]).
    pub(super) fn admit(self, topic: &mut TopicSeen) -> bool {
        topic.fresh |= self.confirmed.as_ref() == Some(&topic.etag);
        self.fresh
    }
}

impl Committer {
    /// For a batch of `q` that holds nothing from a batch before it (`held` is `None`)
    /// and was not taken ahead: reads the manifest (confirming the topic record beside it
    /// when this process created the topic a moment ago), then adds to `batch` what
    /// queued meanwhile, up to [`MAX_BATCH_BYTES`]. Returns the batch, what it starts from
    /// (the read) and how it was read; `None` for the last when there was nothing to do
    /// or the read failed (the commit reads again and answers that failure).
    pub(super) async fn start_cold(
        &self,
        q: &Queue,
        mut batch: Vec<Pending>,
        held: Option<Snapshot<Manifest>>,
        taken_ahead: bool,
    ) -> (Vec<Pending>, Option<Snapshot<Manifest>>, Option<ColdStart>) {
        let Some(first) = batch.first() else {
            return (batch, held, None);
        };
        let (contended, created) = {
            let st = lock(&q.state);
            let created = st.more.created;
            let contended = st.role.contended(crate::runtime::now());
            (
                contended,
                created.is_some_and(|t| t.elapsed() < CREATED_RECENTLY),
            )
        };
        if held.is_some() || taken_ahead || contended {
            return (batch, held, None);
        }
        let etag = first.topic.etag.clone();
        let confirm = (created && !first.topic.fresh).then(|| self.check_topic(q, &etag));
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        let (read, checked) =
            futures::join!(cell.read::<Infallible>(), OptionFuture::from(confirm));
        let Ok(snap) = read else {
            return (batch, None, None);
        };
        let joined = {
            let mut st = lock(&q.state);
            let bytes: usize = batch.iter().map(Pending::bytes).sum();
            let n = joining(bytes, st.pending.iter().map(Pending::bytes));
            batch.extend(st.pending.drain(..n));
            st.last_batch = batch.len();
            n
        };
        let start = ColdStart {
            fresh: joined == 0,
            confirmed: matches!(checked, Some(Ok(()))).then_some(etag),
        };
        (batch, Some(snap), Some(start))
    }
}

/// How many of the queued operations whose payload sizes are `queued` join a batch of
/// `bytes` already: in order, while the batch stays within [`MAX_BATCH_BYTES`].
fn joining(bytes: usize, queued: impl Iterator<Item = usize>) -> usize {
    let mut total = bytes;
    let mut n = 0;
    for b in queued {
        total += b;
        if total > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_queued_joins_in_order_within_the_batch_limit() {
        assert_eq!(joining(0, [].into_iter()), 0);
        assert_eq!(joining(10, [1, 2, 3].into_iter()), 3);
        let half = MAX_BATCH_BYTES / 2;
        // The third does not fit, and nothing after it joins either (order is kept).
        assert_eq!(joining(half, [half / 2, half / 2, 1, 0].into_iter()), 2);
        assert_eq!(joining(MAX_BATCH_BYTES, [1].into_iter()), 0);
        assert_eq!(joining(MAX_BATCH_BYTES, [0, 0].into_iter()), 2);
    }
}
