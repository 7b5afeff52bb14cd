//! Compaction's manifest change: swap runs of adjacent segments for merged ones
//! (docs/design.md §7). The merged segment is written first by the maintenance pass;
//! the swap takes effect only where the manifest still holds exactly the run that was
//! copied, so a run that changed meanwhile (retention, another compaction) is left alone.

use super::{Manifest, SegmentRef};

/// One merged segment and the run of segments it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Swap {
    /// The segments copied, in order, exactly as the manifest named them.
    pub run: Vec<SegmentRef>,
    /// The merged segment (its `base_offset` is the run's).
    pub merged: SegmentRef,
}

/// Applies every swap whose run `m` still holds. Returns how many segments were replaced.
pub(crate) fn swap(m: &mut Manifest, swaps: &[Swap]) -> u64 {
    let mut replaced = 0u64;
    for Swap { run, merged } in swaps {
        let Some(first) = run.first() else { continue };
        let Some(at) = m.segments.iter().position(|s| s.id == first.id) else {
            continue;
        };
        let same = m.segments.get(at..at + run.len()) == Some(run.as_slice());
        if same && super::beside::decided_prefix(m, run) == run.len() {
            m.segments.splice(at..at + run.len(), [merged.clone()]);
            replaced += run.len() as u64;
        }
    }
    replaced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: &str, base: u64, count: u32) -> SegmentRef {
        SegmentRef {
            id: id.into(),
            base_offset: base,
            count,
            last_produced_ms: 0,
            bytes: 1,
        }
    }

    #[test]
    fn swaps_an_exact_run_and_leaves_a_changed_one() {
        let mut m = Manifest::empty("i");
        m.segments = vec![
            seg("a", 0, 1),
            seg("b", 1, 1),
            seg("c", 2, 1),
            seg("d", 3, 1),
        ];
        m.next_offset = 4;
        let good = Swap {
            run: vec![seg("a", 0, 1), seg("b", 1, 1)],
            merged: seg("ab", 0, 2),
        };
        let stale = Swap {
            run: vec![seg("c", 2, 1), seg("x", 3, 1)],
            merged: seg("cx", 2, 2),
        };
        assert_eq!(swap(&mut m, &[good, stale]), 2);
        let ids: Vec<&str> = m.segments.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, vec!["ab", "c", "d"]);
        assert_eq!(m.segment_for(1).map(|s| s.id.as_str()), Some("ab"));
    }
}
