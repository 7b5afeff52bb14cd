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

mod combine;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::oneshot;

use super::role::{Attempts, Confirmed, Idle, Role};
use super::{answer, lock, Committer, LeaseAnswer, Peek};
use crate::cas::{Cell, Decision, Snapshot};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::intent::Intent;
use crate::partition::lease::{self, Keys};
use crate::partition::subscription::{self, LedgerOp, LedgerOutcome, Origin, SubscriptionState};
use crate::partition::{Layout, Manifest, Rules, Settle};
use crate::store::ETag;
use crate::subscription::SubscriptionRecord;
use crate::topic::Topic;
use combine::{Awaited, LedgerAhead};

/// How long a batch may lease over a log read earlier (new messages are seen as soon as
/// the known ones run out; this bounds how long retention and compaction go unseen).
pub const LOG_MAX_AGE: Duration = Duration::from_secs(5);

/// How long a waiting consume may skip a partition on the ledger as this process last
/// read or wrote it ([`Committer::peek_ledger`]): another process's nack or release
/// reaches this process's idle waiters within it, as the longest listing interval
/// (`idle_poll_max`, 4 s) bounds other news.
pub const LEDGER_MAX_AGE: Duration = Duration::from_secs(4);

/// How soon a waiting consume looks again at a partition whose knowledge a batch is
/// renewing ([`Committer::peek_ledger`]).
const RENEWING_LOOK: Duration = Duration::from_millis(50);

/// Whether a batch must read the log before applying `ops` to `state` (`None`: not read
/// yet) over `log` (read at `read_at`) at `now_ms`: when
/// [`subscription::needs_newer_log`] says so, or a lease request would run over a log
/// older than [`LOG_MAX_AGE`].
fn needs_log(
    ops: &[LedgerOp],
    state: Option<&SubscriptionState>,
    (log, read_at): (&Manifest, Instant),
    now_ms: u64,
) -> bool {
    let leases = ops.iter().any(|op| matches!(op, LedgerOp::Lease { .. }));
    (leases && read_at.elapsed() > LOG_MAX_AGE)
        || subscription::needs_newer_log(ops, state, log, now_ms)
}

/// What a batch that succeeded leaves beside `known` at `now`: its [`Figures`], and, when
/// a lease request in it got less than it asked for (`drained`), its [`Quiet`]. No copy
/// of the ledger: a batch leaves it caught up with the log it used (`apply` catches up
/// first, and a batch that kept the ledger as it was found nothing to catch up).
fn note_batch(known: &mut Known, drained: bool, rules: &Rules, now: u64) {
    use crate::partition::Ledger;
    let Known {
        log: Some((log, _)),
        ledger: Some(ledger),
        keys,
        quiet,
        figures,
        ..
    } = known
    else {
        return;
    };
    let lost = ledger.value.lost;
    let view = ledger.value.over(&log.value);
    *figures = Some(Figures {
        available: view.available_count(now),
        in_flight: view.in_flight(now) as u64,
        delayed: view.delayed_count(now),
        lost,
    });
    if drained {
        *quiet = Some(Quiet {
            log: log.etag.clone(),
            until: lease::quiet_until(&view, now, rules, keys),
            at: Instant::now(),
        });
    }
}

/// One rule set per batch: the newest operation's (they differ only across a settings
/// change, which reaches every operation within the topic cache period).
fn batch_rules(batch: &[(LedgerOp, Rules, Answer)]) -> Rules {
    batch
        .last()
        .map(|(_, r, _)| *r)
        .unwrap_or_else(|| Rules::from(&crate::settings::TopicSettings::default()))
}

/// One batch's change of a ledger. Every ledger it is applied to that the log was not
/// already checked against (the ledger read because this process knew none, or read
/// again because another process changed it) first reads the log again when that ledger
/// finds nothing to lease in it ([`needs_log`]): leases and acks of other processes must
/// never make a consume come back empty while newer messages wait.
struct LedgerChange<'a> {
    logs: Cell<'a, Manifest>,
    log: &'a mut (Snapshot<Manifest>, Instant),
    ops: &'a [LedgerOp],
    /// Other processes' intents (and this batch's own, when it took over) to land.
    intents: &'a [Intent],
    /// `ops` and the operations of `intents`: what the log is checked for.
    asked: &'a [LedgerOp],
    /// Attempts made so far.
    attempts: u32,
    /// How many intents the last attempt landed.
    landed: usize,
    /// Whether the last attempt wrote (else it kept the ledger as it was).
    wrote: bool,
    rules: Rules,
    now: u64,
    keys: &'a Keys,
    /// The ledger (its ETag) the log was last checked against; `None` before any.
    checked: Option<Option<ETag>>,
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
                self.log.1 = Instant::now();
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

/// One subscription's partition as a batch left it ([`Committer::ledger_summaries`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Unsettled messages with no live lease and no delay.
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Unsettled messages not due yet.
    pub delayed: u64,
    /// Messages retention or a topic purge removed before this subscription settled them.
    pub lost: u64,
}

/// What this process last saw of one subscription's partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSummary {
    /// Topic.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Partition.
    pub partition: u32,
    /// As of this process's last commit or read of the ledger.
    pub figures: Figures,
}

impl QueueState {
    /// Operations queued, or a batch running.
    fn busy(&self) -> bool {
        self.running || !self.pending.is_empty()
    }
}

/// What a queue knows between batches.
#[derive(Default)]
struct Known {
    /// The log as last read, and when.
    log: Option<(Snapshot<Manifest>, Instant)>,
    /// The ledger as last written or read.
    ledger: Option<Snapshot<SubscriptionState>>,
    /// Message keys read for per-key ordering, at or above the ledger's frontier.
    keys: Keys,
    /// What the last batch left for waiting consumes, when it found nothing more to lease.
    quiet: Option<Quiet>,
    /// What the last batch left, for `/metrics`.
    figures: Option<Figures>,
}

/// What a batch that left nothing to lease knew ([`Committer::peek_ledger`]).
#[derive(Debug, Clone)]
struct Quiet {
    /// The ETag of the log it used.
    log: Option<ETag>,
    /// [`lease::quiet_until`] over that log and the ledger it left.
    until: Option<u64>,
    /// When the batch ended: the ledger was the stored one then.
    at: Instant,
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
    pub async fn lease_subscription(
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
    pub async fn settle_subscription(
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
    pub async fn purge_subscription(
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
    pub fn ledger_busy(
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

    /// What a waiting consume of the subscription `sub` may know of `partition` without a
    /// storage request, as [`Committer::peek`] for the default one: the ETag of the log
    /// and when a lease could next get anything, as the last batch left them when it
    /// found nothing more to lease, for [`LEDGER_MAX_AGE`] after it ([`Peek::Unknown`]
    /// otherwise; while a batch renews it, a little longer). A batch running meanwhile does
    /// not hide it: waiting consumes that wake together do not each start a batch.
    pub fn peek_ledger(
        &self,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
    ) -> Peek {
        let Some(queue) = self.ledger_queue(topic, (name, sub), partition) else {
            return Peek::Unknown;
        };
        let (quiet, renewing) = {
            let st = lock(&queue.state);
            let Some(quiet) = st.quiet.clone() else {
                return Peek::Unknown;
            };
            (quiet, st.busy())
        };
        let left = match LEDGER_MAX_AGE.checked_sub(quiet.at.elapsed()) {
            Some(left) if !left.is_zero() => left,
            // Too old: the first waiter to look starts a batch, which renews it; the
            // others look again shortly rather than each queue a lease of their own.
            _ if renewing => RENEWING_LOOK,
            _ => return Peek::Unknown,
        };
        let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let aged = self.clock.now_ms().saturating_add(left);
        Peek::Known {
            etag: quiet.log,
            quiet_until: quiet.until.map(|u| u.min(aged)),
        }
    }

    /// What this process's ledger queues last saw of every subscription's partitions,
    /// newest topic incarnation and subscription id of each name only; no storage
    /// request.
    pub fn ledger_summaries(&self) -> Vec<LedgerSummary> {
        let queues: Vec<(LedgerKey, Arc<LedgerQueue>)> = lock(&self.ledgers.queues)
            .iter()
            .map(|(k, q)| (k.clone(), q.clone()))
            .collect();
        let mut newest: HashMap<(&str, &str), (&str, &str)> = HashMap::new();
        for (k, _) in &queues {
            let e = newest
                .entry((&k.topic, &k.subscription))
                .or_insert((&k.incarnation, &k.id));
            if (k.incarnation.as_str(), k.id.as_str()) > *e {
                *e = (&k.incarnation, &k.id);
            }
        }
        let mut out: Vec<LedgerSummary> = queues
            .iter()
            .filter(|(k, _)| {
                newest.get(&(k.topic.as_str(), k.subscription.as_str()))
                    == Some(&(k.incarnation.as_str(), k.id.as_str()))
            })
            .filter_map(|(k, q)| {
                let figures = lock(&q.state).figures?;
                Some(LedgerSummary {
                    topic: k.topic.clone(),
                    subscription: k.subscription.clone(),
                    partition: k.partition,
                    figures,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.topic, &a.subscription, a.partition).cmp(&(&b.topic, &b.subscription, b.partition))
        });
        out
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
            tokio::spawn(async move { me.drain_ledger(queue).await });
        }
    }

    /// Commits batches until the queue is empty, then, while this process is the ledger's
    /// committer ([`combine`]), sweeps. While the ledger is busy (the previous batch held
    /// more than one operation) each batch first waits the committer's `linger`, as the
    /// partition's own queue does: the clients answered by the last commit come back in
    /// time to share the next one.
    async fn drain_ledger(self: Arc<Self>, q: Arc<LedgerQueue>) {
        // Should this task ever die mid-batch, the next submit starts a new one.
        struct Running(Arc<LedgerQueue>);
        impl Drop for Running {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    lock(&self.0.state).running = false;
                }
            }
        }
        let _running = Running(q.clone());
        let mut last_batch = 0;
        loop {
            if last_batch > 1 && !self.linger.is_zero() {
                tokio::time::sleep(self.linger).await;
            }
            let (batch, rules, known) = {
                let mut st = lock(&q.state);
                if st.pending.is_empty() {
                    let with = st.role.sweep_with();
                    match (st.role.idle(), with) {
                        (Idle::Sweep, Some(rules)) => {
                            (Vec::new(), rules, std::mem::take(&mut st.known))
                        }
                        _ => {
                            st.running = false;
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

    /// One batch (none: a sweep): apply every operation to the ledger in one write over
    /// the log as known (read again when [`needs_log`] says so), landing other processes'
    /// intents when this process is the committer, or write them as intents when the
    /// ledger is contended ([`combine`]); and answer each. Returns what the next batch may
    /// start from.
    async fn ledger_batch(
        &self,
        q: &LedgerQueue,
        (batch, rules): (Vec<(LedgerOp, Rules, Answer)>, Rules),
        mut known: Known,
    ) -> Known {
        known.quiet = None;
        known.figures = None;
        let ops: Vec<LedgerOp> = batch.iter().map(|(op, _, _)| *op).collect();
        let sweep = batch.is_empty();
        let fail = |batch: Vec<(LedgerOp, Rules, Answer)>, e: BrokerError| {
            for (_, _, tx) in batch {
                tx.fail(e.clone());
            }
        };
        let cell =
            Cell::<SubscriptionState>::new(&*self.store, &*self.ids, &q.ledger_key, &q.origin);
        if rules.ordered && known.ledger.is_none() {
            // The key pass below runs on a copy of the ledger: read it first.
            match cell.read::<BrokerError>().await {
                Ok(snap) => known.ledger = Some(snap),
                Err(e) => {
                    fail(batch, e.into());
                    return known;
                }
            }
        }
        if let Err(e) = self.know_log(q, &ops, &mut known).await {
            fail(batch, e);
            return Known { log: None, ..known };
        }
        // Contended: the operations go as intents, and another process's commit may
        // decide them all.
        let mut own_intents: Option<Vec<Intent>> = None;
        let mut landing: Vec<Intent> = Vec::new();
        if self.ledger_combines(q, &ops, &rules, &mut known) {
            match self.await_intents(q, &ops, &mut known).await {
                Ok(Awaited::Decided(own)) => {
                    self.answer_intents(q, batch, &own, &mut known).await;
                    return known;
                }
                Ok(Awaited::TakeOver { own, listed }) => {
                    landing = listed;
                    landing.extend(own.iter().cloned());
                    own_intents = Some(own);
                }
                Err(e) => {
                    fail(batch, e);
                    return known;
                }
            }
        } else if !rules.ordered && lock(&q.state).role.is_committer() {
            let state = known.ledger.as_ref().map(|l| &l.value);
            landing = self.ledger_landing(q, state).await;
        }
        if sweep && landing.is_empty() {
            lock(&q.state).role.swept(false, Instant::now());
            return known;
        }
        let direct: &[LedgerOp] = if own_intents.is_some() { &[] } else { &ops };
        let asked: Vec<LedgerOp> = direct
            .iter()
            .copied()
            .chain(landing.iter().map(|i| subscription::op_of(i.ask)))
            .collect();
        // Taken out while the ledger changes beside it; put back below.
        let Some((log_snap, read_at)) = known.log.take() else {
            fail(batch, BrokerError::Internal("the log was not read".into()));
            return known;
        };
        let log = &log_snap.value;
        let layout = Arc::new(log.layout());
        let now = self.clock.now_ms();
        if rules.ordered {
            self.know_keys(q, (&ops, &rules, now), (log, &layout), &mut known)
                .await;
        }
        let beside = self.ledger_beside(q, known.ledger.as_ref().map(|l| &l.value), &rules);
        let mut known_log = (log_snap, read_at);
        let mut change = LedgerChange {
            logs: Cell::new(&*self.store, &*self.ids, &q.manifest_key, &q.incarnation),
            log: &mut known_log,
            ops: direct,
            intents: &landing,
            asked: &asked,
            attempts: 0,
            landed: 0,
            wrote: false,
            rules,
            now,
            keys: &known.keys,
            // `know_log` checked the log against the ledger this process knew, for the
            // batch's own operations only.
            checked: if landing.is_empty() {
                known.ledger.as_ref().map(|l| l.etag.clone())
            } else {
                None
            },
        };
        let (done, looked) = futures::join!(
            cell.update_in(&mut known.ledger, &mut change),
            self.list_ledger_beside(q, &beside)
        );
        let (attempts, landed, change_wrote) = (change.attempts, change.landed, change.wrote);
        // The layout of the log the commit used (a retry may have read it again).
        let layout = Arc::new(known_log.0.value.layout());
        known.log = Some(known_log);
        let state = known.ledger.as_ref().map(|l| &l.value);
        if let Some(look) = looked {
            self.ledger_looked(q, look, state);
        }
        {
            let now = Instant::now();
            let mut st = lock(&q.state);
            let a = Attempts {
                tries: attempts,
                confirmed: Confirmed::No,
                callers: !sweep,
            };
            st.role.committed(a, now);
            let own = own_intents.as_ref().map_or(0, Vec::len);
            if landed > own {
                st.role.mark_contended(now);
            }
            if sweep {
                st.role.swept(landed > 0, now);
            }
            if own_intents.is_some() && done.is_ok() {
                st.role.become_committer();
            }
        }
        let outcomes = match done {
            Ok(outcomes) => outcomes,
            Err(e) => {
                fail(batch, e.into());
                return known;
            }
        };
        if change_wrote {
            self.stats.ledger_commits.fetch_add(1, Ordering::Relaxed);
            let n = (direct.len() + landed) as u64;
            self.stats
                .ledger_committed_ops
                .fetch_add(n, Ordering::Relaxed);
        }
        if let Some(own) = own_intents {
            self.answer_intents(q, batch, &own, &mut known).await;
            return known;
        }
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

    /// Makes `known.log` the newest log this process knows (this queue's, or the one its
    /// own commits left), read again when [`needs_log`] says the batch `ops` needs it.
    ///
    /// Errors: the read's.
    async fn know_log(
        &self,
        q: &LedgerQueue,
        ops: &[LedgerOp],
        known: &mut Known,
    ) -> BrokerResult<()> {
        if let Some(own) = self.cached_manifest(&q.topic, &q.incarnation, q.partition) {
            if known
                .log
                .as_ref()
                .is_none_or(|(l, _)| l.value.version < own.value.version)
            {
                known.log = Some((own, Instant::now()));
            }
        }
        let stale = match &known.log {
            None => true,
            Some((l, at)) => {
                let state = known.ledger.as_ref().map(|s| &s.value);
                needs_log(ops, state, (&l.value, *at), self.clock.now_ms())
            }
        };
        if !stale {
            return Ok(());
        }
        let logs = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.manifest_key, &q.incarnation);
        match known.log.as_mut() {
            Some((snap, at)) => {
                logs.refresh::<BrokerError>(snap).await?;
                *at = Instant::now();
            }
            None => known.log = Some((logs.read::<BrokerError>().await?, Instant::now())),
        }
        Ok(())
    }

    /// On a per-key ordered topic: reads into `known.keys` the message keys the lease
    /// pass of `ops` over `log` needs, running the pure batch on a copy of the ledger and
    /// reading what it stopped at, up to [`super::ordering::KEY_ROUNDS`] times (what it
    /// still does not know is not leased this time: never out of order).
    async fn know_keys(
        &self,
        q: &LedgerQueue,
        (ops, rules, now): (&[LedgerOp], &Rules, u64),
        (log, layout): (&Manifest, &Layout),
        known: &mut Known,
    ) {
        let Some(state) = &known.ledger else {
            return;
        };
        for _ in 0..super::ordering::KEY_ROUNDS {
            let mut copy = state.value.clone();
            let (_, wants) = subscription::apply(&mut copy, log, now, rules, (ops, &known.keys));
            let Some(from) = wants else {
                return;
            };
            let at = (q.topic.as_str(), q.partition);
            if !self.read_keys(at, layout, from, &mut known.keys).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::manifest_with;

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
        let old = Instant::now() - LOG_MAX_AGE - Duration::from_secs(1);
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
            (&log, Instant::now()),
            0
        ));
        assert!(!needs_log(&[ack], Some(&state(0)), (&log, old), 0));
    }
}
