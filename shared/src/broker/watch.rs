//! The idle watch: how long-polling consumers learn of work another process committed,
//! and what they pay while nothing happens (docs/design.md §5, "Idle topics").
//!
//! Every consume waiting on a topic of [`keys::LAYOUT_FLAT`] in this process shares one
//! [`Watch`], which looks at the store in *rounds*, at most one per interval however many
//! consumers wait. A topic of up to [`READ_EACH_MAX`] partitions is looked at
//! [`Way::Each`]: one conditional GET of every partition's manifest through the
//! committer ([`crate::commit::Committer::refresh`]), which answers 304 when the manifest
//! is the copy this process holds and otherwise makes the new one that copy, so a waiter
//! woken by it leases at the first try with no read of its own; `topic.json` is confirmed
//! every [`TOPIC_CONFIRM_EVERY`]. A topic of more partitions is looked at [`Way::List`]:
//! one delimited listing shows the ETag of `topic.json` and of every manifest (a LIST is
//! priced like 12.5 GETs). A waiting consume then skips, with no storage request, each
//! partition whose manifest the round saw as the copy the committer holds with nothing to
//! lease before its next lease lapses ([`crate::commit::Committer::peek`]).
//!
//! The interval starts short while the topic is active and doubles after every round
//! that shows no change, up to an idle cap, falling back to the start as soon as a round
//! shows a change ([`next_interval`], [`Intervals::of`]). Commits made by this process
//! wake its waiters at once ([`crate::commit::Wakers`]); work committed by another
//! process reaches a waiter within one interval. A consume with `wait=0` never relies on
//! the watch: it reads every partition's manifest, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::runtime::Instant;
use tokio::sync::Notify;

use super::Broker;
use crate::commit::Refreshed;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::store::ETag;
use crate::topic::Topic;

/// Partitions at most a watch reads one by one; past it a listing is cheaper for the
/// same wake-up time (12.5 GETs cost one LIST).
pub(super) const READ_EACH_MAX: u32 = 12;

/// Partitions whose reads set the idle interval of [`Way::Each`]: a topic of `n`
/// partitions reads each at `n / 4` times the idle interval (never less often than
/// active), so an idle topic costs about the same whatever its partition count.
const IDLE_BUDGET_PARTITIONS: u32 = 4;

/// How often a watch reading partitions one by one confirms `topic.json` (a listing shows
/// it every round): settings changed by another process reach idle waiters within this.
pub(super) const TOPIC_CONFIRM_EVERY: Duration = Duration::from_secs(4);

/// How a watch looks at a topic in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// A conditional GET of every partition's manifest.
    Each,
    /// One listing of the topic.
    List,
}

/// The interval ranges of both ways: from the active interval to the idle cap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Intervals {
    /// [`Way::Each`]: the active interval, and the idle one for a topic of up to 4
    /// partitions.
    pub each: (Duration, Duration),
    /// [`Way::List`]: the active interval and the idle cap.
    pub list: (Duration, Duration),
}

impl Intervals {
    /// The way a topic of `partitions` is watched, and its interval range.
    pub(super) fn of(&self, partitions: u32) -> (Way, (Duration, Duration)) {
        if partitions > READ_EACH_MAX {
            let (min, max) = self.list;
            return (Way::List, (min, max.max(min)));
        }
        let (min, idle) = self.each;
        let share = partitions.max(1);
        let max = idle.saturating_mul(share) / IDLE_BUDGET_PARTITIONS;
        (Way::Each, (min, max.max(min)))
    }
}

/// The interval after a round: the shortest after the first round or one that showed a
/// change, else twice the last, within `(min, max)`.
pub(super) fn next_interval(
    last: Option<Duration>,
    changed: bool,
    (min, max): (Duration, Duration),
) -> Duration {
    match last {
        Some(last) if !changed => last.saturating_mul(2).clamp(min, max.max(min)),
        _ => min,
    }
}

/// What a round saw of one partition's manifest (no entry: there is none).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shown {
    /// The manifest with this ETag.
    Etag(ETag),
    /// Not known: a batch of this process was committing it, or its read failed.
    Unknown,
}

/// One topic's latest round.
#[derive(Debug, Default)]
struct Rounds {
    /// When it was made.
    at: Option<Instant>,
    /// The interval until the next one.
    interval: Duration,
    /// ETag of `topic.json` (`None`: the topic is gone), and when it was confirmed.
    topic_etag: Option<ETag>,
    topic_at: Option<Instant>,
    /// What it saw of each partition.
    manifests: HashMap<u32, Shown>,
    /// False after a failed round (until the next one succeeds).
    valid: bool,
    /// Rounds finished (successful or not).
    tried: u64,
}

/// What one round found.
#[derive(Debug, Default)]
struct Found {
    /// ETag of `topic.json` (`None`: the topic is gone).
    topic_etag: Option<ETag>,
    /// Whether the round read `topic.json` (or listed it).
    topic_confirmed: bool,
    manifests: HashMap<u32, Shown>,
    /// Whether another process changed a manifest since this process last saw it.
    changed: bool,
    /// Whether a listing found it: a change is any ETag unlike the last round's.
    listed: bool,
    /// The interval range for the topic's way.
    range: (Duration, Duration),
}

/// A round a consume relies on.
#[derive(Debug, Clone)]
pub(super) struct View {
    /// ETag of `topic.json` (`None`: the topic is gone).
    pub(super) topic_etag: Option<ETag>,
    manifests: HashMap<u32, Shown>,
}

impl View {
    /// What the round saw of partition `p`.
    pub(super) fn seen(&self, p: u32) -> Seen<'_> {
        match self.manifests.get(&p) {
            Some(Shown::Etag(e)) => Seen::Etag(e),
            Some(Shown::Unknown) => Seen::Unknown,
            None => Seen::Missing,
        }
    }
}

/// What a round says of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen<'a> {
    /// No manifest: an empty partition.
    Missing,
    /// The manifest with this ETag.
    Etag(&'a ETag),
    /// Not known: the consume reads it.
    Unknown,
}

/// The shared idle watch of one topic in this process.
#[derive(Debug)]
pub(super) struct Watch {
    topic: String,
    rounds: Mutex<Rounds>,
    /// One round at a time.
    single: tokio::sync::Mutex<()>,
    /// Woken after every round that shows a change.
    changed: Notify,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, Rounds> {
        self.rounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the next round is due (now if none was made), and the number of rounds
    /// tried so far (for [`Broker::watch_round`]).
    pub(super) fn due(&self) -> (Instant, u64) {
        let r = self.lock();
        let at = match r.at {
            Some(at) => at + r.interval,
            None => crate::runtime::now(),
        };
        (at, r.tried)
    }

    /// The notifier woken when a round shows a change.
    pub(super) fn changed(&self) -> &Notify {
        &self.changed
    }

    /// The latest round if a consume may rely on it: made successfully, and still
    /// within its interval (plus a second, for the round under way).
    pub(super) fn view(&self) -> Option<View> {
        let r = self.lock();
        let fresh = r.valid
            && r.at
                .is_some_and(|at| at.elapsed() <= r.interval + Duration::from_secs(1));
        fresh.then(|| View {
            topic_etag: r.topic_etag.clone(),
            manifests: r.manifests.clone(),
        })
    }

    /// The `topic.json` ETag the last confirmation saw, unless it is due again.
    fn topic_confirmed(&self) -> Option<ETag> {
        let r = self.lock();
        let recent = r
            .topic_at
            .is_some_and(|at| at.elapsed() < TOPIC_CONFIRM_EVERY);
        if recent {
            r.topic_etag.clone()
        } else {
            None
        }
    }

    /// Records a round: what it found, or that it failed (the waiters then read the
    /// manifests themselves until a round succeeds). Wakes the waiters on a change.
    fn record(&self, found: Result<Found, Duration>) {
        let changed = {
            let mut r = self.lock();
            let now = crate::runtime::now();
            let changed = match found {
                Ok(f) => {
                    let moved = f.listed && r.manifests != f.manifests;
                    let changed =
                        r.at.is_some() && (f.changed || moved || r.topic_etag != f.topic_etag);
                    let last = r.at.map(|_| r.interval);
                    r.interval = next_interval(last, changed, f.range);
                    if f.topic_confirmed {
                        r.topic_at = Some(now);
                    }
                    r.topic_etag = f.topic_etag;
                    r.manifests = f.manifests;
                    r.valid = true;
                    changed
                }
                Err(shortest) => {
                    (r.interval, r.valid) = (shortest, false);
                    false
                }
            };
            r.at = Some(now);
            // Counted when done: a waiter that read the old due time meanwhile skips.
            r.tried += 1;
            changed
        };
        if changed {
            self.changed.notify_waiters();
        }
    }
}

/// Every topic's [`Watch`] in this process.
#[derive(Debug)]
pub(super) struct Watches {
    intervals: Intervals,
    map: Mutex<HashMap<String, Arc<Watch>>>,
}

/// Watches kept at most; past it, those no waiter holds are dropped (their topics'
/// next waiter looks afresh).
const MAX_WATCHES: usize = 4096;

impl Watches {
    /// Watches whose rounds run at `intervals`.
    pub(super) fn new(intervals: Intervals) -> Self {
        Self {
            intervals,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The watch of `topic`.
    pub(super) fn get(&self, topic: &str) -> Arc<Watch> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_WATCHES && !map.contains_key(topic) {
            map.retain(|_, w| Arc::strong_count(w) > 1);
        }
        map.entry(topic.to_owned())
            .or_insert_with(|| {
                Arc::new(Watch {
                    topic: topic.to_owned(),
                    rounds: Mutex::new(Rounds::default()),
                    single: tokio::sync::Mutex::new(()),
                    changed: Notify::new(),
                })
            })
            .clone()
    }
}

impl Broker {
    /// Makes a round of `watch` unless another waiter made one since [`Watch::due`]
    /// answered `tried`. A failed round is logged; the waiters then read the manifests
    /// themselves.
    pub(super) async fn watch_round(&self, watch: &Watch, tried: u64) {
        let _one = watch.single.lock().await;
        if watch.lock().tried != tried {
            return; // another waiter made one meanwhile
        }
        let found = self.look_around(watch).await;
        if let Err(e) = &found {
            tracing::debug!(topic = watch.topic, error = %e, "idle watch round failed");
        }
        let shortest = self.watches.intervals.each.0;
        watch.record(found.map_err(|_| shortest));
    }

    /// One round: the topic as last confirmed (read again when due or unknown), then its
    /// partitions the topic's [`Way`].
    async fn look_around(&self, watch: &Watch) -> BrokerResult<Found> {
        let name = watch.topic.as_str();
        let confirmed = watch.topic_confirmed();
        let cached = confirmed.and_then(|etag| self.topics.confirmed(name, &etag));
        let (topic, read) = match cached {
            Some(t) => (t, false),
            None => match self.load_topic(name).await {
                Ok(t) => (t, true),
                Err(BrokerError::TopicNotFound) => {
                    return Ok(Found {
                        topic_confirmed: true,
                        ..Found::default()
                    })
                }
                Err(e) => return Err(e),
            },
        };
        let (way, range) = self.watches.intervals.of(topic.settings.partitions);
        let mut found = match way {
            Way::Each => self.read_each(&topic).await,
            Way::List => self.list_topic(name).await?,
        };
        found.range = range;
        if way == Way::Each {
            found.topic_etag = Some(topic.etag.clone());
            found.topic_confirmed = read;
        }
        Ok(found)
    }

    /// A conditional GET of every partition's manifest through the committer.
    async fn read_each(&self, topic: &Topic) -> Found {
        let reads = (0..topic.settings.partitions)
            .map(|p| async move { (p, self.committer.refresh(topic, p).await) });
        let mut found = Found::default();
        for (p, read) in futures::future::join_all(reads).await {
            let shown = match read {
                Ok(Refreshed::Current(etag)) => etag.map(Shown::Etag),
                Ok(Refreshed::Changed(etag)) => {
                    found.changed = true;
                    etag.map(Shown::Etag)
                }
                Ok(Refreshed::Busy) => Some(Shown::Unknown),
                Err(e) => {
                    tracing::debug!(topic = topic.name, partition = p, error = %e,
                        "idle watch read failed");
                    found.changed = true; // the waiters read it themselves at once
                    Some(Shown::Unknown)
                }
            };
            if let Some(shown) = shown {
                found.manifests.insert(p, shown);
            }
        }
        found
    }

    /// One delimited listing of the topic: `topic.json` and every manifest, with ETags.
    async fn list_topic(&self, name: &str) -> BrokerResult<Found> {
        let files = self.store.list_files(&keys::topic_prefix(name)).await?;
        let settings_key = keys::topic_settings(name);
        let mut found = Found {
            topic_confirmed: true,
            listed: true,
            ..Found::default()
        };
        for f in files {
            if f.key == settings_key {
                found.topic_etag = Some(f.etag);
            } else if let Some(p) = keys::partition_of_manifest(name, &f.key) {
                found.manifests.insert(p, Shown::Etag(f.etag));
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn intervals() -> Intervals {
        Intervals {
            each: (100 * MS, 1500 * MS),
            list: (500 * MS, 4000 * MS),
        }
    }

    #[test]
    fn an_idle_topic_costs_about_the_same_whatever_its_partitions() {
        let i = intervals();
        assert_eq!(i.of(4), (Way::Each, (100 * MS, 1500 * MS)));
        // Fewer partitions: each is read more often for the same number of reads.
        assert_eq!(i.of(2), (Way::Each, (100 * MS, 750 * MS)));
        assert_eq!(i.of(1), (Way::Each, (100 * MS, 375 * MS)));
        assert_eq!(i.of(0), (Way::Each, (100 * MS, 375 * MS)));
        assert_eq!(i.of(12), (Way::Each, (100 * MS, 4500 * MS)));
        // Past 12 partitions one listing is cheaper than a GET of each.
        assert_eq!(i.of(13), (Way::List, (500 * MS, 4000 * MS)));
        // A cap below the active interval is the active interval.
        let tight = Intervals {
            each: (100 * MS, 10 * MS),
            list: (500 * MS, 10 * MS),
        };
        assert_eq!(tight.of(1).1, (100 * MS, 100 * MS));
        assert_eq!(tight.of(64).1, (500 * MS, 500 * MS));
    }

    #[test]
    fn the_interval_doubles_while_quiet_and_drops_at_a_change() {
        let range = (100 * MS, 750 * MS);
        assert_eq!(next_interval(None, false, range), 100 * MS);
        let mut last = 100 * MS;
        let mut seen = vec![];
        for _ in 0..5 {
            last = next_interval(Some(last), false, range);
            seen.push(last.as_millis());
        }
        assert_eq!(seen, vec![200, 400, 750, 750, 750]);
        assert_eq!(next_interval(Some(last), true, range), 100 * MS);
    }
}
