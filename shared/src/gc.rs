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
//!
//! The pass lists the store once, then reads each manifest after the listing, so a
//! segment committed meanwhile is either not listed or referenced.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::commit::Op;
use crate::engine::{Broker, BrokerError, BrokerResult};
use crate::keys;

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
            }
        }
        Ok(report)
    }
}
