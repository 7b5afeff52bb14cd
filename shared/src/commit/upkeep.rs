//! Upkeep on the commit path (docs/design.md §3, §6): before an attempt, write the index
//! object a merge of that attempt's state needs, or the chunk a spill of its idempotency
//! keys needs, so the manifest write can name it, and read the spilled keys the batch's
//! produces must be checked against; after a commit, write the index object a fold of its
//! state needs, for later commits to apply ([`FoldAhead`]), and delete what was dropped.
//!
//! An index object is written at most once per planned run: a later attempt whose state
//! plans the same run reuses it, and one that plans another run writes another object
//! (the first becomes an orphan for garbage collection). A failed write only skips the
//! upkeep this time; it never fails the batch.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::StreamExt;

use super::{lock, Committer, Queue, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::dispatch::Kind;
use crate::error::{BrokerError, BrokerResult};
use crate::formats::Unreadable;
use crate::keys;
use crate::partition::batch::Upkeep;
use crate::partition::dedup::{self, Chunk, Spill, CHUNK_FORMAT};
use crate::partition::index::{self, Entries, Fold, Index, IndexRef, Merge, INDEX_FORMAT};
use crate::partition::produce::NewStored;
use crate::partition::{ChunkRef, Dedup, Dropped, Manifest, SegmentRef};
use crate::store::DynStore;

/// The upkeep of one batch across its attempts.
#[derive(Default)]
pub(super) struct Upkeeper {
    /// What the current attempt applies.
    pub(super) upkeep: Upkeep,
    /// The runs the objects in `upkeep` were written for (or attempted).
    fold_run: Option<Vec<SegmentRef>>,
    merge_run: Option<Vec<IndexRef>>,
    spill_keys: Option<BTreeMap<String, Dedup>>,
}

impl Upkeeper {
    /// Plans the upkeep of `after` (the state the attempt sees once retention ran) and
    /// writes the index objects it needs.
    pub(super) async fn prepare(&mut self, c: &Committer, q: &Queue, after: &Manifest) {
        // Like a segment, an index object is never named after garbage collection could
        // have taken it for an orphan: one written too long ago is written again.
        let now = c.clock.now_ms();
        let too_old = |r: &IndexRef| too_old_id(&r.id, now);
        if self.upkeep.fold.as_ref().is_some_and(|f| too_old(&f.index)) {
            (self.upkeep.fold, self.fold_run) = (None, None);
        }
        if self
            .upkeep
            .merge
            .as_ref()
            .is_some_and(|g| too_old(&g.index))
        {
            (self.upkeep.merge, self.merge_run) = (None, None);
        }
        let fold_run = index::fold_candidate(after);
        if fold_run != self.fold_run {
            // Only a fold whose index object the queue's chore wrote after an earlier
            // commit ([`FoldAhead`]): never a write in series before this manifest write.
            self.upkeep.fold = fold_run
                .as_ref()
                .and_then(|_| q.fold_ahead.ready_for(after))
                .filter(|f| !too_old(&f.index));
            self.fold_run = fold_run;
        }
        let merge_run = index::merge_candidate(after);
        if merge_run != self.merge_run {
            self.upkeep.merge = None;
            if let Some(run) = &merge_run {
                let entries = c.merged_entries(q, run).await;
                let written = match entries {
                    Some(entries) => c.write_index(q, entries).await,
                    None => None,
                };
                if let Some(id) = written {
                    let index = index::ref_for_indexes(id, run);
                    let run = run.clone();
                    self.upkeep.merge = Some(Merge { run, index });
                }
            }
            self.merge_run = merge_run;
        }
        if self
            .upkeep
            .spill
            .as_ref()
            .is_some_and(|s| too_old_id(&s.chunk.id, now))
        {
            (self.upkeep.spill, self.spill_keys) = (None, None);
        }
        let spill_keys = dedup::spill_candidate(after, now);
        if spill_keys != self.spill_keys {
            self.upkeep.spill = None;
            if let Some(keys) = &spill_keys {
                self.upkeep.spill = c.write_chunk(q, keys).await;
            }
            self.spill_keys = spill_keys;
        }
    }
}

/// A fold planned ahead: after a commit whose state has hot segments to fold, the queue's
/// chore writes the index object for them beside the next commit, and the commits after
/// it apply the fold while its run is still the oldest hot segments
/// ([`index::fold`]). A fold then costs the commit path no round trip; written before the
/// manifest write, as a merge still is, it cost the commit that folded a second one
/// (about 2 % of commits at 32 × 1: the issue 57 p99).
#[derive(Debug, Default, Clone)]
pub(super) struct FoldAhead(Arc<Mutex<Option<Fold>>>);

impl FoldAhead {
    /// The fold written ahead, if `state` still starts with its run.
    fn ready_for(&self, state: &Manifest) -> Option<Fold> {
        lock(&self.0)
            .as_ref()
            .filter(|f| state.segments.starts_with(&f.run))
            .cloned()
    }

    /// Whether a fold of `state` needs an index object written at `now`: none was written
    /// ahead, or the one written no longer applies (folded, its run replaced, or too old
    /// to be named), and `state` has a run to fold. The write, to run in the chore, then
    /// records the fold here.
    fn wanted(&self, state: &Manifest, now: u64) -> Option<Vec<SegmentRef>> {
        let mut slot = lock(&self.0);
        if slot
            .as_ref()
            .is_some_and(|f| state.segments.starts_with(&f.run) && !too_old_id(&f.index.id, now))
        {
            return None;
        }
        *slot = None;
        index::fold_candidate(state)
    }
}

impl Committer {
    /// The write of the index object a fold of `state` (just landed) needs, for the
    /// queue's chore ([`FoldAhead`]); `None` when none is needed.
    pub(super) fn fold_ahead(
        &self,
        q: &Queue,
        state: &Manifest,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let run = q.fold_ahead.wanted(state, self.clock.now_ms())?;
        let NewIndex {
            id,
            key,
            index,
            body,
        } = self.new_index(q, Entries::Segments(run.clone()))?;
        let (store, cache, ahead) = (
            self.store.clone(),
            self.caches.indexes.clone(),
            q.fold_ahead.clone(),
        );
        Some(async move {
            if let Err(e) = store.put_if_absent(&key, body).await {
                tracing::debug!(%key, error = %e, "index write failed; the fold waits");
                return;
            }
            cache.put(key, Arc::new(index));
            let index = index::ref_for_segments(id, &run);
            *lock(&ahead.0) = Some(Fold { run, index });
        })
    }
}

/// An index object about to be written ([`Committer::new_index`]).
struct NewIndex {
    id: String,
    key: String,
    index: Index,
    body: bytes::Bytes,
}

/// True if an object with this id was written too long ago to be named now.
fn too_old_id(id: &str, now: u64) -> bool {
    let written = keys::segment_time(id).unwrap_or(0);
    now.saturating_sub(written) > MAX_SEGMENT_AGE_AT_COMMIT_MS
}

impl Committer {
    /// What the index merging `run` lists: all their segments when the merge stays at
    /// level 0 (read through the cache), else the refs. `None` (logged) if a listed index
    /// cannot be read.
    async fn merged_entries(&self, q: &Queue, run: &[IndexRef]) -> Option<Entries> {
        if !index::merges_into_leaf(run) {
            return Some(Entries::Indexes(run.to_vec()));
        }
        // Read at once, not one after another: a process that has not cached them (its
        // first commit on a partition) would otherwise spend a round trip per index on
        // every attempt of its commit.
        let reads = run.iter().map(|r| {
            let key = keys::index(&q.topic, q.partition, &r.id);
            async move {
                self.caches
                    .indexes
                    .read_through(&*self.store, &key, Index::decode)
                    .await
            }
        });
        let mut segments = Vec::new();
        for read in futures::future::join_all(reads).await {
            let loaded = match read {
                Ok(Some(i)) => i,
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!(error = %e, "index object unreadable; merge skipped");
                    return None;
                }
            };
            match &loaded.entries {
                Entries::Segments(s) => segments.extend(s.iter().cloned()),
                Entries::Indexes(_) => return None,
            }
        }
        Some(Entries::Segments(segments))
    }

    /// A new index object of `entries` for `q`; `None` (logged) when it does not encode,
    /// a bug.
    fn new_index(&self, q: &Queue, entries: Entries) -> Option<NewIndex> {
        let index = Index {
            format: INDEX_FORMAT,
            entries,
        };
        let id = keys::segment_id(self.clock.now_ms(), &self.ids.new_id());
        let key = keys::index(&q.topic, q.partition, &id);
        match index.encode() {
            Ok(body) => Some(NewIndex {
                id,
                key,
                index,
                body,
            }),
            Err(e) => {
                tracing::error!(%key, error = %e, "cannot encode an index object (a bug)");
                None
            }
        }
    }

    /// Writes one index object; its id, or `None` (logged) if the write failed.
    async fn write_index(&self, q: &Queue, entries: Entries) -> Option<String> {
        let NewIndex {
            id,
            key,
            index,
            body,
        } = self.new_index(q, entries)?;
        if let Err(e) = self.store.put_if_absent(&key, body).await {
            tracing::debug!(%key, error = %e, "index write failed; upkeep skipped this time");
            return None;
        }
        self.caches.indexes.put(key, Arc::new(index));
        Some(id)
    }

    /// Writes the chunk object of a spill of `keys`; the spill, or `None` (logged) if the
    /// write failed.
    async fn write_chunk(&self, q: &Queue, keys: &BTreeMap<String, Dedup>) -> Option<Spill> {
        let chunk = Chunk {
            format: CHUNK_FORMAT,
            keys: keys.clone(),
        };
        let id = keys::segment_id(self.clock.now_ms(), &self.ids.new_id());
        let key = keys::dedup_chunk(&q.topic, q.partition, &id);
        let written = match chunk.encode() {
            Ok(body) => self
                .store
                .put_if_absent(&key, body)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = written {
            tracing::debug!(%key, error = %e, "key chunk write failed; spill skipped this time");
            return None;
        }
        self.caches.chunks.put(key, Arc::new(chunk));
        let chunk = ChunkRef {
            id,
            keys: keys.len() as u32,
            newest_expiry_ms: keys.values().map(|d| d.expires_ms).max().unwrap_or(0),
        };
        let keys = keys.clone();
        Some(Spill { keys, chunk })
    }

    /// The offsets of the batch's idempotency keys that `state` remembers only in chunk
    /// objects (read through the cache), by key.
    ///
    /// Errors: a chunk that cannot be read: the keys' produces cannot be planned safely.
    pub(super) async fn spilled_keys(
        &self,
        q: &Queue,
        state: &Manifest,
        now: u64,
        produces: &[Vec<NewStored>],
    ) -> BrokerResult<HashMap<String, u64>> {
        let mut wanted: HashMap<String, &str> = produces
            .iter()
            .flatten()
            .filter_map(|m| m.idempotency_key.as_deref())
            .filter(|k| state.dedup_lookup(k, now).is_none())
            .map(|k| (dedup::key_hash(k), k))
            .collect();
        let mut found = HashMap::new();
        for c in state.live_chunks(now) {
            if wanted.is_empty() {
                break;
            }
            let key = keys::dedup_chunk(&q.topic, q.partition, &c.id);
            let read = self
                .caches
                .chunks
                .read_through(&*self.store, &key, Chunk::decode);
            let Some(chunk) = read.await? else {
                return Err(BrokerError::Corrupt(format!("{key} is missing")));
            };
            wanted.retain(|hash, k| match chunk.lookup(hash, now) {
                Some(offset) => {
                    found.insert((*k).to_owned(), offset);
                    false
                }
                None => true,
            });
        }
        Ok(found)
    }

    /// The deletes of what retention dropped (after the commit landed): the hot segments
    /// and key chunks, a few at a time, for the queue's chore (`None`: nothing to delete);
    /// dropped index objects, with everything under them, are deleted by a cleanup task
    /// started now. Whatever is not deleted (a crash, an error) garbage collection takes.
    pub(super) fn expired_deletes(
        &self,
        q: &Queue,
        dropped: Dropped,
        chunks: Vec<ChunkRef>,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let mut keys: Vec<String> = (dropped.segments.iter())
            .map(|seg| keys::segment(&q.topic, q.partition, &seg.id))
            .collect();
        keys.extend((chunks.iter()).map(|c| keys::dedup_chunk(&q.topic, q.partition, &c.id)));
        self.clean_indexes(q, dropped.indexes);
        let store = self.store.clone();
        if keys.is_empty() {
            return None;
        }
        Some(async move {
            futures::stream::iter(keys)
                .for_each_concurrent(DELETES_AT_ONCE, |key| delete(&store, key))
                .await;
        })
    }

    /// Deletes dropped index objects, with everything under them, in the background.
    fn clean_indexes(&self, q: &Queue, indexes: Vec<IndexRef>) {
        if indexes.is_empty() {
            return;
        }
        let (store, topic, p) = (self.store.clone(), q.topic.clone(), q.partition);
        let cleanup = async move {
            let mut stack = indexes;
            while let Some(r) = stack.pop() {
                let key = keys::index(&topic, p, &r.id);
                match store
                    .get(&key)
                    .await
                    .map(|o| o.map(|o| Index::decode(&o.data)))
                {
                    Ok(Some(Ok(index))) => match index.entries {
                        Entries::Segments(segs) => {
                            for s in segs {
                                delete(&store, keys::segment(&topic, p, &s.id)).await;
                            }
                        }
                        Entries::Indexes(children) => stack.extend(children),
                    },
                    Ok(None) => {}
                    // Its segments are unknown: a newer build's gc takes them and it.
                    Ok(Some(Err(Unreadable::Newer(newer)))) => {
                        tracing::warn!(%key, %newer, "an expired index object a newer version of Narad wrote is left alone");
                        continue;
                    }
                    Ok(Some(Err(e))) => tracing::warn!(%key, error = %e, "corrupt index object"),
                    Err(e) => {
                        tracing::warn!(%key, error = %e, "could not read an expired index");
                        continue;
                    }
                }
                delete(&store, key).await;
            }
        };
        // Not started once the broker stopped: garbage collection takes them.
        let _ = self.tasks.spawn(Kind::Cleanup, cleanup);
    }
}

/// Deletes of what retention dropped in flight at once (a commit dropping a hundred
/// segments deletes them in 13 round trips, beside the next commits).
const DELETES_AT_ONCE: usize = 8;

async fn delete(store: &DynStore, key: String) {
    if let Err(e) = store.delete(&key).await {
        tracing::warn!(%key, error = %e, "could not delete an expired object");
    }
}
