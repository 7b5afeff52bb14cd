//! The idle watch: what long-polling consumers of a topic pay while nothing happens
//! (docs/design.md §5, "Idle topics").
//!
//! A topic of [`keys::LAYOUT_FLAT`] keeps every partition's manifest beside its
//! `topic.json`, so one delimited listing of the topic ([`crate::store::Store::list_files`])
//! shows the ETag of the topic record and of every manifest. Every consume waiting on the
//! topic in this process shares one [`Watch`]: it lists the topic at most once per
//! interval, however many consumers wait and however many partitions the topic has. A
//! waiting consume skips a partition (no storage request) when the listing shows the very
//! manifest this process's committer holds and that manifest has nothing to lease before
//! its next lease lapses ([`crate::commit::Committer::peek`]); a partition without a
//! manifest is empty. It uses the cached topic settings while the listing shows the
//! ETag they were read with.
//!
//! The interval starts at `poll_interval` (500 ms), doubles after every listing that
//! shows no change, up to `idle_poll_max` (4 s), and falls back to the start as soon as a
//! listing shows a change. Commits made by this process wake its waiters at once
//! ([`crate::commit::Wakers`]); work committed by another process reaches an idle waiter
//! within one interval. A consume with `wait=0` never relies on the watch: it reads every
//! partition's manifest, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::BrokerResult;
use crate::keys;
use crate::store::{ETag, Store};

/// One topic's latest listing.
#[derive(Debug, Default)]
struct Listing {
    /// When it was taken.
    at: Option<Instant>,
    /// The interval until the next one.
    interval: Duration,
    /// ETag of `topic.json` (`None`: the topic is gone).
    topic_etag: Option<ETag>,
    /// ETag of each partition's manifest that exists.
    manifests: HashMap<u32, ETag>,
    /// False after a failed listing (until the next one succeeds).
    valid: bool,
    /// Listings finished (successful or not).
    tried: u64,
}

/// A listing a consume relies on.
#[derive(Debug, Clone)]
pub(super) struct View {
    /// ETag of `topic.json` (`None`: the topic is gone).
    pub(super) topic_etag: Option<ETag>,
    manifests: HashMap<u32, ETag>,
}

impl View {
    /// What the listing shows of partition `p`.
    pub(super) fn seen(&self, p: u32) -> Seen<'_> {
        match self.manifests.get(&p) {
            Some(e) => Seen::Etag(e),
            None => Seen::Missing,
        }
    }
}

/// What a listing says of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen<'a> {
    /// No manifest: an empty partition.
    Missing,
    /// The manifest with this ETag.
    Etag(&'a ETag),
}

/// The shared idle watch of one topic in this process.
#[derive(Debug)]
pub(super) struct Watch {
    topic: String,
    min: Duration,
    max: Duration,
    listing: Mutex<Listing>,
    /// One listing at a time.
    single: tokio::sync::Mutex<()>,
    /// Woken after every listing that shows a change.
    changed: Notify,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, Listing> {
        self.listing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the next listing is due (now if none was taken), and the number of listings
    /// tried so far (for [`Watch::refresh`]).
    pub(super) fn due(&self) -> (Instant, u64) {
        let l = self.lock();
        let at = match l.at {
            Some(at) => at + l.interval,
            None => Instant::now(),
        };
        (at, l.tried)
    }

    /// The notifier woken when a listing shows a change.
    pub(super) fn changed(&self) -> &Notify {
        &self.changed
    }

    /// The latest listing if a consume may rely on it: taken successfully, and still
    /// within its interval (plus the shortest one, for the listing under way).
    pub(super) fn view(&self) -> Option<View> {
        let l = self.lock();
        let fresh = l.valid && l.at.is_some_and(|at| at.elapsed() <= l.interval + self.min);
        fresh.then(|| View {
            topic_etag: l.topic_etag.clone(),
            manifests: l.manifests.clone(),
        })
    }

    /// Lists the topic unless another waiter did since [`Watch::due`] answered `tried`; widens the
    /// interval when nothing changed, narrows it and wakes the waiters when something did.
    ///
    /// Errors: the listing's store failure (the waiter then polls as if unwatched).
    pub(super) async fn refresh(&self, store: &dyn Store, tried: u64) -> BrokerResult<()> {
        let _one = self.single.lock().await;
        if self.lock().tried != tried {
            return Ok(()); // another waiter listed meanwhile
        }
        let prefix = keys::topic_prefix(&self.topic);
        let files = match store.list_files(&prefix).await {
            Ok(f) => f,
            Err(e) => {
                // Not relied on until a listing succeeds; tried again after the shortest
                // interval (the waiters meanwhile read the manifests themselves).
                let mut l = self.lock();
                (l.at, l.interval, l.valid) = (Some(Instant::now()), self.min, false);
                l.tried += 1;
                return Err(e.into());
            }
        };
        let settings_key = keys::topic_settings(&self.topic);
        let mut topic_etag = None;
        let mut manifests = HashMap::new();
        for f in files {
            if f.key == settings_key {
                topic_etag = Some(f.etag);
            } else if let Some(p) = keys::partition_of_manifest(&self.topic, &f.key) {
                manifests.insert(p, f.etag);
            }
        }
        let changed = {
            let mut l = self.lock();
            let changed =
                l.at.is_some() && (l.topic_etag != topic_etag || l.manifests != manifests);
            l.interval = if changed || l.at.is_none() {
                self.min
            } else {
                (l.interval * 2).clamp(self.min, self.max)
            };
            l.at = Some(Instant::now());
            l.valid = true;
            // Counted when done: a waiter that read the old due time meanwhile skips.
            l.tried += 1;
            l.topic_etag = topic_etag;
            l.manifests = manifests;
            changed
        };
        if changed {
            self.changed.notify_waiters();
        }
        Ok(())
    }
}

/// Every topic's [`Watch`] in this process.
#[derive(Debug)]
pub(super) struct Watches {
    min: Duration,
    max: Duration,
    map: Mutex<HashMap<String, Arc<Watch>>>,
}

/// Watches kept at most; past it, those no waiter holds are dropped (their topics'
/// next waiter lists afresh).
const MAX_WATCHES: usize = 4096;

impl Watches {
    /// Watches whose interval runs from `min` to `max` (at least `min`).
    pub(super) fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
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
                    min: self.min,
                    max: self.max,
                    listing: Mutex::new(Listing::default()),
                    single: tokio::sync::Mutex::new(()),
                    changed: Notify::new(),
                })
            })
            .clone()
    }
}
