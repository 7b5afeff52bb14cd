//! Many processes on one partition: wait for a commit that lands this batch's segment
//! instead of racing it (docs/design.md §6, "Many processes on one partition").
//!
//! Classic Lambda serves one request per instance at a time, so group commit inside a
//! process has nothing to fold, and every instance races every other for the manifest.
//! Once a partition is *contended* here (a batch of this process lost a race, or found
//! other processes' segments pending, within [`CONTENDED_FOR`]), a produce-only batch
//! without idempotency keys goes this way instead:
//!
//! 1. it writes its segment under a combinable id ([`crate::partition::combine`]) above
//!    the `combined_through` it knows (one PUT, as always);
//! 2. it lists the partition's segments after `combined_through` (one LIST);
//! 3. if its segment is the oldest pending one whose writer is presumably alive (written
//!    within [`ABANDON_MS`]), or it has deferred [`MAX_DEFER`] times already, it commits:
//!    one CAS that lands every pending segment it listed, its own among them;
//! 4. otherwise it waits about as long as a commit takes and re-reads the manifest with
//!    a conditional GET: *landed*, it answers from the manifest and writes nothing;
//!    *dead* (a commit moved past it without landing it), it writes its messages again
//!    under a new id; *pending*, back to 2.
//!
//! Nobody waits for a coordinator: whoever is oldest commits, a dead writer's segment is
//! passed over after [`ABANDON_MS`] (and landed by whoever commits next), and a deferring
//! writer gives up deferring after [`MAX_DEFER`] rounds. Nothing is answered before the
//! manifest that holds it is read or written; a segment lands at most once (its id is
//! decided by `combined_through`); so a race costs at worst a failed CAS, never a
//! duplicate or a lost message.

use std::time::Duration;

use tokio::time::Instant;

use super::{lock, Committer, Queue, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::cas::{Cell, Snapshot};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::Batch;
use crate::partition::combine::{self, Combinable, Status};
use crate::partition::produce::Plan;
use crate::partition::{Manifest, SegmentRef};

/// How long a partition counts as contended after the last sign of another writer.
pub(super) const CONTENDED_FOR: Duration = Duration::from_secs(5);

/// A pending segment older than this is not waited for: its writer may be gone.
pub(super) const ABANDON_MS: u64 = 1000;

/// Rounds a writer defers to an older pending segment before it commits anyway.
pub(super) const MAX_DEFER: u32 = 3;

/// Most segments one listing (so one commit) lands.
pub(super) const MAX_LANDING: usize = 256;

/// A combining batch ready to commit: its segment, the plan it was written for, the
/// other processes' segments to land with it, and the manifest it listed against.
pub(super) struct Ready {
    pub segment: SegmentRef,
    pub plan: Plan,
    pub foreign: Vec<SegmentRef>,
    pub snap: Snapshot<Manifest>,
}

/// How a combining batch goes on.
pub(super) enum Head {
    /// Another process committed the segment at this base offset.
    Landed(u64, Snapshot<Manifest>),
    /// This process commits (see [`Ready`]).
    Commit(Ready),
    /// The ordinary path (the manifest does not exist yet), from this snapshot.
    Direct(Option<Snapshot<Manifest>>),
}

/// How long to wait for the leader's commit: about one more store round trip than the
/// listing took (the leader lists, then writes).
fn wait_for_leader(listed_in: Duration) -> Duration {
    (listed_in * 3 / 2).clamp(Duration::from_millis(1), Duration::from_secs(1))
}

impl Committer {
    /// Whether `q` counts as contended now.
    pub(super) fn contended(&self, q: &Queue) -> bool {
        lock(&q.state)
            .contended_until
            .is_some_and(|t| Instant::now() < t)
    }

    /// Records a sign of another writer on `q`.
    pub(super) fn mark_contended(&self, q: &Queue) {
        lock(&q.state).contended_until = Some(Instant::now() + CONTENDED_FOR);
    }

    /// Other processes' combinable segments still pending in `state`, listed from the
    /// store (one LIST), oldest first; none when the listing fails. Segments too old to
    /// commit safely (garbage collection may take them) are left out.
    pub(super) async fn list_combinable(
        &self,
        q: &Queue,
        state: &Manifest,
        own: Option<&str>,
    ) -> Vec<SegmentRef> {
        let prefix = keys::segments_prefix(&q.topic, q.partition);
        let Ok(keys) = self
            .store
            .list_after(&prefix, &state.combined_through, MAX_LANDING)
            .await
        else {
            return Vec::new();
        };
        let now = self.clock.now_ms();
        keys.iter()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|id| Some(*id) != own)
            .filter_map(Combinable::parse)
            .filter(|c| now.saturating_sub(c.written_ms) <= MAX_SEGMENT_AGE_AT_COMMIT_MS)
            .filter(|c| combine::status(state, &c.id) == Status::Pending)
            .map(|c| c.to_ref())
            .collect()
    }

    /// Steps 1 to 4 of the module documentation for a produce-only `batch` without
    /// idempotency keys, starting from `cache` (or a fresh read).
    ///
    /// Errors: the segment write's or the store's failure; [`BrokerError::Contention`]
    /// when the segment's fate can no longer be told (the caller answers 503).
    pub(super) async fn combine_head(
        &self,
        q: &Queue,
        batch: &Batch,
        topic_etag: &str,
        cache: Option<Snapshot<Manifest>>,
    ) -> BrokerResult<Head> {
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        let mut snap = match cache {
            Some(s) => s,
            None => cell.read::<BrokerError>().await?,
        };
        if snap.etag.is_none() {
            return Ok(Head::Direct(Some(snap)));
        }
        let plan = Plan::new(&batch.produces, &snap.value, self.clock.now_ms(), &|_| None);
        let messages = plan.new_messages(&batch.produces);
        let write = |after: String| {
            let messages = messages.clone();
            async move {
                self.write_segment(q, topic_etag, messages, false, Some(&after))
                    .await
            }
        };
        let mut segment = write(snap.value.combined_through.clone()).await?;
        for round in 0..=MAX_DEFER {
            let started = Instant::now();
            let foreign = self
                .list_combinable(q, &snap.value, Some(&segment.id))
                .await;
            let listed_in = started.elapsed();
            if !foreign.is_empty() {
                self.mark_contended(q);
            }
            let now = self.clock.now_ms();
            let leader_alive = foreign
                .iter()
                .any(|f| f.id < segment.id && now.saturating_sub(f.last_produced_ms) < ABANDON_MS);
            if round == MAX_DEFER || !leader_alive {
                return Ok(Head::Commit(Ready {
                    segment,
                    plan,
                    foreign,
                    snap,
                }));
            }
            tokio::time::sleep(wait_for_leader(listed_in)).await;
            cell.refresh::<BrokerError>(&mut snap).await?;
            match combine::status(&snap.value, &segment.id) {
                Status::Landed(base) => return Ok(Head::Landed(base, snap)),
                Status::Pending => {}
                Status::Dead => segment = write(snap.value.combined_through.clone()).await?,
                Status::Unknown => return Err(BrokerError::Contention),
            }
        }
        Err(BrokerError::Internal(
            "the combining loop ended without a decision".into(),
        ))
    }
}
