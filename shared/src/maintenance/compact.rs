//! Compaction: runs of adjacent small segments merged into one, so a partition behind
//! single-message producers keeps few segments. The merged segment is written first;
//! the swap is committed through the broker's committer
//! ([`crate::partition::compact::swap`]), which applies it only where the manifest still
//! holds exactly the run that was copied.

use crate::broker::Housekeeping;
use crate::error::BrokerResult;
use crate::keys;
use crate::partition::compact::Swap;
use crate::partition::SegmentRef;
use crate::segment::Segment;
use crate::topic::Topic;

/// Partitions with more segments than this are compacted.
pub const COMPACT_ABOVE_SEGMENTS: usize = 16;
/// Largest merged segment, in payload bytes.
pub const COMPACT_MAX_BYTES: u64 = 4 << 20;
/// Most messages in a merged segment.
pub const COMPACT_MAX_MESSAGES: u32 = 10_000;

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

/// Writes the merged segment of `run`; `None` if one of its segments is already gone
/// (retention raced us).
async fn merge(
    broker: Housekeeping<'_>,
    topic: &Topic,
    partition: u32,
    run: Vec<SegmentRef>,
) -> BrokerResult<Option<Swap>> {
    let mut messages = Vec::new();
    for s in &run {
        let Some(seg) = broker.load_segment(&topic.name, partition, &s.id).await? else {
            return Ok(None);
        };
        messages.extend(seg.messages.iter().cloned());
    }
    let count: u32 = run.iter().map(|s| s.count).sum();
    if messages.len() != count as usize {
        return Ok(None);
    }
    let id = keys::segment_id(broker.clock().now_ms(), &broker.ids().new_id());
    let body = Segment::new(messages).encode(broker.fleet_level())?;
    broker
        .store()
        .put_if_absent(&keys::segment(&topic.name, partition, &id), body)
        .await?;
    let merged = SegmentRef {
        id,
        base_offset: run.first().map_or(0, |s| s.base_offset),
        count,
        last_produced_ms: run.iter().map(|s| s.last_produced_ms).max().unwrap_or(0),
        bytes: run.iter().map(|s| s.bytes).sum(),
    };
    Ok(Some(Swap { run, merged }))
}

/// Merges runs of small adjacent segments of one partition; returns how many segments
/// were replaced.
pub(super) async fn compact(
    broker: Housekeeping<'_>,
    topic: &Topic,
    partition: u32,
    segments: &[SegmentRef],
) -> BrokerResult<u64> {
    let mut swaps = Vec::new();
    for run in plan_runs(segments) {
        if let Some(swap) = merge(broker, topic, partition, run).await? {
            swaps.push(swap);
        }
    }
    if swaps.is_empty() {
        return Ok(0);
    }
    broker.swap_segments(topic, partition, swaps).await
}
