//! Group commit of subscriptions' ledgers (docs/design.md §5): one conditional write of
//! `topics/{t}/subs/{s}/{id}/{p}.json` for every lease request and settle queued on that
//! subscription's partition while the previous write was in flight.
//!
//! A batch applies [`crate::partition::subscription::apply`] to the subscription's state
//! by the CAS protocol, starting from the state this process wrote or read last, over the
//! partition's log (the manifest) as this process knows it: the newer of the one this
//! queue read last and the one this process's own commits left. The log is read again
//! (a conditional read, which transfers nothing when unchanged) only when a lease request
//! finds nothing available in it ([`needs_log`]), or it is older than [`LOG_MAX_AGE`]: a
//! log only grows, so an old one offers fewer messages, never wrong ones. A batch never
//! writes the manifest: a produce costs the same whatever the number of subscriptions.
//!
//! As with the partition's own queue, an operation once queued is committed even if its
//! caller goes away (a lease granted to a vanished caller lapses).

mod batch;
mod change;
mod combine;
mod known;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::role::{Idle, Role};
use super::{answer, lock, Committer, Cut, LeaseAnswer};
use crate::dispatch::Kind;
use crate::error::{BrokerError, BrokerResult};
use crate::partition::subscription::{LedgerOp, LedgerOutcome, Origin};
use crate::partition::{Layout, Rules, Settle};
use crate::subscription::SubscriptionRecord;
use crate::topic::Topic;
use combine::LedgerAhead;
pub(crate) use known::Figures;
use known::{Known, Quiet};

/// One rule set per batch: the newest operation's (they differ only across a settings
/// change, which reaches every operation within the topic cache period).
fn batch_rules(batch: &[(LedgerOp, Rules, Answer)]) -> Rules {
    batch
        .last()
        .map(|(_, r, _)| *r)
        .unwrap_or_else(|| Rules::from(&crate::settings::TopicSettings::default()))
}

/// The ledgers' queues of one process.
#[derive(Default)]
pub(super) struct Ledgers {
    queues: Mutex<HashMap<LedgerKey, Arc<LedgerQueue>>>,
}

/// Which ledger a queue commits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LedgerKey {
    topic: String,
    incarnation: String,
    subscription: String,
    /// The subscription's id ([`Origin::id`]).
    id: String,
    partition: u32,
}

impl LedgerKey {
    fn new(topic: &Topic, (name, sub): (&str, &SubscriptionRecord), partition: u32) -> Self {
        LedgerKey {
            topic: topic.name.clone(),
            incarnation: topic.incarnation.clone(),
            subscription: name.to_owned(),
            id: sub.id.clone(),
            partition,
        }
    }
}

struct LedgerQueue {
    topic: String,
    partition: u32,
    manifest_key: String,
    ledger_key: String,
    /// Where the ledger's intents are written ([`crate::keys::ledger_intents`]).
    intents_prefix: String,
    incarnation: String,
    origin: Origin,
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    pending: Vec<(LedgerOp, Rules, Answer)>,
    running: bool,
    /// What the last batch left.
    known: Known,
    /// A copy of `known.quiet`, readable while a batch runs.
    quiet: Option<Quiet>,
    /// What the last batch that succeeded left, for `/metrics`.
    figures: Option<Figures>,
    /// This process's part among the processes writing the ledger ([`combine`]); sweeps
    /// commit under the last batch's rules.
    role: Role<Rules>,
    /// What the committer listed beside its last commit.
    ahead: Option<LedgerAhead>,
}

impl QueueState {
    /// Operations queued, or a batch running.
    fn busy(&self) -> bool {
        self.running || !self.pending.is_empty()
    }
}

enum Answer {
    Lease(oneshot::Sender<BrokerResult<LeaseAnswer>>),
    Settle(oneshot::Sender<BrokerResult<()>>),
    Purge(oneshot::Sender<BrokerResult<u64>>),
}

impl Answer {
    /// Sends the caller what its operation got (leases with the layout they were granted
    /// over; `shared` when they were granted through an intent).
    fn answer(self, out: LedgerOutcome, layout: &Arc<Layout>, shared: bool) {
        match (self, out) {
            (Answer::Lease(tx), LedgerOutcome::Leased(leased)) => {
                let layout = layout.clone();
                drop(tx.send(Ok(LeaseAnswer {
                    leased,
                    layout,
                    shared,
                })));
            }
            (Answer::Settle(tx), LedgerOutcome::Settled(r)) => {
                drop(tx.send(r.map_err(BrokerError::from)));
            }
            (Answer::Purge(tx), LedgerOutcome::Purged(n)) => drop(tx.send(Ok(n))),
            (tx, _) => tx.fail(BrokerError::Internal(
                "a ledger operation got another's outcome".into(),
            )),
        }
    }

    fn fail(self, e: BrokerError) {
        match self {
            Answer::Lease(tx) => drop(tx.send(Err(e))),
            Answer::Settle(tx) => drop(tx.send(Err(e))),
            Answer::Purge(tx) => drop(tx.send(Err(e))),
        }
    }
}

impl Committer {
    /// Leases up to `max` messages of about `max_bytes` (the first whatever its size) for
    /// the subscription `sub` on `partition`.
    ///
    /// Errors: [`BrokerError::StaleTopic`] when the topic was created again, storage
    /// failures ([`BrokerError::Contention`], [`BrokerError::Store`]).
    pub(crate) async fn lease_subscription(
        self: &Arc<Self>,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
        (max, max_bytes): (usize, u64),
    ) -> BrokerResult<LeaseAnswer> {
        let (tx, rx) = oneshot::channel();
        let op = LedgerOp::Lease { max, max_bytes };
        self.enqueue_ledger(topic, (name, sub), partition, [(op, Answer::Lease(tx))]);
        answer(rx).await
    }

    /// Settles `settles` (offset, lease id, action) of the subscription `sub` on
    /// `partition`, queued together; each one's result, in order.
    ///
    /// Errors: [`BrokerError::LeaseGone`], [`BrokerError::AckedAheadFull`], and as
    /// [`Committer::lease_subscription`], each its own.
    pub(crate) async fn settle_subscription(
        self: &Arc<Self>,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
        settles: &[(u64, u64, Settle)],
    ) -> Vec<BrokerResult<()>> {
        let mut answers = Vec::with_capacity(settles.len());
        let ops: Vec<(LedgerOp, Answer)> = settles
            .iter()
            .map(|&(offset, lease_id, action)| {
                let (tx, rx) = oneshot::channel();
                answers.push(rx);
                let op = LedgerOp::Settle {
                    offset,
                    lease_id,
                    action,
                };
                (op, Answer::Settle(tx))
            })
            .collect();
        self.enqueue_ledger(topic, (name, sub), partition, ops);
        let mut results = Vec::with_capacity(answers.len());
        for rx in answers {
            results.push(answer(rx).await);
        }
        results
    }

    /// Purges the subscription `sub` on `partition`: every message the partition holds
    /// now is settled for it, every lease ends; answers how many were unsettled.
    ///
    /// Errors: as [`Committer::lease_subscription`].
    pub(crate) async fn purge_subscription(
        self: &Arc<Self>,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
    ) -> BrokerResult<u64> {
        let (tx, rx) = oneshot::channel();
        self.enqueue_ledger(
            topic,
            (name, sub),
            partition,
            [(LedgerOp::Purge, Answer::Purge(tx))],
        );
        answer(rx).await
    }

    /// Whether the subscription `sub`'s ledger of `partition` has operations queued or a
    /// batch running in this process (consumes arriving now would share its next commit).
    pub(crate) fn ledger_busy(
        &self,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
    ) -> bool {
        self.ledger_queue(topic, (name, sub), partition)
            .is_some_and(|q| lock(&q.state).busy())
    }

    /// This process's queue of the subscription `sub`'s ledger of `partition`, if any.
    fn ledger_queue(
        &self,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
    ) -> Option<Arc<LedgerQueue>> {
        let key = LedgerKey::new(topic, (name, sub), partition);
        lock(&self.ledgers.queues).get(&key).cloned()
    }

    fn enqueue_ledger(
        self: &Arc<Self>,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
        ops: impl IntoIterator<Item = (LedgerOp, Answer)>,
    ) {
        let key = LedgerKey::new(topic, (name, sub), partition);
        let queue = lock(&self.ledgers.queues)
            .entry(key)
            .or_insert_with(|| {
                Arc::new(LedgerQueue {
                    topic: topic.name.clone(),
                    partition,
                    manifest_key: topic.manifest_key(partition),
                    ledger_key: crate::keys::subscription_ledger(
                        &topic.name,
                        name,
                        &sub.id,
                        partition,
                    ),
                    intents_prefix: crate::keys::ledger_intents(
                        &topic.name,
                        name,
                        &sub.id,
                        partition,
                    ),
                    incarnation: topic.incarnation.clone(),
                    origin: Origin {
                        id: sub.id.clone(),
                        start: sub.start_offset(partition),
                    },
                    state: Mutex::new(QueueState::default()),
                })
            })
            .clone();
        let rules = Rules::from(&sub.settings.effective(&topic.settings));
        let start = {
            let mut st = lock(&queue.state);
            st.pending
                .extend(ops.into_iter().map(|(op, tx)| (op, rules, tx)));
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            let me = self.clone();
            // Refused once the broker stopped: as the partition's own queue does.
            let q = queue.clone();
            let drain = async move { me.drain_ledger(q).await };
            if self.tasks.spawn(Kind::Drain, drain).is_err() {
                let mut st = lock(&queue.state);
                st.pending.clear();
                st.running = false;
            }
        }
    }

    /// Commits batches until the queue is empty, then, while this process is the ledger's
    /// committer ([`combine`]), sweeps. While the ledger is busy (the previous batch held
    /// more than one operation) each batch first waits the committer's `linger`, as the
    /// partition's own queue does: the clients answered by the last commit come back in
    /// time to share the next one.
    async fn drain_ledger(self: Arc<Self>, q: Arc<LedgerQueue>) {
        let held = q.clone();
        let mut cut = Cut::new(move || {
            let mut st = lock(&held.state);
            st.running = false;
            st.pending.clear();
        });
        let mut last_batch = 0;
        loop {
            if last_batch > 1 && !self.linger.is_zero() {
                crate::runtime::sleep(self.linger).await;
            }
            let (batch, rules, known) = {
                let mut st = lock(&q.state);
                if st.pending.is_empty() {
                    let with = st.role.sweep_with();
                    match (st.role.idle(), with) {
                        (Idle::Sweep, Some(rules)) if !self.tasks.stopping() => {
                            (Vec::new(), rules, std::mem::take(&mut st.known))
                        }
                        _ => {
                            st.running = false;
                            cut.disarm();
                            return;
                        }
                    }
                } else {
                    let batch = std::mem::take(&mut st.pending);
                    let rules = batch_rules(&batch);
                    st.role.took_batch(rules);
                    (batch, rules, std::mem::take(&mut st.known))
                }
            };
            last_batch = batch.len();
            if batch.is_empty() {
                self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
            }
            let known = self.ledger_batch(&q, (batch, rules), known).await;
            let mut st = lock(&q.state);
            st.quiet = known.quiet.clone();
            if known.figures.is_some() {
                st.figures = known.figures;
            }
            st.known = known;
        }
    }
}
