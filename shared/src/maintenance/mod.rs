//! Garbage collection and maintenance: `narad gc`, and the scheduled maintenance function.
//! It works through the broker's narrow maintenance handle
//! ([`Housekeeping`]): every manifest change (retention, compaction swaps) is committed by
//! the broker's committer like any other write.
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
//!    An index object is kept that long whatever the grace: a fold's is written ahead of
//!    the commit that names it (`commit/upkeep.rs`).
//! 3. **Leftovers** of deleted topics (objects under a topic prefix with no `topic.json`)
//!    are deleted.
//! 4. **Old checkpoints**: the committer deletes a partition's third-newest checkpoint when
//!    it writes a new one; a delete that failed leaves it behind. Every checkpoint older
//!    than the two the manifest names (its newest and the one before; docs/design.md §7)
//!    is deleted, those of a rebuilt partition's earlier life included once it has two.
//! 5. **Process records** ([`crate::gate`]) that expired an hour or more ago are deleted
//!    (Lambda instances come and go; each left one).
//! 6. **Compaction**: a partition with more than [`COMPACT_ABOVE_SEGMENTS`] segments has
//!    runs of adjacent small segments rewritten as one (up to [`COMPACT_MAX_BYTES`] and
//!    [`COMPACT_MAX_MESSAGES`] each), so the manifest that every commit reads and writes
//!    stays small even behind single-message producers. The merged segment is written
//!    first, then one committed swap ([`crate::partition::compact`]) puts it in for exactly the segments it
//!    copied (a run that changed meanwhile is left alone). The replaced segments are
//!    then unreferenced and older than the grace period, so the next pass deletes them;
//!    a reader holding an older manifest can still read them until then.
//!
//! The pass lists the store once, then reads each manifest after the listing, so a
//! segment committed meanwhile is either not listed or referenced.

mod compact;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::broker::{Broker, Housekeeping, Topic};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::index::Entries;
use crate::partition::Manifest;

pub use compact::{COMPACT_ABOVE_SEGMENTS, COMPACT_MAX_BYTES, COMPACT_MAX_MESSAGES};

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
    /// Checkpoints older than a partition's two newest, deleted.
    pub checkpoints_deleted: u64,
    /// Segments replaced by merged ones (deleted by a later pass).
    pub segments_compacted: u64,
    /// Topics and partitions left alone because a newer version of Narad wrote their
    /// topic record or manifest (logged; a newer build's gc takes care of them).
    pub skipped_newer: u64,
    /// Records of processes that stopped an hour or more ago ([`crate::gate`]), deleted.
    pub process_records_deleted: u64,
    /// Ledgers of deleted subscriptions (an interrupted delete's, or a commit's that
    /// landed after it), deleted.
    pub subscription_ledgers_deleted: u64,
    /// Intents of subscriptions' ledgers older than the grace period (decided, or never
    /// to land: a commit lands none older than 5 minutes) or of deleted subscriptions,
    /// deleted.
    pub ledger_intents_deleted: u64,
}

/// One pass's settings.
#[derive(Debug, Clone, Copy)]
struct Pass {
    grace: Duration,
    dry_run: bool,
}

/// Runs one garbage-collection pass over `broker`'s store (see the module
/// documentation). With `dry_run` nothing is deleted or committed; the report says what
/// would have been.
///
/// Errors: store failures; a pass can be re-run at any time.
pub async fn gc(broker: &Broker, grace: Duration, dry_run: bool) -> BrokerResult<GcReport> {
    let broker = broker.housekeeping();
    // A process stopped by a newer build maintains nothing.
    broker.gate().check()?;
    let pass = Pass { grace, dry_run };
    let mut report = GcReport::default();
    let keys = broker.store().list(keys::TOPICS_PREFIX).await?;
    let mut by_topic: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for k in &keys {
        if let Some(rest) = k.strip_prefix(keys::TOPICS_PREFIX) {
            if let Some((topic, _)) = rest.split_once('/') {
                by_topic.entry(topic).or_default().push(k.as_str());
            }
        }
    }
    for (name, objects) in by_topic {
        let topic = match broker.load_topic(name).await {
            Ok(t) => t,
            Err(BrokerError::UpgradeRequired { object, newer }) => {
                skip_newer(&object, &newer, &mut report);
                continue;
            }
            Err(BrokerError::TopicNotFound) | Err(BrokerError::InvalidTopic(_)) => {
                for k in objects {
                    if !dry_run {
                        broker.store().delete(k).await?;
                    }
                    report.leftovers_deleted += 1;
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        report.topics += 1;
        subscription_objects(broker, pass, (&topic, &objects), &mut report).await?;
        for p in 0..topic.settings.partitions {
            report.partitions += 1;
            match partition(broker, pass, &topic, p, &objects, &mut report).await {
                // Met before anything was written: the manifest is read first.
                Err(BrokerError::UpgradeRequired { object, newer }) => {
                    skip_newer(&object, &newer, &mut report)
                }
                other => other?,
            }
        }
    }
    report.process_records_deleted = crate::gate::delete_expired(
        broker.store(),
        crate::clock::Clock::now_ms(&crate::clock::SystemClock),
        dry_run,
    )
    .await?;
    Ok(report)
}

/// Deletes the ledgers of subscriptions `topic` no longer has (listed before the topic
/// was read: a subscription created since has no ledger in `objects`), and ledger intents
/// past the grace period or of such subscriptions.
///
/// Errors: the store's.
async fn subscription_objects(
    broker: Housekeeping<'_>,
    pass: Pass,
    (topic, objects): (&Topic, &[&str]),
    report: &mut GcReport,
) -> BrokerResult<()> {
    let now = broker.clock().now_ms();
    for k in objects {
        let Some(o) = keys::subscription_object(&topic.name, k) else {
            continue;
        };
        let live = topic.subscription(o.name).is_some_and(|r| r.id == o.id);
        let counter = match o.intent {
            None if live => continue,
            None => &mut report.subscription_ledgers_deleted,
            Some(id) => {
                // Ids without a time (written by something else) are left alone.
                let Some(written) = keys::segment_time(id) else {
                    continue;
                };
                let old = now.saturating_sub(written) > pass.grace.as_millis() as u64;
                if live && !old {
                    continue;
                }
                &mut report.ledger_intents_deleted
            }
        };
        if !pass.dry_run {
            broker.store().delete(k).await?;
        }
        *counter += 1;
    }
    Ok(())
}

/// Logs and counts a topic or partition this pass leaves alone.
fn skip_newer(object: &str, newer: &crate::cas::Newer, report: &mut GcReport) {
    tracing::warn!(%object, %newer, "gc leaves alone what a newer version of Narad wrote");
    report.skipped_newer += 1;
}

/// Retention, orphans, old checkpoints and compaction of one partition; `objects` are the
/// topic's keys. The manifest is read before anything is written.
async fn partition(
    broker: Housekeeping<'_>,
    pass: Pass,
    topic: &Topic,
    p: u32,
    objects: &[&str],
    report: &mut GcReport,
) -> BrokerResult<()> {
    let before = broker.read_manifest(topic, p).await?;
    if !pass.dry_run {
        broker.apply_retention(topic, p).await?;
    }
    let after = broker.read_manifest(topic, p).await?;
    report.expired_segments += if pass.dry_run {
        let mut expired = before.clone();
        expired.apply_retention(broker.clock().now_ms(), topic.settings.retention_ms);
        before.retained_segments() - expired.retained_segments()
    } else {
        before
            .retained_segments()
            .saturating_sub(after.retained_segments())
    };
    let Some(named) = named(broker, topic, p, &after).await? else {
        tracing::error!(
            topic = %topic.name, p,
            "an index object named by the manifest is missing; orphans left alone"
        );
        return Ok(());
    };
    let now = broker.clock().now_ms();
    // An index object is written ahead of the commit that names it (a fold's, by the
    // queue's chore beside an earlier commit: `commit/upkeep.rs`), up to
    // `named_within` before, whatever the grace: taken for an orphan meanwhile,
    // the fold would name an object that is gone, and the messages it indexes with it.
    let index_grace = pass.grace.max(broker.named_within());
    for (prefix, grace) in [
        (keys::segment(&topic.name, p, ""), pass.grace),
        (keys::index(&topic.name, p, ""), index_grace),
    ] {
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
                if !pass.dry_run {
                    broker.store().delete(k).await?;
                }
                report.orphans_deleted += 1;
            } else {
                report.orphans_kept += 1;
            }
        }
    }
    // The manifest names the two it keeps: its newest checkpoint and the one before.
    let previous = after.checkpoint.previous;
    let ckpt_prefix = keys::checkpoints_prefix(&topic.name, p);
    for k in objects.iter().filter(|k| {
        k.starts_with(&ckpt_prefix) && keys::checkpoint_version(k).is_some_and(|v| v < previous)
    }) {
        if !pass.dry_run {
            broker.store().delete(k).await?;
        }
        report.checkpoints_deleted += 1;
    }
    if !pass.dry_run && after.segments.len() > COMPACT_ABOVE_SEGMENTS {
        report.segments_compacted += compact::compact(broker, topic, p, &after.segments).await?;
    }
    Ok(())
}

/// The ids of every segment, index object and key chunk `m` names, directly or through its index
/// objects; `None` if one of those index objects is missing (then nothing may be taken
/// for an orphan).
async fn named(
    broker: Housekeeping<'_>,
    topic: &Topic,
    p: u32,
    m: &Manifest,
) -> BrokerResult<Option<HashSet<String>>> {
    let mut named: HashSet<String> = m.segments.iter().map(|s| s.id.clone()).collect();
    named.extend(m.dedup_chunks.iter().map(|c| c.id.clone()));
    let mut stack = m.indexes.clone();
    while let Some(r) = stack.pop() {
        named.insert(r.id.clone());
        let Some(index) = broker.load_index(&topic.name, p, &r.id).await? else {
            return Ok(None);
        };
        match &index.entries {
            Entries::Segments(segs) => named.extend(segs.iter().map(|s| s.id.clone())),
            Entries::Indexes(children) => stack.extend(children.iter().cloned()),
        }
    }
    Ok(Some(named))
}
