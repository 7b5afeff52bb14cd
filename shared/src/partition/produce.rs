//! Producing: which messages are new, and appending them (docs/design.md §6).
//!
//! A produce may carry an idempotency key. A key the partition still remembers (within
//! the topic's `dedup_window_ms`, at most [`super::MAX_DEDUP_KEYS`] keys) appends nothing
//! and answers the first produce's offset; a key repeated within one batch shares the
//! offset of its first occurrence. [`Plan::new`] decides this from the state a commit
//! attempt starts from, so the segment written for that attempt holds exactly the new
//! messages, and [`append`] gives them contiguous offsets in one segment.
//!
//! A message may be delayed: it gets its offset at once but is not delivered before its
//! time ([`delay_due`]), kept as runs of offsets in the manifest. A produce whose delayed
//! messages could need more runs than the partition has room for ([`MAX_DELAYED_RUNS`])
//! is refused whole, before its segment is written ([`Unplaced::DelayedFull`]).

use std::collections::{HashMap, HashSet};

use super::{Manifest, SegmentRef, MAX_DELAYED_RUNS};
use crate::segment::StoredMessage;

/// A message to append, with its optional idempotency key.
#[derive(Debug, Clone)]
pub(crate) struct NewStored {
    /// The message.
    pub message: StoredMessage,
    /// `Idempotency-Key`: a retry with the same key within the window appends nothing.
    pub idempotency_key: Option<String>,
    /// Not delivered before this many ms from the commit (0: at once).
    pub delay_ms: u64,
}

impl NewStored {
    /// Without an idempotency key or a delay: new whatever the partition's state, so its
    /// plan ([`Plan::stateless`]) and its segment need no state, and any process may land
    /// that segment (`partition/combine.rs`).
    pub(crate) fn stateless(&self) -> bool {
        self.idempotency_key.is_none() && self.delay_ms == 0
    }
}

/// Why a produce got no offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unplaced {
    /// Its segment write was refused, or its fate is unknown: the batch's refusal applies.
    NoSegment,
    /// The partition holds as many delayed runs as it may.
    DelayedFull,
}

/// When a message produced at `now` with `delay_ms` becomes deliverable: rounded up to a
/// step of 2% of the delay (100 ms to 60 s), so that messages produced close together
/// share one run. Never earlier than asked.
pub(crate) fn delay_due(now: u64, delay_ms: u64) -> u64 {
    let step = (delay_ms / 50).clamp(100, 60_000);
    now.saturating_add(delay_ms)
        .div_ceil(step)
        .saturating_mul(step)
}

/// Where one produced message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    /// Index into the batch's segment.
    New(usize),
    /// Already committed at this offset.
    Dup(u64),
    /// Same idempotency key as an earlier new message of this batch.
    Same(String),
    /// Refused: no room for its delay.
    Full,
}

/// The per-message plan of a batch's produces (one list of slots per produce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    slots: Vec<Vec<Slot>>,
}

impl Plan {
    /// Plans `produces` against `m` at `now`. `spilled` answers for keys the manifest
    /// spilled into chunk objects ([`super::dedup`]), which the caller read.
    pub(crate) fn new(
        produces: &[Vec<NewStored>],
        m: &Manifest,
        now: u64,
        spilled: &dyn Fn(&str) -> Option<u64>,
    ) -> Self {
        let mut seen = HashSet::new();
        let mut n = 0;
        let mut new_slot = || {
            n += 1;
            Slot::New(n - 1)
        };
        // Each delayed message may start a run (an upper bound: runs merge).
        let live = m.delayed.iter().filter(|d| d.until_ms > now).count();
        let mut room = MAX_DELAYED_RUNS.saturating_sub(live);
        let slots = produces
            .iter()
            .map(|msgs| {
                let runs = msgs.iter().filter(|msg| msg.delay_ms > 0).count();
                if runs > room {
                    return vec![Slot::Full; msgs.len()];
                }
                room -= runs;
                msgs.iter()
                    .map(|msg| match &msg.idempotency_key {
                        Some(k) => match m.dedup_lookup(k, now).or_else(|| spilled(k)) {
                            Some(o) => Slot::Dup(o),
                            None if !seen.insert(k.clone()) => Slot::Same(k.clone()),
                            None => new_slot(),
                        },
                        None => new_slot(),
                    })
                    .collect()
            })
            .collect();
        Self { slots }
    }

    /// The plan of `produces` when none carries an idempotency key or a delay: every
    /// message new, in order, which is what [`Plan::new`] gives against any manifest, so a
    /// segment can be written for it before the state it commits to is known (a batch
    /// taken ahead, `commit/queue.rs`). `None` when some message has a key or a delay.
    pub(crate) fn stateless<'a>(
        produces: impl IntoIterator<Item = &'a [NewStored]>,
    ) -> Option<Self> {
        let mut n = 0;
        let mut slots = Vec::new();
        for msgs in produces {
            let mut row = Vec::with_capacity(msgs.len());
            for m in msgs {
                if !m.stateless() {
                    return None;
                }
                row.push(Slot::New(n));
                n += 1;
            }
            slots.push(row);
        }
        Some(Self { slots })
    }

    /// A plan under which no produce can be made (every one is answered with the
    /// batch's refusal): for when the remembered keys could not be read.
    pub(crate) fn refused(produces: &[Vec<NewStored>]) -> Self {
        let slots = produces
            .iter()
            .map(|msgs| (0..msgs.len()).map(Slot::New).collect())
            .collect();
        Self { slots }
    }

    /// The messages planned as new, in segment order.
    pub(crate) fn new_messages(&self, produces: &[Vec<NewStored>]) -> Vec<StoredMessage> {
        let mut out = Vec::new();
        for (msgs, slots) in produces.iter().zip(&self.slots) {
            for (m, slot) in msgs.iter().zip(slots) {
                if matches!(slot, Slot::New(_)) {
                    out.push(m.message.clone());
                }
            }
        }
        out
    }

    /// True when some message is new, so a segment is needed.
    pub(crate) fn needs_segment(&self) -> bool {
        self.slots
            .iter()
            .flatten()
            .any(|s| matches!(s, Slot::New(_)))
    }

    fn produce_needs_segment(&self, i: usize) -> bool {
        self.slots[i].iter().any(|s| matches!(s, Slot::New(_)))
    }
}

/// Places `segment` at the next offsets of `m`; returns its base offset.
pub(crate) fn place(m: &mut Manifest, segment: &SegmentRef) -> u64 {
    let base = m.next_offset;
    let mut r = segment.clone();
    r.base_offset = base;
    m.next_offset += u64::from(segment.count);
    m.segments.push(r);
    base
}

/// Answers the planned produces at `now`, their segment (holding the plan's new messages,
/// in order) being at `base` (placed by [`place`], or landed by [`super::combine`]); new
/// idempotency keys are remembered for `dedup_window_ms`, new delayed messages join the
/// manifest's delayed runs. Returns each produce's offsets, in order, or why it has none.
pub(crate) fn append(
    m: &mut Manifest,
    now: u64,
    dedup_window_ms: u64,
    produces: &[Vec<NewStored>],
    plan: &Plan,
    base: Option<u64>,
) -> Vec<Result<Vec<u64>, Unplaced>> {
    let mut assigned: HashMap<&str, u64> = HashMap::new();
    let mut out = Vec::with_capacity(produces.len());
    for (i, (msgs, slots)) in produces.iter().zip(&plan.slots).enumerate() {
        if slots.contains(&Slot::Full) {
            out.push(Err(Unplaced::DelayedFull));
            continue;
        }
        if base.is_none() && plan.produce_needs_segment(i) {
            out.push(Err(Unplaced::NoSegment));
            continue;
        }
        // A produce that needs no segment holds only retries: no `New` slot reads it.
        let base = base.unwrap_or(0);
        let offsets = msgs.iter().zip(slots).map(|(msg, slot)| match slot {
            Slot::New(j) => {
                let o = base + *j as u64;
                if let Some(k) = &msg.idempotency_key {
                    m.dedup_insert(k, o, now + dedup_window_ms, now);
                    assigned.insert(k, o);
                }
                if msg.delay_ms > 0 {
                    m.delay(o, o + 1, delay_due(now, msg.delay_ms));
                }
                Some(o)
            }
            Slot::Dup(o) => Some(*o),
            Slot::Same(k) => assigned.get(k.as_str()).copied(),
            Slot::Full => None,
        });
        out.push(
            offsets
                .collect::<Option<Vec<u64>>>()
                .ok_or(Unplaced::NoSegment),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::manifest_with;

    fn none(_: &str) -> Option<u64> {
        None
    }

    fn msg(key: Option<&str>) -> NewStored {
        NewStored {
            message: StoredMessage::new(1, None, b"x".to_vec()),
            idempotency_key: key.map(str::to_owned),
            delay_ms: 0,
        }
    }

    #[test]
    fn a_stateless_plan_is_the_plan_against_any_manifest() {
        let produces = vec![vec![msg(None), msg(None)], vec![msg(None)]];
        let plan =
            Plan::stateless(produces.iter().map(Vec::as_slice)).expect("keyless and undelayed");
        // A manifest with messages, and one whose delayed runs are full.
        let mut full = manifest_with(4);
        for i in 0..MAX_DELAYED_RUNS as u64 {
            full.delayed.push(super::super::delay::Delayed {
                from: i,
                to: i + 1,
                until_ms: u64::MAX,
            });
        }
        for m in [manifest_with(2), full] {
            assert_eq!(Plan::new(&produces, &m, 5, &none), plan);
        }
        assert_eq!(plan.new_messages(&produces).len(), 3);
        // A key or a delay makes the plan depend on the state.
        assert!(Plan::stateless([&[msg(None), msg(Some("k"))][..]]).is_none());
        assert!(Plan::stateless([&[delayed(10)][..]]).is_none());
    }

    fn delayed(ms: u64) -> NewStored {
        NewStored {
            delay_ms: ms,
            ..msg(None)
        }
    }

    fn seg(count: u32) -> SegmentRef {
        SegmentRef {
            id: "new".into(),
            base_offset: 0,
            count,
            last_produced_ms: 1,
            bytes: u64::from(count),
        }
    }

    #[test]
    fn new_messages_get_contiguous_offsets_after_next_offset() {
        let mut m = manifest_with(3);
        let produces = vec![vec![msg(None), msg(None)], vec![msg(None)]];
        let plan = Plan::new(&produces, &m, 0, &none);
        assert_eq!(plan.new_messages(&produces).len(), 3);
        let base = place(&mut m, &seg(3));
        let got = append(&mut m, 0, 100, &produces, &plan, Some(base));
        assert_eq!(got, vec![Ok(vec![3, 4]), Ok(vec![5])]);
        assert_eq!((m.next_offset, m.segments.len()), (6, 2));
        assert_eq!(m.segments[1].base_offset, 3);
    }

    #[test]
    fn remembered_and_repeated_keys_append_nothing() {
        let mut m = manifest_with(1);
        m.dedup_insert("a", 0, 1000, 0);
        let produces = vec![vec![msg(Some("a")), msg(Some("b"))], vec![msg(Some("b"))]];
        let plan = Plan::new(&produces, &m, 10, &none);
        assert_eq!(plan.new_messages(&produces).len(), 1);
        let base = place(&mut m, &seg(1));
        let got = append(&mut m, 10, 100, &produces, &plan, Some(base));
        assert_eq!(got, vec![Ok(vec![0, 1]), Ok(vec![1])]);
        assert_eq!(m.dedup_lookup("b", 10), Some(1));
        assert_eq!(m.dedup_lookup("b", 110), None, "forgotten after the window");
    }

    #[test]
    fn an_expired_key_is_new_again() {
        let mut m = manifest_with(1);
        m.dedup_insert("a", 0, 50, 0);
        let produces = vec![vec![msg(Some("a"))]];
        assert!(Plan::new(&produces, &m, 60, &none).needs_segment());
        assert!(!Plan::new(&produces, &m, 40, &none).needs_segment());
    }

    #[test]
    fn without_a_segment_only_pure_duplicates_are_answered() {
        let mut m = manifest_with(1);
        m.dedup_insert("a", 0, 1000, 0);
        let produces = vec![vec![msg(Some("a"))], vec![msg(None)]];
        let plan = Plan::new(&produces, &m, 0, &none);
        let before = m.clone();
        let got = append(&mut m, 0, 100, &produces, &plan, None);
        assert_eq!(got, vec![Ok(vec![0]), Err(Unplaced::NoSegment)]);
        assert_eq!(m, before);
    }

    #[test]
    fn delays_are_rounded_up_to_a_fiftieth_and_never_early() {
        assert_eq!(delay_due(1_000, 30_000), 31_200);
        assert_eq!(delay_due(1_050, 10), 1_100);
        assert_eq!(delay_due(0, 43_200_000), 43_200_000);
        assert_eq!(delay_due(1, 43_200_000), 43_260_000);
        for (now, d) in [(7, 1), (123_456, 999), (5, 3_600_000)] {
            let due = delay_due(now, d);
            assert!(due >= now + d && due - (now + d) <= (d / 50).clamp(100, 60_000));
        }
    }

    #[test]
    fn delayed_messages_share_runs_and_a_produce_beyond_the_room_is_refused_whole() {
        let mut m = manifest_with(1);
        let produces = vec![vec![delayed(1000), delayed(1000), msg(None), delayed(1000)]];
        let plan = Plan::new(&produces, &m, 0, &none);
        let base = place(&mut m, &seg(4));
        assert_eq!(
            append(&mut m, 0, 100, &produces, &plan, Some(base)),
            vec![Ok(vec![1, 2, 3, 4])]
        );
        let runs: Vec<_> = m.delayed.iter().map(|d| (d.from, d.to)).collect();
        assert_eq!(runs, vec![(1, 3), (4, 5)]);
        assert_eq!(m.delayed_count(0), 3);
        assert!(m.is_available(3, 0) && !m.is_available(4, 0));

        m.delayed = (0..MAX_DELAYED_RUNS as u64 - 1)
            .map(|i| super::super::Delayed {
                from: 100 + 2 * i,
                to: 101 + 2 * i,
                until_ms: 5000,
            })
            .collect();
        let produces = vec![
            vec![delayed(10), delayed(10)],
            vec![delayed(10)],
            vec![msg(None)],
        ];
        let plan = Plan::new(&produces, &m, 0, &none);
        assert_eq!(
            plan.new_messages(&produces).len(),
            2,
            "the first produce is out"
        );
        let base = place(&mut m, &seg(2));
        let got = append(&mut m, 0, 100, &produces, &plan, Some(base));
        assert_eq!(
            got,
            vec![Err(Unplaced::DelayedFull), Ok(vec![5]), Ok(vec![6])]
        );
        // Runs that are due no longer take room.
        assert!(
            Plan::new(&produces, &m, 5000, &none)
                .new_messages(&produces)
                .len()
                == 4
        );
    }
}
