//! Index objects: the partition's older segments, described outside the manifest
//! (docs/design.md §3), so the manifest's size does not grow with the backlog or retention.
//!
//! The manifest keeps its newest segments ("hot") and a short list of [`IndexRef`]s, oldest
//! first, contiguous, covering `[start_offset, first hot segment)`. An index object
//! (`topics/{t}/{p}/indexes/{id}`, immutable, written with put-if-absent *before* the
//! manifest write that names it) lists either segments (level 0) or index refs of the level
//! below (level 1 and up), so a lookup reads at most one object per level.
//!
//! Two upkeep transitions run on the commit path, whenever a batch finds them due:
//! * [`fold`]: when the manifest holds more than [`FOLD_ABOVE`] hot segments, the oldest
//!   ones (keeping the newest [`KEEP_HOT`], at most [`MAX_FOLD`]) move into one level-0
//!   index;
//! * [`merge`]: when it holds more than [`MERGE_ABOVE`] index refs, the oldest run of
//!   [`MERGE_FANOUT`] refs of one level becomes one ref: a larger level-0 index listing all
//!   their segments while that stays within [`MAX_LEAF_SEGMENTS`] (so lookups stay one
//!   level deep for long), else an index of the next level listing the refs.
//!
//! The manifest thus holds at most about `FOLD_ABOVE` segments and `MERGE_ABOVE` + a few
//! index refs per level, whatever is retained. Both take effect only where the manifest
//! still holds exactly the run the index object was written for; otherwise the object is
//! an orphan that garbage collection deletes.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{codec, Manifest, SegmentRef};
use crate::cache::Weigh;
use crate::formats::{Magic, Unreadable};

/// Hot segments above which the oldest are folded into an index.
pub(crate) const FOLD_ABOVE: usize = 64;
/// Hot segments a fold leaves in the manifest.
pub(crate) const KEEP_HOT: usize = 16;
/// Most segments one level-0 index lists.
pub(crate) const MAX_FOLD: usize = 1024;
/// Index refs above which the oldest are merged into the next level.
pub(crate) const MERGE_ABOVE: usize = 32;
/// Refs one merged index lists.
pub(crate) const MERGE_FANOUT: usize = 16;
/// Most segments a level-0 index lists after merges (a few hundred KiB).
pub(crate) const MAX_LEAF_SEGMENTS: u64 = 4096;

/// The format of index objects this code writes (and the only one it reads).
pub(crate) const INDEX_FORMAT: u32 = 1;
const MAGIC: Magic = Magic {
    kind: b"NIX",
    what: "index object format",
    known: 1,
};

/// One index object, as the manifest (or a higher-level index) names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexRef {
    /// Index object id (the last part of its key; a time-sortable id like a segment's).
    pub id: String,
    /// 0: lists segments; n > 0: lists index refs of level n - 1.
    pub level: u8,
    /// First offset it covers.
    pub base_offset: u64,
    /// One past the last offset it covers.
    pub end_offset: u64,
    /// Segment objects under it.
    pub segments: u64,
    /// Produce time of its newest message (retention drops the whole index after this).
    pub last_produced_ms: u64,
    /// Payload bytes under it.
    pub bytes: u64,
}

impl IndexRef {
    /// True if `offset` is one this index covers.
    pub(crate) fn covers(&self, offset: u64) -> bool {
        self.base_offset <= offset && offset < self.end_offset
    }
}

/// What an index object lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Entries {
    /// Level 0: segments in offset order.
    Segments(Vec<SegmentRef>),
    /// Level n > 0: index refs of level n - 1 in offset order.
    Indexes(Vec<IndexRef>),
}

/// A decoded index object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Index {
    /// [`INDEX_FORMAT`].
    pub format: u32,
    /// What it lists.
    pub entries: Entries,
}

impl Index {
    /// The bytes to store ([`codec::seal`]).
    ///
    /// Errors: a description of why it cannot be encoded (a bug).
    pub(crate) fn encode(&self) -> Result<Bytes, crate::cas::EncodeError> {
        codec::seal(&MAGIC, self)
    }

    /// Decodes stored bytes, checking the magic, the checksum and the format.
    ///
    /// Errors: [`Unreadable`]: damaged, or written by a newer build.
    pub(crate) fn decode(data: &[u8]) -> Result<Self, Unreadable> {
        codec::open(&MAGIC, ("index format", INDEX_FORMAT), data)
    }

    /// The entry holding `offset`: a segment (level 0) or a lower index.
    pub(crate) fn find(&self, offset: u64) -> Option<Found<'_>> {
        match &self.entries {
            Entries::Segments(s) => {
                let i = s
                    .partition_point(|x| x.base_offset <= offset)
                    .checked_sub(1)?;
                let seg = &s[i];
                (offset < seg.base_offset + u64::from(seg.count)).then_some(Found::Segment(seg))
            }
            Entries::Indexes(x) => {
                let i = x
                    .partition_point(|r| r.base_offset <= offset)
                    .checked_sub(1)?;
                x[i].covers(offset).then_some(Found::Index(&x[i]))
            }
        }
    }
}

impl Weigh for Index {
    fn weight(&self) -> usize {
        match &self.entries {
            Entries::Segments(s) => s.len() * 96,
            Entries::Indexes(x) => x.len() * 112,
        }
    }
}

/// Where an offset was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found<'a> {
    /// In this segment.
    Segment(&'a SegmentRef),
    /// Under this index.
    Index(&'a IndexRef),
}

/// A planned fold: the hot segments `run` (the oldest, in order) become `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fold {
    /// The segments folded, exactly as the manifest named them.
    pub run: Vec<SegmentRef>,
    /// The index object listing them.
    pub index: IndexRef,
}

/// A planned merge: the index refs `run` (consecutive, one level) become `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merge {
    /// The refs merged, exactly as the manifest named them.
    pub run: Vec<IndexRef>,
    /// The index object listing them.
    pub index: IndexRef,
}

/// The hot segments a fold of `m` would take now, if one is due.
pub(crate) fn fold_candidate(m: &Manifest) -> Option<Vec<SegmentRef>> {
    if m.segments.len() <= FOLD_ABOVE {
        return None;
    }
    let n = (m.segments.len() - KEEP_HOT).min(MAX_FOLD);
    // Never an undecided segment: its fate is kept in the manifest only.
    let n = super::beside::decided_prefix(m, &m.segments[..n]);
    (n > 0).then(|| m.segments[..n].to_vec())
}

/// The index refs a merge of `m` would take now, if one is due: the oldest run of
/// [`MERGE_FANOUT`] consecutive refs of one level.
pub(crate) fn merge_candidate(m: &Manifest) -> Option<Vec<IndexRef>> {
    if m.indexes.len() <= MERGE_ABOVE {
        return None;
    }
    let at = (0..=m.indexes.len() - MERGE_FANOUT).find(|&i| {
        let level = m.indexes[i].level;
        m.indexes[i..i + MERGE_FANOUT]
            .iter()
            .all(|r| r.level == level)
    })?;
    Some(m.indexes[at..at + MERGE_FANOUT].to_vec())
}

/// The ref of a level-0 index listing `run`.
pub(crate) fn ref_for_segments(id: String, run: &[SegmentRef]) -> IndexRef {
    IndexRef {
        id,
        level: 0,
        base_offset: run.first().map_or(0, |s| s.base_offset),
        end_offset: run.last().map_or(0, |s| s.base_offset + u64::from(s.count)),
        segments: run.len() as u64,
        last_produced_ms: run.iter().map(|s| s.last_produced_ms).max().unwrap_or(0),
        bytes: run.iter().map(|s| s.bytes).sum(),
    }
}

/// Whether a merge of `run` becomes one larger level-0 index (listing every segment of
/// the run, so lookups stay one level deep) rather than an index of the next level: when
/// the run is of level 0 and lists at most [`MAX_LEAF_SEGMENTS`] segments in all.
pub(crate) fn merges_into_leaf(run: &[IndexRef]) -> bool {
    run.iter().all(|r| r.level == 0)
        && run.iter().map(|r| r.segments).sum::<u64>() <= MAX_LEAF_SEGMENTS
}

/// The ref of the index a merge of `run` writes: level 0 when it
/// [`merges_into_leaf`], else one level above `run`.
pub(crate) fn ref_for_indexes(id: String, run: &[IndexRef]) -> IndexRef {
    let level = if merges_into_leaf(run) {
        0
    } else {
        run.first().map_or(0, |r| r.level + 1)
    };
    IndexRef {
        id,
        level,
        base_offset: run.first().map_or(0, |r| r.base_offset),
        end_offset: run.last().map_or(0, |r| r.end_offset),
        segments: run.iter().map(|r| r.segments).sum(),
        last_produced_ms: run.iter().map(|r| r.last_produced_ms).max().unwrap_or(0),
        bytes: run.iter().map(|r| r.bytes).sum(),
    }
}

/// Applies `f` if `m`'s hot segments still start with exactly its run. Returns whether
/// it did.
pub(crate) fn fold(m: &mut Manifest, f: &Fold) -> bool {
    if !m.segments.starts_with(&f.run) {
        return false;
    }
    m.segments.drain(..f.run.len());
    m.indexes.push(f.index.clone());
    true
}

/// Applies `g` if `m` still holds exactly its run of refs. Returns whether it did.
pub(crate) fn merge(m: &mut Manifest, g: &Merge) -> bool {
    let Some(first) = g.run.first() else {
        return false;
    };
    let Some(at) = m.indexes.iter().position(|r| r.id == first.id) else {
        return false;
    };
    if m.indexes.get(at..at + g.run.len()) != Some(g.run.as_slice()) {
        return false;
    }
    m.indexes.splice(at..at + g.run.len(), [g.index.clone()]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(n: u64) -> Vec<SegmentRef> {
        (0..n)
            .map(|i| SegmentRef {
                id: format!("s{i}"),
                base_offset: i * 2,
                count: 2,
                last_produced_ms: i,
                bytes: 10,
            })
            .collect()
    }

    fn manifest(n: u64) -> Manifest {
        let mut m = Manifest::empty("i");
        m.segments = segs(n);
        m.next_offset = n * 2;
        m
    }

    #[test]
    fn folds_the_oldest_segments_once_there_are_too_many() {
        let mut m = manifest(FOLD_ABOVE as u64);
        assert!(fold_candidate(&m).is_none());
        m = manifest(FOLD_ABOVE as u64 + 1);
        let run = fold_candidate(&m).unwrap();
        assert_eq!(run.len(), FOLD_ABOVE + 1 - KEEP_HOT);
        let index = ref_for_segments("x".into(), &run);
        assert_eq!(
            (index.base_offset, index.end_offset),
            (0, run.len() as u64 * 2)
        );
        assert!(fold(
            &mut m,
            &Fold {
                run: run.clone(),
                index
            }
        ));
        assert_eq!(m.segments.len(), KEEP_HOT);
        assert_eq!(m.start_offset, 0);
        // The same fold again no longer matches.
        let again = Fold {
            run,
            index: ref_for_segments("y".into(), &[]),
        };
        assert!(!fold(&mut m, &again));
        assert_eq!(m.indexes.len(), 1);
    }

    #[test]
    fn merges_the_oldest_run_of_one_level() {
        let mut m = Manifest::empty("i");
        for i in 0..=MERGE_ABOVE as u64 {
            m.indexes
                .push(ref_for_segments(format!("i{i}"), &segs(3)[..]));
            let r = m.indexes.last_mut().unwrap();
            (r.base_offset, r.end_offset) = (i * 6, i * 6 + 6);
        }
        m.next_offset = (MERGE_ABOVE as u64 + 1) * 6;
        let run = merge_candidate(&m).unwrap();
        assert_eq!(run.len(), MERGE_FANOUT);
        let index = ref_for_indexes("m".into(), &run);
        assert_eq!((index.level, index.base_offset, index.segments), (0, 0, 48));
        let big: Vec<IndexRef> = run
            .iter()
            .map(|r| IndexRef {
                segments: MAX_LEAF_SEGMENTS,
                ..r.clone()
            })
            .collect();
        assert_eq!(ref_for_indexes("b".into(), &big).level, 1);
        assert!(merge(&mut m, &Merge { run, index }));
        assert_eq!(m.indexes.len(), MERGE_ABOVE + 1 - MERGE_FANOUT + 1);
        assert_eq!(m.indexes[0].id, "m");
        assert!(merge_candidate(&m).is_none());
    }

    #[test]
    fn index_objects_round_trip_and_find_offsets() {
        let idx = Index {
            format: INDEX_FORMAT,
            entries: Entries::Segments(segs(4)),
        };
        let bytes = idx.encode().unwrap();
        assert_eq!(Index::decode(&bytes).unwrap(), idx);
        assert_eq!(idx.find(5), Some(Found::Segment(&segs(4)[2])));
        assert_eq!(idx.find(8), None);
        let mut bad = bytes.to_vec();
        bad[6] ^= 1;
        assert!(Index::decode(&bad).is_err());
        assert!(Index::decode(b"NIX1").is_err());
    }
}
