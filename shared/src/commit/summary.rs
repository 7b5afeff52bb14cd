//! What this process last saw of every partition and subscription it committed to or
//! read, for `/metrics` ([`Committer::summaries`]): no storage request.

use std::collections::HashMap;
use std::sync::Arc;

use super::{lock, Committer, Queue};
use crate::partition::{Ledger, Manifest, SegmentRef};

/// A group's figures on one partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    /// Unsettled messages with no live lease and no delay.
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Unsettled messages not due yet.
    pub delayed: u64,
    /// Messages retention or a topic purge removed before a named subscription settled
    /// them (0 for the default one).
    pub lost: u64,
}

impl Figures {
    /// `ledger`'s figures at `now`, with `lost` messages.
    pub(crate) fn of(ledger: &impl Ledger, now: u64, lost: u64) -> Self {
        Figures {
            available: ledger.available_count(now),
            in_flight: ledger.in_flight(now) as u64,
            delayed: ledger.delayed_count(now),
            lost,
        }
    }
}

/// One partition of one group as this process last saw it: as of its last commit or read
/// of the manifest (the default group) or of the subscription's ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Topic.
    pub topic: String,
    /// The named subscription; `None`: the default one.
    pub subscription: Option<String>,
    /// Partition.
    pub partition: u32,
    /// Its figures.
    pub figures: Figures,
    /// The default group's lowest unsettled offset and the hot segment holding it, when
    /// there is one and the manifest names it directly.
    pub frontier: Option<(u64, SegmentRef)>,
}

/// A queue as [`Committer::summaries`] finds it.
pub(super) struct Seen {
    /// Whose it is: the topic and the subscription (`None`: the default one).
    pub group: (String, Option<String>),
    /// Which incarnation of the topic and which subscription id ("" for the default one).
    pub version: (String, String),
    /// What it last saw (`None`: nothing yet).
    pub summary: Option<Summary>,
}

/// The summaries of `seen` of each group's newest version only (the queues of a topic or
/// subscription deleted and created again linger), by topic, subscription and partition.
pub(super) fn newest(seen: Vec<Seen>) -> Vec<Summary> {
    let mut top: HashMap<&(String, Option<String>), &(String, String)> = HashMap::new();
    for s in &seen {
        let e = top.entry(&s.group).or_insert(&s.version);
        if s.version > **e {
            *e = &s.version;
        }
    }
    let keep: Vec<bool> = seen.iter().map(|s| top[&s.group] == &s.version).collect();
    let mut out: Vec<Summary> = seen
        .into_iter()
        .zip(keep)
        .filter_map(|(s, keep)| s.summary.filter(|_| keep))
        .collect();
    out.sort_by(|a, b| {
        (&a.topic, &a.subscription, a.partition).cmp(&(&b.topic, &b.subscription, b.partition))
    });
    out
}

/// What `q`'s cached manifest `m` shows at `now`.
fn of_manifest(q: &Queue, m: &Manifest, now: u64) -> Summary {
    let frontier = (m.next_offset > m.frontier)
        .then(|| m.hot_segment_of(m.frontier).cloned())
        .flatten()
        .map(|seg| (m.frontier, seg));
    Summary {
        topic: q.topic.clone(),
        subscription: None,
        partition: q.partition,
        figures: Figures::of(m, now, 0),
        frontier,
    }
}

impl Committer {
    /// What this process last saw of every partition and every subscription's partition,
    /// the newest topic incarnation and subscription id of each name only; no storage
    /// request.
    pub(crate) fn summaries(&self) -> Vec<Summary> {
        let now = self.clock.now_ms();
        let queues: Vec<Arc<Queue>> = lock(&self.queues).values().cloned().collect();
        let mut seen: Vec<Seen> = queues
            .iter()
            .map(|q| Seen {
                group: (q.topic.clone(), None),
                version: (q.incarnation.clone(), String::new()),
                summary: lock(&q.state)
                    .held
                    .as_ref()
                    .map(|snap| of_manifest(q, &snap.value, now)),
            })
            .collect();
        seen.extend(self.ledgers.seen());
        newest(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(topic: &str, sub: Option<&str>, version: (&str, &str), p: Option<u32>) -> Seen {
        Seen {
            group: (topic.into(), sub.map(Into::into)),
            version: (version.0.into(), version.1.into()),
            summary: p.map(|partition| Summary {
                topic: topic.into(),
                subscription: sub.map(Into::into),
                partition,
                figures: Figures::default(),
                frontier: None,
            }),
        }
    }

    #[test]
    fn only_the_newest_incarnation_and_subscription_id_of_each_group_counts() {
        let got = newest(vec![
            seen("t", None, ("i2", ""), Some(1)),
            seen("t", None, ("i1", ""), Some(0)),
            // The newest incarnation's partition 0 has seen nothing yet: no old figures.
            seen("t", None, ("i2", ""), None),
            seen("t", Some("s"), ("i2", "a"), Some(0)),
            seen("t", Some("s"), ("i2", "b"), Some(3)),
            seen("t", Some("s"), ("i1", "z"), Some(5)),
            seen("a", None, ("i0", ""), Some(2)),
        ]);
        let keys: Vec<(&str, Option<&str>, u32)> = got
            .iter()
            .map(|s| (s.topic.as_str(), s.subscription.as_deref(), s.partition))
            .collect();
        assert_eq!(keys, [("a", None, 2), ("t", None, 1), ("t", Some("s"), 3)]);
    }
}
