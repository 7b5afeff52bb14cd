//! Many processes on one subscription's ledger: intents instead of races (docs/design.md
//! §5, "Ledgers across processes").
//!
//! Every process commits its own operations to a ledger, so on one partition several
//! processes race for one object, and the one that wrote last wins again: it writes one
//! round trip later, before the losers have read the ledger again. The way through is the
//! manifest's (§6, [`super::super::combine`]), on the ledger's own prefix
//! `topics/{t}/subs/{s}/{id}/{p}/`:
//!
//! 1. once the ledger is *contended* here (a batch lost races, a look found other
//!    processes' intents, or a wait saw the ledger change), a batch of at most
//!    [`MAX_OWN_INTENTS`] settles and lease requests that the ledger as known does not
//!    refuse already ([`intent::worth_writing`]) writes one intent per operation, each an
//!    empty object whose id names it ([`Intent`]), above the ids the ledger decided;
//! 2. it waits about one and a quarter store round trips and reads the ledger (a
//!    conditional GET): every intent *decided*, it answers from the outcomes the ledger
//!    records; *dead* (a commit moved past it), it writes that one again; *pending*, it
//!    waits a round trip and reads again, up to [`MAX_POLLS`] reads;
//! 3. when a read shows the ledger unchanged (nobody is committing), it lists the prefix
//!    and, unless an older writer's intent is pending (that writer takes over first),
//!    commits itself: one CAS landing every pending intent listed, its own among them,
//!    and becomes the ledger's *committer*;
//! 4. the committer commits its own operations as they are, lands with each commit what
//!    its listing made beside the previous commit found ([`super::super::listing::Ahead`]), and while its
//!    queue is empty keeps sweeping (list, and land what is pending) as the manifest's
//!    committer does ([`super::super::role::Role`]).
//!
//! [`crate::partition::subscription::apply_landing`] lands each intent at most once: only
//! ids above the ledger's `combined_through`, which landing raises past them. An answer
//! comes only from a ledger read or written that records the outcome. Not on per-key
//! ordered topics: a lease there reads message keys first, which an intent cannot carry.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::batch::MAX_OWN_INTENTS;
use super::super::listing::Listed;
use super::super::replies::{answer_intents, Answer};
use super::super::wait::{Holds, Own, Waited, Waits};
use super::super::{lock, Committer, Object};
use super::{Known, LedgerQueue};
use crate::cas::Cell;
use crate::error::{BrokerError, BrokerResult};
use crate::partition::intent::{self, Answered, Ask, Decides, Intent, MAX_LEASE_ASK};
use crate::partition::subscription::{LedgerOp, SubscriptionState};
use crate::partition::{Manifest, Rules};

/// How a batch that wrote intents goes on.
pub(super) enum Awaited {
    /// Other processes' commits decided every one of its intents (in batch order).
    Decided(Vec<Intent>),
    /// This process commits: its own intents, and what its listing found pending.
    TakeOver {
        own: Vec<Intent>,
        listed: Vec<Intent>,
    },
}

/// What one ledger operation asks for as an intent; `None` for one that cannot be one (a
/// purge, a lease of more than [`MAX_LEASE_ASK`] messages).
pub(super) fn ask_of(op: LedgerOp) -> Option<Ask> {
    match op {
        LedgerOp::Settle {
            offset,
            lease_id,
            action,
        } => Some(Ask::Settle {
            offset,
            lease_id,
            action,
        }),
        LedgerOp::Lease { max, max_bytes } => {
            let max = u32::try_from(max)
                .ok()
                .filter(|m| (1..=MAX_LEASE_ASK).contains(&u64::from(*m)))?;
            Some(Ask::Lease { max, max_bytes })
        }
        LedgerOp::Purge => None,
    }
}

impl LedgerQueue {
    /// Whether the batch `ops` writes intents (step 1 of the module documentation): the
    /// fleet writes them, the ledger is contended here and this process is not its
    /// committer, and the ledger and log as known do not refuse any of them.
    pub(super) fn combines(
        &self,
        c: &Committer,
        ops: &[LedgerOp],
        rules: &Rules,
        known: &mut Known,
    ) -> bool {
        if ops.is_empty()
            || ops.len() > MAX_OWN_INTENTS
            || rules.ordered
            || !c.level.get().combines_ledgers()
        {
            return false;
        }
        {
            let st = lock(&self.state);
            if !st.role.contended(crate::runtime::now()) || st.role.is_committer() {
                return false;
            }
        }
        let (Some(ledger), Some((log, _))) = (known.ledger.as_mut(), known.log.as_ref()) else {
            return false;
        };
        if ledger.etag.is_none() {
            return false;
        }
        let now = c.clock.now_ms();
        let view = ledger.value.over(&log.value);
        ops.iter()
            .all(|op| ask_of(*op).is_some_and(|a| intent::worth_writing(&view, now, rules, a)))
    }

    /// Steps 1 to 3 of the module documentation for `ops`, over the ledger in `known`
    /// (which it keeps as read).
    ///
    /// Errors: an intent's write or the ledger's read failing;
    /// [`BrokerError::OutcomeUnknown`] when the fate of an intent can no longer be told.
    pub(super) async fn await_intents(
        &self,
        c: &Committer,
        ops: &[LedgerOp],
        known: &mut Known,
    ) -> BrokerResult<Awaited> {
        let Some(snap) = known.ledger.as_ref() else {
            return Err(BrokerError::Internal("no ledger to wait on".into()));
        };
        let started = crate::runtime::now();
        let after = snap.value.ids_above().to_owned();
        let own = futures::future::try_join_all(
            ops.iter()
                .filter_map(|op| ask_of(*op))
                .map(|ask| c.write_intent(self, &after, ask)),
        )
        .await?;
        self.wait_intents(c, own, known, started.elapsed()).await
    }

    /// Steps 2 and 3 of the module documentation for the intents `own`, written
    /// `round_trip` ago, over the ledger in `known` (which it keeps as read)
    /// ([`Committer::wait`]). Also for intents a takeover's own commit passed over
    /// (another commit moved past them first): they are written again, and waited for as
    /// before.
    ///
    /// Errors: as [`LedgerQueue::await_intents`].
    pub(super) async fn wait_intents(
        &self,
        c: &Committer,
        own: Vec<Intent>,
        known: &mut Known,
        round_trip: std::time::Duration,
    ) -> BrokerResult<Awaited> {
        let cell =
            Cell::<SubscriptionState>::new(&*c.store, &*c.ids, &self.ledger_key, &self.origin);
        let Some(snap) = known.ledger.as_mut() else {
            return Err(BrokerError::Internal("no ledger to wait on".into()));
        };
        let mut own = Own {
            segment: None,
            intents: own,
        };
        let listed = match c.wait(self, (&cell, snap), &mut own, round_trip).await? {
            Waited::Decided(_) => return Ok(Awaited::Decided(own.intents)),
            Waited::Corrupt => return Err(BrokerError::Corrupt(self.ledger_key.clone())),
            Waited::TakeOver(Some(listed)) => listed,
            Waited::TakeOver(None) => c.list_after(self, &snap.value.combined_through).await,
        };
        c.stats.takeovers.fetch_add(1, Ordering::Relaxed);
        Ok(Awaited::TakeOver {
            own: own.intents,
            listed: listed.intents,
        })
    }

    /// What the committer's next commit lands: the listing made beside its last commit
    /// when it is younger than [`super::super::listing::AHEAD_FOR`], else a listing made
    /// now.
    pub(super) async fn landing(
        &self,
        c: &Committer,
        state: Option<&SubscriptionState>,
    ) -> Vec<Intent> {
        if let Some(listed) = state.and_then(|s| c.take_ahead(self, s)) {
            return listed.intents;
        }
        let after = state.map_or("", |s| s.combined_through.as_str());
        c.list_after(self, after).await.intents
    }

    /// Answers a batch whose operations went as intents `own` (in batch order) from the
    /// outcomes the ledger in `known` records: a settle as its outcome says, a lease with
    /// the grants the ledger still shows held by it (over the log, read again when a grant
    /// lies beyond the one this process knows). One whose outcome the ledger does not
    /// record gets 503, the outcome unknown.
    pub(super) async fn answer_intents(
        &self,
        c: &Committer,
        batch: Vec<(LedgerOp, Rules, Answer)>,
        own: &[Intent],
        known: &mut Known,
    ) {
        let answers: Vec<Option<Answered>> = own
            .iter()
            .map(|i| {
                let l = &known.ledger.as_ref()?.value;
                intent::answered(l, &l.leases, &i.id)
            })
            .collect();
        let next = known.log.as_ref().map_or(0, |(l, _)| l.value.next_offset);
        let beyond = answers.iter().flatten().any(|a| {
            matches!(a, Answered::Leased(l) if l.grants.iter().chain(&l.dead).any(|g| g.offset >= next))
        });
        if beyond {
            if let Some((log, at)) = known.log.as_mut() {
                let logs = Cell::<Manifest>::new(
                    &*c.store,
                    &*c.ids,
                    &self.manifest_key,
                    &self.incarnation,
                );
                if logs.refresh::<BrokerError>(log).await.is_ok() {
                    *at = crate::runtime::now();
                }
            }
        }
        let layout = Arc::new(
            known
                .log
                .as_ref()
                .map(|(l, _)| l.value.layout())
                .unwrap_or_default(),
        );
        let callers = batch.into_iter().map(|(_, _, tx)| tx);
        match &known.ledger {
            Some(l) => answer_intents(callers, own, (&l.value, &l.value.leases), &layout),
            None => callers.for_each(|tx| tx.fail(BrokerError::Contention)),
        }
    }
}

impl Waits for LedgerQueue {
    type State = SubscriptionState;
    const OBJECT: Object = Object::Ledger;

    fn holds(&self) -> Holds {
        Holds::IntentsOnly
    }

    fn contended(&self) {
        lock(&self.state).role.mark_contended(crate::runtime::now());
    }

    async fn segment(
        &self,
        _: &Committer,
        _: &SubscriptionState,
        _: &Own,
    ) -> Option<crate::partition::combine::Status> {
        None
    }

    async fn rewrite(
        &self,
        c: &Committer,
        own: &mut Own,
        (_, dead): (bool, &[usize]),
        state: &SubscriptionState,
    ) -> BrokerResult<()> {
        let after = state.ids_above();
        for &i in dead {
            own.intents[i] = c.write_intent(self, after, own.intents[i].ask).await?;
        }
        Ok(())
    }

    async fn list(&self, c: &Committer, state: &SubscriptionState, _: &Own) -> Listed {
        c.list_after(self, &state.combined_through).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::Settle;

    #[test]
    fn settles_and_small_leases_can_be_intents_purges_and_big_leases_cannot() {
        let ack = LedgerOp::Settle {
            offset: 3,
            lease_id: 9,
            action: Settle::Ack,
        };
        assert_eq!(
            ask_of(ack),
            Some(Ask::Settle {
                offset: 3,
                lease_id: 9,
                action: Settle::Ack
            })
        );
        let lease = |max| LedgerOp::Lease {
            max,
            max_bytes: 1 << 20,
        };
        assert_eq!(
            ask_of(lease(10)),
            Some(Ask::Lease {
                max: 10,
                max_bytes: 1 << 20
            })
        );
        assert_eq!(ask_of(lease(0)), None);
        assert_eq!(ask_of(lease(101)), None);
        assert_eq!(ask_of(LedgerOp::Purge), None);
        // Every intent asked this way names the same operation again.
        for op in [ack, lease(1), lease(100)] {
            let ask = ask_of(op).unwrap();
            assert_eq!(crate::partition::subscription::op_of(ask), op);
        }
    }
}
