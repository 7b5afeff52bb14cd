//! Leasing: which messages a consume gets (docs/design.md §4, §5).
//!
//! A lease goes to the lowest available offset at or above the frontier (unsettled, not
//! acked ahead, no live lease). Its id is the version of the manifest write that grants
//! it, its deadline now + the visibility timeout, and the message's delivery count goes
//! up by one. Flow control: no lease is granted while `max_in_flight` leases are live,
//! and while the acked-ahead set is full only the frontier message may go out.
//!
//! A message already delivered `max_deliveries` times (when that limit is set) is not
//! delivered again: it is *parked* under a system lease for [`DEAD_LETTER_PARK_MS`] and
//! returned in [`Leased::dead`] for the broker to move to the dead-letter topic.

use super::{Lease, Manifest, Rules};

/// How long a message parked for dead-lettering stays invisible; if the move does not
/// finish in time it is parked and moved again (the move is idempotent).
pub const DEAD_LETTER_PARK_MS: u64 = 60_000;

/// A lease granted by a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Offset leased.
    pub offset: u64,
    /// Lease id (the version of the commit that granted it).
    pub lease_id: u64,
    /// Deliveries so far, this one included.
    pub delivery_count: u32,
}

/// What one lease request got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leased {
    /// Messages for the consumer.
    pub grants: Vec<Grant>,
    /// Messages parked for the dead-letter topic.
    pub dead: Vec<Grant>,
}

/// Where leasing stands within one batch: several lease requests in one commit share one
/// pass over the offsets they skip, and one in-flight count.
#[derive(Debug, Clone, Copy)]
pub struct Cursor {
    next: u64,
    in_flight: usize,
}

impl Cursor {
    /// A cursor at the frontier of `m`, counting the leases live at `now`.
    pub fn new(m: &Manifest, now: u64) -> Self {
        Self {
            next: m.frontier,
            in_flight: m.in_flight(now),
        }
    }

    /// The next offset to lease, if any is allowed.
    fn pick(&mut self, m: &Manifest, now: u64, rules: &Rules) -> Option<u64> {
        if self.in_flight >= rules.max_in_flight as usize {
            return None;
        }
        if m.acked_ahead.len() >= rules.max_acked_ahead as usize {
            // Window full: only the message blocking the frontier may go out.
            return m.is_available(m.frontier, now).then_some(m.frontier);
        }
        self.next = self.next.max(m.frontier);
        while self.next < m.next_offset && !m.is_available(self.next, now) {
            self.next += 1;
        }
        (self.next < m.next_offset).then_some(self.next)
    }
}

/// Leases up to `max` available messages of `m` at `now`, lowest offsets first, and no
/// more than `max_bytes` of payload by [`Manifest::message_bytes_estimate`] (the first
/// message always). The lease id is `m.version` (the version this write will have).
pub fn lease(
    m: &mut Manifest,
    now: u64,
    rules: &Rules,
    (max, max_bytes): (usize, u64),
    cur: &mut Cursor,
) -> Leased {
    let mut out = Leased::default();
    let mut bytes = 0u64;
    while out.grants.len() < max {
        let Some(offset) = cur.pick(m, now, rules) else {
            break;
        };
        let size = m.message_bytes_estimate(offset);
        if !out.grants.is_empty() && bytes.saturating_add(size) > max_bytes {
            break;
        }
        let version = m.version;
        let lease = m.leases.entry(offset).or_insert(Lease {
            lease_id: 0,
            deadline_ms: 0,
            delivery_count: 0,
        });
        lease.lease_id = version;
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

/// When a lease request on `m` could next get anything, if the manifest does not change
/// meanwhile: `None` when it could now; else `Some(t)`, the earliest deadline of a live
/// lease or end of a delay (`u64::MAX` when there is none), before which nothing can be
/// granted. An idle waiter skips the partition until then (`broker/watch.rs`).
pub fn quiet_until(m: &Manifest, now: u64, rules: &Rules) -> Option<u64> {
    if Cursor::new(m, now).pick(m, now, rules).is_some() {
        return None;
    }
    let lapses = m.leases.values().map(|l| l.deadline_ms);
    let due = m.delayed.iter().map(|d| d.until_ms);
    let next = lapses.chain(due).filter(|&d| d > now).min();
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
        let mut cur = Cursor::new(m, now);
        lease(m, now, rules, (max, u64::MAX), &mut cur)
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
    fn quiet_until_the_first_lease_lapses_and_not_while_anything_is_available() {
        let mut m = manifest_with(2);
        assert_eq!(
            quiet_until(&m, 10, &rules()),
            None,
            "two available messages"
        );
        leased(&mut m, &[0], 3, 1000);
        leased(&mut m, &[1], 3, 700);
        assert_eq!(quiet_until(&m, 10, &rules()), Some(700));
        assert_eq!(quiet_until(&m, 700, &rules()), None, "offset 1 lapsed");
        let empty = manifest_with(0);
        assert_eq!(quiet_until(&empty, 10, &rules()), Some(u64::MAX));
        let mut full = manifest_with(3);
        leased(&mut full, &[0], 3, 500);
        let r = Rules {
            max_in_flight: 1,
            ..rules()
        };
        assert_eq!(
            quiet_until(&full, 10, &r),
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
        assert_eq!(quiet_until(&m, 10, &r), Some(500));
        // The acked-ahead window full behind a delayed frontier: nothing until it is due.
        let mut w = manifest_with(3);
        w.delay(0, 1, 500);
        w.acked_ahead.insert(1);
        let one = Rules {
            max_acked_ahead: 1,
            ..rules()
        };
        assert!(lease_now(&mut w, 10, &one, 3).grants.is_empty());
        assert_eq!(quiet_until(&w, 10, &one), Some(500));
        assert_eq!(offsets(&lease_now(&mut w, 500, &one, 3)), vec![0]);
        assert_eq!(w.delayed_count(500), 0);
    }

    #[test]
    fn one_cursor_serves_several_requests_in_a_batch() {
        let mut m = manifest_with(4);
        let mut cur = Cursor::new(&m, 0);
        let a = lease(&mut m, 0, &rules(), (2, u64::MAX), &mut cur);
        let b = lease(&mut m, 0, &rules(), (3, u64::MAX), &mut cur);
        assert_eq!((offsets(&a), offsets(&b)), (vec![0, 1], vec![2, 3]));
    }

    #[test]
    fn leases_stop_at_the_byte_budget_but_always_grant_one() {
        // manifest_with(n): one segment of n messages, a byte each.
        let mut m = manifest_with(6);
        let size = m.message_bytes_estimate(0);
        assert!(size > 0);
        let mut cur = Cursor::new(&m, 0);
        let got = lease(&mut m, 0, &rules(), (6, size * 3 + size / 2), &mut cur);
        assert_eq!(offsets(&got), vec![0, 1, 2]);
        let got = lease(&mut m, 0, &rules(), (6, 0), &mut cur);
        assert_eq!(offsets(&got), vec![3], "one message whatever its size");
    }
}
