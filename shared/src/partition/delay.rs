//! Delayed messages (docs/design.md §5): runs of offsets not delivered before a time,
//! kept in the manifest ([`Manifest::delayed`], format 5). A delayed message is unsettled:
//! it holds the frontier until it has been delivered and acked, and counts in neither the
//! in-flight limit nor the acked-ahead set.

use serde::{Deserialize, Serialize};

use super::{Ledger, Manifest};

/// Offsets `[from, to)` are not delivered before wall-clock ms `until_ms` (a delayed
/// produce). Stored as a three-number JSON array to keep manifests small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u64, u64, u64)", into = "(u64, u64, u64)")]
pub struct Delayed {
    /// First delayed offset.
    pub from: u64,
    /// One past the last.
    pub to: u64,
    /// Not delivered before this, wall-clock ms.
    pub until_ms: u64,
}

impl From<(u64, u64, u64)> for Delayed {
    fn from((from, to, until_ms): (u64, u64, u64)) -> Self {
        Self { from, to, until_ms }
    }
}

impl From<Delayed> for (u64, u64, u64) {
    fn from(d: Delayed) -> Self {
        (d.from, d.to, d.until_ms)
    }
}

impl Manifest {
    /// The run of delayed offsets holding `offset` and not yet due at `now_ms`, if any.
    pub(crate) fn delayed_run(&self, offset: u64, now_ms: u64) -> Option<&Delayed> {
        let i = self.delayed.partition_point(|d| d.from <= offset);
        let d = self.delayed.get(i.checked_sub(1)?)?;
        (offset < d.to && d.until_ms > now_ms).then_some(d)
    }

    #[cfg(test)]
    /// When `offset`'s delay ends, if it is delayed at `now_ms`.
    pub(crate) fn delayed_until(&self, offset: u64, now_ms: u64) -> Option<u64> {
        self.delayed_run(offset, now_ms).map(|d| d.until_ms)
    }

    /// Unsettled messages at `now_ms` with no live lease and no delay
    /// ([`Ledger::available_count`]).
    pub(crate) fn available_count(&self, now_ms: u64) -> u64 {
        Ledger::available_count(self, now_ms)
    }

    /// Unsettled messages still delayed at `now_ms` ([`Ledger::delayed_count`]).
    pub(crate) fn delayed_count(&self, now_ms: u64) -> u64 {
        Ledger::delayed_count(self, now_ms)
    }

    /// Delays `[from, to)` until `until_ms`, extending the last run when it ends at `from`
    /// with the same time. Offsets are delayed as they are appended, so runs stay ordered.
    pub(crate) fn delay(&mut self, from: u64, to: u64, until_ms: u64) {
        match self.delayed.last_mut() {
            Some(d) if d.to == from && d.until_ms == until_ms => d.to = to,
            _ => self.delayed.push(Delayed { from, to, until_ms }),
        }
    }

    /// Forgets runs that are due at `now_ms` or no longer retained; true if any left.
    /// A run below the frontier stays until due: the default subscription may have
    /// settled (cancelled) its messages, other subscriptions have not.
    pub(crate) fn expire_delays(&mut self, now_ms: u64) -> bool {
        let before = self.delayed.len();
        let start = self.start_offset;
        self.delayed.retain(|d| d.until_ms > now_ms && d.to > start);
        self.delayed.len() != before
    }
}
