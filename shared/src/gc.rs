//! Garbage collection and maintenance: `narad gc`, and the scheduled maintenance function.
//!
//! One pass over the store:
//!
//! 1. **Retention** for every partition, even idle ones: a commit that only applies
//!    retention (segments whose newest message is older than `retention_ms` leave the
//!    manifest, and their objects are deleted).
//! 2. **Orphan segments**: a segment object that no manifest names is deleted once it is
//!    older than the grace period. Orphans come from commits that never landed (a crash,
//!    a lost race that gave up, an ambiguous error) and from deletes that failed. The
//!    age comes from the write time in the segment id ([`crate::keys::segment_id`]); a
//!    segment is never committed more than
//!    [`crate::commit::MAX_SEGMENT_AGE_AT_COMMIT_MS`] after it was written, and the grace
//!    period ([`DEFAULT_GRACE`], 30 min) is longer than that and longer than any handler
//!    can live (15 min on Lambda), so a segment whose commit is still coming is never taken.
//! 3. **Leftovers** of deleted topics (objects under a topic prefix with no `topic.json`)
//!    are deleted.
//! 4. **Compaction**: a partition with more than [`COMPACT_ABOVE_SEGMENTS`] segments has
//!    runs of adjacent small segments rewritten as one (up to [`COMPACT_MAX_BYTES`] and
//!    [`COMPACT_MAX_MESSAGES`] each), so the manifest that every commit reads and writes
//!    stays small even behind single-message producers. The merged segment is written
//!    first, then one conditional manifest write swaps it in for exactly the segments it
//!    copied (a run that changed meanwhile is left alone). The replaced segments are
//!    then unreferenced and older than the grace period, so the next pass deletes them;
//!    a reader holding an older manifest can still read them until then.
//!
//! The pass lists the store once, then reads each manifest after the listing, so a
//! segment committed meanwhile is either not listed or referenced.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::commit::Op;
use crate::engine::{Broker, BrokerError, BrokerResult, Topic};
use crate::keys;
use crate::manifest::{self, Decision, SegmentRef};
use crate::segment::Segment;

/// Partitions with more segments than this are compacted.
pub const COMPACT_ABOVE_SEGMENTS: usize = 16;
/// Largest merged segment, in payload bytes.
pub const COMPACT_MAX_BYTES: u64 = 4 << 20;
/// Most messages in a merged segment.
pub const COMPACT_MAX_MESSAGES: u32 = 10_000;

/// How old an unreferenced segment must be before it is deleted.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30 * 60);

/// What one pass did.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct GcReport {
    /// Topics visited.
    pub topics: u64,
    /// Partitions visited.
    pub partitions: u64,
    /// Segments that left their manifest by retention (and were deleted).
    pub expired_segments: u64,
    /// Unreferenced segments older than the grace period, deleted.
    pub orphans_deleted: u64,
    /// Unreferenced segments younger than the grace period, kept.
    pub orphans_kept: u64,
    /// Objects of deleted topics, deleted.
    pub leftovers_deleted: u64,
    /// Segments replaced by merged ones (deleted by a later pass).
    pub segments_compacted: u64,
}

impl Broker {
    /// Runs one garbage-collection pass (see the module documentation). With `dry_run`
    /// nothing is deleted or committed; the report says what would have been.
    ///
    /// Errors: store failures; a pass can be re-run at any time.
    pub async fn gc(&self, grace: Duration, dry_run: bool) -> BrokerResult<GcReport> {
        let mut report = GcReport::default();
        let keys = self.store.list(keys::TOPICS_PREFIX).await?;
        let mut by_topic: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for k in &keys {
            if let Some(rest) = k.strip_prefix(keys::TOPICS_PREFIX) {
                if let Some((topic, _)) = rest.split_once('/') {
                    by_topic.entry(topic).or_default().push(k.as_str());
                }
            }
        }
        for (name, objects) in by_topic {
            let topic = match self.load_topic(name).await {
                Ok(t) => t,
                Err(BrokerError::TopicNotFound) | Err(BrokerError::InvalidTopic(_)) => {
                    for k in objects {
                        if !dry_run {
                            self.store.delete(k).await?;
                        }
                        report.leftovers_deleted += 1;
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            report.topics += 1;
            for p in 0..topic.settings.partitions {
                report.partitions += 1;
                let before = self.read_manifest(&topic, p).await?;
                if !dry_run {
                    // A commit that only applies retention.
                    self.committer.submit(&topic, p, Op::Lease(0)).await?;
                }
                let after = self.read_manifest(&topic, p).await?;
                let cutoff = self
                    .clock
                    .now_ms()
                    .saturating_sub(topic.settings.retention_ms);
                report.expired_segments += if dry_run {
                    before
                        .segments
                        .iter()
                        .take_while(|s| s.last_produced_ms < cutoff)
                        .count() as u64
                } else {
                    before.segments.len().saturating_sub(after.segments.len()) as u64
                };
                let named: HashSet<&str> = after.segments.iter().map(|s| s.id.as_str()).collect();
                let prefix = keys::segment(name, p, "");
                let now = self.clock.now_ms();
                for k in objects.iter().filter(|k| k.starts_with(&prefix)) {
                    let id = &k[prefix.len()..];
                    if named.contains(id) {
                        continue;
                    }
                    // Ids without a time (written by something else) are left alone.
                    let Some(written) = keys::segment_time(id) else {
                        continue;
                    };
                    if now.saturating_sub(written) > grace.as_millis() as u64 {
                        if !dry_run {
                            self.store.delete(k).await?;
                        }
                        report.orphans_deleted += 1;
                    } else {
                        report.orphans_kept += 1;
                    }
                }
                if !dry_run && after.segments.len() > COMPACT_ABOVE_SEGMENTS {
                    report.segments_compacted += self.compact(&topic, p, &after.segments).await?;
                }
            }
        }
        Ok(report)
    }
}

/// Runs of adjacent segments worth merging: at least two, within the size limits.
fn plan_runs(segments: &[SegmentRef]) -> Vec<Vec<SegmentRef>> {
    let mut runs = Vec::new();
    let mut run: Vec<SegmentRef> = Vec::new();
    let (mut bytes, mut count) = (0u64, 0u32);
    for s in segments {
        if !run.is_empty()
            && (bytes + s.bytes > COMPACT_MAX_BYTES || count + s.count > COMPACT_MAX_MESSAGES)
        {
            if run.len() > 1 {
                runs.push(std::mem::take(&mut run));
            }
            run.clear();
            (bytes, count) = (0, 0);
        }
        bytes += s.bytes;
        count += s.count;
        run.push(s.clone());
    }
    if run.len() > 1 {
        runs.push(run);
    }
    runs
}

impl Broker {
    /// Merges runs of small adjacent segments of one partition; returns how many
    /// segments were replaced.
    async fn compact(
        &self,
        topic: &Topic,
        partition: u32,
        segments: &[SegmentRef],
    ) -> BrokerResult<u64> {
        let mut merged: Vec<(Vec<SegmentRef>, SegmentRef)> = Vec::new();
        for run in plan_runs(segments) {
            let mut messages = Vec::new();
            for s in &run {
                // A segment already gone (retention raced us): skip this run.
                let Some(seg) = self.load_segment(&topic.name, partition, &s.id).await? else {
                    messages.clear();
                    break;
                };
                messages.extend(seg.messages.iter().cloned());
            }
            let count: u32 = run.iter().map(|s| s.count).sum();
            if messages.len() != count as usize {
                continue;
            }
            let id = keys::segment_id(self.clock.now_ms(), &self.ids.new_id());
            let body = Segment { messages }.encode()?;
            self.store
                .put_if_absent(&keys::segment(&topic.name, partition, &id), body)
                .await?;
            let new = SegmentRef {
                id,
                base_offset: run[0].base_offset,
                count,
                last_produced_ms: run.iter().map(|s| s.last_produced_ms).max().unwrap_or(0),
                bytes: run.iter().map(|s| s.bytes).sum(),
            };
            merged.push((run, new));
        }
        if merged.is_empty() {
            return Ok(0);
        }
        let key = keys::manifest(&topic.name, partition);
        let (replaced, _) =
            manifest::update(&*self.store, &*self.ids, &key, &topic.incarnation, |m| {
                let mut replaced = 0u64;
                for (run, new) in &merged {
                    // Swap only if the manifest still holds exactly this run.
                    let Some(at) = m.segments.iter().position(|s| s.id == run[0].id) else {
                        continue;
                    };
                    let same = m.segments.len() >= at + run.len()
                        && m.segments[at..at + run.len()]
                            .iter()
                            .zip(run)
                            .all(|(a, b)| a == b);
                    if same {
                        m.segments.splice(at..at + run.len(), [new.clone()]);
                        replaced += run.len() as u64;
                    }
                }
                Ok::<_, BrokerError>(if replaced == 0 {
                    Decision::Keep(0)
                } else {
                    Decision::Commit(replaced)
                })
            })
            .await?;
        Ok(replaced)
    }
}
