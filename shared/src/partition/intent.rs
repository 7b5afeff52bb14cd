//! Intents: settles and lease requests that any process may commit (docs/design.md §6,
//! "Many processes on one partition").
//!
//! Combinable segments ([`super::combine`]) let one process commit other processes'
//! produces. An *intent* does the same for the other state changes: a process that finds
//! the partition contended writes an empty object under the partition's `segments/`
//! prefix whose id alone says what it asks for,
//! `{ms:013}-{unique}-i{op}`, so a committer that lists the prefix (the one listing that
//! already finds pending segments) applies it without reading it:
//!
//! | op | meaning |
//! |---|---|
//! | `a{offset}.{lease}` | ack |
//! | `e{offset}.{lease}` | extend by the visibility timeout |
//! | `x{offset}.{lease}.{ms}` | end the lease `ms` from when it lands ("retry later") |
//! | `n{offset}.{lease}` | nack |
//! | `r{offset}.{lease}` | release (a consume that could not carry the message) |
//! | `l{max}.{bytes}` | lease up to `max` messages, about `bytes` of payload |
//!
//! Intents share the id space of combinable segments: an id at or below the manifest's
//! `combined_through` is decided. A commit applies the pending intents it listed (settles
//! after produces, leases after settles, as in any batch) and records each one's
//! [`Outcome`] in the manifest's `decided` list, the last [`DECIDED_KEEP`] of them, so
//! that the writer, reading the manifest, answers its client: 204 or 410 for a settle,
//! the granted offsets for a lease. `decided_floor` is the highest id that left the list:
//! the fate of an intent at or below it can no longer be told ([`Status::Unknown`], a
//! 503 with the outcome unknown). An intent at or below `combined_through` and not in
//! the list never landed and never will ([`Status::Dead`]): its writer writes it again.
//! An intent is applied at most once, because only ids above `combined_through` are
//! applied and applying raises it past them.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::lease::{Grant, Leased};
use super::ledger::Ledger;
use super::settle::{Refused, Settle};
use super::{Lease, Manifest};

/// A state that decides intents: the partition's manifest (the default subscription's,
/// intents under `segments/`) or a subscription's ledger (intents under the ledger's own
/// prefix, [`super::subscription`]). Both keep the same three fields, and [`status`] and
/// [`record`] read and write them the same way.
pub(crate) trait Decides {
    /// Every intent id at or below it is decided.
    fn combined_through(&self) -> &str;
    /// The highest id that left [`Decides::decided`].
    fn decided_floor(&self) -> &str;
    /// The last intents applied, with what each got, oldest first.
    fn decided(&self) -> &VecDeque<(String, Outcome)>;
    /// The decided list and its floor, to record in.
    fn decisions_mut(&mut self) -> (&mut VecDeque<(String, Outcome)>, &mut String);

    /// What a new intent's id must sort above ([`super::combine::stem`]):
    /// `combined_through`, or `decided_floor` where that is higher.
    fn ids_above(&self) -> &str {
        self.combined_through().max(self.decided_floor())
    }
}

impl Decides for Manifest {
    fn combined_through(&self) -> &str {
        &self.combined_through
    }

    fn decided_floor(&self) -> &str {
        &self.decided_floor
    }

    fn decided(&self) -> &VecDeque<(String, Outcome)> {
        &self.decided
    }

    fn decisions_mut(&mut self) -> (&mut VecDeque<(String, Outcome)>, &mut String) {
        (&mut self.decided, &mut self.decided_floor)
    }
}

/// How many decided intents a manifest remembers.
pub(crate) const DECIDED_KEEP: usize = 96;

/// Most messages one lease intent asks for (a consume's `max`).
pub(crate) const MAX_LEASE_ASK: u64 = 100;

/// Characters of an intent's unique part that the manifest keeps to know it by.
pub(crate) const KEY_CHARS: usize = 16;

/// What the manifest's `decided` list knows intent `id` by: its time and the last
/// [`KEY_CHARS`] characters of its unique part (random bits of a UUIDv7), which keeps a
/// decided entry near 40 bytes.
pub(crate) fn key(id: &str) -> String {
    let mut parts = id.split('-');
    let (time, unique) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let tail = &unique[unique.len().saturating_sub(KEY_CHARS)..];
    format!("{time}-{tail}")
}

/// An id at or above every id written at the time of `key` (`~` sorts after every
/// character of an id's unique part).
fn floor_of(key: &str) -> String {
    let time = key.split('-').next().unwrap_or("");
    format!("{time}-~")
}

/// What an intent asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Settle the lease `lease_id` on `offset`.
    Settle {
        /// Offset of the leased message.
        offset: u64,
        /// Lease id from the receipt handle.
        lease_id: u64,
        /// What to do.
        action: Settle,
    },
    /// Lease up to `max` messages of about `max_bytes` of payload (the first whatever its
    /// size).
    Lease {
        /// Most leases wanted.
        max: u32,
        /// Most payload bytes wanted.
        max_bytes: u64,
    },
}

/// An intent as named by its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The object id (the last part of its key).
    pub id: String,
    /// What it asks for.
    pub ask: Ask,
    /// When it was written (ms since the epoch, the writer's clock).
    pub written_ms: u64,
}

impl Intent {
    /// The id of an intent asking `ask`, its time and unique part as
    /// [`super::combine::stem`] makes them.
    pub fn id(now_ms: u64, after: &str, unique: &str, ask: Ask) -> String {
        let op = match ask {
            Ask::Settle {
                offset,
                lease_id,
                action,
            } => match action {
                Settle::Ack => format!("a{offset}.{lease_id}"),
                Settle::Extend => format!("e{offset}.{lease_id}"),
                Settle::ExtendFor(ms) => format!("x{offset}.{lease_id}.{ms}"),
                Settle::Nack => format!("n{offset}.{lease_id}"),
                Settle::Release => format!("r{offset}.{lease_id}"),
                Settle::Cancel => format!("c{offset}.{lease_id}"),
            },
            Ask::Lease { max, max_bytes } => format!("l{max}.{max_bytes}"),
        };
        format!("{}-i{op}", super::combine::stem(now_ms, after, unique))
    }

    /// Reads an intent id; `None` for any other id (segments among them).
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.split('-');
        let (time, unique, op) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || time.len() != 13 || unique.is_empty() {
            return None;
        }
        let written_ms = time.parse().ok()?;
        let op = op.strip_prefix('i')?;
        let (tag, rest) = op.split_at_checked(1)?;
        let nums: Vec<u64> = rest
            .split('.')
            .map(|n| n.parse().ok())
            .collect::<Option<_>>()?;
        let settle = |action| match nums[..] {
            [offset, lease_id] => Some(Ask::Settle {
                offset,
                lease_id,
                action,
            }),
            _ => None,
        };
        let ask = match tag {
            "a" => settle(Settle::Ack)?,
            "e" => settle(Settle::Extend)?,
            "n" => settle(Settle::Nack)?,
            "r" => settle(Settle::Release)?,
            "c" => settle(Settle::Cancel)?,
            "x" => match nums[..] {
                [offset, lease_id, ms] => Ask::Settle {
                    offset,
                    lease_id,
                    action: Settle::ExtendFor(ms),
                },
                _ => return None,
            },
            "l" => match nums[..] {
                [max, max_bytes] if (1..=MAX_LEASE_ASK).contains(&max) => Ask::Lease {
                    max: u32::try_from(max).ok()?,
                    max_bytes,
                },
                _ => return None,
            },
            _ => return None,
        };
        let intent = Self {
            id: id.to_owned(),
            ask,
            written_ms,
        };
        // Only the canonical spelling: one intent, one id.
        (Self::id(written_ms, "", unique, ask) == id).then_some(intent)
    }
}

/// What a landed intent got, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// The settle took effect.
    #[serde(rename = "ok")]
    Done,
    /// The settle was refused: the lease is gone (410).
    #[serde(rename = "gone")]
    Gone,
    /// The settle was refused: the acked-ahead window is full (503).
    #[serde(rename = "full")]
    Full,
    /// The lease request got these leases (lease id `v`): `g` delivered, `d` parked for
    /// the dead-letter topic, each as (offset, delivery count).
    #[serde(rename = "l")]
    Leased {
        /// The lease id of every grant (the version of the commit that granted them).
        v: u64,
        /// Messages for the consumer.
        g: Vec<(u64, u32)>,
        /// Messages parked for the dead-letter topic.
        d: Vec<(u64, u32)>,
    },
}

impl Outcome {
    /// The outcome of a settle.
    pub(crate) fn settled(r: Result<(), Refused>) -> Self {
        match r {
            Ok(()) => Self::Done,
            Err(Refused::LeaseGone) => Self::Gone,
            Err(Refused::AckedAheadFull) => Self::Full,
        }
    }

    /// The outcome of a lease request granted by the write of `version`.
    pub(crate) fn leased(version: u64, got: &Leased) -> Self {
        let pairs = |g: &[Grant]| g.iter().map(|g| (g.offset, g.delivery_count)).collect();
        Self::Leased {
            v: version,
            g: pairs(&got.grants),
            d: pairs(&got.dead),
        }
    }

    /// A settle's result, as the settle itself answered it; `None` for a lease outcome.
    pub(crate) fn settle_result(&self) -> Option<Result<(), Refused>> {
        match self {
            Self::Done => Some(Ok(())),
            Self::Gone => Some(Err(Refused::LeaseGone)),
            Self::Full => Some(Err(Refused::AckedAheadFull)),
            Self::Leased { .. } => None,
        }
    }

    /// A lease request's grants; `None` for a settle outcome.
    pub(crate) fn lease_result(&self) -> Option<Leased> {
        let Self::Leased { v, g, d } = self else {
            return None;
        };
        let grants = |p: &[(u64, u32)]| {
            p.iter()
                .map(|&(offset, delivery_count)| Grant {
                    offset,
                    lease_id: *v,
                    delivery_count,
                })
                .collect()
        };
        Some(Leased {
            grants: grants(g),
            dead: grants(d),
        })
    }
}

/// Whether writing an intent for `ask` is worth it, as the state `m` a process holds
/// (maybe an old one) shows it at `now` under `rules`. Not when `m` refuses it already:
/// a lease request while nothing is available or the in-flight limit is reached, a settle
/// of a lease `m` has seen granted (its version is at least the lease id) and no longer
/// holds live. Those go the ordinary way, whose refusal writes nothing and is confirmed
/// with a conditional GET, so an idle poll or a stale handle costs no intent, and no
/// manifest write that would wake every other process's idle watch.
pub(crate) fn worth_writing(m: &impl Ledger, now: u64, rules: &super::Rules, ask: Ask) -> bool {
    match ask {
        Ask::Lease { .. } => {
            m.available_count(now) > 0 && m.in_flight(now) < rules.max_in_flight as usize
        }
        Ask::Settle {
            offset, lease_id, ..
        } => {
            m.lease_id() < lease_id
                || m.leases()
                    .get(&offset)
                    .is_some_and(|l| l.lease_id == lease_id && l.deadline_ms > now)
        }
    }
}

/// How far ahead of the committing batch's clock an intent's own time is taken (see
/// [`Intent::applied_at`]): further than any batch lasts, so only a writer whose clock runs
/// ahead of the committer's by more is held to it.
pub(crate) const MAX_LEAD_MS: u64 = 60_000;

impl Intent {
    /// The time this intent is applied at by a commit whose clock read `now` when its
    /// batch began: its own time when that is later (the batch listed it after it began,
    /// perhaps several attempts later), by at most [`MAX_LEAD_MS`]. A lease or an extend
    /// therefore runs its full visibility timeout from no earlier than the request was
    /// made, however long the commit that carries it took; an ack is judged at no
    /// earlier a time than it was asked.
    pub(crate) fn applied_at(&self, now: u64) -> u64 {
        now.max(self.written_ms.min(now.saturating_add(MAX_LEAD_MS)))
    }
}

/// What a manifest says of an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// Applied, with this outcome.
    Decided(Outcome),
    /// Not applied yet; any commit may apply it.
    Pending,
    /// Never applied, and never will be.
    Dead,
    /// Too old to tell.
    Unknown,
}

/// The fate of the intent `id` in `m`.
pub(crate) fn status(m: &impl Decides, id: &str) -> Status {
    let k = key(id);
    if let Some((_, o)) = m.decided().iter().find(|(i, _)| *i == k) {
        return Status::Decided(o.clone());
    }
    let floor = m.decided_floor();
    if !floor.is_empty() && id <= floor {
        return Status::Unknown;
    }
    if id <= m.combined_through() {
        return Status::Dead;
    }
    Status::Pending
}

/// What an intent's operation is answered, once decided ([`answered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answered {
    /// A settle's result.
    Settled(Result<(), Refused>),
    /// A lease request's grants and parked messages.
    Leased(Leased),
}

/// What the operation of the intent `id` is answered from `m`, whose leases are `leases`:
/// a settle as its outcome says, a lease request with the grants `leases` still shows
/// held by it (a later commit may have ended one already). `None` while `m` records no
/// outcome for it: its caller gets 503, the outcome unknown.
pub(crate) fn answered(
    m: &impl Decides,
    leases: &BTreeMap<u64, Lease>,
    id: &str,
) -> Option<Answered> {
    let Status::Decided(o) = status(m, id) else {
        return None;
    };
    if let Some(r) = o.settle_result() {
        return Some(Answered::Settled(r));
    }
    let mut got = o.lease_result()?;
    let held = |g: &Grant| {
        leases
            .get(&g.offset)
            .is_some_and(|l| l.lease_id == g.lease_id)
    };
    got.grants.retain(held);
    got.dead.retain(held);
    Some(Answered::Leased(got))
}

/// The intents of `listed` still pending in `m`, in id order, each once: what a commit
/// from `m` applies (decided by the state it starts from, so that landing raises
/// `combined_through` without making a listed intent look passed over).
pub(crate) fn pending<'a>(m: &impl Decides, listed: &'a [Intent]) -> Vec<&'a Intent> {
    let mut pending: Vec<&Intent> = listed
        .iter()
        .filter(|i| status(m, &i.id) == Status::Pending)
        .collect();
    pending.sort_by(|a, b| a.id.cmp(&b.id));
    pending.dedup_by(|a, b| a.id == b.id);
    pending
}

/// Records in `m` that `id` was applied with `outcome`, forgetting the oldest record
/// past [`DECIDED_KEEP`]; `decided_floor` then rises to cover every id of that record's
/// millisecond, since keys do not order like ids. Covering more than was forgotten is
/// safe: such an intent, if it never landed, is answered 503 (outcome unknown) instead
/// of being written again, and is never applied. The caller raises `combined_through`
/// past `id`.
pub(crate) fn record(m: &mut impl Decides, id: &str, outcome: Outcome) {
    let (decided, decided_floor) = m.decisions_mut();
    decided.push_back((key(id), outcome));
    while decided.len() > DECIDED_KEEP {
        if let Some((gone, _)) = decided.pop_front() {
            let floor = floor_of(&gone);
            if floor > *decided_floor {
                *decided_floor = floor;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::combine::Combinable;
    use crate::partition::testing::manifest_with;

    fn ack(offset: u64, lease_id: u64) -> Ask {
        Ask::Settle {
            offset,
            lease_id,
            action: Settle::Ack,
        }
    }

    #[test]
    fn ids_round_trip_for_every_ask() {
        let asks = [
            ack(5, 42),
            Ask::Settle {
                offset: 0,
                lease_id: 1,
                action: Settle::Extend,
            },
            Ask::Settle {
                offset: 7,
                lease_id: 9,
                action: Settle::ExtendFor(30_000),
            },
            Ask::Settle {
                offset: 3,
                lease_id: 4,
                action: Settle::Nack,
            },
            Ask::Settle {
                offset: 3,
                lease_id: 4,
                action: Settle::Release,
            },
            Ask::Settle {
                offset: 8,
                lease_id: 0,
                action: Settle::Cancel,
            },
            Ask::Lease {
                max: 10,
                max_bytes: 4 << 20,
            },
        ];
        for ask in asks {
            let id = Intent::id(1_700_000_000_000, "", "0190-abcd", ask);
            let got = Intent::parse(&id).unwrap_or_else(|| panic!("{id} parses"));
            assert_eq!((got.ask, got.written_ms), (ask, 1_700_000_000_000), "{id}");
            assert!(Combinable::parse(&id).is_none(), "{id} is no segment");
        }
    }

    #[test]
    fn segments_and_malformed_ids_are_not_intents() {
        let seg = Combinable::id(1_700_000_000_000, "", "abc", 3, 42);
        for id in [
            seg.as_str(),
            "1700000000000-0190abcd-ef01-7000-8000-000000000000",
            "1700000000000-abc-ia5",
            "1700000000000-abc-ia5.1.2",
            "1700000000000-abc-il0.10",
            "1700000000000-abc-il101.10",
            "1700000000000-abc-iq5.1",
            "1700000000000-abc-ia05.1",
            "1700000000000-abc-ia-5.1",
            "17-abc-ia5.1",
            "1700000000000--ia5.1",
        ] {
            assert!(Intent::parse(id).is_none(), "{id}");
        }
    }

    #[test]
    fn a_lagging_clock_writes_no_earlier_than_what_the_writer_knows() {
        let later = Combinable::id(5_000, "", "b", 1, 1);
        let id = Intent::id(1_000, &later, "c", ack(1, 1));
        assert!(id > later);
        assert_eq!(Intent::parse(&id).map(|i| i.written_ms), Some(5_000));
    }

    #[test]
    fn outcomes_answer_what_the_operation_would_have() {
        assert_eq!(Outcome::settled(Ok(())).settle_result(), Some(Ok(())));
        for why in [Refused::LeaseGone, Refused::AckedAheadFull] {
            assert_eq!(Outcome::settled(Err(why)).settle_result(), Some(Err(why)));
        }
        let got = Leased {
            grants: vec![Grant {
                offset: 4,
                lease_id: 9,
                delivery_count: 2,
            }],
            dead: vec![Grant {
                offset: 1,
                lease_id: 9,
                delivery_count: 5,
            }],
        };
        let o = Outcome::leased(9, &got);
        assert_eq!(o.lease_result(), Some(got));
        assert_eq!(o.settle_result(), None);
        assert_eq!(Outcome::Done.lease_result(), None);
        // Stored compactly: the manifest holds up to DECIDED_KEEP of them.
        assert_eq!(
            serde_json::to_string(&o).unwrap(),
            r#"{"l":{"v":9,"g":[[4,2]],"d":[[1,5]]}}"#
        );
        assert_eq!(serde_json::to_string(&Outcome::Gone).unwrap(), r#""gone""#);
    }

    #[test]
    fn a_decided_lease_is_answered_only_the_grants_still_held_by_it() {
        use crate::partition::testing::leased;
        let mut m = manifest_with(3);
        let (lease, settle) = (
            Ask::Lease {
                max: 2,
                max_bytes: 1,
            },
            ack(2, 4),
        );
        let (l, s) = (
            Intent::id(1, "", "a", lease),
            Intent::id(2, "", "b", settle),
        );
        assert_eq!(answered(&m, &m.leases, &l), None, "pending");
        let grant = |offset| Grant {
            offset,
            lease_id: 9,
            delivery_count: 1,
        };
        let got = Leased {
            grants: vec![grant(0), grant(1)],
            dead: vec![],
        };
        record(&mut m, &l, Outcome::leased(9, &got));
        record(&mut m, &s, Outcome::settled(Err(Refused::LeaseGone)));
        m.combined_through = s.clone();
        // Offset 1 was leased again since (another lease id): only offset 0 is its.
        leased(&mut m, &[0], 9, 100);
        leased(&mut m, &[1], 10, 100);
        let only_0 = Leased {
            grants: vec![grant(0)],
            dead: vec![],
        };
        assert_eq!(answered(&m, &m.leases, &l), Some(Answered::Leased(only_0)));
        let gone = Answered::Settled(Err(Refused::LeaseGone));
        assert_eq!(answered(&m, &m.leases, &s), Some(gone));
    }

    #[test]
    fn an_intent_is_written_only_when_the_state_held_does_not_refuse_it() {
        use crate::partition::testing::{leased, rules};
        let mut m = manifest_with(2);
        m.version = 10;
        let r = crate::partition::Rules {
            max_in_flight: 1,
            ..rules()
        };
        let lease = Ask::Lease {
            max: 1,
            max_bytes: 1,
        };
        assert!(worth_writing(&m, 5, &r, lease));
        leased(&mut m, &[0], 7, 100);
        // In flight at the limit: nothing could be granted.
        assert!(!worth_writing(&m, 5, &r, lease));
        // A live lease, one of a version not seen yet, one seen and gone, one lapsed.
        assert!(worth_writing(&m, 5, &r, ack(0, 7)));
        assert!(worth_writing(&m, 5, &r, ack(1, 11)));
        assert!(!worth_writing(&m, 5, &r, ack(1, 9)));
        assert!(!worth_writing(&m, 100, &r, ack(0, 7)));
        m.frontier = 2;
        m.leases.clear();
        assert!(!worth_writing(&m, 5, &rules(), lease), "nothing available");
    }

    #[test]
    fn forgotten_intents_are_unknown_and_passed_over_ones_dead() {
        let mut m = manifest_with(0);
        let id = |t: u64, u: &str| Intent::id(t, "", u, ack(0, 1));
        let first = id(1, "first");
        record(&mut m, &first, Outcome::Done);
        m.combined_through = first.clone();
        assert_eq!(status(&m, &first), Status::Decided(Outcome::Done));
        for i in 0..DECIDED_KEEP as u64 {
            let later = id(100 + i, "x");
            record(&mut m, &later, Outcome::Gone);
            m.combined_through = later;
        }
        assert_eq!(m.decided.len(), DECIDED_KEEP);
        assert_eq!(m.decided_floor, format!("{:013}-~", 1));
        assert_eq!(key(&first), format!("{:013}-first", 1));
        assert_eq!(status(&m, &first), Status::Unknown);
        assert_eq!(status(&m, &id(0, "late")), Status::Unknown);
        assert_eq!(status(&m, &id(5, "late")), Status::Dead);
        assert_eq!(status(&m, &id(9_999, "new")), Status::Pending);
    }
}
