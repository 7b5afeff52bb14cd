//! The per-process cache of topic records ([`TopicCache`]): settings served for
//! `topic_cache` after they were read, and read again in the background once half that
//! old (docs/design.md §6).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::runtime::Instant;

use crate::cas::Snapshot;
use crate::error::{BrokerError, BrokerResult};
use crate::store::ETag;
use crate::topic::{Topic, TopicRecord};

/// Topic settings cached in this process.
///
/// A topic is served from the cache for `ttl` after it was read. Once it is half that
/// old, the request that finds it is also told to refresh it in the background
/// ([`Lookup::Aging`], one such request at a time per topic), so that a topic in steady
/// use is read again before it expires and no request waits for that read in series.
pub(super) struct TopicCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, Entry>>,
    /// Numbers the entries put, so that a refresh replaces only the entry it refreshes.
    puts: AtomicU64,
    /// The reads of a topic that was not cached, one per topic at a time: held by the
    /// request reading it ([`Load::Lead`]) until it is done ([`TopicCache::join_load`]).
    loads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A request's part in reading a topic that was not cached ([`TopicCache::join_load`]).
pub(super) enum Load<'a> {
    /// Read it; those who came meanwhile wait until this is dropped.
    Lead(LoadTurn<'a>),
    /// Another request is reading it: wait for that ([`Load::wait`]), then look again.
    Follow(Arc<tokio::sync::Mutex<()>>),
}

/// The leading request's hold on a topic's read: dropped (done, failed or cancelled), it
/// ends the read's entry and lets those waiting on it go.
pub(super) struct LoadTurn<'a> {
    cache: &'a TopicCache,
    name: String,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for LoadTurn<'_> {
    fn drop(&mut self) {
        self.cache.lock_loads().remove(&self.name);
    }
}

impl Load<'_> {
    /// For a follower, waits until the leading read is done; for the leader, nothing.
    pub(super) async fn wait(self) {
        if let Load::Follow(gate) = self {
            drop(gate.lock().await);
        }
    }
}

/// One cached topic.
struct Entry {
    /// When it was read.
    at: Instant,
    topic: Topic,
    /// Which put made it ([`TopicCache::puts`]).
    put: u64,
    /// Whether a background refresh of it is running. One that never ends (a frozen
    /// Lambda instance) holds no request up: the entry still expires after `ttl`, and the
    /// read that follows puts a new one.
    refreshing: bool,
}

/// The entry a background refresh refreshes ([`Lookup::Aging`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refresh(u64);

/// What the cache holds for a topic.
#[derive(Debug)]
pub(super) enum Lookup {
    /// Read less than half the cache period ago.
    Fresh(Topic),
    /// Still fresh, but past half the cache period: the caller refreshes it (and is the
    /// only one told so until that refresh ends), and hands the
    /// [`Refresh`] back with what it read.
    Aging(Topic, Refresh),
    /// Not cached, or older than the cache period: read it before use.
    Missing,
}

impl TopicCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
            puts: AtomicU64::new(0),
            loads: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_loads(&self) -> MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.loads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the read of `name` that a request which found it uncached makes: the first
    /// such request leads (it reads the record), and those that come while it reads
    /// follow (they wait, then look in the cache again). Without this, a burst of
    /// requests that all find a topic expired (16 clients answered by one commit a second
    /// later, on R2) would each read the record: 0.84 GET per produced message where one
    /// read a second would do. A follower that still finds nothing cached (the topic is
    /// missing, or the read failed) reads for itself, so nothing waits on more than one
    /// read, and a topic created after the leader's read began is never missed.
    pub(super) fn join_load(&self, name: &str) -> Load<'_> {
        let mut loads = self.lock_loads();
        if let Some(gate) = loads.get(name) {
            return Load::Follow(gate.clone());
        }
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        match gate.clone().try_lock_owned() {
            Ok(turn) => {
                loads.insert(name.to_owned(), gate);
                Load::Lead(LoadTurn {
                    cache: self,
                    name: name.to_owned(),
                    _turn: turn,
                })
            }
            // A gate nobody else has seen is never locked; should it be, just follow.
            Err(_) => Load::Follow(gate),
        }
    }

    /// The cached topic, if fresh, and whether the caller should refresh it.
    pub(super) fn lookup(&self, name: &str) -> Lookup {
        let mut map = self.lock();
        let Some(e) = map.get_mut(name) else {
            return Lookup::Missing;
        };
        let age = e.at.elapsed();
        if age >= self.ttl {
            return Lookup::Missing;
        }
        let topic = Topic {
            from_cache: true,
            ..e.topic.clone()
        };
        if age < self.ttl / 2 || e.refreshing {
            return Lookup::Fresh(topic);
        }
        e.refreshing = true;
        Lookup::Aging(topic, Refresh(e.put))
    }

    /// What a background refresh read: the record replaces the entry it refreshed (a
    /// missing one removes it), unless this process put a newer one meanwhile (its own
    /// change or read, which the refresh may predate). `None`: the read failed, and the
    /// next request past half the period may try again.
    pub(super) fn refreshed(
        &self,
        name: &str,
        Refresh(put): Refresh,
        read: Option<Snapshot<Option<TopicRecord>>>,
    ) {
        let mut map = self.lock();
        let Some(e) = map.get_mut(name).filter(|e| e.put == put) else {
            return;
        };
        match read.map(|snap| topic_of(name, snap)) {
            None => e.refreshing = false,
            Some(Some(topic)) => *e = self.entry(topic),
            Some(None) => {
                map.remove(name);
            }
        }
    }

    /// Keeps a topic just read or written, as a [`Topic`]; a missing one leaves.
    ///
    /// Errors: [`BrokerError::TopicNotFound`] when the record is missing.
    pub(super) fn remember(
        &self,
        name: &str,
        snap: Snapshot<Option<TopicRecord>>,
    ) -> BrokerResult<Topic> {
        let Some(topic) = topic_of(name, snap) else {
            self.forget(name);
            return Err(BrokerError::TopicNotFound);
        };
        self.put(&topic);
        Ok(topic)
    }

    fn entry(&self, topic: Topic) -> Entry {
        Entry {
            at: crate::runtime::now(),
            topic,
            put: self.puts.fetch_add(1, Ordering::Relaxed),
            refreshing: false,
        }
    }

    /// The cached topic if it was read within `max_age` (however long the cache period).
    pub(super) fn recent(&self, name: &str, max_age: Duration) -> Option<Topic> {
        let map = self.lock();
        let e = map.get(name)?;
        (e.at.elapsed() < max_age.max(self.ttl)).then(|| Topic {
            from_cache: true,
            ..e.topic.clone()
        })
    }

    /// The cached topic whatever its age, if it was read with ETag `etag` (a listing
    /// just showed that ETag: the settings are current).
    pub(super) fn confirmed(&self, name: &str, etag: &ETag) -> Option<Topic> {
        let map = self.lock();
        let e = map.get(name)?;
        (e.topic.etag == *etag).then(|| Topic {
            from_cache: true,
            ..e.topic.clone()
        })
    }

    pub(super) fn put(&self, topic: &Topic) {
        let e = self.entry(topic.clone());
        self.lock().insert(topic.name.clone(), e);
    }

    pub(super) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }
}

/// The topic a read of its record found (`None`: no record).
fn topic_of(name: &str, snap: Snapshot<Option<TopicRecord>>) -> Option<Topic> {
    let (Some(rec), Some(etag)) = (snap.value, snap.etag) else {
        return None;
    };
    Some(Topic::from_record(name, rec, etag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;
    use crate::settings::TopicSettings;

    #[tokio::test]
    async fn one_request_reads_an_uncached_topic_and_the_rest_wait_for_it() {
        let c = TopicCache::new(Duration::from_millis(1000));
        let lead = c.join_load("t");
        assert!(matches!(lead, Load::Lead(_)));
        let follow = c.join_load("t");
        assert!(matches!(follow, Load::Follow(_)));
        assert!(
            matches!(c.join_load("u"), Load::Lead(_)),
            "another topic leads its own"
        );
        let mut waiting = Box::pin(follow.wait());
        assert!(
            futures::poll!(&mut waiting).is_pending(),
            "a follower waits for the read"
        );
        c.put(&topic("i1"));
        drop(lead);
        waiting.await;
        assert!(
            matches!(c.lookup("t"), Lookup::Fresh(_)),
            "and then finds it cached"
        );
        assert!(
            matches!(c.join_load("t"), Load::Lead(_)),
            "the next miss leads again"
        );
    }

    #[tokio::test]
    async fn a_cancelled_read_lets_its_followers_go() {
        let c = TopicCache::new(Duration::from_millis(1000));
        let Load::Lead(turn) = c.join_load("t") else {
            panic!("first leads")
        };
        let follow = c.join_load("t");
        drop(turn);
        follow.wait().await;
        assert!(matches!(c.lookup("t"), Lookup::Missing));
        assert!(c.lock_loads().is_empty(), "nothing is left behind");
    }

    fn record(incarnation: &str) -> TopicRecord {
        TopicRecord {
            settings: TopicSettings::default(),
            incarnation: incarnation.into(),
            created_at_ms: 0,
            layout: keys::LAYOUT_FLAT,
            subscriptions: Default::default(),
            unknown: serde_json::Map::new(),
        }
    }

    fn topic(incarnation: &str) -> Topic {
        Topic::from_record("t", record(incarnation), ETag::new(incarnation))
    }

    fn read(incarnation: Option<&str>) -> Option<Snapshot<Option<TopicRecord>>> {
        Some(Snapshot {
            value: incarnation.map(record),
            etag: incarnation.map(ETag::new),
        })
    }

    fn incarnation(l: &Lookup) -> Option<&str> {
        match l {
            Lookup::Fresh(t) | Lookup::Aging(t, _) => Some(&t.incarnation),
            Lookup::Missing => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn past_half_its_period_one_request_refreshes_and_all_are_served() {
        let c = TopicCache::new(Duration::from_millis(1000));
        assert!(matches!(c.lookup("t"), Lookup::Missing));
        c.put(&topic("a"));
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(matches!(c.lookup("t"), Lookup::Fresh(_)));
        tokio::time::advance(Duration::from_millis(1)).await;
        let Lookup::Aging(t, refresh) = c.lookup("t") else {
            panic!("past half the period: refresh")
        };
        assert!(t.from_cache);
        // The refresh is running: the others are served without being told to.
        assert!(matches!(c.lookup("t"), Lookup::Fresh(_)));
        c.refreshed("t", refresh, read(Some("a")));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(incarnation(&c.lookup("t")), Some("a"), "read again: fresh");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            matches!(c.lookup("t"), Lookup::Missing),
            "never older than ttl"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_replaces_only_the_entry_it_refreshed() {
        let c = TopicCache::new(Duration::from_millis(1000));
        c.put(&topic("a"));
        tokio::time::advance(Duration::from_millis(600)).await;
        let Lookup::Aging(_, refresh) = c.lookup("t") else {
            panic!("aging")
        };
        // This process wrote the topic meanwhile: the older read must not undo it.
        c.put(&topic("b"));
        c.refreshed("t", refresh, read(Some("a")));
        assert_eq!(incarnation(&c.lookup("t")), Some("b"));
        c.refreshed("t", refresh, read(None));
        assert_eq!(incarnation(&c.lookup("t")), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_lets_the_next_request_try_and_a_deleted_topic_leaves() {
        let c = TopicCache::new(Duration::from_millis(1000));
        c.put(&topic("a"));
        tokio::time::advance(Duration::from_millis(600)).await;
        let Lookup::Aging(_, refresh) = c.lookup("t") else {
            panic!("aging")
        };
        c.refreshed("t", refresh, None);
        let Lookup::Aging(_, refresh) = c.lookup("t") else {
            panic!("the failed refresh no longer counts as running")
        };
        c.refreshed("t", refresh, read(None));
        assert!(
            matches!(c.lookup("t"), Lookup::Missing),
            "deleted meanwhile"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_that_never_ends_keeps_no_entry_past_its_period() {
        let c = TopicCache::new(Duration::from_millis(1000));
        c.put(&topic("a"));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(matches!(c.lookup("t"), Lookup::Aging(..)));
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(matches!(c.lookup("t"), Lookup::Fresh(_)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(matches!(c.lookup("t"), Lookup::Missing));
    }
}
