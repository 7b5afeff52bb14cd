//! The callers of one batch and how each is answered: from the manifest this process
//! wrote, or (a combining batch) from what another process's commit recorded of its
//! segment and intents. Nobody is answered before the manifest that holds their
//! operation was written or read.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::wait::Own;
use super::{LeaseAnswer, Op, Pending, TopicSeen};
use crate::error::{BrokerError, BrokerResult};
use crate::partition::batch::{self, Applied, Batch};
use crate::partition::intent::{self, Answered, Decides, Intent};
use crate::partition::produce::Unplaced;
use crate::partition::subscription::{LedgerOp, LedgerOutcome};
use crate::partition::Lease;
use crate::partition::{Layout, Manifest, Rules};
use crate::settings::TopicSettings;
use crate::store::ETag;
use std::collections::BTreeMap;

/// The callers of a batch, group by group in the batch's order.
#[derive(Default)]
pub(super) struct Replies {
    produced: Vec<oneshot::Sender<BrokerResult<Vec<u64>>>>,
    settled: Vec<oneshot::Sender<BrokerResult<()>>>,
    leased: Vec<oneshot::Sender<BrokerResult<LeaseAnswer>>>,
    compacted: Vec<oneshot::Sender<BrokerResult<u64>>>,
    purged: Vec<oneshot::Sender<BrokerResult<u64>>>,
}

impl Replies {
    pub(super) fn len(&self) -> usize {
        self.produced.len()
            + self.settled.len()
            + self.leased.len()
            + self.compacted.len()
            + self.purged.len()
    }

    /// Answers every caller with its own result; leases with the committed `layout`, and
    /// as `shared` when the partition is contended (other processes lease from it too).
    pub(super) fn answer(
        self,
        applied: Applied,
        refused: Option<&BrokerError>,
        layout: Arc<Layout>,
        shared: bool,
    ) {
        for (tx, r) in self.produced.into_iter().zip(applied.produced) {
            let r = r.map_err(|why| match why {
                Unplaced::DelayedFull => BrokerError::DelayedFull,
                Unplaced::NoSegment => refused.cloned().unwrap_or_else(|| {
                    BrokerError::Internal("a produce found no segment and no refusal".into())
                }),
            });
            let _ = tx.send(r);
        }
        for (tx, r) in self.settled.into_iter().zip(applied.settled) {
            let _ = tx.send(r.map_err(BrokerError::from));
        }
        for (tx, leased) in self.leased.into_iter().zip(applied.leased) {
            let layout = layout.clone();
            let _ = tx.send(Ok(LeaseAnswer {
                leased,
                layout,
                shared,
            }));
        }
        for (tx, r) in self.compacted.into_iter().zip(applied.compacted) {
            let _ = tx.send(Ok(r));
        }
        for (tx, r) in self.purged.into_iter().zip(applied.purged) {
            let _ = tx.send(Ok(r));
        }
    }

    /// Answers a combining batch that other processes' commits decided, as `state`
    /// shows: its produces from its segment's base offset, its settles and leases from
    /// the outcomes of its `own` intents.
    pub(super) fn answer_decided(
        self,
        batch: &Batch,
        base: Option<u64>,
        own: &Own,
        state: &Manifest,
    ) {
        let mut next = base;
        for (tx, msgs) in self.produced.into_iter().zip(&batch.produces) {
            let n = msgs.len() as u64;
            let _ = tx.send(match next {
                Some(b) => {
                    next = Some(b + n);
                    Ok((b..b + n).collect())
                }
                None => {
                    tracing::warn!("a combining produce decided without a segment: answered 503");
                    Err(BrokerError::Contention)
                }
            });
        }
        let layout = Arc::new(state.layout());
        let callers = answers(self.settled, self.leased);
        answer_intents(callers, &own.intents, (state, &state.leases), &layout);
    }

    /// Answers a combining batch this process committed: its produces from `applied`,
    /// its settles and leases from the outcomes of its `own` intents in `state`.
    pub(super) fn answer_own(
        self,
        applied: Applied,
        refused: Option<&BrokerError>,
        own: &[Intent],
        state: &Manifest,
    ) {
        let layout = Arc::new(state.layout());
        let Self {
            produced,
            settled,
            leased,
            compacted,
            purged,
        } = self;
        let produces = Self {
            produced,
            ..Self::default()
        };
        produces.answer(applied, refused, layout.clone(), true);
        answer_intents(
            answers(settled, leased),
            own,
            (state, &state.leases),
            &layout,
        );
        // A combining batch holds neither; should one slip in, it is not left hanging.
        let e = BrokerError::Internal("not a combining operation".into());
        Self {
            compacted,
            purged,
            ..Self::default()
        }
        .fail(&e);
    }

    /// Answers every caller with `e`.
    pub(super) fn fail(self, e: &BrokerError) {
        fn all<T>(txs: Vec<oneshot::Sender<BrokerResult<T>>>, e: &BrokerError) {
            for tx in txs {
                let _ = tx.send(Err(e.clone()));
            }
        }
        all(self.produced, e);
        all(self.settled, e);
        all(self.leased, e);
        all(self.compacted, e);
        all(self.purged, e);
    }
}

/// Answers the callers of intents `own` (one each, in order) from what `state`, whose
/// leases are `leases`, records of them ([`intent::answered`]): leases with `layout`, as
/// shared. One whose outcome is not recorded gets 503 (the outcome unknown).
pub(super) fn answer_intents(
    callers: impl IntoIterator<Item = Answer>,
    own: &[Intent],
    (state, leases): (&impl Decides, &BTreeMap<u64, Lease>),
    layout: &Arc<Layout>,
) {
    for (k, tx) in callers.into_iter().enumerate() {
        match own
            .get(k)
            .and_then(|i| intent::answered(state, leases, &i.id))
        {
            Some(Answered::Settled(r)) => tx.answer(LedgerOutcome::Settled(r), layout, true),
            Some(Answered::Leased(l)) => tx.answer(LedgerOutcome::Leased(l), layout, true),
            None => tx.fail(BrokerError::Contention),
        }
    }
}

pub(super) enum Answer {
    Lease(oneshot::Sender<BrokerResult<LeaseAnswer>>),
    Settle(oneshot::Sender<BrokerResult<()>>),
    Purge(oneshot::Sender<BrokerResult<u64>>),
}

impl Answer {
    /// Sends the caller what its operation got (leases with the layout they were granted
    /// over; `shared` when they were granted through an intent).
    pub(super) fn answer(self, out: LedgerOutcome, layout: &Arc<Layout>, shared: bool) {
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

    pub(super) fn fail(self, e: BrokerError) {
        match self {
            Answer::Lease(tx) => drop(tx.send(Err(e))),
            Answer::Settle(tx) => drop(tx.send(Err(e))),
            Answer::Purge(tx) => drop(tx.send(Err(e))),
        }
    }
}

impl Answer {
    /// The ledger operation `op` asks for, and its caller; `Err` with the caller for an
    /// operation no ledger takes (a produce, a compaction: they go to the partition's
    /// queue).
    pub(super) fn of(op: Op) -> Result<(LedgerOp, Answer), Op> {
        Ok(match op {
            Op::Lease(max, max_bytes, tx) => {
                (LedgerOp::Lease { max, max_bytes }, Answer::Lease(tx))
            }
            Op::Settle(s, tx) => {
                let op = LedgerOp::Settle {
                    offset: s.offset,
                    lease_id: s.lease_id,
                    action: s.action,
                };
                (op, Answer::Settle(tx))
            }
            Op::Purge(tx) => (LedgerOp::Purge, Answer::Purge(tx)),
            op @ (Op::Produce(..) | Op::Compact(..)) => return Err(op),
        })
    }
}

/// The callers of a combining batch's settles, then of its lease requests, in the order
/// of its intents.
fn answers(
    settled: Vec<oneshot::Sender<BrokerResult<()>>>,
    leased: Vec<oneshot::Sender<BrokerResult<LeaseAnswer>>>,
) -> impl Iterator<Item = Answer> {
    let settled = settled.into_iter().map(Answer::Settle);
    settled.chain(leased.into_iter().map(Answer::Lease))
}

/// Splits queued operations into the pure batch and the callers to answer.
pub(super) fn split(pending: Vec<Pending>) -> (Batch, Replies, TopicSeen) {
    // Retention and the dedup window follow the first operation's view of the topic.
    let rules = pending
        .first()
        .map_or_else(|| Rules::from(&TopicSettings::default()), |p| p.rules);
    let mut batch = Batch::new(rules);
    let mut replies = Replies::default();
    let mut topic: Option<TopicSeen> = None;
    for p in pending {
        match &mut topic {
            None => topic = Some(p.topic),
            // Fresh only if every caller read the same record itself.
            Some(t) => t.fresh &= p.topic.fresh && p.topic.etag == t.etag,
        }
        match p.op {
            Op::Produce(msgs, tx) => {
                batch.produces.push(msgs);
                replies.produced.push(tx);
            }
            Op::Settle(op, tx) => {
                batch.settles.push(op);
                replies.settled.push(tx);
            }
            Op::Lease(max, max_bytes, tx) => {
                batch.leases.push(batch::LeaseOp {
                    max,
                    max_bytes,
                    rules: p.rules,
                });
                replies.leased.push(tx);
            }
            Op::Compact(swaps, tx) => {
                batch.swaps.push(swaps);
                replies.compacted.push(tx);
            }
            Op::Purge(tx) => {
                batch.purges += 1;
                replies.purged.push(tx);
            }
        }
    }
    let topic = topic.unwrap_or(TopicSeen {
        etag: ETag::new(""),
        fresh: false,
    });
    (batch, replies, topic)
}
