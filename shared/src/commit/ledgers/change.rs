//! One batch's change of a ledger: what it must know first (the log, read again only when
//! [`needs_log`] says so; on an ordered topic, message keys) and the conditional write
//! applying it ([`LedgerChange`]), with other processes' intents landed beside it.

use std::time::Duration;

use crate::runtime::Instant;

use super::{Known, LedgerQueue};
use crate::cas::{Cell, Decision, Snapshot};
use crate::commit::Committer;
use crate::error::{BrokerError, BrokerResult};
use crate::partition::intent::Intent;
use crate::partition::lease::Keys;
use crate::partition::subscription::{self, LedgerOp, LedgerOutcome, SubscriptionState};
use crate::partition::{beside, Layout, Manifest, Rules};
use crate::store::ETag;

/// How long a batch may lease over a log read earlier (new messages are seen as soon as
/// the known ones run out; this bounds how long retention and compaction go unseen).
pub(super) const LOG_MAX_AGE: Duration = Duration::from_secs(5);

/// Whether a batch must read the log before applying `ops` to `state` (`None`: not read
/// yet) over `log` (read at `read_at`) at `now_ms`: when
/// [`subscription::needs_newer_log`] says so, or a lease request would run over a log
/// older than [`LOG_MAX_AGE`].
pub(super) fn needs_log(
    ops: &[LedgerOp],
    state: Option<&SubscriptionState>,
    (log, read_at): (&Manifest, Instant),
    now_ms: u64,
) -> bool {
    let leases = ops.iter().any(|op| matches!(op, LedgerOp::Lease { .. }));
    (leases && read_at.elapsed() > LOG_MAX_AGE)
        || subscription::needs_newer_log(ops, state, log, now_ms)
}

/// One batch's change of a ledger. Every ledger it is applied to that the log was not
/// already checked against (the ledger read because this process knew none, or read
/// again because another process changed it) first reads the log again when that ledger
/// finds nothing to lease in it ([`needs_log`]): leases and acks of other processes must
/// never make a consume come back empty while newer messages wait.
pub(super) struct LedgerChange<'a> {
    pub(super) logs: Cell<'a, Manifest>,
    /// The committer and the partition: a log read again has its undecided segments
    /// decided in this copy too ([`Committer::look_beside`]).
    pub(super) looks: (&'a Committer, (&'a str, u32)),
    pub(super) log: &'a mut (Snapshot<Manifest>, Instant),
    pub(super) ops: &'a [LedgerOp],
    /// Other processes' intents (and this batch's own, when it took over) to land.
    pub(super) intents: &'a [Intent],
    /// `ops` and the operations of `intents`: what the log is checked for.
    pub(super) asked: &'a [LedgerOp],
    /// Attempts made so far.
    pub(super) attempts: u32,
    /// How many intents the last attempt landed.
    pub(super) landed: usize,
    /// Whether the last attempt wrote (else it kept the ledger as it was).
    pub(super) wrote: bool,
    pub(super) rules: Rules,
    pub(super) now: u64,
    pub(super) keys: &'a Keys,
    /// The ledger (its ETag) the log was last checked against; `None` before any.
    pub(super) checked: Option<Option<ETag>>,
}

impl crate::cas::Change<SubscriptionState> for LedgerChange<'_> {
    type Output = Vec<LedgerOutcome>;
    type Error = BrokerError;

    fn prepare(
        &mut self,
        snap: &Snapshot<SubscriptionState>,
    ) -> impl std::future::Future<Output = ()> + Send {
        self.attempts += 1;
        let unchecked = self.checked.as_ref() != Some(&snap.etag);
        self.checked = Some(snap.etag.clone());
        let stale = unchecked
            && needs_log(
                self.asked,
                Some(&snap.value),
                (&self.log.0.value, self.log.1),
                self.now,
            );
        async move {
            if stale
                && self
                    .logs
                    .refresh::<BrokerError>(&mut self.log.0)
                    .await
                    .is_ok()
            {
                self.log.1 = crate::runtime::now();
                let (c, at) = self.looks;
                decide_copy(c, at, &mut self.log.0.value).await;
            }
        }
    }

    fn apply(
        &mut self,
        s: &mut SubscriptionState,
    ) -> Result<Decision<Vec<LedgerOutcome>>, BrokerError> {
        let before = (s.frontier, s.leases.clone(), s.acked_ahead.clone(), s.lost);
        let log = &self.log.0.value;
        let rules = &self.rules;
        let (out, _, landed) = subscription::apply_landing(
            s,
            log,
            self.now,
            rules,
            (self.ops, self.keys),
            self.intents,
        );
        self.landed = landed;
        let after = (s.frontier, s.leases.clone(), s.acked_ahead.clone(), s.lost);
        self.wrote = after != before || landed > 0;
        Ok(if self.wrote {
            Decision::Commit(out)
        } else {
            Decision::Keep(out)
        })
    }
}

/// Decides, in this process's copy `log` of partition `at`'s log, the undecided segments
/// a look at their keys decides ([`Committer::look_beside`]): a ledger leases from its
/// copy, and a segment's fate is the object at its key, whoever wrote the log. The log
/// itself is left to the partition's own commits.
pub(super) async fn decide_copy(c: &Committer, at: (&str, u32), log: &mut Manifest) {
    if log.beside.is_empty() {
        return;
    }
    let learnt = c.look_beside(at, log, &[]).await;
    beside::decide(log, learnt.iter().map(String::as_str));
}

impl LedgerQueue {
    /// Makes `known.log` the newest log this process knows (this queue's, or the one its
    /// own commits left), read again when [`needs_log`] says the batch `ops` needs it.
    ///
    /// Errors: the read's.
    pub(super) async fn know_log(
        &self,
        c: &Committer,
        ops: &[LedgerOp],
        known: &mut Known,
    ) -> BrokerResult<()> {
        let have = known.log.as_ref().map(|(l, _)| l.value.version);
        let at = (
            self.topic.as_str(),
            self.incarnation.as_str(),
            self.partition,
        );
        if let Some(own) = c.cached_manifest_newer(at, have) {
            known.log = Some((own, crate::runtime::now()));
        }
        let stale = match &known.log {
            None => true,
            Some((l, at)) => {
                let state = known.ledger.as_ref().map(|s| &s.value);
                needs_log(ops, state, (&l.value, *at), c.clock.now_ms())
            }
        };
        if !stale {
            return Ok(());
        }
        let logs = Cell::<Manifest>::new(&*c.store, &*c.ids, &self.manifest_key, &self.incarnation);
        match known.log.as_mut() {
            Some((snap, at)) => {
                logs.refresh::<BrokerError>(snap).await?;
                *at = crate::runtime::now();
            }
            None => known.log = Some((logs.read::<BrokerError>().await?, crate::runtime::now())),
        }
        Ok(())
    }

    /// On a per-key ordered topic: reads into `known.keys` the message keys the lease
    /// pass of `ops` over `log` needs, running the pure batch on a copy of the ledger and
    /// reading what it stopped at ([`Committer::read_keys_for`]); what it still does not
    /// know is not leased this time (never out of order).
    pub(super) async fn know_keys(
        &self,
        c: &Committer,
        (ops, rules, now): (&[LedgerOp], &Rules, u64),
        (log, layout): (&Manifest, &Layout),
        known: &mut Known,
    ) {
        let Some(state) = &known.ledger else {
            return;
        };
        let wants = |keys: &Keys| {
            let mut copy = state.value.clone();
            subscription::apply(&mut copy, log, now, rules, (ops, keys)).1
        };
        let at = (self.topic.as_str(), self.partition);
        c.read_keys_for(at, layout, &mut known.keys, wants).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::subscription::Origin;
    use crate::partition::testing::manifest_with;
    use crate::partition::Settle;

    fn state(frontier: u64) -> SubscriptionState {
        SubscriptionState::new(&Origin {
            id: "s".into(),
            start: frontier,
        })
    }

    const LEASE: LedgerOp = LedgerOp::Lease {
        max: 1,
        max_bytes: u64::MAX,
    };

    #[test]
    fn an_old_log_is_read_again_for_a_lease_never_for_settles() {
        let log = manifest_with(3);
        let old = crate::runtime::now() - LOG_MAX_AGE - Duration::from_secs(1);
        let ack = LedgerOp::Settle {
            offset: 0,
            lease_id: 1,
            action: Settle::Ack,
        };
        // The ledger has 0..3 to lease: only the age makes the lease read.
        assert!(needs_log(&[LEASE], Some(&state(0)), (&log, old), 0));
        assert!(!needs_log(
            &[LEASE],
            Some(&state(0)),
            (&log, crate::runtime::now()),
            0
        ));
        assert!(!needs_log(&[ack], Some(&state(0)), (&log, old), 0));
    }
}
