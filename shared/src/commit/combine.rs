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
//! 2. unless this process is the partition's committer already (below), it waits about
//!    two and a half store round trips and re-reads the manifest with a conditional GET:
//!    *landed*, it answers from the manifest and writes nothing; *dead* (a commit moved
//!    past it without landing it), it writes its messages again under a new id;
//!    *pending*, it waits and reads again, for up to [`MAX_POLLS`] reads;
//! 3. when a read shows the manifest unchanged since the previous one (nobody is
//!    committing), it lists the partition's segments after `combined_through` (one LIST);
//!    if no older pending segment was written within [`ABANDON_MS`] (its writer would take
//!    over first), or after [`MAX_POLLS`] reads in any case, it commits itself: one CAS
//!    landing every pending segment listed, its own among them.
//!
//! A process that committed that way becomes the partition's *committer* for a while: when
//! its queue is empty it keeps *sweeping* (list, and if segments are pending, one CAS that
//! lands them all) until [`IDLE_SWEEPS`] listings in a row find nothing pending or
//! [`MAX_SWEEPS`] rounds have run. The other writers meanwhile see the manifest change and keep waiting, so commits
//! follow one another without racing, each landing whatever arrived meanwhile.
//!
//! Nobody waits for a coordinator: a writer takes over as soon as the manifest stops
//! changing, and a committer that dies simply stops changing it. Nothing is answered
//! before the manifest that holds it is read or written; a segment lands at most once
//! (its id is decided by `combined_through`); so a race costs at worst a failed CAS,
//! never a duplicate or a lost message.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::batch::{Replies, Work};
use super::{lock, Committer, Queue, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::cas::{Cell, Snapshot};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::Batch;
use crate::partition::combine::{self, Combinable, Status};
use crate::partition::index::{Entries, Index};
use crate::partition::produce::Plan;
use crate::partition::{Manifest, SegmentRef};
use crate::store::ETag;

/// How long a partition counts as contended after the last sign of another writer.
pub(super) const CONTENDED_FOR: Duration = Duration::from_secs(5);

/// A pending segment older than this is not deferred to: its writer may be gone.
pub(super) const ABANDON_MS: u64 = 1000;

/// Manifest reads a waiting writer makes before it commits itself.
pub(super) const MAX_POLLS: u32 = 6;

/// Consecutive sweeps a committer makes with its queue empty.
pub(super) const MAX_SWEEPS: u32 = 256;

/// Listings in a row that may find nothing pending before a committer stops sweeping:
/// with few writers the next segment is often a round trip away.
pub(super) const IDLE_SWEEPS: u32 = 3;

/// Index objects read to find a segment the manifest no longer remembers.
pub(super) const FOLDED_LOOKUP: usize = 4;

/// Most segments one listing (so one commit) lands.
pub(super) const MAX_LANDING: usize = 256;

/// A combining commit ready to go: the batch's segment and the plan it was written for
/// (none for a sweep), the other processes' segments to land with it, and the manifest it
/// listed against.
pub(crate) struct Ready {
    pub segment: Option<SegmentRef>,
    pub plan: Option<Plan>,
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
    /// The manifest turned out corrupt after this batch's segment (planned by this plan)
    /// was written: repair, then commit it (a rebuild may have taken it in already).
    Corrupt(SegmentRef, Plan),
}

/// How long to wait before reading the manifest: first two and a half store round trips
/// (measured by this writer's own PUT: a committer's next listing and CAS, and some of
/// the wait for that listing to start), then one and a half.
fn poll_after(round_trip: Duration, first: bool) -> Duration {
    let d = if first {
        round_trip * 5 / 2
    } else {
        round_trip * 3 / 2
    };
    d.clamp(Duration::from_millis(1), Duration::from_secs(1))
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

    /// Makes this process the partition's committer for a while (see the module
    /// documentation).
    pub(super) fn start_sweeping(&self, q: &Queue) {
        let mut st = lock(&q.state);
        st.sweeping = true;
        st.sweeps = 0;
        st.idle_sweeps = 0;
    }

    /// One sweep: lists the pending combinable segments and lands them in one CAS.
    /// Returns the snapshot to cache and whether anything was pending.
    pub(super) async fn sweep(
        &self,
        q: &Queue,
        cache: Option<Snapshot<Manifest>>,
    ) -> (Option<Snapshot<Manifest>>, bool) {
        let with = lock(&q.state).sweep_with.clone();
        let (Some(snap), Some((rules, topic_etag))) = (cache, with) else {
            return (None, false);
        };
        let foreign = self.list_combinable(q, &snap.value, None).await;
        if foreign.is_empty() {
            return (Some(snap), false);
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let ready = Ready {
            segment: None,
            plan: None,
            foreign,
            snap: snap.clone(),
        };
        let (cache, landed) = self
            .commit(
                q,
                Work {
                    batch: Batch::new(rules),
                    replies: Replies::default(),
                    topic_etag,
                },
                Some(snap),
                true,
                Some(ready),
            )
            .await;
        if landed > 0 {
            self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
            self.mark_contended(q);
        }
        (cache, landed > 0)
    }

    /// Steps 1 to 3 of the module documentation for a produce-only `batch` without
    /// idempotency keys, starting from `cache` (or a fresh read).
    ///
    /// Errors: the segment write's or the store's failure; [`BrokerError::Contention`]
    /// when the segment's fate can no longer be told (the caller answers 503).
    pub(super) async fn combine_head(
        &self,
        q: &Queue,
        batch: &Batch,
        topic_etag: &ETag,
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
                let started = Instant::now();
                let seg = self
                    .write_segment(q, topic_etag, messages, Some(&after))
                    .await?;
                Ok::<_, BrokerError>((seg, started.elapsed()))
            }
        };
        let (mut segment, mut round_trip) = write(snap.value.combined_through.clone()).await?;
        let committer = lock(&q.state).sweeping;
        let mut listed = None;
        let mut round = 0;
        while !committer && round < MAX_POLLS {
            tokio::time::sleep(poll_after(round_trip, round == 0)).await;
            round += 1;
            self.stats.polls.fetch_add(1, Ordering::Relaxed);
            let unchanged = match cell.refresh::<BrokerError>(&mut snap).await {
                Ok(u) => u,
                Err(e) if super::repair::damaged(&e) => return Ok(Head::Corrupt(segment, plan)),
                Err(e) => return Err(e.into()),
            };
            if !unchanged {
                self.mark_contended(q);
            }
            match self.segment_status(q, &snap.value, &segment.id).await {
                Status::Landed(base) => {
                    self.stats.landed_by_others.fetch_add(1, Ordering::Relaxed);
                    return Ok(Head::Landed(base, snap));
                }
                Status::Pending if unchanged => {
                    // Nobody committed meanwhile: the oldest pending writer takes over.
                    let foreign = self
                        .list_combinable(q, &snap.value, Some(&segment.id))
                        .await;
                    let now = self.clock.now_ms();
                    let older = foreign.iter().any(|f| {
                        f.id < segment.id && now.saturating_sub(f.last_produced_ms) < ABANDON_MS
                    });
                    if !older {
                        listed = Some(foreign);
                        break;
                    }
                }
                Status::Pending => {}
                Status::Dead => {
                    self.stats.rewritten.fetch_add(1, Ordering::Relaxed);
                    // It never lands: deleted before it is written again, so a rebuild
                    // from segments (which cannot tell a dead one from a pending one)
                    // never finds two copies of these produces.
                    let dead = keys::segment(&q.topic, q.partition, &segment.id);
                    self.store.delete(&dead).await?;
                    (segment, round_trip) = write(snap.value.combined_through.clone()).await?;
                }
                Status::Unknown => return Err(BrokerError::Contention),
            }
        }
        if !committer {
            self.stats.takeovers.fetch_add(1, Ordering::Relaxed);
        }
        let foreign = match listed {
            Some(f) => f,
            None => {
                self.list_combinable(q, &snap.value, Some(&segment.id))
                    .await
            }
        };
        if !foreign.is_empty() {
            self.mark_contended(q);
        }
        Ok(Head::Commit(Ready {
            segment: Some(segment),
            plan: Some(plan),
            foreign,
            snap,
        }))
    }
}
