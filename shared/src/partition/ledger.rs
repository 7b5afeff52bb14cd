//! Where one set of competing consumers stands in a partition's log: its frontier, its
//! leases and its acks above the frontier ([`Ledger`]).
//!
//! A topic's default subscription keeps its ledger in the partition's manifest, beside the
//! log it reads ([`Manifest`]); every other subscription keeps its own in a separate object
//! and reads the log from the manifest ([`super::subscription`]). Leasing ([`super::lease`])
//! and settling ([`super::settle`]) are written once, over this trait.

use std::collections::{BTreeMap, BTreeSet};

use super::{Delayed, Lease, Manifest};

/// The parts of a ledger a settle changes, borrowed together.
pub(crate) struct LedgerMut<'a> {
    /// The lowest unsettled offset.
    pub frontier: &'a mut u64,
    /// Delivered, unsettled messages by offset.
    pub leases: &'a mut BTreeMap<u64, Lease>,
    /// Offsets acked above the frontier.
    pub acked_ahead: &'a mut BTreeSet<u64>,
}

impl LedgerMut<'_> {
    /// Advances the frontier past every contiguous acked offset.
    pub(crate) fn advance_frontier(&mut self) {
        while self.acked_ahead.remove(self.frontier) {
            *self.frontier += 1;
        }
    }
}

/// One set of competing consumers' progress through a partition's log, and the log's
/// facts leasing needs.
///
/// Invariants (every transition keeps them): every offset below `frontier` is settled;
/// `acked_ahead` holds only offsets in `(frontier, next_offset)`; `leases` only offsets in
/// `[frontier, next_offset)`, never one also in `acked_ahead`.
pub(crate) trait Ledger {
    /// The lowest unsettled offset.
    fn frontier(&self) -> u64;
    /// Delivered, unsettled messages by offset.
    fn leases(&self) -> &BTreeMap<u64, Lease>;
    /// Offsets acked above the frontier.
    fn acked_ahead(&self) -> &BTreeSet<u64>;
    /// The parts a settle or lease changes.
    fn parts_mut(&mut self) -> LedgerMut<'_>;
    /// The id of a lease this write grants: the version the write will have.
    fn lease_id(&self) -> u64;
    /// The log: the offset the next produced message gets.
    fn next_offset(&self) -> u64;
    /// The log: the run of delayed offsets holding `offset` and not yet due at `now_ms`.
    fn delayed_run(&self, offset: u64, now_ms: u64) -> Option<&Delayed>;
    /// The log: every delayed run, ascending.
    fn delayed(&self) -> &[Delayed];
    /// The log: the average payload size of the message at `offset` (0: not retained).
    fn message_bytes_estimate(&self, offset: u64) -> u64;
    /// The log: the end of the run of offsets of the undecided segment holding `offset`
    /// ([`super::beside`]), if it is in one.
    fn undecided_run(&self, offset: u64) -> Option<u64>;
    /// The log: when a waiter should look at its undecided segments again
    /// ([`super::beside::next_look`]).
    fn next_look(&self, now_ms: u64) -> Option<u64>;

    /// Leases still live at `now_ms`.
    fn in_flight(&self, now_ms: u64) -> usize {
        self.leases()
            .values()
            .filter(|l| l.deadline_ms > now_ms)
            .count()
    }

    /// Unsettled messages still delayed at `now_ms` (a delayed message settled already,
    /// cancelled, is not counted).
    fn delayed_count(&self, now_ms: u64) -> u64 {
        let frontier = self.frontier();
        self.delayed()
            .iter()
            .filter(|d| d.until_ms > now_ms && d.to > frontier)
            .map(|d| {
                let from = d.from.max(frontier);
                let settled = self.acked_ahead().range(from..d.to).count() as u64;
                (d.to - from).saturating_sub(settled)
            })
            .sum()
    }

    /// Unsettled messages at `now_ms` with no live lease and no delay: what a consume
    /// could get, flow control aside. Offsets of undecided segments count: their
    /// producers were answered, and a lease decides them by a look at their keys
    /// ([`super::beside`]).
    fn available_count(&self, now_ms: u64) -> u64 {
        let held = self.in_flight(now_ms) as u64
            + self.acked_ahead().len() as u64
            + self.delayed_count(now_ms);
        self.next_offset()
            .saturating_sub(self.frontier())
            .saturating_sub(held)
    }

    /// True when `offset` exists, is unsettled, has no live lease, is not delayed at
    /// `now_ms` and is not in an undecided segment.
    fn is_available(&self, offset: u64, now_ms: u64) -> bool {
        offset >= self.frontier()
            && offset < self.next_offset()
            && !self.acked_ahead().contains(&offset)
            && self
                .leases()
                .get(&offset)
                .is_none_or(|l| l.deadline_ms <= now_ms)
            && self.delayed_run(offset, now_ms).is_none()
            && self.undecided_run(offset).is_none()
    }
}

impl Ledger for Manifest {
    fn frontier(&self) -> u64 {
        self.frontier
    }

    fn leases(&self) -> &BTreeMap<u64, Lease> {
        &self.leases
    }

    fn acked_ahead(&self) -> &BTreeSet<u64> {
        &self.acked_ahead
    }

    fn parts_mut(&mut self) -> LedgerMut<'_> {
        LedgerMut {
            frontier: &mut self.frontier,
            leases: &mut self.leases,
            acked_ahead: &mut self.acked_ahead,
        }
    }

    fn lease_id(&self) -> u64 {
        self.version
    }

    fn next_offset(&self) -> u64 {
        self.next_offset
    }

    fn delayed_run(&self, offset: u64, now_ms: u64) -> Option<&Delayed> {
        Manifest::delayed_run(self, offset, now_ms)
    }

    fn delayed(&self) -> &[Delayed] {
        &self.delayed
    }

    fn message_bytes_estimate(&self, offset: u64) -> u64 {
        Manifest::message_bytes_estimate(self, offset)
    }

    fn undecided_run(&self, offset: u64) -> Option<u64> {
        super::beside::run(self, offset)
    }

    fn next_look(&self, now_ms: u64) -> Option<u64> {
        super::beside::next_look(self, now_ms)
    }
}
