//! One batch of a ledger's queue (none: a sweep): routed as intents or as it is
//! ([`combine`](super::combine)), committed in one conditional write with what the role
//! lists beside it, and answered.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::change::{decide_copy, LedgerChange};
use super::combine::Awaited;
use super::known::{note_batch, Known};
use super::LedgerQueue;
use crate::cas::Cell;
use crate::commit::replies::Answer;
use crate::commit::role::{Attempts, Confirmed};
use crate::commit::{lock, Committer};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::intent::{self, Intent};
use crate::partition::subscription::{self, LedgerOp, LedgerOutcome, SubscriptionState};
use crate::partition::{Layout, Rules};

/// How a batch's operations reach the ledger ([`LedgerQueue::route`]).
enum Routed {
    /// Other processes' commits decided every one of its intents (in batch order).
    Decided(Vec<Intent>),
    /// This process writes the ledger.
    Commit(Route),
}

/// What a commit of the ledger applies.
struct Route {
    /// The batch's own intents, when it took over: they land as listed ones, and its
    /// operations are answered from their outcomes. `None`: its operations apply as
    /// they are.
    own: Option<Vec<Intent>>,
    /// The intents it lands (other processes', and its own).
    landing: Vec<Intent>,
}

/// What the ledger write of a routed batch came to ([`LedgerQueue::commit_routed`]).
enum Committed {
    /// The batch's operations applied as they are: their outcomes, in batch order.
    Direct(Vec<LedgerOutcome>, Arc<Layout>),
    /// The batch went as intents: it is answered from what the ledger decided for them.
    Intents(Vec<Intent>),
    /// The write failed: every operation gets this error.
    Failed(BrokerError),
}

/// Takeovers one batch makes at most before it answers what is still undecided 503.
const MAX_TAKEOVERS: u32 = 3;

/// Whether the ledger in `known` records an outcome for every one of `own`.
fn all_decided(own: &[Intent], known: &Known) -> bool {
    known.ledger.as_ref().is_some_and(|l| {
        own.iter()
            .all(|i| matches!(intent::status(&l.value, &i.id), intent::Status::Decided(_)))
    })
}

/// What one ledger commit did, as the role and the counters need it.
#[derive(Debug, Clone, Copy)]
struct Did {
    /// Conditional writes tried.
    attempts: u32,
    /// Intents the last attempt landed.
    landed: usize,
    /// Whether it wrote (else it kept the ledger as it was).
    wrote: bool,
    /// The batch's operations applied as they are (0 for a sweep or a takeover).
    direct: usize,
}

impl LedgerQueue {
    /// One batch (none: a sweep): apply every operation to the ledger in one write over
    /// the log as known (read again when [`needs_log`] says so), landing other processes'
    /// intents when this process is the committer, or write them as intents when the
    /// ledger is contended ([`combine`]); and answer each. Returns what the next batch may
    /// start from.
    pub(super) async fn run_batch(
        &self,
        c: &Committer,
        (batch, rules): (Vec<(LedgerOp, Rules, Answer)>, Rules),
        mut known: Known,
    ) -> Known {
        known.quiet = None;
        known.figures = None;
        let ops: Vec<LedgerOp> = batch.iter().map(|(op, _, _)| *op).collect();
        let fail = |batch: Vec<(LedgerOp, Rules, Answer)>, e: BrokerError| {
            for (_, _, tx) in batch {
                tx.fail(e.clone());
            }
        };
        if let Err(e) = self.know_for_batch(c, (&ops, &rules), &mut known).await {
            fail(batch, e);
            return known;
        }
        let route = match self.route(c, (&ops, &rules), &mut known).await {
            Ok(Routed::Decided(own)) => {
                self.answer_intents(c, batch, &own, &mut known).await;
                return known;
            }
            Ok(Routed::Commit(route)) => route,
            Err(e) => {
                fail(batch, e);
                return known;
            }
        };
        if batch.is_empty() && route.landing.is_empty() {
            lock(&self.state).role.swept(false, crate::runtime::now());
            return known;
        }
        let now = c.clock.now_ms();
        let (outcomes, layout) = match self
            .commit_routed(c, (&ops, &rules, now), route, &mut known)
            .await
        {
            Committed::Direct(outcomes, layout) => (outcomes, layout),
            Committed::Intents(own) => {
                self.answer_intents(c, batch, &own, &mut known).await;
                return known;
            }
            Committed::Failed(e) => {
                fail(batch, e);
                return known;
            }
        };
        if let Some(state) = &known.ledger {
            known.keys.forget_below(state.value.frontier);
        }
        let drained = ops.iter().zip(&outcomes).any(|(op, out)| {
            matches!((op, out), (LedgerOp::Lease { max, .. }, LedgerOutcome::Leased(l))
                if l.grants.len() + l.dead.len() < *max)
        });
        note_batch(&mut known, drained, &rules, now);
        for ((_, _, tx), out) in batch.into_iter().zip(outcomes) {
            tx.answer(out, &layout, false);
        }
        known
    }

    /// The ledger write of a routed batch. A takeover whose own intents another commit
    /// passed over first writes them again and waits, as before it took over, up to
    /// [`MAX_TAKEOVERS`] takeovers.
    async fn commit_routed(
        &self,
        c: &Committer,
        (ops, rules, now): (&[LedgerOp], &Rules, u64),
        mut route: Route,
        known: &mut Known,
    ) -> Committed {
        let mut takeovers = 1;
        loop {
            let (done, layout) = self.commit(c, (ops, rules, now), &route, known).await;
            let outcomes = match done {
                Ok(outcomes) => outcomes,
                Err(e) => return Committed::Failed(e),
            };
            let Some(own) = route.own else {
                return Committed::Direct(outcomes, layout);
            };
            if takeovers >= MAX_TAKEOVERS || all_decided(&own, known) {
                return Committed::Intents(own);
            }
            takeovers += 1;
            match self.wait_intents(c, own, known, Duration::ZERO).await {
                Ok(Awaited::Decided(own)) => return Committed::Intents(own),
                Ok(Awaited::TakeOver { own, mut listed }) => {
                    listed.extend(own.iter().cloned());
                    route = Route {
                        own: Some(own),
                        landing: listed,
                    };
                }
                Err(e) => return Committed::Failed(e),
            }
        }
    }

    /// What a batch must know before it is routed: the ledger on an ordered topic (its key
    /// pass runs on a copy), and the log ([`LedgerQueue::know_log`]).
    ///
    /// Errors: the reads'.
    async fn know_for_batch(
        &self,
        c: &Committer,
        (ops, rules): (&[LedgerOp], &Rules),
        known: &mut Known,
    ) -> BrokerResult<()> {
        if rules.ordered && known.ledger.is_none() {
            let cell =
                Cell::<SubscriptionState>::new(&*c.store, &*c.ids, &self.ledger_key, &self.origin);
            known.ledger = Some(cell.read::<BrokerError>().await?);
        }
        if let Err(e) = self.know_log(c, ops, known).await {
            known.log = None;
            return Err(e);
        }
        let leases = ops.iter().any(|op| matches!(op, LedgerOp::Lease { .. }));
        if let Some((log, _)) = known.log.as_mut().filter(|_| leases) {
            decide_copy(c, (&self.topic, self.partition), &mut log.value).await;
        }
        Ok(())
    }

    /// How the batch `ops` reaches the ledger: as intents another process's commit may
    /// decide, or may leave this process to land ([`combine`]); or as they are, with
    /// what the committer lands beside them.
    ///
    /// Errors: an intent's write or a read failing; [`BrokerError::OutcomeUnknown`] when
    /// an intent's fate can no longer be told.
    async fn route(
        &self,
        c: &Committer,
        (ops, rules): (&[LedgerOp], &Rules),
        known: &mut Known,
    ) -> BrokerResult<Routed> {
        if self.combines(c, ops, rules, known) {
            return Ok(match self.await_intents(c, ops, known).await? {
                Awaited::Decided(own) => Routed::Decided(own),
                Awaited::TakeOver { own, mut listed } => {
                    listed.extend(own.iter().cloned());
                    Routed::Commit(Route {
                        own: Some(own),
                        landing: listed,
                    })
                }
            });
        }
        let landing = if !rules.ordered && lock(&self.state).role.is_committer() {
            let state = known.ledger.as_ref().map(|l| &l.value);
            self.landing(c, state).await
        } else {
            Vec::new()
        };
        Ok(Routed::Commit(Route { own: None, landing }))
    }

    /// The conditional write of `route` (the batch `ops` as they are, or its intents)
    /// with the listing the role calls for beside it; records what it did in the role and
    /// the counters. Returns the outcomes of the operations applied as they are, and the
    /// layout of the log the write used.
    async fn commit(
        &self,
        c: &Committer,
        (ops, rules, now): (&[LedgerOp], &Rules, u64),
        route: &Route,
        known: &mut Known,
    ) -> (BrokerResult<Vec<LedgerOutcome>>, Arc<Layout>) {
        let direct: &[LedgerOp] = if route.own.is_some() { &[] } else { ops };
        let asked: Vec<LedgerOp> = direct
            .iter()
            .copied()
            .chain(route.landing.iter().map(|i| subscription::op_of(i.ask)))
            .collect();
        // Taken out while the ledger changes beside it; put back below.
        let Some((log_snap, read_at)) = known.log.take() else {
            let e = BrokerError::Internal("the log was not read".into());
            return (Err(e), Arc::default());
        };
        if rules.ordered {
            let layout = log_snap.value.layout();
            let log = &log_snap.value;
            self.know_keys(c, (ops, rules, now), (log, &layout), known)
                .await;
        }
        // Not on per-key ordered topics, nor before the fleet writes ledger intents.
        let may = !rules.ordered && c.level.get().combines_ledgers();
        let beside = c.beside(self, known.ledger.as_ref().map(|l| &l.value), (may, may));
        let mut known_log = (log_snap, read_at);
        let cell =
            Cell::<SubscriptionState>::new(&*c.store, &*c.ids, &self.ledger_key, &self.origin);
        let mut change = LedgerChange {
            logs: Cell::new(&*c.store, &*c.ids, &self.manifest_key, &self.incarnation),
            looks: (c, (&self.topic, self.partition)),
            log: &mut known_log,
            ops: direct,
            intents: &route.landing,
            asked: &asked,
            attempts: 0,
            landed: 0,
            wrote: false,
            rules: *rules,
            now,
            keys: &known.keys,
            // `know_log` checked the log against the ledger this process knew, for the
            // batch's own operations only.
            checked: if route.landing.is_empty() {
                known.ledger.as_ref().map(|l| l.etag.clone())
            } else {
                None
            },
        };
        let (done, looked) = futures::join!(
            cell.update_in(&mut known.ledger, &mut change),
            c.list_beside(self, &beside)
        );
        let did = Did {
            attempts: change.attempts,
            landed: change.landed,
            wrote: change.wrote,
            direct: direct.len(),
        };
        // The layout of the log the commit used (a retry may have read it again).
        let layout = Arc::new(known_log.0.value.layout());
        known.log = Some(known_log);
        let state = known.ledger.as_ref().map(|l| &l.value);
        if let Some(look) = looked {
            c.looked(self, look, state);
        }
        self.committed(c, route, did, done.is_ok());
        (done.map_err(BrokerError::from), layout)
    }

    /// Records in the role and the counters what a commit of `route` did.
    fn committed(&self, c: &Committer, route: &Route, did: Did, ok: bool) {
        let now = crate::runtime::now();
        let own = route.own.as_ref().map(Vec::len);
        let sweep = did.direct == 0 && own.is_none();
        {
            let mut st = lock(&self.state);
            let a = Attempts {
                tries: did.attempts,
                confirmed: Confirmed::No,
                callers: !sweep,
            };
            st.role.committed(a, now);
            if did.landed > own.unwrap_or(0) {
                st.role.mark_contended(now);
            }
            if sweep {
                st.role.swept(did.landed > 0, now);
            }
            if own.is_some() && ok {
                st.role.become_committer();
            }
        }
        if ok && did.wrote {
            c.stats.ledger_commits.fetch_add(1, Ordering::Relaxed);
            let n = (did.direct + did.landed) as u64;
            c.stats.ledger_committed_ops.fetch_add(n, Ordering::Relaxed);
        }
    }
}
