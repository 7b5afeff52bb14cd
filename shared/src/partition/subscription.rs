//! A subscription's ledger on one partition: `topics/{t}/subs/{s}/{id}/{p}.json`
//! ([`SubscriptionState`], a [`crate::cas::Cell`] of its own, docs/design.md §5).
//!
//! A topic's messages are stored once, in the partition's segments, listed by its
//! manifest. The default subscription keeps its frontier, leases and acks in the manifest;
//! every other subscription keeps them in this object and reads the log (which offsets
//! exist, which are delayed, where their segments are) from the manifest without writing
//! it. A produce therefore costs the same whatever the number of subscriptions, and a
//! consume or ack on one subscription writes only that subscription's object.
//!
//! The state belongs to one creation of the subscription (its `id`, time-sortable, kept in
//! the topic record): the state of a deleted subscription of the same name reads as new,
//! one of a newer creation as [`Invalid::Superseded`]. A state nothing was written to
//! starts at the offset the subscription's creation recorded for the partition.
//!
//! Retention is the topic's: when it removes messages this subscription had not settled,
//! [`SubscriptionState::catch_up`] moves the frontier past them and counts them in `lost`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::intent::{self, Ask, Decides, Intent, Outcome};
use super::lease::{self, Cursor, Keys, Leased};
use super::ledger::{Ledger, LedgerMut};
use super::settle::{self, Refused, Settle};
use super::{recent, Delayed, Lease, Manifest, Rules};
use crate::cas::{Invalid, Stored, WriteFate, WriteMark};

/// The newest subscription state format this build reads and writes: 2 adds
/// `combined_through`, `decided` and `decided_floor` (intents, fleet level 6), and is
/// written only while they hold something.
pub(crate) const STATE_FORMAT: u32 = 2;

/// The format written while no intent was ever landed in the ledger.
const FORMAT_WITHOUT_INTENTS: u32 = 1;

/// Which creation of a subscription a state belongs to, and where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The subscription's id: changes each time a subscription of its name is created,
    /// and sorts by creation time.
    pub id: String,
    /// The partition's first offset for this subscription (recorded at creation).
    pub start: u64,
}

/// One subscription's ledger on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SubscriptionState {
    /// [`STATE_FORMAT`].
    pub format: u32,
    /// Strictly increasing with every write; leases carry the version that granted them.
    pub version: u64,
    /// The subscription's id ([`Origin::id`]).
    pub subscription: String,
    /// Ids of the last writes, newest last.
    pub recent_writes: VecDeque<String>,
    /// The lowest unsettled offset.
    pub frontier: u64,
    /// Delivered, unsettled messages by offset (live or lapsed leases).
    pub leases: BTreeMap<u64, Lease>,
    /// Offsets acked above the frontier.
    pub acked_ahead: BTreeSet<u64>,
    /// Messages retention removed before this subscription settled them.
    #[serde(default)]
    pub lost: u64,
    /// Intent ids at or below this are decided (format 2; absent when none,
    /// [`intent`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub combined_through: String,
    /// The last intents landed, with what each got, oldest first (format 2).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub decided: VecDeque<(String, Outcome)>,
    /// The highest intent id that left `decided` (format 2).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub decided_floor: String,
}

impl Decides for SubscriptionState {
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

impl SubscriptionState {
    /// The state of a subscription nothing has been written to on this partition.
    pub(crate) fn new(origin: &Origin) -> Self {
        Self {
            format: STATE_FORMAT,
            version: 0,
            subscription: origin.id.clone(),
            recent_writes: VecDeque::new(),
            frontier: origin.start,
            leases: BTreeMap::new(),
            acked_ahead: BTreeSet::new(),
            lost: 0,
            combined_through: String::new(),
            decided: VecDeque::new(),
            decided_floor: String::new(),
        }
    }

    /// Whether the fields of format 2 hold anything.
    fn has_intents(&self) -> bool {
        !self.combined_through.is_empty()
            || !self.decided.is_empty()
            || !self.decided_floor.is_empty()
    }

    /// Moves the frontier to the log's oldest retained offset when retention removed
    /// messages below it, counting the unsettled ones among them in `lost`; true if it
    /// changed anything.
    pub(crate) fn catch_up(&mut self, log: &Manifest) -> bool {
        let start = log.start_offset;
        if self.frontier >= start {
            return false;
        }
        let acked_below = self.acked_ahead.range(..start).count() as u64;
        self.lost += (start - self.frontier).saturating_sub(acked_below);
        self.leases = self.leases.split_off(&start);
        self.acked_ahead = self.acked_ahead.split_off(&start);
        self.frontier = start;
        self.parts().advance_frontier();
        true
    }

    /// Settles every message of `log` for this subscription: the frontier moves to the
    /// log's next offset and every lease ends. Returns how many were unsettled.
    pub(crate) fn purge(&mut self, log: &Manifest) -> u64 {
        let next = log.next_offset.max(self.frontier);
        let acked = self.acked_ahead.range(..next).count() as u64;
        let purged = (next - self.frontier).saturating_sub(acked);
        self.frontier = next;
        self.leases = self.leases.split_off(&next);
        self.acked_ahead = self.acked_ahead.split_off(&next);
        purged
    }

    /// This state as a ledger over `log`, the partition's manifest.
    pub(crate) fn over<'a>(&'a mut self, log: &'a Manifest) -> Subscribed<'a> {
        Subscribed { state: self, log }
    }

    fn parts(&mut self) -> LedgerMut<'_> {
        LedgerMut {
            frontier: &mut self.frontier,
            leases: &mut self.leases,
            acked_ahead: &mut self.acked_ahead,
        }
    }
}

/// One operation on a subscription's ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerOp {
    /// Lease up to `max` messages, up to `max_bytes` of payload (the first always).
    Lease {
        /// Messages at most.
        max: usize,
        /// Payload bytes at most.
        max_bytes: u64,
    },
    /// Settle every message of the log for this subscription (its purge): the frontier
    /// moves to the log's next offset, every lease ends.
    Purge,
    /// Settle the lease `lease_id` on `offset`.
    Settle {
        /// The message.
        offset: u64,
        /// The lease the handle names.
        lease_id: u64,
        /// What to do.
        action: Settle,
    },
}

/// What one [`LedgerOp`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LedgerOutcome {
    /// A lease request's leases and parked messages.
    Leased(Leased),
    /// A settle's result.
    Settled(Result<(), Refused>),
    /// A purge's count: the unsettled messages it settled.
    Purged(u64),
}

/// Whether the batch `ops` needs a newer log than `log` before it is applied to `state`
/// (`None`: not read yet) at `now`: for a purge, always (it settles what the log holds
/// now); for a cancel of an offset `log` does not hold yet; for a lease request, when
/// `log` offers nothing available to `state` (a log only grows: an older one offers fewer
/// messages, never wrong ones); never for acks, extends and nacks (their leases were
/// granted over a log that held their offsets).
pub(crate) fn needs_newer_log(
    ops: &[LedgerOp],
    state: Option<&SubscriptionState>,
    log: &Manifest,
    now: u64,
) -> bool {
    let beyond = |op: &LedgerOp| match *op {
        LedgerOp::Purge => true,
        LedgerOp::Settle {
            offset,
            action: Settle::Cancel,
            ..
        } => offset >= log.next_offset,
        _ => false,
    };
    if ops.iter().any(beyond) {
        return true;
    }
    let Some(state) = state else {
        return false;
    };
    if !ops.iter().any(|op| matches!(op, LedgerOp::Lease { .. })) {
        return false;
    }
    // Bounded by the ledger's leases and acks ahead (flow control), plus one step per
    // delayed run.
    let mut o = state.frontier.max(log.start_offset);
    while o < log.next_offset {
        if let Some(d) = log.delayed_run(o, now) {
            o = d.to;
            continue;
        }
        // An undecided segment counts as something to lease: the batch looks at its key
        // (`decide_copy` in `commit/ledgers/change.rs`), which a newer log would not spare it.
        let leased = state.leases.get(&o).is_some_and(|l| l.deadline_ms > now);
        if !leased && !state.acked_ahead.contains(&o) {
            return false;
        }
        o += 1;
    }
    true
}

/// Applies one batch of operations to a subscription's state over `log` at `now`: first
/// what retention removed ([`SubscriptionState::catch_up`]), then every settle in order
/// (so acks free room for the leases), then purges, then the lease requests in order,
/// sharing one pass. One outcome per operation, in order; beside them, on a per-key ordered
/// topic, the first offset whose key the pass needed and `keys` did not hold
/// ([`Cursor::wants_key`]: the caller reads it and applies again).
pub(crate) fn apply(
    state: &mut SubscriptionState,
    log: &Manifest,
    now: u64,
    rules: &Rules,
    (ops, keys): (&[LedgerOp], &Keys),
) -> (Vec<LedgerOutcome>, Option<u64>) {
    apply_at(state, log, now, rules, (ops, &|_| now, keys))
}

/// As [`apply`], with each operation judged at its own time `at(i)` (an intent's,
/// [`Intent::applied_at`]): a settle at it, a lease running its visibility timeout from
/// it. The pass over available messages begins at `now` (a lapse it has not counted only
/// makes it more careful), as [`super::batch::apply`] does.
fn apply_at(
    state: &mut SubscriptionState,
    log: &Manifest,
    now: u64,
    rules: &Rules,
    (ops, at, keys): (&[LedgerOp], &dyn Fn(usize) -> u64, &Keys),
) -> (Vec<LedgerOutcome>, Option<u64>) {
    state.catch_up(log);
    let mut out: Vec<Option<LedgerOutcome>> = vec![None; ops.len()];
    let mut view = state.over(log);
    for (i, op) in ops.iter().enumerate() {
        if let LedgerOp::Settle {
            offset,
            lease_id,
            action,
        } = *op
        {
            let r = settle::settle(&mut view, at(i), rules, offset, lease_id, action);
            out[i] = Some(LedgerOutcome::Settled(r));
        }
    }
    for (i, op) in ops.iter().enumerate() {
        if *op == LedgerOp::Purge {
            out[i] = Some(LedgerOutcome::Purged(state.purge(log)));
        }
    }
    let mut view = state.over(log);
    let mut cursor = Cursor::new(&view, now, rules.ordered);
    for (i, op) in ops.iter().enumerate() {
        if let LedgerOp::Lease { max, max_bytes } = *op {
            let got = lease::lease(&mut view, at(i), rules, (max, max_bytes), &mut cursor, keys);
            out[i] = Some(LedgerOutcome::Leased(got));
        }
    }
    let outcomes = out
        .into_iter()
        .map(|o| o.unwrap_or(LedgerOutcome::Settled(Err(Refused::LeaseGone))))
        .collect();
    (outcomes, cursor.wants_key)
}

/// The operation an intent of a subscription's ledger asks for.
pub(crate) fn op_of(ask: Ask) -> LedgerOp {
    match ask {
        Ask::Settle {
            offset,
            lease_id,
            action,
        } => LedgerOp::Settle {
            offset,
            lease_id,
            action,
        },
        Ask::Lease { max, max_bytes } => LedgerOp::Lease {
            max: max as usize,
            max_bytes,
        },
    }
}

/// As [`apply`], landing beside the batch's own `ops` every intent of `intents` still
/// pending in `state` ([`intent::status`]: listed ones another commit decided meanwhile
/// are left out), in id order: their settles after the batch's own settles, their lease
/// requests after its own leases. Each one's outcome is recorded ([`intent::record`]) and
/// `combined_through` rises to the newest, so each lands at most once. Returns the own
/// operations' outcomes, the key [`apply`] wants, and how many intents landed.
pub(crate) fn apply_landing(
    state: &mut SubscriptionState,
    log: &Manifest,
    now: u64,
    rules: &Rules,
    (ops, keys): (&[LedgerOp], &Keys),
    intents: &[Intent],
) -> (Vec<LedgerOutcome>, Option<u64>, usize) {
    let pending = intent::pending(state, intents);
    if pending.is_empty() {
        let (out, wants) = apply(state, log, now, rules, (ops, keys));
        return (out, wants, 0);
    }
    let all: Vec<LedgerOp> = ops
        .iter()
        .copied()
        .chain(pending.iter().map(|i| op_of(i.ask)))
        .collect();
    // A commit may list an intent written after it began: judged at its own time.
    let own = ops.len();
    let at = |i: usize| {
        i.checked_sub(own)
            .map_or(now, |j| pending[j].applied_at(now))
    };
    let (mut out, wants) = apply_at(state, log, now, rules, (&all, &at, keys));
    let theirs = out.split_off(own);
    for (i, got) in pending.iter().zip(theirs) {
        let outcome = match got {
            LedgerOutcome::Leased(l) => Outcome::leased(state.version, &l),
            LedgerOutcome::Settled(r) => Outcome::settled(r),
            LedgerOutcome::Purged(_) => Outcome::Gone,
        };
        intent::record(state, &i.id, outcome);
    }
    if let Some(newest) = pending.last() {
        if newest.id > state.combined_through {
            state.combined_through.clone_from(&newest.id);
        }
    }
    (out, wants, pending.len())
}

/// A subscription's state read together with the partition's log.
pub(crate) struct Subscribed<'a> {
    state: &'a mut SubscriptionState,
    log: &'a Manifest,
}

impl Ledger for Subscribed<'_> {
    fn frontier(&self) -> u64 {
        self.state.frontier
    }

    fn leases(&self) -> &BTreeMap<u64, Lease> {
        &self.state.leases
    }

    fn acked_ahead(&self) -> &BTreeSet<u64> {
        &self.state.acked_ahead
    }

    fn parts_mut(&mut self) -> LedgerMut<'_> {
        self.state.parts()
    }

    fn lease_id(&self) -> u64 {
        self.state.version
    }

    fn next_offset(&self) -> u64 {
        self.log.next_offset
    }

    fn delayed_run(&self, offset: u64, now_ms: u64) -> Option<&Delayed> {
        self.log.delayed_run(offset, now_ms)
    }

    fn delayed(&self) -> &[Delayed] {
        &self.log.delayed
    }

    fn message_bytes_estimate(&self, offset: u64) -> u64 {
        self.log.message_bytes_estimate(offset)
    }

    fn undecided_run(&self, offset: u64) -> Option<u64> {
        super::beside::run(self.log, offset)
    }

    fn next_look(&self, now_ms: u64) -> Option<u64> {
        super::beside::next_look(self.log, now_ms)
    }
}

impl Stored for SubscriptionState {
    type Context = Origin;

    fn absent(origin: &Origin) -> Self {
        Self::new(origin)
    }

    fn decode(data: &[u8], origin: &Origin) -> Result<Self, Invalid> {
        let raw = crate::cas::open_json(data)?;
        // The format first, so a newer layout is never taken for damage.
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let Format { format } =
            serde_json::from_slice(raw).map_err(|e| Invalid::Corrupt(e.to_string()))?;
        if let Some(newer) = crate::formats::Newer::check(
            "subscription state format",
            format.into(),
            STATE_FORMAT.into(),
        ) {
            return Err(Invalid::Newer(newer));
        }
        let stored: SubscriptionState =
            serde_json::from_slice(raw).map_err(|e| Invalid::Corrupt(e.to_string()))?;
        // Left over from a deleted subscription of the same name: start afresh.
        let stored_id = stored.subscription.clone();
        crate::cas::of_generation((&stored_id, &origin.id), stored, |old| SubscriptionState {
            version: old.version,
            ..SubscriptionState::new(origin)
        })
    }

    fn encode(&self) -> Result<Bytes, crate::cas::EncodeError> {
        Ok(crate::cas::seal_json(serde_json::to_vec(self)?))
    }

    fn next_write(&mut self) {
        self.version += 1;
    }

    fn stamp(&mut self, write_id: &str) -> Option<WriteMark> {
        self.format = if self.has_intents() {
            STATE_FORMAT
        } else {
            FORMAT_WITHOUT_INTENTS
        };
        Some(recent::record(
            &mut self.recent_writes,
            write_id,
            self.version,
        ))
    }

    fn fate_of(&self, mark: &WriteMark) -> WriteFate {
        recent::fate(&self.recent_writes, self.version, mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::lease::{lease, Cursor, Keys};
    use crate::partition::settle::{settle, Refused, Settle};
    use crate::partition::testing::{ack_ask, intent, manifest_with, rules};

    fn origin(id: &str, start: u64) -> Origin {
        Origin {
            id: id.into(),
            start,
        }
    }

    fn lease_some(s: &mut SubscriptionState, log: &Manifest, now: u64, max: usize) -> Vec<u64> {
        let mut view = s.over(log);
        let mut cur = Cursor::new(&view, now, false);
        let got = lease(
            &mut view,
            now,
            &rules(),
            (max, u64::MAX),
            &mut cur,
            &Keys::default(),
        );
        got.grants.iter().map(|g| g.offset).collect()
    }

    #[test]
    fn a_subscription_leases_and_acks_without_touching_the_log() {
        let log = manifest_with(5);
        let before = log.clone();
        let mut a = SubscriptionState::new(&origin("a", 0));
        let mut b = SubscriptionState::new(&origin("b", 2));
        a.version = 7;
        assert_eq!(lease_some(&mut a, &log, 10, 3), vec![0, 1, 2]);
        assert_eq!(lease_some(&mut b, &log, 10, 9), vec![2, 3, 4]);
        // Each acks on its own: an ack in one never settles the other.
        settle(&mut a.over(&log), 10, &rules(), 0, 7, Settle::Ack).unwrap();
        assert_eq!((a.frontier, b.frontier), (1, 2));
        assert_eq!(
            settle(&mut b.over(&log), 10, &rules(), 0, 7, Settle::Ack),
            Err(Refused::LeaseGone)
        );
        settle(&mut b.over(&log), 10, &rules(), 3, 0, Settle::Ack).unwrap();
        assert_eq!(b.acked_ahead.iter().copied().collect::<Vec<_>>(), vec![3]);
        assert_eq!(log, before, "the log is read, never written");
    }

    #[test]
    fn a_batch_settles_first_then_leases_and_answers_each_operation_in_order() {
        let log = manifest_with(4);
        let mut s = SubscriptionState::new(&origin("a", 0));
        let r = Rules {
            max_in_flight: 2,
            ..rules()
        };
        s.version = 1;
        let lease2 = LedgerOp::Lease {
            max: 2,
            max_bytes: u64::MAX,
        };
        let got = apply(&mut s, &log, 10, &r, (&[lease2], &Keys::default())).0;
        assert!(matches!(&got[0], LedgerOutcome::Leased(l) if l.grants.len() == 2));
        s.version = 2;
        let ack = |offset| LedgerOp::Settle {
            offset,
            lease_id: 1,
            action: Settle::Ack,
        };
        // The lease comes first, yet the acks before it free its room.
        let got = apply(
            &mut s,
            &log,
            10,
            &r,
            (&[lease2, ack(0), ack(9)], &Keys::default()),
        )
        .0;
        match &got[0] {
            LedgerOutcome::Leased(l) => {
                assert_eq!(l.grants.iter().map(|g| g.offset).collect::<Vec<_>>(), [2])
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(got[1], LedgerOutcome::Settled(Ok(())));
        assert_eq!(got[2], LedgerOutcome::Settled(Err(Refused::LeaseGone)));
        assert_eq!(s.frontier, 1);
    }

    #[test]
    fn a_purge_settles_everything_the_log_holds_for_this_subscription_only() {
        let log = manifest_with(6);
        let mut s = SubscriptionState::new(&origin("a", 1));
        s.version = 3;
        let lease2 = LedgerOp::Lease {
            max: 2,
            max_bytes: u64::MAX,
        };
        apply(&mut s, &log, 10, &rules(), (&[lease2], &Keys::default()));
        s.acked_ahead.insert(4);
        s.version = 4;
        let got = apply(
            &mut s,
            &log,
            10,
            &rules(),
            (&[LedgerOp::Purge, lease2], &Keys::default()),
        )
        .0;
        // 1..6 were unsettled but for 4 (acked): four settled; nothing left to lease.
        assert_eq!(got[0], LedgerOutcome::Purged(4));
        assert_eq!(got[1], LedgerOutcome::Leased(Leased::default()));
        assert_eq!(s.frontier, 6);
        assert!(s.leases.is_empty() && s.acked_ahead.is_empty());
        let ack = LedgerOp::Settle {
            offset: 1,
            lease_id: 3,
            action: Settle::Ack,
        };
        assert_eq!(
            apply(&mut s, &log, 10, &rules(), (&[ack], &Keys::default())).0[0],
            LedgerOutcome::Settled(Err(Refused::LeaseGone)),
            "a handle of before the purge is gone"
        );
    }

    #[test]
    fn a_delayed_message_of_the_log_waits_for_every_subscription() {
        let mut log = manifest_with(3);
        log.delay(1, 2, 500);
        let mut s = SubscriptionState::new(&origin("a", 0));
        assert_eq!(lease_some(&mut s, &log, 10, 9), vec![0, 2]);
        assert_eq!(lease_some(&mut s, &log, 500, 9), vec![1]);
    }

    #[test]
    fn retention_past_the_frontier_counts_what_was_never_settled() {
        let mut log = manifest_with(10);
        let mut s = SubscriptionState::new(&origin("a", 0));
        assert_eq!(lease_some(&mut s, &log, 10, 4), vec![0, 1, 2, 3]);
        settle(&mut s.over(&log), 10, &rules(), 2, 0, Settle::Ack).unwrap();
        settle(&mut s.over(&log), 10, &rules(), 5, 0, Settle::Ack).unwrap_err();
        s.acked_ahead.insert(6);
        log.start_offset = 5;
        assert!(s.catch_up(&log));
        // 0, 1, 3 and 4 were unsettled; 2 had been acked.
        assert_eq!(s.lost, 4);
        assert_eq!(s.frontier, 5);
        assert!(s.leases.is_empty());
        log.start_offset = 6;
        assert!(s.catch_up(&log));
        // 5 lost; 6 was acked, so the frontier passes it.
        assert_eq!((s.lost, s.frontier), (5, 7));
        assert!(s.acked_ahead.is_empty());
        assert!(!s.catch_up(&log));
    }

    #[test]
    fn a_deleted_subscriptions_state_reads_as_new_and_a_newer_ones_as_superseded() {
        let mut old = SubscriptionState::new(&origin("a1", 0));
        old.version = 9;
        old.frontier = 4;
        let bytes = old.encode().unwrap();
        let back = SubscriptionState::decode(&bytes, &origin("a1", 0)).unwrap();
        assert_eq!(back, old);
        let fresh = SubscriptionState::decode(&bytes, &origin("a2", 7)).unwrap();
        assert_eq!((fresh.version, fresh.frontier), (9, 7));
        assert!(matches!(
            SubscriptionState::decode(&bytes, &origin("a0", 0)),
            Err(Invalid::Superseded)
        ));
    }

    #[test]
    fn a_newer_format_is_newer_not_corrupt() {
        let json = br#"{"format":3,"layout":"something else"}"#;
        assert!(matches!(
            SubscriptionState::decode(json, &origin("a", 0)),
            Err(Invalid::Newer(_))
        ));
        assert!(matches!(
            SubscriptionState::decode(b"{}", &origin("a", 0)),
            Err(Invalid::Corrupt(_))
        ));
    }

    #[test]
    fn a_newer_log_is_needed_only_when_a_lease_finds_nothing_in_this_one() {
        let log = manifest_with(3);
        let lease_one = LedgerOp::Lease {
            max: 1,
            max_bytes: u64::MAX,
        };
        let ack = LedgerOp::Settle {
            offset: 0,
            lease_id: 1,
            action: Settle::Ack,
        };
        let at = |frontier| SubscriptionState::new(&origin("s", frontier));
        assert!(
            !needs_newer_log(&[ack], Some(&at(3)), &log, 0),
            "settles alone"
        );
        assert!(!needs_newer_log(&[lease_one], Some(&at(0)), &log, 0));
        assert!(needs_newer_log(&[ack, lease_one], Some(&at(3)), &log, 0));
        assert!(
            !needs_newer_log(&[lease_one], None, &log, 0),
            "no ledger yet"
        );
        // Everything leased, acked ahead or delayed: nothing to lease in this log.
        let mut s = at(0);
        s.leases.insert(
            0,
            Lease {
                lease_id: 1,
                deadline_ms: 100,
                delivery_count: 1,
                key_hash: None,
            },
        );
        s.acked_ahead.insert(1);
        let mut delayed = log.clone();
        delayed.delay(2, 3, 500);
        assert!(needs_newer_log(&[lease_one], Some(&s), &delayed, 50));
        // A lease lapses, a delay ends: available again without a read.
        assert!(!needs_newer_log(&[lease_one], Some(&s), &delayed, 100));
        assert!(!needs_newer_log(&[lease_one], Some(&s), &log, 50));
        // A cancel of an offset this log does not hold yet, and a purge: always.
        let cancel = |offset| LedgerOp::Settle {
            offset,
            lease_id: 0,
            action: Settle::Cancel,
        };
        assert!(!needs_newer_log(&[cancel(2)], Some(&s), &log, 50));
        assert!(needs_newer_log(&[cancel(3)], Some(&s), &log, 50));
        assert!(needs_newer_log(&[cancel(3)], None, &log, 50));
        assert!(needs_newer_log(&[LedgerOp::Purge], None, &log, 50));
    }

    #[test]
    fn intents_land_once_in_id_order_after_the_batchs_own_operations() {
        let log = manifest_with(4);
        let mut s = SubscriptionState::new(&origin("a", 0));
        s.version = 3;
        let one = LedgerOp::Lease {
            max: 1,
            max_bytes: u64::MAX,
        };
        apply(&mut s, &log, 10, &rules(), (&[one], &Keys::default()));
        assert_eq!(s.leases.keys().copied().collect::<Vec<_>>(), vec![0]);
        s.version = 4;
        let lease = intent(
            20,
            "b",
            Ask::Lease {
                max: 2,
                max_bytes: u64::MAX,
            },
        );
        let ack = intent(30, "c", ack_ask(0, 3));
        let stale = intent(25, "d", ack_ask(3, 1));
        // The batch's own lease comes first; the lease intent after it, in id order.
        let listed = [ack.clone(), lease.clone(), stale.clone(), ack.clone()];
        let (own, _, landed) = apply_landing(
            &mut s,
            &log,
            40,
            &rules(),
            (&[one], &Keys::default()),
            &listed,
        );
        assert_eq!(landed, 3, "the duplicate listing lands once");
        assert!(matches!(&own[0], LedgerOutcome::Leased(l) if l.grants[0].offset == 1));
        assert_eq!(
            intent::status(&s, &ack.id),
            intent::Status::Decided(Outcome::Done)
        );
        assert_eq!(
            intent::status(&s, &stale.id),
            intent::Status::Decided(Outcome::Gone)
        );
        let want = Outcome::Leased {
            v: 4,
            g: vec![(2, 1), (3, 1)],
            d: vec![],
        };
        assert_eq!(intent::status(&s, &lease.id), intent::Status::Decided(want));
        assert_eq!(s.combined_through, ack.id);
        assert_eq!(s.frontier, 1, "the intent's ack settled offset 0");
        // Landed again against the state they left: nothing changes.
        let before = s.clone();
        let (_, _, again) =
            apply_landing(&mut s, &log, 50, &rules(), (&[], &Keys::default()), &listed);
        assert_eq!((again, &s), (0, &before));
        // Passed over: an id at or below `combined_through` never lands.
        let late = intent(21, "e", ack_ask(1, 4));
        assert_eq!(intent::status(&s, &late.id), intent::Status::Dead);
    }

    #[test]
    fn an_intent_written_after_the_batch_began_runs_its_lease_from_its_own_time() {
        // The batch's clock read 1000; it listed intents written at 1800 and 2000 on a
        // later attempt. Their leases must run a full visibility timeout from then.
        let log = manifest_with(2);
        let r = rules();
        let vis = r.visibility_timeout_ms;
        let mut s = SubscriptionState::new(&origin("a", 0));
        let one = LedgerOp::Lease {
            max: 1,
            max_bytes: u64::MAX,
        };
        apply(&mut s, &log, 900, &r, (&[one], &Keys::default()));
        let lease_id = s.leases[&0].lease_id;
        let extend = intent(
            1800,
            "a",
            Ask::Settle {
                offset: 0,
                lease_id,
                action: Settle::Extend,
            },
        );
        let lease = intent(
            2000,
            "b",
            Ask::Lease {
                max: 1,
                max_bytes: u64::MAX,
            },
        );
        let listed = [extend.clone(), lease];
        let (_, _, landed) =
            apply_landing(&mut s, &log, 1000, &r, (&[], &Keys::default()), &listed);
        assert_eq!(landed, 2);
        assert_eq!(
            intent::status(&s, &extend.id),
            intent::Status::Decided(Outcome::Done)
        );
        assert_eq!(s.leases[&0].deadline_ms, 1800 + vis);
        assert_eq!(s.leases[&1].deadline_ms, 2000 + vis);
        // An ack is judged at its own time too: asked after the lease lapsed, it is gone.
        let mut s = SubscriptionState::new(&origin("a", 0));
        apply(&mut s, &log, 100, &r, (&[one], &Keys::default()));
        let lapsed = s.leases[&0].clone();
        let late = intent(100 + vis + 1, "c", ack_ask(0, lapsed.lease_id));
        let listed = std::slice::from_ref(&late);
        apply_landing(
            &mut s,
            &log,
            100 + vis - 1,
            &r,
            (&[], &Keys::default()),
            listed,
        );
        assert_eq!(
            intent::status(&s, &late.id),
            intent::Status::Decided(Outcome::Gone)
        );
    }

    #[test]
    fn a_ledger_is_written_in_format_2_only_once_it_decided_an_intent() {
        let mut s = SubscriptionState::new(&origin("a", 0));
        s.stamp("w1");
        assert_eq!(s.format, 1);
        let text = String::from_utf8(s.encode().unwrap().to_vec()).unwrap();
        assert!(!text.contains("combined_through"), "{text}");
        let log = manifest_with(1);
        let i = intent(
            5,
            "x",
            Ask::Lease {
                max: 1,
                max_bytes: 1,
            },
        );
        apply_landing(&mut s, &log, 10, &rules(), (&[], &Keys::default()), &[i]);
        s.stamp("w2");
        assert_eq!(s.format, 2);
        let back = SubscriptionState::decode(&s.encode().unwrap(), &origin("a", 0)).unwrap();
        assert_eq!(back, s);
    }
}
