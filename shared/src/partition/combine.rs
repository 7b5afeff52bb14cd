//! Combining: segments that any process may commit (docs/design.md §6, "Many
//! processes on one partition").
//!
//! A produce batch without idempotency keys writes its segment under a *combinable* id,
//! `{ms:013}-{unique}-c{count}-b{bytes}`: the id alone says what the manifest needs to
//! commit it, so a process that lists the partition's `segments/` prefix can commit
//! every such segment it sees in one write, without reading them. Many instances
//! producing to one partition at once then share commits instead of racing.
//!
//! From fleet level 4 the id ends in the topic incarnation's [`tag`], `…-t{tag}`, and a
//! commit lands only its own incarnation's (and untagged ones, which their writers
//! checked against the topic record before writing them): a segment written by a process
//! whose cached topic was deleted and created again meanwhile is never landed into the
//! new topic, so its writer may check the topic beside the write and retry elsewhere.
//!
//! Three manifest fields make that safe:
//! * `combined_through`: every combinable id at or below it is decided, landed or dead.
//!   Commits only land ids above it, in id order, and raise it to the highest id landed.
//! * `landed`: the last [`LANDED_KEEP`] combinable segments landed, with their base
//!   offsets, so the writer of one learns its offsets from the manifest.
//! * `landed_floor`: the highest id that left `landed`; the fate of an id at or below it
//!   can no longer be told from the manifest.
//!
//! So a segment's [`status`] is [`Status::Landed`] (in `landed`, or still among the hot
//! segments), [`Status::Pending`] (it may still land,
//! by anyone), [`Status::Dead`] (it never will: its writer writes its messages again under a
//! new id) or [`Status::Unknown`] (its writer waited too long to tell; it answers 503, the
//! outcome unknown). A segment lands at most once: only ids above `combined_through`
//! land, and landing raises it past them.

use super::{Manifest, SegmentRef};

/// How many landed combinable segments a manifest remembers.
pub(crate) const LANDED_KEEP: usize = 64;

/// The start of a combinable segment's or an intent's id, `{ms:013}-{unique}` (dashes
/// taken out of `unique`): written at `now_ms`, and always above `after` (what the writer
/// knows of [`Manifest::ids_above`]), so that it is never passed over on arrival. A writer
/// whose clock lags writes at the millisecond of `after`, and one past it when its unique
/// part would sort at or below `after`'s (two processes within one millisecond; within
/// one process unique parts rise). Ids run ahead of the clock only as far as such steps
/// take them.
pub(crate) fn stem(now_ms: u64, after: &str, unique: &str) -> String {
    let floor = after
        .split_once('-')
        .and_then(|(t, _)| t.parse::<u64>().ok())
        .unwrap_or(0);
    let unique: String = unique.chars().filter(|c| *c != '-').collect();
    let at = format!("{:013}-{unique}", now_ms.max(floor));
    if at.as_str() > after {
        at
    } else {
        format!("{:013}-{unique}", floor + 1)
    }
}

/// A combinable segment as named by its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combinable {
    /// The segment id.
    pub id: String,
    /// Messages in the segment.
    pub count: u32,
    /// Payload bytes in the segment.
    pub bytes: u64,
    /// When it was written (ms since the epoch, the writer's clock).
    pub written_ms: u64,
    /// The topic incarnation's [`tag`] (fleet level 4 and up); `None`: untagged.
    pub tag: Option<String>,
}

/// The short tag of a topic incarnation that level-4 combinable ids end in: its last 12
/// letters and digits (of a UUIDv7, random bits), lowercased.
pub(crate) fn tag(incarnation: &str) -> String {
    let s: Vec<char> = incarnation
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    s[s.len().saturating_sub(12)..].iter().collect()
}

impl Combinable {
    /// The id of a combinable segment of `count` messages and `bytes` of payload, its
    /// time and unique part as [`stem`] makes them.
    pub fn id(now_ms: u64, after: &str, unique: &str, count: u32, bytes: u64) -> String {
        format!("{}-c{count}-b{bytes}", stem(now_ms, after, unique))
    }

    /// The id of a combinable segment as [`Combinable::id`], ending in the topic
    /// incarnation's `tag` (fleet level 4 and up).
    pub fn tagged_id(
        now_ms: u64,
        after: &str,
        unique: &str,
        (count, bytes): (u32, u64),
        tag: &str,
    ) -> String {
        format!("{}-t{tag}", Self::id(now_ms, after, unique, count, bytes))
    }

    /// Reads a combinable id; `None` for any other segment id.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.split('-');
        let (time, unique) = (parts.next()?, parts.next()?);
        let count = parts.next()?.strip_prefix('c')?;
        let bytes = parts.next()?.strip_prefix('b')?;
        let tag = match parts.next() {
            None => None,
            Some(t) => Some(t.strip_prefix('t')?),
        };
        let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
        if parts.next().is_some() || time.len() != 13 || !plain(unique) {
            return None;
        }
        if tag.is_some_and(|t| !plain(t) || t.len() > 12) {
            return None;
        }
        Some(Self {
            id: id.to_owned(),
            count: count.parse().ok().filter(|c| *c > 0)?,
            bytes: bytes.parse().ok()?,
            written_ms: time.parse().ok()?,
            tag: tag.map(str::to_owned),
        })
    }

    /// Whether a commit of the incarnation tagged `tag` may land it: untagged, or
    /// tagged so.
    pub fn belongs_to(&self, tag: &str) -> bool {
        self.tag.as_deref().is_none_or(|t| t == tag)
    }

    /// The segment ref to land (its base offset is set when it lands).
    pub fn to_ref(&self) -> SegmentRef {
        SegmentRef {
            id: self.id.clone(),
            base_offset: 0,
            count: self.count,
            last_produced_ms: self.written_ms,
            bytes: self.bytes,
        }
    }
}

/// What a manifest says of a combinable segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Committed, at this base offset.
    Landed(u64),
    /// Not committed yet; any commit may land it.
    Pending,
    /// Never committed, and never will be.
    Dead,
    /// Too old to tell.
    Unknown,
}

/// The fate of the combinable segment `id` in `m`.
pub(crate) fn status(m: &Manifest, id: &str) -> Status {
    if let Some((_, base)) = m.landed.iter().find(|(i, _)| i == id) {
        return Status::Landed(*base);
    }
    // Forgotten by `landed` but still a hot segment (not yet folded or compacted).
    if let Some(seg) = m.segments.iter().find(|s| s.id == id) {
        return Status::Landed(seg.base_offset);
    }
    if !m.landed_floor.is_empty() && id <= m.landed_floor.as_str() {
        if never_landed(&m.segments, id) {
            return Status::Dead;
        }
        return Status::Unknown;
    }
    if id <= m.combined_through.as_str() {
        return Status::Dead;
    }
    Status::Pending
}

/// Whether the hot segments `hot` (in offset order) show that the combinable segment
/// `id`, which is not among them, never landed. Combinable segments land in id order (each
/// only above `combined_through`, which it raises), so one that landed sits after every
/// combinable segment below its id and before every one above it. Hot segments leave
/// only from the front (folding, retention) or by compaction, which merges a run under
/// an id that is not combinable. So when a combinable segment below `id` is hot and no
/// segment of another kind follows the last such one before the first above `id` (or
/// the end), nothing could hold it: it never landed.
fn never_landed(hot: &[SegmentRef], id: &str) -> bool {
    let (mut below, mut hidden) = (false, false);
    for seg in hot {
        match Combinable::parse(&seg.id) {
            Some(_) if seg.id.as_str() < id => (below, hidden) = (true, false),
            Some(_) => return below && !hidden && seg.id != id,
            None => hidden = true,
        }
    }
    below && !hidden
}

/// Lands every pending segment of `segs` in id order: each gets the next offsets, is
/// remembered in `landed`, and `combined_through` rises past it. Returns the base offset
/// of each segment of `segs` that landed now, in the order of `segs` (`None`: not pending).
pub(crate) fn land(m: &mut Manifest, segs: &[SegmentRef]) -> Vec<Option<u64>> {
    let mut order: Vec<usize> = (0..segs.len()).collect();
    order.sort_by(|a, b| segs[*a].id.cmp(&segs[*b].id));
    let mut out = vec![None; segs.len()];
    for i in order {
        let seg = &segs[i];
        if status(m, &seg.id) != Status::Pending {
            continue;
        }
        let base = m.next_offset;
        let mut r = seg.clone();
        r.base_offset = base;
        m.next_offset += u64::from(seg.count);
        m.segments.push(r);
        m.landed.push_back((seg.id.clone(), base));
        while m.landed.len() > LANDED_KEEP {
            if let Some((gone, _)) = m.landed.pop_front() {
                m.landed_floor = gone;
            }
        }
        m.combined_through = seg.id.clone();
        out[i] = Some(base);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::manifest_with;

    #[test]
    fn tagged_ids_name_their_incarnation_and_old_ones_parse_as_before() {
        let t = tag("0190a3b2-7c4d-7e8f-9a0b-1c2d3e4f5a6B");
        assert_eq!(t, "1c2d3e4f5a6b");
        assert_eq!(tag("inc-1"), "inc1");
        let id = Combinable::tagged_id(1_000, "", "u", (3, 30), &t);
        let c = Combinable::parse(&id).unwrap();
        assert_eq!(
            (c.count, c.bytes, c.tag.as_deref()),
            (3, 30, Some(t.as_str()))
        );
        assert!(c.belongs_to(&t) && !c.belongs_to("other"));
        let old = Combinable::parse(&Combinable::id(1_000, "", "u", 3, 30)).unwrap();
        assert!(old.tag.is_none() && old.belongs_to("any"));
        for bad in [
            format!("{}-x", Combinable::id(1_000, "", "u", 1, 1)),
            format!("{}-t", Combinable::id(1_000, "", "u", 1, 1)),
            format!("{}-tab-c", Combinable::id(1_000, "", "u", 1, 1)),
            format!(
                "{}-t{}",
                Combinable::id(1_000, "", "u", 1, 1),
                "a".repeat(13)
            ),
        ] {
            assert!(Combinable::parse(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_new_id_always_sorts_above_what_the_writer_knows() {
        let t = 1_700_000_000_000u64;
        let after = format!("{t:013}-5555-c1-b1");
        // The clock moved on: its own time.
        assert!(stem(t + 3, &after, "0000").starts_with(&format!("{:013}-", t + 3)));
        // Same millisecond, or a clock behind: above `after` either way.
        for (now, unique) in [(t, "9999"), (t, "0000"), (t - 50, "0000"), (t - 50, "9-9")] {
            let id = Combinable::id(now, &after, unique, 1, 1);
            assert!(id > after, "{id} above {after}");
            assert!(Combinable::parse(&id).is_some());
        }
        assert_eq!(stem(t, &after, "9999"), format!("{t:013}-9999"));
        assert_eq!(stem(t, &after, "0000"), format!("{:013}-0000", t + 1));
        // A floor covering a whole millisecond.
        let floor = format!("{t:013}-~");
        assert_eq!(stem(t, &floor, "zzzz"), format!("{:013}-zzzz", t + 1));
        assert!(stem(t, "", "a").starts_with(&format!("{t:013}-")));
    }

    fn seg(t: u64, u: &str, count: u32) -> SegmentRef {
        Combinable::parse(&Combinable::id(t, "", u, count, 10))
            .unwrap()
            .to_ref()
    }

    #[test]
    fn ids_round_trip_and_other_ids_are_not_combinable() {
        let id = Combinable::id(1_700_000_000_000, "", "abc", 3, 42);
        let c = Combinable::parse(&id).unwrap();
        assert_eq!((c.count, c.bytes, c.written_ms), (3, 42, 1_700_000_000_000));
        assert!(Combinable::parse("1700000000000-abc").is_none());
        assert!(Combinable::parse("1700000000000-abc-c0-b1").is_none());
        assert!(Combinable::parse("17-abc-c1-b1").is_none());
    }

    #[test]
    fn a_lagging_clock_writes_no_earlier_than_what_the_writer_knows() {
        let later = Combinable::id(5_000, "", "b", 1, 1);
        assert!(Combinable::id(1_000, &later, "c", 1, 1) > later);
        let written = |u| {
            Combinable::parse(&Combinable::id(1_000, &later, u, 1, 1))
                .unwrap()
                .written_ms
        };
        assert_eq!(written("c"), 5_000);
        // One that would sort below `later` within its millisecond: one past it.
        assert_eq!(written("a"), 5_001);
    }

    #[test]
    fn segments_land_once_in_id_order() {
        let mut m = manifest_with(2);
        let (a, b, c) = (seg(10, "a", 1), seg(20, "b", 2), seg(30, "c", 3));
        let got = land(&mut m, &[c.clone(), a.clone()]);
        assert_eq!(got, vec![Some(3), Some(2)]);
        assert_eq!(status(&m, &a.id), Status::Landed(2));
        assert_eq!(status(&m, &c.id), Status::Landed(3));
        // b sorts below what landed: it can never land now.
        assert_eq!(status(&m, &b.id), Status::Dead);
        assert_eq!(land(&mut m, &[a.clone(), b, c]), vec![None, None, None]);
        assert_eq!(m.next_offset, 6);
    }

    #[test]
    fn forgotten_segments_are_unknown_not_dead() {
        let mut m = manifest_with(0);
        let first = seg(1, "first", 1);
        land(&mut m, std::slice::from_ref(&first));
        for i in 0..LANDED_KEEP as u64 {
            land(&mut m, &[seg(100 + i, "x", 1)]);
        }
        assert_eq!(m.landed.len(), LANDED_KEEP);
        // Still a hot segment: its offset is known.
        assert_eq!(status(&m, &first.id), Status::Landed(0));
        m.segments.retain(|s| s.id != first.id);
        assert_eq!(status(&m, &first.id), Status::Unknown);
        assert_eq!(status(&m, &seg(0, "late", 1).id), Status::Unknown);
        assert_eq!(status(&m, &seg(5, "late", 1).id), Status::Dead);
        assert_eq!(status(&m, &seg(9_999, "new", 1).id), Status::Pending);
    }

    #[test]
    fn a_forgotten_segment_that_the_hot_ones_show_never_landed_is_dead() {
        let mut m = manifest_with(0);
        for i in 0..LANDED_KEEP as u64 + 5 {
            land(&mut m, &[seg(100 + i, "x", 1)]);
        }
        // Passed over between the second and the third landed: had it landed, it would
        // sit between them.
        let passed = seg(101, "y", 1);
        assert!(passed.id <= m.landed_floor);
        assert_eq!(status(&m, &passed.id), Status::Dead);
        // Below every hot segment: it may have been folded into an index.
        assert_eq!(status(&m, &seg(50, "z", 1).id), Status::Unknown);
        // A segment of another kind where it would sit (compaction's merge of it and
        // its neighbours, say): it may be in there.
        let mut merged = m.clone();
        merged.segments[2].id = "0000000000102-merged".into();
        assert_eq!(status(&merged, &passed.id), Status::Unknown);
        // One of another kind before the last combinable below it hides nothing.
        let mut early = m.clone();
        early.segments[0].id = "0000000000100-merged".into();
        assert_eq!(status(&early, &passed.id), Status::Dead);
        // Above every hot one but at or below the floor cannot be; still, nothing after
        // the last below it could hold it.
        assert!(never_landed(&m.segments, &seg(9_999, "late", 1).id));
        assert!(!never_landed(&[], &passed.id));
    }
}
