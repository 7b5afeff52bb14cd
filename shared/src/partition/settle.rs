//! Ack, extend and nack: what settling a lease does to a partition (docs/design.md §4, §5).
//!
//! A settle needs a live lease with the handle's lease id; anything else is
//! [`Refused::LeaseGone`] and changes nothing. Acking the frontier advances it past every
//! contiguous acked offset; acking above it joins the acked-ahead set, refused with
//! [`Refused::AckedAheadFull`] when that set is at its limit. Extend restarts the
//! visibility window from now, or ends the lease a given time from now ("retry later");
//! nack ends the lease at once (the delivery count stays).
//! Release (internal, never from a client) ends it as if it had not been granted: a
//! consume that leased more than its response can carry gives the rest back this way.

use super::{Ledger, Rules};

/// What to do with a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Settle the message forever.
    Ack,
    /// Restart the visibility window from now.
    Extend,
    /// End the lease this many milliseconds from now, whatever the visibility timeout:
    /// "retry later" (SQS's ChangeMessageVisibility); the message comes back after it.
    ExtendFor(u64),
    /// Make the message available again at once.
    Nack,
    /// Make the message available again at once and take back its delivery: the
    /// consumer never saw it (the response had no room for it).
    Release,
    /// Settle the message forever whether or not it is leased (the lease id is not
    /// checked): `DELETE /v1/topics/{t}/messages/{p}/{o}`. A live lease's handle then
    /// gets 410; a delayed message is never delivered. Settled already: nothing changes.
    Cancel,
}

/// Why a partition refused a settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The lease the handle names is no longer held (acked, expired, nacked, redelivered).
    #[error("the lease for this receipt handle is no longer held")]
    LeaseGone,
    /// The acked-ahead window is full; the frontier message must be acked first.
    #[error("too many out-of-order acks are outstanding on this partition; retry later")]
    AckedAheadFull,
}

/// Acks, extends or nacks the lease `lease_id` on offset `o` at `now`.
///
/// Errors: [`Refused`]; a refused settle leaves `m` unchanged.
pub(crate) fn settle(
    m: &mut impl Ledger,
    now: u64,
    rules: &Rules,
    o: u64,
    lease_id: u64,
    action: Settle,
) -> Result<(), Refused> {
    if action == Settle::Cancel {
        if o < m.frontier() || o >= m.next_offset() || m.acked_ahead().contains(&o) {
            return Ok(());
        }
    } else {
        let live = m
            .leases()
            .get(&o)
            .is_some_and(|l| l.lease_id == lease_id && l.deadline_ms > now);
        if !live {
            return Err(Refused::LeaseGone);
        }
    }
    let mut m = m.parts_mut();
    match action {
        Settle::Ack | Settle::Cancel if o == *m.frontier => {
            m.leases.remove(&o);
            *m.frontier += 1;
            m.advance_frontier();
        }
        Settle::Ack | Settle::Cancel => {
            if m.acked_ahead.len() >= rules.max_acked_ahead as usize {
                return Err(Refused::AckedAheadFull);
            }
            m.leases.remove(&o);
            m.acked_ahead.insert(o);
        }
        Settle::Extend | Settle::ExtendFor(_) | Settle::Nack | Settle::Release => {
            if let Some(l) = m.leases.get_mut(&o) {
                l.deadline_ms = match action {
                    Settle::Extend => now + rules.visibility_timeout_ms,
                    Settle::ExtendFor(ms) if ms > 0 => now.saturating_add(ms),
                    _ => 0,
                };
                if action == Settle::Release {
                    l.delivery_count = l.delivery_count.saturating_sub(1);
                    if l.delivery_count == 0 {
                        m.leases.remove(&o);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{leased, manifest_with, rules};

    #[test]
    fn cancel_settles_leased_delayed_or_available_messages_and_keeps_the_delay() {
        let mut m = manifest_with(5);
        leased(&mut m, &[1], 7, 1000);
        m.delay(3, 4, 9000);
        // A leased message: settled, its handle no longer holds.
        settle(&mut m, 10, &rules(), 1, 0, Settle::Cancel).unwrap();
        assert!(m.leases.is_empty() && m.acked_ahead.contains(&1));
        assert_eq!(
            settle(&mut m, 10, &rules(), 1, 7, Settle::Ack),
            Err(Refused::LeaseGone)
        );
        // A delayed one: settled; the delay stays for other subscriptions.
        settle(&mut m, 10, &rules(), 3, 0, Settle::Cancel).unwrap();
        assert!(m.delayed_until(3, 10).is_some());
        // The frontier message: the frontier moves past every settled one.
        settle(&mut m, 10, &rules(), 0, 0, Settle::Cancel).unwrap();
        assert_eq!(m.frontier, 2);
        // Settled already, or not there: nothing changes.
        let before = m.clone();
        for o in [0, 1, 3, 99] {
            settle(&mut m, 10, &rules(), o, 0, Settle::Cancel).unwrap();
        }
        assert_eq!(m, before);
        let mut got = Vec::new();
        let mut cur = crate::partition::lease::Cursor::new(&m, 10_000, false);
        let l = crate::partition::lease::lease(
            &mut m,
            10_000,
            &rules(),
            (9, u64::MAX),
            &mut cur,
            &Default::default(),
        );
        got.extend(l.grants.iter().map(|g| g.offset));
        assert_eq!(got, [2, 4], "a cancelled message is never delivered");
    }

    #[test]
    fn ack_at_the_frontier_advances_over_acked_ahead() {
        let mut m = manifest_with(5);
        leased(&mut m, &[0, 1, 2], 7, 1000);
        settle(&mut m, 10, &rules(), 2, 7, Settle::Ack).unwrap();
        settle(&mut m, 10, &rules(), 1, 7, Settle::Ack).unwrap();
        assert_eq!((m.frontier, m.acked_ahead.len()), (0, 2));
        settle(&mut m, 10, &rules(), 0, 7, Settle::Ack).unwrap();
        assert_eq!(m.frontier, 3);
        assert!(m.acked_ahead.is_empty() && m.leases.is_empty());
    }

    #[test]
    fn extend_for_sets_the_lease_end_from_now_and_keeps_the_delivery_count() {
        let mut m = manifest_with(2);
        leased(&mut m, &[0], 7, 1000);
        settle(&mut m, 100, &rules(), 0, 7, Settle::ExtendFor(30_000)).unwrap();
        assert_eq!(m.leases[&0].deadline_ms, 30_100);
        assert_eq!(m.leases[&0].delivery_count, 1);
        assert!(!m.is_available(0, 30_099) && m.is_available(0, 30_100));
        // Shorter than what is left is allowed too: the message comes back sooner.
        settle(&mut m, 200, &rules(), 0, 7, Settle::ExtendFor(10)).unwrap();
        assert_eq!(m.leases[&0].deadline_ms, 210);
        settle(&mut m, 205, &rules(), 0, 7, Settle::ExtendFor(0)).unwrap();
        assert!(m.is_available(0, 205), "0 gives it back at once, as nack");
    }

    #[test]
    fn ack_above_the_frontier_is_refused_when_the_window_is_full() {
        let mut m = manifest_with(5);
        leased(&mut m, &[0, 1, 2], 7, 1000);
        let r = Rules {
            max_acked_ahead: 1,
            ..rules()
        };
        settle(&mut m, 10, &r, 1, 7, Settle::Ack).unwrap();
        let before = m.clone();
        assert_eq!(
            settle(&mut m, 10, &r, 2, 7, Settle::Ack),
            Err(Refused::AckedAheadFull)
        );
        assert_eq!(m, before, "a refused ack changes nothing");
        // The frontier may always be acked, and it takes the acked-ahead offset with it.
        settle(&mut m, 10, &r, 0, 7, Settle::Ack).unwrap();
        assert_eq!(m.frontier, 2);
    }

    #[test]
    fn stale_wrong_or_lapsed_leases_are_gone_and_change_nothing() {
        let mut m = manifest_with(3);
        leased(&mut m, &[0], 7, 1000);
        let before = m.clone();
        for (now, id, offset) in [(10, 6, 0), (1000, 7, 0), (2000, 7, 0), (10, 7, 1)] {
            let r = settle(&mut m, now, &rules(), offset, id, Settle::Ack);
            assert_eq!(
                r,
                Err(Refused::LeaseGone),
                "now {now} id {id} offset {offset}"
            );
        }
        assert_eq!(m, before);
    }

    #[test]
    fn extend_restarts_the_window_and_nack_ends_it_keeping_the_count() {
        let mut m = manifest_with(2);
        leased(&mut m, &[0, 1], 7, 1000);
        settle(&mut m, 500, &rules(), 0, 7, Settle::Extend).unwrap();
        assert_eq!(
            m.leases[&0].deadline_ms,
            500 + rules().visibility_timeout_ms
        );
        settle(&mut m, 500, &rules(), 1, 7, Settle::Nack).unwrap();
        assert!(m.is_available(1, 500));
        assert_eq!(m.leases[&1].delivery_count, 1);
        // Release takes the delivery back too.
        leased(&mut m, &[0], 8, 1000);
        if let Some(l) = m.leases.get_mut(&0) {
            l.delivery_count = 2;
        }
        settle(&mut m, 500, &rules(), 0, 8, Settle::Release).unwrap();
        assert_eq!(m.leases[&0].delivery_count, 1);
        assert!(m.is_available(0, 500));
        leased(&mut m, &[0], 9, 1000);
        settle(&mut m, 500, &rules(), 0, 9, Settle::Release).unwrap();
        assert!(!m.leases.contains_key(&0), "never delivered now");
        // The nacked handle is spent.
        assert_eq!(
            settle(&mut m, 500, &rules(), 1, 7, Settle::Ack),
            Err(Refused::LeaseGone)
        );
    }
}
