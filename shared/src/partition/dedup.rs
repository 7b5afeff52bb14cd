//! Idempotency keys, kept compact (docs/design.md §6).
//!
//! A partition remembers each produce's `Idempotency-Key` for the topic's
//! `dedup_window_ms`, at most [`MAX_DEDUP_KEYS`] keys. Keys are stored as 128-bit hashes
//! ([`key_hash`]), so a key's length costs nothing. The newest keys sit in the manifest
//! (`dedup`); once more than [`HOT_KEYS`] are live there, the committer spills them into an
//! immutable *chunk* object (`topics/{t}/{p}/dedup/{id}`, written before the manifest that
//! names it) and the manifest keeps only a [`ChunkRef`]. A lookup checks the manifest's
//! keys, then the live chunks (read once per process and cached). A chunk whose newest key
//! has expired is dropped; past [`MAX_DEDUP_KEYS`] the oldest chunks go first, then the
//! manifest's keys that expire soonest, so the keys closest to expiry are forgotten first.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{codec, Manifest};
use crate::cache::Weigh;
use crate::formats::{Magic, Unreadable};

/// Most idempotency keys a partition remembers.
pub(crate) const MAX_DEDUP_KEYS: usize = 5000;
/// Live keys the manifest holds before they spill into a chunk.
pub(crate) const HOT_KEYS: usize = 128;
/// The format of chunk objects this code writes (and the only one it reads).
pub(crate) const CHUNK_FORMAT: u32 = 1;
const MAGIC: Magic = Magic {
    kind: b"NDK",
    what: "key chunk format",
    known: 1,
};

/// A remembered key: the offset its first produce got, until `expires_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Dedup {
    /// Offset the first produce with this key got.
    pub offset: u64,
    /// Wall-clock ms after which the key is forgotten.
    pub expires_ms: u64,
}

/// A chunk object of spilled keys, as the manifest names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChunkRef {
    /// Chunk object id (time-sortable, like a segment's).
    pub id: String,
    /// Keys in it.
    pub keys: u32,
    /// When its last key expires.
    pub newest_expiry_ms: u64,
}

/// A decoded chunk object: key hash → remembered produce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Chunk {
    /// [`CHUNK_FORMAT`].
    pub format: u32,
    /// The spilled keys.
    pub keys: BTreeMap<String, Dedup>,
}

impl Chunk {
    /// The bytes to store.
    ///
    /// Errors: a description of why it cannot be encoded (a bug).
    pub(crate) fn encode(&self) -> Result<Bytes, crate::cas::EncodeError> {
        codec::seal(&MAGIC, self)
    }

    /// Decodes stored bytes.
    ///
    /// Errors: [`Unreadable`]: damaged, or written by a newer build.
    pub(crate) fn decode(data: &[u8]) -> Result<Self, Unreadable> {
        codec::open(&MAGIC, ("key chunk format", CHUNK_FORMAT), data)
    }

    /// The offset `hash`'s produce got, if still remembered at `now_ms`.
    pub(crate) fn lookup(&self, hash: &str, now_ms: u64) -> Option<u64> {
        live(self.keys.get(hash), now_ms)
    }
}

impl Weigh for Chunk {
    fn weight(&self) -> usize {
        self.keys.len() * 64
    }
}

/// A planned spill: the manifest's live keys `keys` move into the chunk `chunk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spill {
    /// The keys spilled, exactly as the manifest held them.
    pub keys: BTreeMap<String, Dedup>,
    /// The chunk object holding them.
    pub chunk: ChunkRef,
}

/// The stored form of an idempotency key: 32 hex digits of its SHA-256.
pub(crate) fn key_hash(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn live(d: Option<&Dedup>, now_ms: u64) -> Option<u64> {
    d.filter(|d| d.expires_ms > now_ms).map(|d| d.offset)
}

impl Manifest {
    /// The offset a produce with idempotency key `key` got, if the manifest itself still
    /// remembers it at `now_ms` (chunks are looked up by the caller, [`Chunk::lookup`]).
    pub(crate) fn dedup_lookup(&self, key: &str, now_ms: u64) -> Option<u64> {
        live(self.dedup.get(&key_hash(key)), now_ms)
    }

    /// Remembers `key` → `offset` until `expires_ms`, forgetting expired keys and keeping
    /// the total within [`MAX_DEDUP_KEYS`] (see the module documentation).
    pub(crate) fn dedup_insert(&mut self, key: &str, offset: u64, expires_ms: u64, now_ms: u64) {
        self.dedup.retain(|_, d| d.expires_ms > now_ms);
        self.dedup
            .insert(key_hash(key), Dedup { offset, expires_ms });
        self.dedup_bound();
    }

    /// Keeps the keys the manifest and its chunks hold within [`MAX_DEDUP_KEYS`]: the
    /// oldest chunks go first, then the manifest's keys that expire soonest.
    fn dedup_bound(&mut self) {
        let spilled = |m: &Manifest| {
            m.dedup_chunks
                .iter()
                .map(|c| c.keys as usize)
                .sum::<usize>()
        };
        while self.dedup.len() + spilled(self) > MAX_DEDUP_KEYS && !self.dedup_chunks.is_empty() {
            self.dedup_chunks.remove(0);
        }
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

    /// Chunks that may still hold live keys at `now_ms`, newest first.
    pub(crate) fn live_chunks(&self, now_ms: u64) -> impl Iterator<Item = &ChunkRef> {
        self.dedup_chunks
            .iter()
            .rev()
            .filter(move |c| c.newest_expiry_ms > now_ms)
    }

    /// Drops chunks whose keys have all expired at `now_ms`; returns them (their objects
    /// are deleted after the commit lands).
    pub(crate) fn expire_chunks(&mut self, now_ms: u64) -> Vec<ChunkRef> {
        let (keep, gone) = std::mem::take(&mut self.dedup_chunks)
            .into_iter()
            .partition(|c| c.newest_expiry_ms > now_ms);
        self.dedup_chunks = keep;
        gone
    }
}

/// The keys a spill of `m` would take at `now_ms`, if one is due.
pub(crate) fn spill_candidate(m: &Manifest, now_ms: u64) -> Option<BTreeMap<String, Dedup>> {
    let live: BTreeMap<String, Dedup> = m
        .dedup
        .iter()
        .filter(|(_, d)| d.expires_ms > now_ms)
        .map(|(k, d)| (k.clone(), *d))
        .collect();
    (live.len() > HOT_KEYS).then_some(live)
}

/// Applies `s` if `m` still holds every key of it as spilled. Returns whether it did.
pub(crate) fn spill(m: &mut Manifest, s: &Spill) -> bool {
    if !s.keys.iter().all(|(k, d)| m.dedup.get(k) == Some(d)) {
        return false;
    }
    for k in s.keys.keys() {
        m.dedup.remove(k);
    }
    m.dedup_chunks.push(s.chunk.clone());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_keys(n: u64) -> Manifest {
        let mut m = Manifest::empty("i");
        for i in 0..n {
            m.dedup_insert(&format!("key-{i}"), i, 1000 + i, 0);
        }
        m
    }

    #[test]
    fn keys_are_stored_as_fixed_size_hashes() {
        let long = "k".repeat(128);
        let mut m = Manifest::empty("i");
        m.dedup_insert(&long, 7, 100, 0);
        assert_eq!(m.dedup_lookup(&long, 50), Some(7));
        assert_eq!(m.dedup_lookup(&long, 100), None, "expired");
        assert!(m.dedup.keys().all(|k| k.len() == 32));
    }

    #[test]
    fn live_keys_spill_into_a_chunk_past_the_hot_limit() {
        let mut m = with_keys(HOT_KEYS as u64);
        assert!(spill_candidate(&m, 0).is_none());
        m.dedup_insert("one-more", 9999, 5000, 0);
        let keys = spill_candidate(&m, 0).unwrap();
        let chunk = ChunkRef {
            id: "c".into(),
            keys: keys.len() as u32,
            newest_expiry_ms: keys.values().map(|d| d.expires_ms).max().unwrap(),
        };
        let s = Spill { keys, chunk };
        let stored = Chunk {
            format: CHUNK_FORMAT,
            keys: s.keys.clone(),
        };
        assert!(spill(&mut m, &s));
        assert!(m.dedup.is_empty());
        assert_eq!(
            m.dedup_lookup("key-3", 0),
            None,
            "no longer in the manifest"
        );
        let back = Chunk::decode(&stored.encode().unwrap()).unwrap();
        assert_eq!(
            back.lookup(&key_hash("key-3"), 0),
            Some(3),
            "but in the chunk"
        );
        assert!(!spill(&mut m, &s), "a spill applies once");
        assert_eq!(m.live_chunks(4999).count(), 1);
        assert_eq!(m.expire_chunks(5000).len(), 1);
        assert!(m.dedup_chunks.is_empty());
    }

    #[test]
    fn past_the_limit_the_oldest_chunks_go_first() {
        let mut m = Manifest::empty("i");
        for i in 0..40 {
            m.dedup_chunks.push(ChunkRef {
                id: format!("c{i}"),
                keys: HOT_KEYS as u32,
                newest_expiry_ms: 10_000 + i,
            });
        }
        m.dedup_insert("new", 1, 20_000, 0);
        let total: usize = m
            .dedup_chunks
            .iter()
            .map(|c| c.keys as usize)
            .sum::<usize>()
            + 1;
        assert!(total <= MAX_DEDUP_KEYS);
        assert_eq!(m.dedup_chunks[0].id, "c1", "c0 was the oldest");
    }
}
