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

use super::listing::Ahead;
use super::queue::Place;
use super::queue::{Drained, Onward, QueueState};
use super::replies::Answer;
use super::{lock, Committer, Object, Op};
use crate::error::BrokerError;
use crate::partition::subscription::{LedgerOp, Origin};
use crate::partition::Rules;
use crate::subscription::SubscriptionRecord;
use crate::topic::Topic;
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
    /// Its operations, role and what the last batch left ([`QueueState::held`]).
    state: Mutex<QueueState<LedgerQueue>>,
}

/// What only a ledger's queue keeps ([`QueueState::more`]): copies of what the last
/// batch left, readable while the next one runs.
#[derive(Default)]
struct LedgerMore {
    /// A copy of `known.quiet`.
    quiet: Option<Quiet>,
    /// When a waiting consume found `quiet` too old and went to renew it
    /// ([`Ledgers::peek`]): the others look again shortly instead of each starting a batch.
    renewal: Option<crate::runtime::Instant>,
    /// What the last batch that succeeded left, for `/metrics`.
    figures: Option<super::summary::Figures>,
}

impl Ledgers {
    /// This process's queue of the subscription `sub`'s ledger of `partition`, if any.
    fn queue(
        &self,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
    ) -> Option<Arc<LedgerQueue>> {
        let key = LedgerKey::new(topic, (name, sub), partition);
        lock(&self.queues).get(&key).cloned()
    }

    /// Whether the subscription `sub`'s ledger of `partition` has operations queued or a
    /// batch running in this process (consumes arriving now would share its next commit).
    pub(super) fn busy(
        &self,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
    ) -> bool {
        self.queue(topic, (name, sub), partition)
            .is_some_and(|q| lock(&q.state).busy())
    }
}

impl Committer {
    /// Queues `ops` on the subscription `sub`'s queue of `partition` (made on first use)
    /// under the subscription's rules ([`Committer::enqueue_on`]).
    pub(super) fn enqueue_subscription(
        self: &Arc<Self>,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
        ops: Vec<Op>,
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
        let ops = ops.into_iter().filter_map(|op| match Answer::of(op) {
            Ok((op, tx)) => Some((op, rules, tx)),
            Err(op) => {
                op.fail(BrokerError::Internal(
                    "a ledger got a produce or a compaction".into(),
                ));
                None
            }
        });
        self.enqueue_on(&queue, ops);
    }
}

impl Drained for LedgerQueue {
    const OBJECT: Object = Object::Ledger;
    type Op = (LedgerOp, Rules, Answer);
    type With = Rules;
    type Held = Known;
    type Ahead = Ahead;
    type More = LedgerMore;
    /// A ledger's batch writes nothing before its commit: never taken ahead.
    type Early = ();

    fn state(&self) -> &Mutex<QueueState<Self>> {
        &self.state
    }

    fn key(&self) -> &str {
        &self.ledger_key
    }

    /// The ledger's own prefix: intents only.
    fn listing(&self) -> Place<'_> {
        Place {
            prefix: &self.intents_prefix,
            tag: None,
            created_at_ms: 0,
        }
    }

    /// All of them, under the newest operation's rules ([`batch_rules`]).
    fn take(pending: &[Self::Op]) -> (usize, Rules) {
        (pending.len(), batch_rules(pending))
    }

    async fn run(
        c: &Arc<Committer>,
        q: &Arc<Self>,
        batch: Vec<Self::Op>,
        (rules, known): (Rules, Known),
        _: (Option<()>, Onward),
    ) -> Known {
        if batch.is_empty() {
            c.stats.sweeps.fetch_add(1, Ordering::Relaxed);
        }
        q.run_batch(c, (batch, rules), known).await
    }

    fn takes_ahead(_: &Committer, _: &QueueState<Self>, _: usize) -> bool {
        false
    }

    async fn early(_: &Arc<Committer>, _: &Arc<Self>, _: &[Self::Op]) {}

    fn keep(st: &mut QueueState<Self>, known: Known) {
        st.more.quiet = known.quiet.clone();
        if known.figures.is_some() {
            st.more.figures = known.figures;
        }
        st.held = known;
    }
}
