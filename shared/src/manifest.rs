//! The partition manifest and the one protocol that changes it.
//!
//! A partition's whole mutable state is one object, `topics/{t}/{p}/manifest.json`
//! ([`Manifest`]). It is changed only by [`update`]: read the manifest and its ETag →
//! apply a pure function to a copy → write the copy with `If-Match` (or
//! `If-None-Match: *` when none exists yet) → on conflict re-read and retry with
//! jittered backoff, a bounded number of times.
//!
//! Invariants every state change keeps:
//! * `version` strictly increases with every committed write, so two different states
//!   never share content (identical bytes could share an ETag on S3: the ABA hazard).
//! * `start_offset <= frontier <= next_offset`; every offset below `frontier` is settled.
//! * `acked_ahead` holds only offsets in `(frontier, next_offset)`; `leases` only offsets
//!   in `[frontier, next_offset)`, never one that is also in `acked_ahead`.
//! * `segments` are ordered by `base_offset`, contiguous, and cover
//!   `[start_offset, next_offset)`.
//!
//! Lost responses: every write stamps a fresh `write_id` and keeps the last
//! [`RECENT_WRITES`] of them. When a conditional write fails ambiguously (timeout, 5xx),
//! [`update`] re-reads the manifest and, if its own write id is there, treats the
//! write as committed instead of applying the operation twice.
//!
//! A manifest whose `incarnation` sorts before the topic's is a leftover of a deleted
//! topic of the same name; [`update`] and [`read`] treat it as empty. One that sorts
//! after it means the caller's view of the topic is stale: [`UpdateError::Superseded`].
//!
//! [`commit`] is the same protocol for a caller that keeps the last snapshot cached (the
//! group committer): it writes speculatively against the cached ETag and re-reads only
//! when that write loses.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::clock::IdSource;
use crate::store::{Fetched, Object, Store, StoreError};

/// How many recent write ids a manifest remembers for lost-response recovery.
pub const RECENT_WRITES: usize = 16;
/// How many times [`update`] tries before giving up with [`UpdateError::Contention`].
pub const MAX_ATTEMPTS: u32 = 24;

/// One immutable segment object and the offsets it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    /// Segment object id (the last part of its key).
    pub id: String,
    /// Offset of the segment's first message.
    pub base_offset: u64,
    /// Number of messages in it.
    pub count: u32,
    /// Produce time of its newest message (retention drops the segment after this).
    pub last_produced_ms: u64,
    /// Payload bytes in it.
    pub bytes: u64,
}

/// Delivery state of an unsettled message that has been delivered at least once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The manifest version that granted the current lease; receipt handles carry it.
    pub lease_id: u64,
    /// Wall-clock ms until which the lease is live; at or after it the message is available.
    pub deadline_ms: u64,
    /// How many times the message has been delivered.
    pub delivery_count: u32,
}

/// A remembered `Idempotency-Key`: the offset its produce got, until `expires_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dedup {
    /// Offset the first produce with this key got.
    pub offset: u64,
    /// Wall-clock ms after which the key is forgotten.
    pub expires_ms: u64,
}

/// Most idempotency keys one manifest remembers; past it the soonest to expire go first.
pub const MAX_DEDUP_KEYS: usize = 5000;

/// A partition's whole mutable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Strictly increasing with every write.
    pub version: u64,
    /// The topic incarnation this state belongs to.
    pub incarnation: String,
    /// Ids of the last writes, newest last.
    pub recent_writes: VecDeque<String>,
    /// The offset the next produced message gets.
    pub next_offset: u64,
    /// The oldest retained offset.
    pub start_offset: u64,
    /// The lowest unsettled offset.
    pub frontier: u64,
    /// Retained segments in offset order.
    pub segments: Vec<SegmentRef>,
    /// Delivered, unsettled messages by offset (live or lapsed leases).
    pub leases: BTreeMap<u64, Lease>,
    /// Offsets acked above the frontier.
    pub acked_ahead: BTreeSet<u64>,
    /// Idempotency keys of recent produces.
    #[serde(default)]
    pub dedup: BTreeMap<String, Dedup>,
}

impl Manifest {
    /// The state of a partition nothing has been written to.
    pub fn empty(incarnation: &str) -> Self {
        Self {
            version: 0,
            incarnation: incarnation.to_owned(),
            recent_writes: VecDeque::new(),
            next_offset: 0,
            start_offset: 0,
            frontier: 0,
            segments: Vec::new(),
            leases: BTreeMap::new(),
            acked_ahead: BTreeSet::new(),
            dedup: BTreeMap::new(),
        }
    }

    /// The offset a produce with idempotency key `key` got, if still remembered at `now_ms`.
    pub fn dedup_lookup(&self, key: &str, now_ms: u64) -> Option<u64> {
        self.dedup
            .get(key)
            .filter(|d| d.expires_ms > now_ms)
            .map(|d| d.offset)
    }

    /// Remembers `key` → `offset` until `expires_ms`, forgetting expired keys and, past
    /// [`MAX_DEDUP_KEYS`], those that expire soonest.
    pub fn dedup_insert(&mut self, key: String, offset: u64, expires_ms: u64, now_ms: u64) {
        self.dedup.retain(|_, d| d.expires_ms > now_ms);
        self.dedup.insert(key, Dedup { offset, expires_ms });
        if self.dedup.len() > MAX_DEDUP_KEYS {
            let mut by_expiry: Vec<(u64, String)> = self
                .dedup
                .iter()
                .map(|(k, d)| (d.expires_ms, k.clone()))
                .collect();
            by_expiry.sort();
            let excess = self.dedup.len() - MAX_DEDUP_KEYS;
            for (_, k) in by_expiry.into_iter().take(excess) {
                self.dedup.remove(&k);
            }
        }
    }

    /// Leases still live at `now_ms`.
    pub fn in_flight(&self, now_ms: u64) -> usize {
        self.leases
            .values()
            .filter(|l| l.deadline_ms > now_ms)
            .count()
    }

    /// True when `offset` exists, is unsettled, and has no live lease at `now_ms`.
    pub fn is_available(&self, offset: u64, now_ms: u64) -> bool {
        offset >= self.frontier
            && offset < self.next_offset
            && !self.acked_ahead.contains(&offset)
            && self
                .leases
                .get(&offset)
                .is_none_or(|l| l.deadline_ms <= now_ms)
    }

    /// The segment holding `offset`, if retained.
    pub fn segment_for(&self, offset: u64) -> Option<&SegmentRef> {
        let i = self.segments.partition_point(|s| s.base_offset <= offset);
        let seg = self.segments.get(i.checked_sub(1)?)?;
        (offset < seg.base_offset + u64::from(seg.count)).then_some(seg)
    }

    /// Advances the frontier past every contiguous acked offset.
    pub fn advance_frontier(&mut self) {
        while self.acked_ahead.remove(&self.frontier) {
            self.frontier += 1;
        }
    }

    /// Drops segments whose newest message is older than `retention_ms` at `now_ms`,
    /// with every lease and ack below the new start. Returns the dropped segments, whose
    /// objects the caller deletes after the write commits.
    pub fn apply_retention(&mut self, now_ms: u64, retention_ms: u64) -> Vec<SegmentRef> {
        let cutoff = now_ms.saturating_sub(retention_ms);
        let keep_from = self
            .segments
            .iter()
            .position(|s| s.last_produced_ms >= cutoff);
        let n = keep_from.unwrap_or(self.segments.len());
        if n == 0 {
            return Vec::new();
        }
        let dropped: Vec<SegmentRef> = self.segments.drain(..n).collect();
        self.start_offset = self
            .segments
            .first()
            .map_or(self.next_offset, |s| s.base_offset);
        let start = self.start_offset;
        self.leases.retain(|o, _| *o >= start);
        self.acked_ahead.retain(|o| *o >= start);
        if self.frontier < start {
            self.frontier = start;
        }
        // An ack at the new start is now contiguous with the frontier.
        self.advance_frontier();
        dropped
    }
}

/// What an operation decided about the manifest copy it was given.
#[derive(Debug)]
pub enum Decision<T> {
    /// Write the changed copy, then return the value.
    Commit(T),
    /// Write nothing; return the value.
    Keep(T),
}

/// Why [`update`] or [`read`] failed.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError<E> {
    /// The operation refused (its own error type).
    #[error("{0}")]
    Rejected(E),
    /// Too many concurrent writers; retry later.
    #[error("manifest contention: gave up after {MAX_ATTEMPTS} attempts")]
    Contention,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored manifest belongs to a newer incarnation of the topic: the caller's view
    /// of the topic is stale (it was deleted and created again).
    #[error("the topic was re-created; reload it")]
    Superseded,
    /// The stored manifest does not parse.
    #[error("corrupt manifest: {0}")]
    Corrupt(String),
}

/// A manifest as read, with the ETag to write against (`None`: no object yet).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The state (empty if absent or of another incarnation).
    pub manifest: Manifest,
    /// ETag of the stored object, if one exists.
    pub etag: Option<String>,
}

/// Reads the manifest at `key` for topic incarnation `incarnation`.
///
/// Errors: [`UpdateError::Superseded`] when the stored manifest belongs to a newer
/// incarnation (incarnation ids sort by creation time).
pub async fn read<E>(
    store: &dyn Store,
    key: &str,
    incarnation: &str,
) -> Result<Snapshot, UpdateError<E>> {
    match store.get(key).await? {
        None => Ok(Snapshot {
            manifest: Manifest::empty(incarnation),
            etag: None,
        }),
        Some(obj) => parse(obj, incarnation),
    }
}

fn parse<E>(obj: Object, incarnation: &str) -> Result<Snapshot, UpdateError<E>> {
    let stored: Manifest =
        serde_json::from_slice(&obj.data).map_err(|e| UpdateError::Corrupt(e.to_string()))?;
    let manifest = match stored.incarnation.as_str().cmp(incarnation) {
        std::cmp::Ordering::Equal => stored,
        std::cmp::Ordering::Greater => return Err(UpdateError::Superseded),
        // Left over from a deleted topic of the same name: start afresh, but keep the
        // version climbing so no two states share bytes.
        std::cmp::Ordering::Less => Manifest {
            version: stored.version,
            ..Manifest::empty(incarnation)
        },
    };
    Ok(Snapshot {
        manifest,
        etag: Some(obj.etag),
    })
}

/// Makes sure `snap` is the current stored state: a conditional read that costs no body
/// transfer when nothing changed. Returns `true` if `snap` was already current.
async fn refresh<E>(
    store: &dyn Store,
    key: &str,
    incarnation: &str,
    snap: &mut Snapshot,
) -> Result<bool, UpdateError<E>> {
    let fetched = match &snap.etag {
        Some(etag) => store.get_if_changed(key, etag).await?,
        None => match store.get(key).await? {
            None => Fetched::Missing,
            Some(o) => Fetched::Object(o),
        },
    };
    match fetched {
        Fetched::Unchanged => Ok(true),
        Fetched::Missing if snap.etag.is_none() => Ok(true),
        Fetched::Missing => {
            *snap = Snapshot {
                manifest: Manifest::empty(incarnation),
                etag: None,
            };
            Ok(false)
        }
        Fetched::Object(o) => {
            *snap = parse(o, incarnation)?;
            Ok(false)
        }
    }
}

/// Applies `op` to the manifest at `key` with optimistic concurrency, as described in
/// the module documentation. `op` sees a copy whose `version` is already the version
/// this write will have (a lease granted now uses it as its lease id); it may be
/// called several times and must be a pure function of the manifest.
///
/// Returns the op's value and the manifest as committed (or as read, for `Keep`).
///
/// Errors: the op's own error as [`UpdateError::Rejected`]; [`UpdateError::Contention`]
/// after [`MAX_ATTEMPTS`] lost races; [`UpdateError::Superseded`]; [`UpdateError::Store`]
/// when the store fails, including an ambiguous write that a re-read cannot confirm.
pub async fn update<T, E>(
    store: &dyn Store,
    ids: &dyn IdSource,
    key: &str,
    incarnation: &str,
    op: impl FnMut(&mut Manifest) -> Result<Decision<T>, E>,
) -> Result<(T, Manifest), UpdateError<E>> {
    commit(store, ids, key, incarnation, &mut None, op).await
}

/// [`update`] with a cached snapshot, for a caller that writes one manifest repeatedly
/// (the group committer). The first attempt applies `op` to `cache` speculatively, with
/// no read: a successful conditional write proves the cache was current. A `Keep`
/// decision taken on the cache is confirmed with a conditional read first. On return
/// `cache` holds the latest known state (or `None` after an error).
pub async fn commit<T, E>(
    store: &dyn Store,
    ids: &dyn IdSource,
    key: &str,
    incarnation: &str,
    cache: &mut Option<Snapshot>,
    mut op: impl FnMut(&mut Manifest) -> Result<Decision<T>, E>,
) -> Result<(T, Manifest), UpdateError<E>> {
    let (mut snap, mut fresh) = match cache.take() {
        Some(s) => (s, false),
        None => (read(store, key, incarnation).await?, true),
    };
    for attempt in 0..MAX_ATTEMPTS {
        let mut next = snap.manifest.clone();
        next.version += 1;
        let value = match op(&mut next).map_err(UpdateError::Rejected)? {
            Decision::Keep(v) => {
                if !fresh {
                    fresh = true;
                    if !refresh(store, key, incarnation, &mut snap).await? {
                        continue;
                    }
                }
                let m = snap.manifest.clone();
                *cache = Some(snap);
                return Ok((v, m));
            }
            Decision::Commit(v) => v,
        };
        let write_id = ids.new_id();
        next.recent_writes.push_back(write_id.clone());
        while next.recent_writes.len() > RECENT_WRITES {
            next.recent_writes.pop_front();
        }
        let body = match serde_json::to_vec(&next) {
            Ok(b) => Bytes::from(b),
            Err(e) => return Err(UpdateError::Corrupt(e.to_string())),
        };
        let put = match &snap.etag {
            None => store.put_if_absent(key, body).await,
            Some(etag) => store.put_if_match(key, body, etag).await,
        };
        match put {
            Ok(etag) => {
                *cache = Some(Snapshot {
                    manifest: next.clone(),
                    etag: Some(etag),
                });
                return Ok((value, next));
            }
            Err(StoreError::Conflict) | Err(StoreError::NotFound) => {
                // A stale cache is expected to miss once: re-read at once. Real races back off.
                if fresh {
                    backoff(attempt).await;
                }
                snap = read(store, key, incarnation).await?;
                fresh = true;
            }
            Err(StoreError::Unavailable(why)) => {
                // The write may have landed. Look for our write id before retrying.
                let Ok(current) = read::<E>(store, key, incarnation).await else {
                    return Err(UpdateError::Store(StoreError::Unavailable(why)));
                };
                if current.manifest.recent_writes.contains(&write_id) {
                    *cache = Some(current);
                    return Ok((value, next));
                }
                snap = current;
                fresh = true;
                backoff(attempt).await;
            }
            Err(e) => return Err(UpdateError::Store(e)),
        }
    }
    Err(UpdateError::Contention)
}

/// Full-jitter exponential backoff: up to 2 ms × 2^attempt, capped at 100 ms.
async fn backoff(attempt: u32) {
    let cap = (2u64 << attempt.min(6)).min(100);
    let ms = rand::thread_rng().gen_range(0..=cap);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::SequentialIds;
    use crate::store::memory::MemoryStore;

    fn seg(id: &str, base: u64, count: u32, t: u64) -> SegmentRef {
        SegmentRef {
            id: id.into(),
            base_offset: base,
            count,
            last_produced_ms: t,
            bytes: 1,
        }
    }

    #[test]
    fn segment_lookup() {
        let mut m = Manifest::empty("i");
        m.segments = vec![seg("a", 0, 2, 0), seg("b", 2, 3, 0)];
        m.next_offset = 5;
        assert_eq!(m.segment_for(0).map(|s| s.id.as_str()), Some("a"));
        assert_eq!(m.segment_for(1).map(|s| s.id.as_str()), Some("a"));
        assert_eq!(m.segment_for(2).map(|s| s.id.as_str()), Some("b"));
        assert_eq!(m.segment_for(4).map(|s| s.id.as_str()), Some("b"));
        assert!(m.segment_for(5).is_none());
    }

    #[test]
    fn retention_moves_start_and_frontier() {
        let mut m = Manifest::empty("i");
        m.segments = vec![
            seg("a", 0, 2, 100),
            seg("b", 2, 2, 200),
            seg("c", 4, 1, 300),
        ];
        m.next_offset = 5;
        m.leases.insert(
            1,
            Lease {
                lease_id: 1,
                deadline_ms: 9999,
                delivery_count: 1,
            },
        );
        m.acked_ahead.insert(3);
        let dropped = m.apply_retention(1150, 1000);
        assert_eq!(dropped.len(), 1);
        assert_eq!((m.start_offset, m.frontier), (2, 2));
        assert!(m.leases.is_empty());
        let dropped = m.apply_retention(1250, 1000);
        assert_eq!(dropped.len(), 1);
        assert_eq!((m.start_offset, m.frontier), (4, 4));
        assert!(m.acked_ahead.is_empty());
        m.apply_retention(5000, 1000);
        assert_eq!((m.start_offset, m.frontier, m.next_offset), (5, 5, 5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_updates_all_land_with_increasing_versions() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let ids = Arc::new(SequentialIds::default());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (store, ids) = (store.clone(), ids.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    update::<_, ()>(&*store, &*ids, "m", "i", |m| {
                        m.next_offset += 1;
                        Ok(Decision::Commit(()))
                    })
                    .await
                    .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let snap = read::<()>(&*store, "m", "i").await.unwrap();
        assert_eq!(snap.manifest.next_offset, 80);
        assert_eq!(snap.manifest.version, 80);
    }

    #[tokio::test]
    async fn other_incarnation_reads_as_empty() {
        let store = MemoryStore::new();
        let ids = SequentialIds::default();
        update::<_, ()>(&store, &ids, "m", "a-old", |m| {
            m.next_offset = 7;
            Ok(Decision::Commit(()))
        })
        .await
        .unwrap();
        let snap = read::<()>(&store, "m", "b-new").await.unwrap();
        assert_eq!(snap.manifest.next_offset, 0);
        assert_eq!(snap.manifest.version, 1);
        let (_, m) = update::<_, ()>(&store, &ids, "m", "b-new", |_| Ok(Decision::Commit(())))
            .await
            .unwrap();
        assert_eq!(
            (m.version, m.next_offset, m.incarnation.as_str()),
            (2, 0, "b-new")
        );
        // The old incarnation's view is stale now.
        let stale = read::<()>(&store, "m", "a-old").await;
        assert!(matches!(stale, Err(UpdateError::Superseded)));
    }
}
