//! What a ledger's queue knows between batches, and what it tells without a storage
//! request: whether a waiting consume may skip the partition ([`Ledgers::peek`])
//! and the figures `/metrics` shows ([`crate::commit::Committer::summaries`]).

use std::time::Duration;

use crate::runtime::Instant;

use super::Ledgers;
use crate::cas::Snapshot;
use crate::commit::summary::{Figures, Seen, Summary};
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

/// How long the waiting consume that went to renew a partition's knowledge has for it
/// before another may ([`Ledgers::peek`]): one whose request ended first leaves it.
const RENEWAL_CLAIM: Duration = Duration::from_secs(1);

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
    *figures = Some(Figures::of(&view, now, lost));
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
        let (quiet, left) = {
            let mut st = lock(&queue.state);
            let Some(quiet) = st.more.quiet.clone() else {
                return Peek::Unknown;
            };
            let renewing =
                st.busy() || st.more.renewal.is_some_and(|t| t.elapsed() < RENEWAL_CLAIM);
            let left = match LEDGER_MAX_AGE.checked_sub(quiet.at.elapsed()) {
                Some(left) if !left.is_zero() => left,
                // Too old: the first waiter to look starts a batch, which renews it; the
                // others look again shortly rather than each queue a lease of their own
                // (waiters waking together each started one, and read the log and the
                // ledger again: an idle subscription's cost varied by a tenth).
                _ if renewing => RENEWING_LOOK,
                _ => {
                    st.more.renewal = Some(crate::runtime::now());
                    return Peek::Unknown;
                }
            };
            (quiet, left)
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
    /// Every ledger queue of this process as [`crate::commit::Committer::summaries`] counts it: the
    /// figures its last batch that succeeded left.
    pub(in crate::commit) fn seen(&self) -> Vec<Seen> {
        lock(&self.queues)
            .iter()
            .map(|(k, q)| Seen {
                group: (k.topic.clone(), Some(k.subscription.clone())),
                version: (k.incarnation.clone(), k.id.clone()),
                summary: lock(&q.state).more.figures.map(|figures| Summary {
                    topic: k.topic.clone(),
                    subscription: Some(k.subscription.clone()),
                    partition: k.partition,
                    figures,
                    frontier: None,
                }),
            })
            .collect()
    }
}
