//! What a ledger's queue knows between batches, and what it tells without a storage
//! request: whether a waiting consume may skip the partition ([`Ledgers::peek`])
//! and the figures `/metrics` shows ([`Ledgers::summaries`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::Instant;

use super::{LedgerKey, LedgerQueue, Ledgers};
use crate::cas::Snapshot;
use crate::commit::{lock, Peek};
use crate::partition::lease::{self, Keys};
use crate::partition::subscription::SubscriptionState;
use crate::partition::{Manifest, Rules};
use crate::store::ETag;
use crate::subscription::SubscriptionRecord;
use crate::topic::Topic;

/// How long a waiting consume may skip a partition on the ledger as this process last
/// read or wrote it ([`Ledgers::peek`]): another process's nack or release
/// reaches this process's idle waiters within it, as the longest listing interval
/// (`idle_poll_max`, 4 s) bounds other news.
pub(super) const LEDGER_MAX_AGE: Duration = Duration::from_secs(4);

/// How soon a waiting consume looks again at a partition whose knowledge a batch is
/// renewing ([`Ledgers::peek`]).
const RENEWING_LOOK: Duration = Duration::from_millis(50);

/// One subscription's partition as a batch left it ([`Ledgers::summaries`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
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
pub(crate) struct LedgerSummary {
    /// Topic.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Partition.
    pub partition: u32,
    /// As of this process's last commit or read of the ledger.
    pub figures: Figures,
}

/// What a queue knows between batches.
#[derive(Default)]
pub(super) struct Known {
    /// The log as last read, and when.
    pub(super) log: Option<(Snapshot<Manifest>, Instant)>,
    /// The ledger as last written or read.
    pub(super) ledger: Option<Snapshot<SubscriptionState>>,
    /// Message keys read for per-key ordering, at or above the ledger's frontier.
    pub(super) keys: Keys,
    /// What the last batch left for waiting consumes, when it found nothing more to lease.
    pub(super) quiet: Option<Quiet>,
    /// What the last batch left, for `/metrics`.
    pub(super) figures: Option<Figures>,
}

/// What a batch that left nothing to lease knew ([`Ledgers::peek`]).
#[derive(Debug, Clone)]
pub(super) struct Quiet {
    /// The ETag of the log it used.
    pub(super) log: Option<ETag>,
    /// [`lease::quiet_until`] over that log and the ledger it left.
    pub(super) until: Option<u64>,
    /// When the batch ended: the ledger was the stored one then.
    pub(super) at: Instant,
}

/// What a batch that succeeded leaves beside `known` at `now`: its [`Figures`], and, when
/// a lease request in it got less than it asked for (`drained`), its [`Quiet`]. No copy
/// of the ledger: a batch leaves it caught up with the log it used (`apply` catches up
/// first, and a batch that kept the ledger as it was found nothing to catch up).
pub(super) fn note_batch(known: &mut Known, drained: bool, rules: &Rules, now: u64) {
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
            at: crate::runtime::now(),
        });
    }
}

impl Ledgers {
    /// What a waiting consume of the subscription `sub` may know of `partition` at `now`
    /// without a storage request ([`Committer::peek`]): the ETag of the log
    /// and when a lease could next get anything, as the last batch left them when it
    /// found nothing more to lease, for [`LEDGER_MAX_AGE`] after it ([`Peek::Unknown`]
    /// otherwise; while a batch renews it, a little longer). A batch running meanwhile does
    /// not hide it: waiting consumes that wake together do not each start a batch.
    pub(in crate::commit) fn peek(
        &self,
        topic: &Topic,
        (name, sub): (&str, &SubscriptionRecord),
        partition: u32,
        now: u64,
    ) -> Peek {
        let Some(queue) = self.queue(topic, (name, sub), partition) else {
            return Peek::Unknown;
        };
        let (quiet, renewing) = {
            let st = lock(&queue.state);
            let Some(quiet) = st.more.quiet.clone() else {
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
        let aged = now.saturating_add(left);
        Peek::Known {
            etag: quiet.log,
            quiet_until: quiet.until.map(|u| u.min(aged)),
        }
    }
}

impl Ledgers {
    /// What this process's ledger queues last saw of every subscription's partitions,
    /// newest topic incarnation and subscription id of each name only; no storage
    /// request.
    pub(crate) fn summaries(&self) -> Vec<LedgerSummary> {
        let queues: Vec<(LedgerKey, Arc<LedgerQueue>)> = lock(&self.queues)
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
                let figures = lock(&q.state).more.figures?;
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
}
