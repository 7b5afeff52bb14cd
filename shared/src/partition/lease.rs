//! Leasing: which messages a consume gets (docs/design.md §4, §5).
//!
//! A lease goes to the lowest available offset at or above the frontier (unsettled, not
//! acked ahead, not delayed, no live lease). Its id is the version of the manifest write that grants
//! it, its deadline now + the visibility timeout, and the message's delivery count goes
//! up by one. Flow control: no lease is granted while `max_in_flight` leases are live,
//! and while the acked-ahead set is full only the frontier message may go out.
//!
//! A message already delivered `max_deliveries` times (when that limit is set) is not
//! delivered again: it is *parked* under a system lease for [`DEAD_LETTER_PARK_MS`] and
//! returned in [`Leased::dead`] for the broker to move to the dead-letter topic.
//!
//! Per-key ordering (topic setting `"ordering": "key"`): an available message is passed
//! over while an earlier unsettled message (leased, lapsed, delayed, or itself passed
//! over) has the same [`key_hash`]; messages without a key are never held. The pass needs
//! the key of every unsettled offset it crosses: a lease records its message's hash, the
//! committer reads the rest from segments ([`Keys`]) and asks again when the pass stops at
//! an offset it did not know ([`Cursor::wants_key`]). A delayed message holds its key too.

use std::collections::{BTreeMap, HashSet};

#[cfg(test)]
use super::Manifest;
use super::{Lease, Ledger, Rules};

/// How long a message parked for dead-lettering stays invisible; if the move does not
/// finish in time it is parked and moved again (the move is idempotent).
pub(crate) const DEAD_LETTER_PARK_MS: u64 = 60_000;

/// How far past the frontier a per-key ordered lease looks for a message whose key is
/// free: the most flow control can hold (in flight and acked ahead) and as many again
/// of messages waiting behind their keys. Beyond it a hot key blocks the rest (head of
/// line), as SQS FIFO's message groups do past their window.
pub(crate) const MAX_ORDERED_SCAN: u64 = 30_000;

/// How a message's key takes part in per-key ordering: 0 for a message without a key
/// (ordered with nothing), else a non-zero CRC-32 of the key (two keys sharing a hash are
/// ordered together: never out of order, at worst less parallel).
pub(crate) fn key_hash(key: Option<&str>) -> u32 {
    key.map_or(0, |k| crc32fast::hash(k.as_bytes()).max(1))
}

/// The [`key_hash`] of messages by offset, read from their segments by the committer
/// (facts: an offset's message never changes). An offset missing here is unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Keys(BTreeMap<u64, u32>);

impl Keys {
    /// The key hash of `offset`, if known.
    pub(crate) fn get(&self, offset: u64) -> Option<u32> {
        self.0.get(&offset).copied()
    }

    /// Records `offset`'s key hash.
    pub(crate) fn insert(&mut self, offset: u64, hash: u32) {
        self.0.insert(offset, hash);
    }

    /// How many offsets are known.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Forgets offsets below `frontier` (settled: no lease pass crosses them again).
    pub(crate) fn forget_below(&mut self, frontier: u64) {
        self.0 = self.0.split_off(&frontier);
    }
}

/// A lease granted by a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Offset leased.
    pub offset: u64,
    /// Lease id (the version of the commit that granted it).
    pub lease_id: u64,
    /// Deliveries so far, this one included.
    pub delivery_count: u32,
}

/// What one lease request got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Leased {
    /// Messages for the consumer.
    pub grants: Vec<Grant>,
    /// Messages parked for the dead-letter topic.
    pub dead: Vec<Grant>,
}

/// Where leasing stands within one batch: several lease requests in one commit share one
/// pass over the offsets they skip, and one in-flight count. On a per-key ordered topic
/// the pass also gathers the keys of the unsettled messages it passed: a message whose
/// key is among them waits.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    next: u64,
    in_flight: usize,
    ordered: bool,
    /// Keys of unsettled messages below `next` (ordered only).
    blocked: HashSet<u32>,
    /// The key hash of the offset `pick` answered last (ordered only).
    picked_key: Option<u32>,
    /// The first offset whose key the ordered pass needed and did not know.
    pub wants_key: Option<u64>,
}

impl Cursor {
    /// A cursor at the frontier of `m`, counting the leases live at `now`; `ordered` for
    /// a per-key ordered topic.
    pub(crate) fn new(m: &impl Ledger, now: u64, ordered: bool) -> Self {
        Self {
            next: m.frontier(),
            in_flight: m.in_flight(now),
            ordered,
            blocked: HashSet::new(),
            picked_key: None,
            wants_key: None,
        }
    }

    /// The next offset to lease, if any is allowed.
    fn pick(&mut self, m: &impl Ledger, now: u64, rules: &Rules, keys: &Keys) -> Option<u64> {
        if self.in_flight >= rules.max_in_flight as usize {
            return None;
        }
        if m.acked_ahead().len() >= rules.max_acked_ahead as usize {
            // Window full: only the message blocking the frontier may go out (nothing
            // unsettled is before it, so its key is free).
            self.picked_key = m.leases().get(&m.frontier()).and_then(|l| l.key_hash);
            return m.is_available(m.frontier(), now).then_some(m.frontier());
        }
        self.next = self.next.max(m.frontier());
        if !self.ordered {
            while self.next < m.next_offset() && !m.is_available(self.next, now) {
                // A delayed run, or an undecided segment, is skipped whole: it may be long.
                self.next = match (m.delayed_run(self.next, now), m.undecided_run(self.next)) {
                    (Some(d), _) => d.to,
                    (None, Some(end)) => end,
                    (None, None) => self.next + 1,
                };
            }
            return (self.next < m.next_offset()).then_some(self.next);
        }
        while self.next < m.next_offset() && self.next - m.frontier() < MAX_ORDERED_SCAN {
            let o = self.next;
            if m.acked_ahead().contains(&o) {
                self.next += 1;
                continue;
            }
            if m.undecided_run(o).is_some() {
                // Its keys are unknown until its segment is found: nothing is passed over
                // it (every later message might share a key with one in it).
                return None;
            }
            let known = m.leases().get(&o).and_then(|l| l.key_hash);
            let Some(k) = known.or_else(|| keys.get(o)) else {
                self.wants_key = Some(o);
                return None;
            };
            if m.is_available(o, now) && (k == 0 || !self.blocked.contains(&k)) {
                self.picked_key = Some(k);
                return Some(o);
            }
            if k != 0 {
                self.blocked.insert(k);
            }
            self.next += 1;
        }
        None
    }
}

/// Leases up to `max` available messages of `m` at `now`, lowest offsets first, and no
/// more than `max_bytes` of payload by [`Manifest::message_bytes_estimate`] (the first
/// message always). The lease id is `m.version` (the version this write will have). On a
/// per-key ordered topic (the cursor's), `keys` answers the keys leases do not record;
/// the pass stops at the first offset it needs and they do not know ([`Cursor::wants_key`]).
pub(crate) fn lease(
    m: &mut impl Ledger,
    now: u64,
    rules: &Rules,
    (max, max_bytes): (usize, u64),
    cur: &mut Cursor,
    keys: &Keys,
) -> Leased {
    let mut out = Leased::default();
    let mut bytes = 0u64;
    while out.grants.len() < max {
        let Some(offset) = cur.pick(m, now, rules, keys) else {
            break;
        };
        let size = m.message_bytes_estimate(offset);
        if !out.grants.is_empty() && bytes.saturating_add(size) > max_bytes {
            break;
        }
        let version = m.lease_id();
        let lease = m.parts_mut().leases.entry(offset).or_insert(Lease {
            lease_id: 0,
            deadline_ms: 0,
            delivery_count: 0,
            key_hash: None,
        });
        lease.lease_id = version;
        if cur.ordered {
            lease.key_hash = lease.key_hash.or(cur.picked_key);
        }
        cur.in_flight += 1;
        if rules.max_deliveries > 0 && lease.delivery_count >= rules.max_deliveries {
            // Delivered often enough without an ack: park it for the dead-letter topic
            // instead of delivering it again.
            lease.deadline_ms = now + DEAD_LETTER_PARK_MS;
            out.dead.push(Grant {
                offset,
                lease_id: version,
                delivery_count: lease.delivery_count,
            });
            continue;
        }
        lease.deadline_ms = now + rules.visibility_timeout_ms;
        lease.delivery_count += 1;
        bytes = bytes.saturating_add(size);
        out.grants.push(Grant {
            offset,
            lease_id: version,
            delivery_count: lease.delivery_count,
        });
    }
    out
}

/// The offset a lease request on `m` at `now` would get first, if any (`None` also when
/// an ordered pass needs keys `keys` does not know). A guess for reading its segment
/// beside the lease's commit: another writer may take it first.
pub(crate) fn first_available(
    m: &impl Ledger,
    now: u64,
    rules: &Rules,
    keys: &Keys,
) -> Option<u64> {
    Cursor::new(m, now, rules.ordered).pick(m, now, rules, keys)
}

/// When a lease request on `m` could next get anything, if the manifest does not change
/// meanwhile: `None` when it could now; else `Some(t)`, the earliest deadline of a live
/// lease, end of a delay or next look at an undecided segment
/// ([`super::beside::next_look`]; `u64::MAX` when there is none), before which nothing
/// can be granted. An idle waiter skips the partition until then (`broker/watch.rs`). On
/// an ordered topic it needs the `keys` of the messages waiting behind their keys.
pub(crate) fn quiet_until(m: &impl Ledger, now: u64, rules: &Rules, keys: &Keys) -> Option<u64> {
    let mut probe = Cursor::new(m, now, rules.ordered);
    if probe.pick(m, now, rules, keys).is_some() || probe.wants_key.is_some() {
        // Available, or unknown without reading keys: not quiet.
        return None;
    }
    let lapses = m.leases().values().map(|l| l.deadline_ms);
    let due = m.delayed().iter().map(|d| d.until_ms);
    let look = m.next_look(now);
    let next = lapses.chain(due).filter(|&d| d > now).chain(look).min();
    Some(next.unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{leased, manifest_with, rules};

    fn offsets(l: &Leased) -> Vec<u64> {
        l.grants.iter().map(|g| g.offset).collect()
    }

    fn lease_now(m: &mut Manifest, now: u64, rules: &Rules, max: usize) -> Leased {
        let mut cur = Cursor::new(m, now, rules.ordered);
        lease(m, now, rules, (max, u64::MAX), &mut cur, &Keys::default())
    }

    #[test]
    fn the_first_available_offset_is_the_one_a_lease_gets_first() {
        let mut m = manifest_with(5);
        leased(&mut m, &[0, 1], 3, 1000);
        let r = rules();
        assert_eq!(first_available(&m, 500, &r, &Keys::default()), Some(2));
        let got = lease_now(&mut m.clone(), 500, &r, 1);
        assert_eq!(offsets(&got), vec![2]);
        // Past the deadline the lapsed lease's offset comes first again.
        assert_eq!(first_available(&m, 2000, &r, &Keys::default()), Some(0));
        leased(&mut m, &[2, 3, 4], 4, 1000);
        assert_eq!(first_available(&m, 500, &r, &Keys::default()), None);
    }

    #[test]
    fn lowest_available_offsets_first_with_the_write_version_as_lease_id() {
        let mut m = manifest_with(5);
        m.version = 9;
        leased(&mut m, &[1], 3, 1000);
        m.acked_ahead.insert(2);
        let got = lease_now(&mut m, 10, &rules(), 3);
        assert_eq!(offsets(&got), vec![0, 3, 4]);
        assert!(got.grants.iter().all(|g| g.lease_id == 9));
        assert_eq!(m.leases[&3].deadline_ms, 10 + rules().visibility_timeout_ms);
        assert!(lease_now(&mut m, 10, &rules(), 3).grants.is_empty());
    }

    #[test]
    fn a_lapsed_lease_is_available_again_and_counts_its_deliveries() {
        let mut m = manifest_with(1);
        leased(&mut m, &[0], 3, 1000);
        assert!(lease_now(&mut m, 999, &rules(), 1).grants.is_empty());
        let got = lease_now(&mut m, 1000, &rules(), 1);
        assert_eq!(offsets(&got), vec![0]);
        assert_eq!(got.grants[0].delivery_count, 2);
    }

    #[test]
    fn nothing_beyond_max_in_flight() {
        let mut m = manifest_with(5);
        let r = Rules {
            max_in_flight: 2,
            ..rules()
        };
        assert_eq!(offsets(&lease_now(&mut m, 0, &r, 5)), vec![0, 1]);
        assert!(lease_now(&mut m, 0, &r, 5).grants.is_empty());
    }

    #[test]
    fn a_full_acked_ahead_window_offers_only_the_frontier() {
        let mut m = manifest_with(5);
        m.acked_ahead.insert(2);
        let r = Rules {
            max_acked_ahead: 1,
            ..rules()
        };
        assert_eq!(offsets(&lease_now(&mut m, 0, &r, 5)), vec![0]);
        // The frontier is leased now: nothing else goes out.
        assert!(lease_now(&mut m, 0, &r, 5).grants.is_empty());
    }

    #[test]
    fn a_message_delivered_max_deliveries_times_is_parked_not_delivered() {
        let mut m = manifest_with(2);
        m.version = 4;
        m.leases.insert(
            0,
            Lease {
                lease_id: 1,
                deadline_ms: 0,
                delivery_count: 3,
                key_hash: None,
            },
        );
        let r = Rules {
            max_deliveries: 3,
            ..rules()
        };
        let got = lease_now(&mut m, 100, &r, 1);
        assert_eq!(offsets(&got), vec![1]);
        assert_eq!(got.dead.len(), 1);
        assert_eq!((got.dead[0].offset, got.dead[0].lease_id), (0, 4));
        assert_eq!(m.leases[&0].deadline_ms, 100 + DEAD_LETTER_PARK_MS);
        assert_eq!(m.leases[&0].delivery_count, 3, "parking is not a delivery");
    }

    #[test]
    fn a_segment_still_undecided_is_looked_at_again_soon() {
        let mut m = crate::partition::testing::manifest_of(&[1, 1]);
        m.segments[1].id = "0000000001000-b".into();
        crate::partition::beside::name(&mut m, "0000000001000-b");
        leased(&mut m, &[0], 3, 60_000);
        // Offset 1 is undecided: nothing to lease until a look decides it, and that is
        // soon, not when the lease on 0 lapses.
        let (soonest, _) = crate::partition::beside::LOOK_AGAIN_MS;
        assert_eq!(
            quiet_until(&m, 1_010, &rules(), &Keys::default()),
            Some(1_010 + soonest)
        );
        crate::partition::beside::decide(&mut m, ["0000000001000-b"]);
        assert_eq!(quiet_until(&m, 1_010, &rules(), &Keys::default()), None);
    }

    #[test]
    fn quiet_until_the_first_lease_lapses_and_not_while_anything_is_available() {
        let mut m = manifest_with(2);
        assert_eq!(
            quiet_until(&m, 10, &rules(), &Keys::default()),
            None,
            "two available messages"
        );
        leased(&mut m, &[0], 3, 1000);
        leased(&mut m, &[1], 3, 700);
        assert_eq!(quiet_until(&m, 10, &rules(), &Keys::default()), Some(700));
        assert_eq!(
            quiet_until(&m, 700, &rules(), &Keys::default()),
            None,
            "offset 1 lapsed"
        );
        let empty = manifest_with(0);
        assert_eq!(
            quiet_until(&empty, 10, &rules(), &Keys::default()),
            Some(u64::MAX)
        );
        let mut full = manifest_with(3);
        leased(&mut full, &[0], 3, 500);
        let r = Rules {
            max_in_flight: 1,
            ..rules()
        };
        assert_eq!(
            quiet_until(&full, 10, &r, &Keys::default()),
            Some(500),
            "flow control holds the rest"
        );
    }

    #[test]
    fn a_delayed_message_is_not_leased_before_its_time_and_counts_in_no_flow_control() {
        let mut m = manifest_with(3);
        m.delay(0, 2, 500);
        let r = Rules {
            max_in_flight: 1,
            ..rules()
        };
        assert_eq!(m.in_flight(10), 0, "a delayed message is not in flight");
        assert_eq!(m.delayed_count(10), 2);
        assert_eq!(offsets(&lease_now(&mut m, 10, &r, 3)), vec![2]);
        assert_eq!(quiet_until(&m, 10, &r, &Keys::default()), Some(500));
        // The acked-ahead window full behind a delayed frontier: nothing until it is due.
        let mut w = manifest_with(3);
        w.delay(0, 1, 500);
        w.acked_ahead.insert(1);
        let one = Rules {
            max_acked_ahead: 1,
            ..rules()
        };
        assert!(lease_now(&mut w, 10, &one, 3).grants.is_empty());
        assert_eq!(quiet_until(&w, 10, &one, &Keys::default()), Some(500));
        assert_eq!(offsets(&lease_now(&mut w, 500, &one, 3)), vec![0]);
        assert_eq!(w.delayed_count(500), 0);
    }

    /// Keys `a a b - b c` at offsets 0–5 (`-`: no key).
    fn keyed() -> (Manifest, Keys, Rules) {
        let m = manifest_with(6);
        let mut keys = Keys::default();
        for (o, k) in [Some("a"), Some("a"), Some("b"), None, Some("b"), Some("c")]
            .into_iter()
            .enumerate()
        {
            keys.insert(o as u64, key_hash(k));
        }
        let r = Rules {
            ordered: true,
            ..rules()
        };
        (m, keys, r)
    }

    fn lease_keyed(m: &mut Manifest, now: u64, r: &Rules, keys: &Keys) -> (Vec<u64>, Cursor) {
        let mut cur = Cursor::new(m, now, true);
        let got = lease(m, now, r, (10, u64::MAX), &mut cur, keys);
        (offsets(&got), cur)
    }

    #[test]
    fn an_ordered_partition_is_quiet_behind_its_keys_only_when_they_are_known() {
        let (mut m, keys, r) = keyed();
        lease_keyed(&mut m, 10, &r, &keys);
        let lapse = 10 + r.visibility_timeout_ms;
        assert_eq!(quiet_until(&m, 20, &r, &keys), Some(lapse), "1 and 4 wait");
        assert_eq!(
            quiet_until(&m, 20, &r, &Keys::default()),
            None,
            "unknown keys"
        );
        let mut settled = keys.clone();
        settled.forget_below(2);
        assert_eq!(settled.get(1), None);
        assert_eq!(settled.get(4), keys.get(4));
    }

    #[test]
    fn per_key_ordering_holds_a_message_while_an_earlier_one_of_its_key_is_unsettled() {
        let (mut m, keys, r) = keyed();
        assert_eq!(lease_keyed(&mut m, 10, &r, &keys).0, vec![0, 2, 3, 5]);
        assert_eq!(m.leases[&0].key_hash, Some(key_hash(Some("a"))), "recorded");
        assert_eq!(m.leases[&3].key_hash, Some(0));
        // Lapsed (available again, unsettled): it goes out again, still before 1 and 4.
        let t = 10 + r.visibility_timeout_ms;
        let (got, cur) = lease_keyed(&mut m.clone(), t, &r, &Keys::default());
        assert_eq!(
            (got, cur.wants_key),
            (vec![0], Some(1)),
            "1 never leased: unknown"
        );
        assert_eq!(lease_keyed(&mut m, t, &r, &keys).0, vec![0, 2, 3, 5]);
        // Settled: the next of its key follows.
        crate::partition::settle::settle(&mut m, t, &r, 0, 0, super::super::Settle::Ack).unwrap();
        assert_eq!(lease_keyed(&mut m, t, &r, &keys).0, vec![1]);
        // Without ordering, everything available goes.
        let (mut plain, keys, _) = keyed();
        let mut cur = Cursor::new(&plain, 10, false);
        let got = lease(&mut plain, 10, &rules(), (10, u64::MAX), &mut cur, &keys);
        assert_eq!(offsets(&got), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn per_key_ordering_stops_at_an_unknown_key_and_a_delayed_message_holds_its_key() {
        let (mut m, keys, r) = keyed();
        let mut some = Keys::default();
        for o in 0..3 {
            some.insert(o, keys.get(o).unwrap());
        }
        let (got, cur) = lease_keyed(&mut m.clone(), 10, &r, &some);
        assert_eq!((got, cur.wants_key), (vec![0, 2], Some(3)));
        m.delay(0, 1, 500);
        assert_eq!(lease_keyed(&mut m, 10, &r, &keys).0, vec![2, 3, 5]);
        assert_eq!(lease_keyed(&mut m, 500, &r, &keys).0, vec![0]);
    }

    #[test]
    fn one_cursor_serves_several_requests_in_a_batch() {
        let mut m = manifest_with(4);
        let mut cur = Cursor::new(&m, 0, false);
        let a = lease(
            &mut m,
            0,
            &rules(),
            (2, u64::MAX),
            &mut cur,
            &Keys::default(),
        );
        let b = lease(
            &mut m,
            0,
            &rules(),
            (3, u64::MAX),
            &mut cur,
            &Keys::default(),
        );
        assert_eq!((offsets(&a), offsets(&b)), (vec![0, 1], vec![2, 3]));
    }

    #[test]
    fn leases_stop_at_the_byte_budget_but_always_grant_one() {
        // manifest_with(n): one segment of n messages, a byte each.
        let mut m = manifest_with(6);
        let size = m.message_bytes_estimate(0);
        assert!(size > 0);
        let mut cur = Cursor::new(&m, 0, false);
        let got = lease(
            &mut m,
            0,
            &rules(),
            (6, size * 3 + size / 2),
            &mut cur,
            &Keys::default(),
        );
        assert_eq!(offsets(&got), vec![0, 1, 2]);
        let got = lease(&mut m, 0, &rules(), (6, 0), &mut cur, &Keys::default());
        assert_eq!(offsets(&got), vec![3], "one message whatever its size");
    }
}
