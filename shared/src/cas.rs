//! The one CAS'd object: read → apply → conditional write → on conflict re-read and retry.
//!
//! Every object Narad changes in place (a partition manifest, a topic record, the
//! generated receipt key) is a [`Cell`] over a [`Stored`] type, and every change goes
//! through [`Cell::update`] or [`Cell::update_cached`]. This is the only place in the
//! code that loops on a conditional write (docs/design.md §3).
//!
//! The protocol of one update:
//!
//! 1. Start from a snapshot: the caller's cached one (speculative, no read), or a fresh
//!    read. A missing object reads as [`Stored::absent`].
//! 2. [`Change::prepare`] may do I/O the change depends on (the committer writes the
//!    batch's segment here, planned against this very state), then [`Change::apply`], a
//!    pure function, edits a copy on which [`Stored::next_write`] already ran (the
//!    manifest's version is already the one this write will have).
//! 3. [`Decision::Commit`] writes the copy with `If-Match` (or `If-None-Match: *` when no
//!    object exists). [`Decision::Keep`] writes nothing; taken on a cached snapshot, it
//!    is first confirmed with a conditional read (`If-None-Match`, a 304 on S3).
//! 4. A lost race (`Conflict`, or `NotFound` on a replace) re-reads and tries again: at
//!    once the first time after a speculative attempt (a stale cache is expected to miss
//!    once), after full-jitter backoff ([`backoff`]) otherwise, at most [`MAX_ATTEMPTS`]
//!    times; then [`CasError::Contention`].
//! 5. An ambiguous failure (timeout, 5xx: the write may have landed) re-reads. A type
//!    that records write ids ([`Stored::stamp`]) tells from every state read afterwards
//!    what became of each such write of this update ([`Stored::fate_of`]): landed (the
//!    update succeeds with that attempt's value, never applying again), superseded by
//!    another write (forgotten), not yet decided (kept, and the update goes on; it may
//!    not end in a refusal or a `Keep` while one is undecided), or no longer known
//!    (the writer fell out of the window of write ids: [`CasError::OutcomeUnknown`]).
//!    Types that record no write ids report the failure.
//!
//! Errors are typed ([`CasError`]): the change's own refusal, contention, the store's
//! failure, a stored object that does not decode, or one that belongs to a newer
//! generation than the caller's view ([`CasError::Superseded`]).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::Digest;

use crate::clock::IdSource;
use crate::store::{ETag, Fetched, Object, Store, StoreError};

/// How many times an update tries before giving up with [`CasError::Contention`].
pub(crate) const MAX_ATTEMPTS: u32 = 24;

/// Why a stored object could not be taken as the caller's state.
#[derive(Debug)]
pub enum Invalid {
    /// The bytes do not decode.
    Corrupt(String),
    /// A newer version of Narad wrote it: not damage, and never to be rewritten here.
    Newer(Newer),
    /// The object belongs to a newer generation than the caller's context (a topic that
    /// was deleted and created again).
    Superseded,
}

pub(crate) use crate::formats::Newer;

/// A stored state of the generation `stored` (a topic's incarnation, a subscription's id)
/// taken for the caller's generation `own`: itself when they are the same; `fresh`, the
/// caller's empty state with `version` still climbing past the stored one (so no two
/// states share bytes), when the stored one is left over from an older generation; and
/// [`Invalid::Superseded`] when it belongs to a newer one.
pub(crate) fn of_generation<S>(
    (stored, own): (&str, &str),
    value: S,
    fresh: impl FnOnce(&S) -> S,
) -> Result<S, Invalid> {
    match stored.cmp(own) {
        std::cmp::Ordering::Equal => Ok(value),
        std::cmp::Ordering::Greater => Err(Invalid::Superseded),
        std::cmp::Ordering::Less => Ok(fresh(&value)),
    }
}

impl From<crate::formats::Unreadable> for Invalid {
    fn from(e: crate::formats::Unreadable) -> Self {
        match e {
            crate::formats::Unreadable::Corrupt(why) => Invalid::Corrupt(why),
            crate::formats::Unreadable::Newer(newer) => Invalid::Newer(newer),
        }
    }
}

/// What ends a sealed JSON object: a newline, `#crc32:`, 8 hex digits, a newline.
const SEAL_TAG: &[u8] = b"\n#crc32:";
const SEAL_LEN: usize = SEAL_TAG.len() + 8 + 1;

/// JSON bytes with their own checksum appended (every record Narad changes in place: a
/// manifest, a topic record, the generated receipt key), so damage is found on read
/// whatever the store does. A reader of an older release refuses such an object rather
/// than misread it (its JSON parser stops at the trailer).
pub fn seal_json(json: Vec<u8>) -> Bytes {
    let mut out = json;
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(SEAL_TAG);
    out.extend_from_slice(format!("{crc:08x}\n").as_bytes());
    Bytes::from(out)
}

/// The JSON of bytes written by [`seal_json`], checksum verified; bytes without a seal
/// (written before seals existed) are returned as they are.
///
/// Errors: [`Invalid::Corrupt`] when the checksum does not match.
pub fn open_json(data: &[u8]) -> Result<&[u8], Invalid> {
    let Some(start) = data.len().checked_sub(SEAL_LEN) else {
        return Ok(data);
    };
    let (json, seal) = data.split_at(start);
    let Some(hex) = seal
        .strip_prefix(SEAL_TAG)
        .and_then(|h| h.strip_suffix(b"\n"))
    else {
        return Ok(data);
    };
    let want = std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| Invalid::Corrupt("bad checksum trailer".into()))?;
    if crc32fast::hash(json) != want {
        return Err(Invalid::Corrupt("checksum mismatch".into()));
    }
    Ok(json)
}

/// A type kept as one conditionally replaced object.
pub(crate) trait Stored: Clone + Send + Sync + Sized + 'static {
    /// What decoding needs to know from the caller (the manifest: the topic incarnation).
    type Context: Send + Sync;

    /// The state when no object exists.
    fn absent(ctx: &Self::Context) -> Self;

    /// Decodes stored bytes.
    ///
    /// Errors: [`Invalid`].
    fn decode(data: &[u8], ctx: &Self::Context) -> Result<Self, Invalid>;

    /// The bytes to store.
    ///
    /// Errors: why the value cannot be encoded (a bug).
    fn encode(&self) -> Result<Bytes, EncodeError>;

    /// Prepares a copy for the next write, before the change sees it.
    fn next_write(&mut self) {}

    /// Records `write_id` in the copy about to be written, and returns how that write is
    /// found in later states; `None` when the type keeps no write ids (no lost-response
    /// recovery).
    fn stamp(&mut self, _write_id: &str) -> Option<WriteMark> {
        None
    }

    /// What this state tells of the write `mark` ([`crate::partition::recent::fate`]).
    fn fate_of(&self, _mark: &WriteMark) -> WriteFate {
        WriteFate::Unknown
    }
}

/// How a write is found in later states: its id as stored, and the version it makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteMark {
    /// The id as the state records it.
    pub stamped: String,
    /// The version the write makes.
    pub version: u64,
}

/// What a state tells of a write whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteFate {
    /// It is part of this state.
    Landed,
    /// Nothing was written over the state it was based on yet: it may still land.
    NotYet,
    /// Another write replaced the state it was based on: it never will.
    Superseded,
    /// The state no longer remembers the writes of that version.
    Unknown,
}

/// Why a stored object could not be encoded: a bug, never the caller's input (every
/// stored type serialises).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// JSON serialisation failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Binary (postcard) serialisation failed.
    #[error("postcard: {0}")]
    Postcard(#[from] postcard::Error),
    /// An absent record has nothing to write.
    #[error("an absent record cannot be written")]
    Absent,
}

/// A plain JSON record kept as one object; `Option<T>` is the stored state (`None`:
/// absent). Records keep no write ids.
pub(crate) trait JsonRecord:
    Serialize + DeserializeOwned + Clone + Send + Sync + 'static
{
    /// The version field that says a newer build wrote this record, if one does.
    fn newer(&self) -> Option<Newer> {
        None
    }
}

impl<T: JsonRecord> Stored for Option<T> {
    type Context = ();

    fn absent(_: &()) -> Self {
        None
    }

    fn decode(data: &[u8], _: &()) -> Result<Self, Invalid> {
        let record: T = serde_json::from_slice(open_json(data)?)
            .map_err(|e| Invalid::Corrupt(e.to_string()))?;
        match record.newer() {
            Some(newer) => Err(Invalid::Newer(newer)),
            None => Ok(Some(record)),
        }
    }

    fn encode(&self) -> Result<Bytes, EncodeError> {
        match self {
            Some(v) => Ok(seal_json(serde_json::to_vec(v)?)),
            None => Err(EncodeError::Absent),
        }
    }
}

/// A state as read, with the ETag to write against (`None`: no object yet).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot<S> {
    /// The state.
    pub value: S,
    /// ETag of the stored object, if one exists.
    pub etag: Option<ETag>,
}

/// What a change decided about the copy it was given.
#[derive(Debug)]
pub(crate) enum Decision<T> {
    /// Write the changed copy, then return the value.
    Commit(T),
    /// Write nothing; return the value.
    Keep(T),
}

/// Why an update or read failed.
#[derive(Debug, thiserror::Error)]
pub enum CasError<E> {
    /// The change refused (its own error type).
    #[error("{0}")]
    Rejected(E),
    /// Too many concurrent writers; retry later.
    #[error("contention: gave up after {MAX_ATTEMPTS} attempts")]
    Contention,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored object belongs to a newer generation than the caller's view.
    #[error("the object belongs to a newer generation; reload")]
    Superseded,
    /// The stored object was written by a newer version of Narad.
    #[error("{key} was written by a newer version of Narad: {newer}")]
    Newer {
        /// Its key.
        key: String,
        /// Which version, and the newest this build knows.
        newer: Newer,
    },
    /// The stored object does not decode.
    #[error("corrupt stored object {key}: {detail}")]
    Corrupt {
        /// Its key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// A write's answer was lost, and the state no longer tells whether it landed: the
    /// change may or may not have been applied, and is not applied again.
    #[error("the outcome of a write to {key} is unknown: its answer was lost and {why}")]
    OutcomeUnknown {
        /// Its key.
        key: String,
        /// Why it cannot be told.
        why: &'static str,
    },
    /// The new state could not be encoded (a bug).
    #[error("cannot encode {key}: {source}")]
    Encode {
        /// Its key.
        key: String,
        /// What went wrong.
        source: EncodeError,
    },
}

/// One change of a [`Cell`]'s state. See the module documentation for when each
/// method runs.
pub(crate) trait Change<S> {
    /// What the update returns.
    type Output;
    /// The change's own refusal.
    type Error;

    /// Runs before every attempt with the snapshot the attempt starts from (its ETag is
    /// `None` when no object exists yet); may do I/O the change depends on. It cannot
    /// fail: it records what it needs for `apply`.
    fn prepare(&mut self, _snap: &Snapshot<S>) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Edits `state` (a copy). Must be a pure function of the state and what `prepare`
    /// recorded: it may run several times.
    ///
    /// Errors: the change's refusal, which ends the update with [`CasError::Rejected`].
    fn apply(&mut self, state: &mut S) -> Result<Decision<Self::Output>, Self::Error>;
}

/// A [`Change`] that is only a pure function.
pub(crate) struct Pure<F>(pub F);

impl<S, T, E, F> Change<S> for Pure<F>
where
    F: FnMut(&mut S) -> Result<Decision<T>, E>,
{
    type Output = T;
    type Error = E;

    fn apply(&mut self, state: &mut S) -> Result<Decision<T>, E> {
        (self.0)(state)
    }
}

/// One object of type `S` at `key`.
pub(crate) struct Cell<'a, S: Stored> {
    store: &'a dyn Store,
    ids: &'a dyn IdSource,
    key: &'a str,
    ctx: &'a S::Context,
}

impl<'a, S: Stored> Cell<'a, S> {
    /// The object at `key`, decoded with `ctx`; `ids` stamps write ids.
    pub(crate) fn new(
        store: &'a dyn Store,
        ids: &'a dyn IdSource,
        key: &'a str,
        ctx: &'a S::Context,
    ) -> Self {
        Self {
            store,
            ids,
            key,
            ctx,
        }
    }

    /// Reads the current state.
    ///
    /// Errors: [`CasError::Store`], [`CasError::Corrupt`], [`CasError::Superseded`].
    pub(crate) async fn read<E>(&self) -> Result<Snapshot<S>, CasError<E>> {
        match self.store.get(self.key).await? {
            None => Ok(self.absent()),
            Some(obj) => self.decode(obj),
        }
    }

    fn absent(&self) -> Snapshot<S> {
        Snapshot {
            value: S::absent(self.ctx),
            etag: None,
        }
    }

    fn decode<E>(&self, obj: Object) -> Result<Snapshot<S>, CasError<E>> {
        match S::decode(&obj.data, self.ctx) {
            Ok(value) => Ok(Snapshot {
                value,
                etag: Some(obj.etag),
            }),
            Err(Invalid::Superseded) => Err(CasError::Superseded),
            Err(Invalid::Newer(newer)) => Err(CasError::Newer {
                key: self.key.to_owned(),
                newer,
            }),
            Err(Invalid::Corrupt(detail)) => Err(CasError::Corrupt {
                key: self.key.to_owned(),
                detail,
            }),
        }
    }

    /// Makes `snap` the current stored state with a conditional read that transfers no
    /// body when nothing changed. Returns `true` if `snap` was already current.
    pub(crate) async fn refresh<E>(&self, snap: &mut Snapshot<S>) -> Result<bool, CasError<E>> {
        match self.read_unless(Some(&snap.etag)).await? {
            None => Ok(true),
            Some(fresh) => {
                *snap = fresh;
                Ok(false)
            }
        }
    }

    /// The current state, unless it is still the one whose ETag is `held` (`Some(None)`:
    /// held as missing; `None`: nothing held): `None` then, after a conditional read that
    /// transfers no body.
    ///
    /// Errors: as [`Cell::read`].
    pub(crate) async fn read_unless<E>(
        &self,
        held: Option<&Option<ETag>>,
    ) -> Result<Option<Snapshot<S>>, CasError<E>> {
        let fetched = match held {
            Some(Some(etag)) => self.store.get_if_changed(self.key, etag).await?,
            Some(None) | None => match self.store.get(self.key).await? {
                None => Fetched::Missing,
                Some(o) => Fetched::Object(o),
            },
        };
        match fetched {
            Fetched::Unchanged => Ok(None),
            Fetched::Missing if held == Some(&None) => Ok(None),
            Fetched::Missing => Ok(Some(self.absent())),
            Fetched::Object(o) => self.decode(o).map(Some),
        }
    }

    /// Applies `change` starting from a fresh read. Returns the change's value and the
    /// state as written (or as read, for `Keep`).
    ///
    /// Errors: see [`Cell::update_cached`].
    pub(crate) async fn update<C: Change<S>>(
        &self,
        change: C,
    ) -> Result<(C::Output, Snapshot<S>), CasError<C::Error>> {
        let mut change = change;
        self.update_cached(&mut None, &mut change).await
    }

    /// Applies `change` starting from `cache` when it holds a snapshot (speculatively,
    /// with no read), else from a fresh read. On return `cache` holds the latest known
    /// state, or `None` after an error.
    ///
    /// Errors: the change's refusal as [`CasError::Rejected`]; [`CasError::Contention`]
    /// after [`MAX_ATTEMPTS`] lost races; [`CasError::Superseded`]; [`CasError::Corrupt`];
    /// [`CasError::Store`] when the store fails, including an ambiguous write that a
    /// re-read cannot confirm.
    pub(crate) async fn update_cached<C: Change<S>>(
        &self,
        cache: &mut Option<Snapshot<S>>,
        change: &mut C,
    ) -> Result<(C::Output, Snapshot<S>), CasError<C::Error>> {
        let value = self.update_in(cache, change).await?;
        match cache {
            Some(snap) => Ok((value, snap.clone())),
            None => Err(CasError::Contention),
        }
    }

    /// As [`Cell::update_cached`], leaving the state written (or read, for `Keep`) in
    /// `cache` only, where it always is after `Ok`: a caller that borrows it from there
    /// saves a copy of the whole state per commit.
    ///
    /// Errors: see [`Cell::update_cached`].
    pub(crate) async fn update_in<C: Change<S>>(
        &self,
        cache: &mut Option<Snapshot<S>>,
        change: &mut C,
    ) -> Result<C::Output, CasError<C::Error>> {
        self.update_in_read(cache, change, false).await
    }

    /// As [`Cell::update_in`]; with `read_now`, a snapshot in `cache` is one the caller
    /// has just read itself ([`Cell::read`]) and is trusted as a fresh read: a `Keep` is
    /// answered from it without confirming it first.
    ///
    /// Errors: see [`Cell::update_cached`].
    pub(crate) async fn update_in_read<C: Change<S>>(
        &self,
        cache: &mut Option<Snapshot<S>>,
        change: &mut C,
        read_now: bool,
    ) -> Result<C::Output, CasError<C::Error>> {
        let (mut snap, mut fresh) = match cache.take() {
            Some(s) => (s, read_now),
            None => (self.read().await?, true),
        };
        // This update's writes whose answer was lost and whose fate no state read since
        // could tell, each with the value its attempt would answer.
        let mut unanswered: Vec<(WriteMark, C::Output)> = Vec::new();
        for attempt in 0..MAX_ATTEMPTS {
            if let Some(value) = self.landed_earlier(&snap, &mut unanswered)? {
                *cache = Some(snap);
                return Ok(value);
            }
            change.prepare(&snap).await;
            let mut next = snap.value.clone();
            next.next_write();
            let decision = change.apply(&mut next);
            if !unanswered.is_empty() && !matches!(decision, Ok(Decision::Commit(_))) {
                // A refusal or no change now, while an earlier write of this very update
                // may still land: neither answer would be true if it did.
                return Err(self.unknown("an earlier attempt may still land"));
            }
            let value = match decision.map_err(CasError::Rejected)? {
                Decision::Keep(v) => {
                    if !fresh {
                        fresh = true;
                        if !self.refresh(&mut snap).await? {
                            continue;
                        }
                    }
                    *cache = Some(snap);
                    return Ok(v);
                }
                Decision::Commit(v) => v,
            };
            match self.write(&snap, next).await? {
                Written::Landed(s) => {
                    *cache = Some(s);
                    return Ok(value);
                }
                Written::Lost => {
                    // A stale cache is expected to miss once: re-read at once. Real races back
                    // off first, so the state they retry on is as fresh as it can be.
                    if fresh {
                        backoff(attempt, &self.ids.new_id()).await;
                    }
                    snap = self.read().await?;
                    fresh = true;
                }
                Written::Unanswered(mark, current) => {
                    unanswered.push((mark, value));
                    snap = current;
                    fresh = true;
                }
            }
        }
        Err(CasError::Contention)
    }

    /// What `snap` tells of this update's unanswered writes: the value of the one that
    /// landed, if one did. Forgets those another write superseded.
    ///
    /// Errors: [`CasError::OutcomeUnknown`] when `snap` no longer tells of one.
    fn landed_earlier<T, E>(
        &self,
        snap: &Snapshot<S>,
        unanswered: &mut Vec<(WriteMark, T)>,
    ) -> Result<Option<T>, CasError<E>> {
        let mut i = 0;
        while i < unanswered.len() {
            match snap.value.fate_of(&unanswered[i].0) {
                WriteFate::Landed => return Ok(Some(unanswered.swap_remove(i).1)),
                WriteFate::NotYet => i += 1,
                WriteFate::Superseded => {
                    unanswered.swap_remove(i);
                }
                WriteFate::Unknown => {
                    return Err(self.unknown("the object no longer remembers writes that old"))
                }
            }
        }
        Ok(None)
    }

    fn unknown<E>(&self, why: &'static str) -> CasError<E> {
        tracing::warn!(key = %self.key, why, "a write's answer was lost and its outcome is unknown: answered 503");
        CasError::OutcomeUnknown {
            key: self.key.to_owned(),
            why,
        }
    }

    /// Writes `next` against `snap`'s ETag; when the answer is lost, reads the state again
    /// for the caller to tell the write's fate from.
    async fn write<E>(&self, snap: &Snapshot<S>, mut next: S) -> Result<Written<S>, CasError<E>> {
        let mark = next.stamp(&self.ids.new_id());
        let body = next.encode().map_err(|source| CasError::Encode {
            key: self.key.to_owned(),
            source,
        })?;
        let put = match &snap.etag {
            None => self.store.put_if_absent(self.key, body).await,
            Some(etag) => self.store.put_if_match(self.key, body, etag).await,
        };
        match (put, mark) {
            (Ok(etag), _) => Ok(Written::Landed(Snapshot {
                value: next,
                etag: Some(etag),
            })),
            (Err(StoreError::Conflict) | Err(StoreError::NotFound), _) => Ok(Written::Lost),
            (Err(StoreError::Unavailable(why)), Some(mark)) => {
                // The write may have landed, or may still: the caller looks for it in this
                // state and in every one it reads after.
                let Ok(current) = self.read::<E>().await else {
                    return Err(CasError::Store(StoreError::Unavailable(why)));
                };
                Ok(Written::Unanswered(mark, current))
            }
            (Err(e), _) => Err(CasError::Store(e)),
        }
    }
}

enum Written<S> {
    /// The write landed; the state as written.
    Landed(Snapshot<S>),
    /// It did not (a lost race).
    Lost,
    /// Its answer was lost; how to find it, and the state read after.
    Unanswered(WriteMark, Snapshot<S>),
}

/// Full-jitter exponential backoff: up to 2 ms × 2^attempt, capped at 100 ms. The one
/// retry policy for conditional writes. The jitter is drawn from `entropy`, a fresh id of
/// the injected id source (random in production, a sequence in tests, so a seeded test
/// replays identically).
pub(crate) async fn backoff(attempt: u32, entropy: &str) {
    let cap = (2u64 << attempt.min(6)).min(100);
    let digest = sha2::Sha256::digest(entropy.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let ms = u64::from_be_bytes(first) % (cap + 1);
    crate::runtime::sleep(Duration::from_millis(ms)).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;
    use crate::clock::SequentialIds;
    use crate::partition::Manifest;
    use crate::store::memory::MemoryStore;
    use crate::store::testing::fault::{FaultPlan, FaultStore};
    use crate::store::testing::hook::ReplaceHook;
    use crate::store::DynStore;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Counter(u64);
    impl JsonRecord for Counter {}

    fn add(n: u64) -> Pure<impl FnMut(&mut Option<Counter>) -> Result<Decision<u64>, ()>> {
        Pure(move |c: &mut Option<Counter>| {
            let next = c.as_ref().map_or(0, |c| c.0) + n;
            *c = Some(Counter(next));
            Ok(Decision::Commit(next))
        })
    }

    #[test]
    fn sealed_json_round_trips_and_damage_is_found() {
        let sealed = seal_json(br#"{"a":1}"#.to_vec());
        assert!(sealed.ends_with(b"\n"));
        assert_eq!(open_json(&sealed).unwrap(), br#"{"a":1}"#);
        // Written before seals existed: read as it is.
        assert_eq!(open_json(br#"{"a":1}"#).unwrap(), br#"{"a":1}"#);
        // A flipped digit in the body, or in the checksum.
        let mut bad = sealed.to_vec();
        bad[5] = b'2';
        assert!(matches!(open_json(&bad), Err(Invalid::Corrupt(_))));
        let mut bad = sealed.to_vec();
        let n = bad.len();
        bad[n - 2] = if bad[n - 2] == b'0' { b'1' } else { b'0' };
        assert!(matches!(open_json(&bad), Err(Invalid::Corrupt(_))));
        // Cut short: no seal left, and the JSON does not parse.
        let cut = &sealed[..sealed.len() - 4];
        assert!(
            serde_json::from_slice::<serde_json::Value>(open_json(cut).unwrap_or(b"x")).is_err()
        );
    }

    #[tokio::test]
    async fn a_stale_cache_is_written_against_once_then_reread() {
        let store = MemoryStore::new();
        let ids = SequentialIds::default();
        let cell = Cell::<Option<Counter>>::new(&store, &ids, "c", &());
        let mut cache = None;
        cell.update_cached(&mut cache, &mut add(1)).await.unwrap();
        // Another writer moves the object on; the cache is stale now.
        cell.update(add(10)).await.unwrap();
        let (v, snap) = cell.update_cached(&mut cache, &mut add(1)).await.unwrap();
        assert_eq!((v, snap.value), (12, Some(Counter(12))));
        assert_eq!(cache.map(|c| c.value), Some(Some(Counter(12))));
    }

    #[tokio::test]
    async fn keep_on_a_stale_cache_is_confirmed_and_applied_again() {
        let store = MemoryStore::new();
        let ids = SequentialIds::default();
        let cell = Cell::<Option<Counter>>::new(&store, &ids, "c", &());
        let mut cache = None;
        cell.update_cached(&mut cache, &mut add(1)).await.unwrap();
        cell.update(add(1)).await.unwrap();
        // "Keep unless the value is even": the cache says 1 (keep), the store says 2.
        let mut seen = Vec::new();
        let mut change = Pure(|c: &mut Option<Counter>| {
            let v = c.as_ref().map_or(0, |c| c.0);
            seen.push(v);
            Ok::<_, ()>(if v.is_multiple_of(2) {
                *c = Some(Counter(v + 1));
                Decision::Commit(v)
            } else {
                Decision::Keep(v)
            })
        });
        let (v, _) = cell.update_cached(&mut cache, &mut change).await.unwrap();
        assert_eq!(v, 2, "the decision was taken again on the current state");
        assert_eq!(seen, vec![1, 2]);
    }

    #[tokio::test]
    async fn refusals_and_contention_are_typed() {
        let store = MemoryStore::new();
        let ids = SequentialIds::default();
        let cell = Cell::<Option<Counter>>::new(&store, &ids, "c", &());
        let refused = cell
            .update(Pure(|_: &mut Option<Counter>| Err::<Decision<()>, _>("no")))
            .await;
        assert!(matches!(refused, Err(CasError::Rejected("no"))));
        // Every conditional write conflicts: the update gives up after MAX_ATTEMPTS.
        let inner: DynStore = Arc::new(MemoryStore::new());
        let plan = FaultPlan {
            error_before: 0.0,
            error_after: 0.0,
            conflict: 1.0,
            max_latency: Duration::ZERO,
        };
        let faulty = FaultStore::new(inner, plan, 1);
        let inc = "i".to_string();
        let cell = Cell::<Manifest>::new(&*faulty, &ids, "topics/t/0/manifest.json", &inc);
        let r = cell
            .update(Pure(|_: &mut Manifest| Ok::<_, ()>(Decision::Commit(()))))
            .await;
        assert!(matches!(r, Err(CasError::Contention)), "{r:?}");
    }

    #[tokio::test]
    async fn a_lost_response_is_recovered_by_write_id_and_applied_once() {
        let inner: DynStore = Arc::new(MemoryStore::new());
        // Every write lands, then reports a timeout.
        let plan = FaultPlan {
            error_before: 0.0,
            error_after: 1.0,
            conflict: 0.0,
            max_latency: Duration::ZERO,
        };
        let faulty = FaultStore::new(inner.clone(), plan, 7);
        let ids = SequentialIds::default();
        let inc = "i".to_string();
        let key = "topics/t/0/manifest.json";
        let cell = Cell::<Manifest>::new(&*faulty, &ids, key, &inc);
        let bump = |m: &mut Manifest| {
            m.next_offset += 1;
            Ok::<_, ()>(Decision::Commit(()))
        };
        cell.update(Pure(bump)).await.unwrap();
        cell.update(Pure(bump)).await.unwrap();
        let stored = Cell::<Manifest>::new(&*inner, &ids, key, &inc);
        let m = stored.read::<()>().await.unwrap().value;
        assert_eq!(
            (m.next_offset, m.version),
            (2, 2),
            "each change applied once"
        );
        // A record without write ids reports the ambiguous failure instead.
        let cell = Cell::<Option<Counter>>::new(&*faulty, &ids, "c", &());
        let r = cell.update(add(1)).await;
        assert!(
            matches!(r, Err(CasError::Store(StoreError::Unavailable(_)))),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn a_write_that_may_still_land_is_retried_but_never_answered_with_a_refusal() {
        let ids = SequentialIds::default();
        let inc = "i".to_string();
        let key = "topics/t/0.manifest.json";
        let bump = |m: &mut Manifest| {
            m.next_offset += 1;
            Ok::<_, ()>(Decision::Commit(()))
        };
        for refuse_second in [false, true] {
            // The first conditional replace times out without being applied: a write
            // whose fate the next read cannot tell yet (it might still arrive).
            let failed = std::sync::atomic::AtomicBool::new(false);
            let store = ReplaceHook::new(Arc::new(MemoryStore::new()), move |_| {
                (!failed.swap(true, std::sync::atomic::Ordering::SeqCst))
                    .then(|| StoreError::Unavailable("timed out".into()))
            });
            let cell = Cell::<Manifest>::new(&*store, &ids, key, &inc);
            cell.update(Pure(bump)).await.unwrap();
            let mut tries = 0;
            let r = cell
                .update(Pure(|m: &mut Manifest| {
                    tries += 1;
                    if refuse_second && tries > 1 {
                        return Err(());
                    }
                    m.next_offset += 1;
                    Ok(Decision::Commit(()))
                }))
                .await;
            let m = cell.read::<()>().await.unwrap().value;
            if refuse_second {
                // The first attempt did not land, but it might have: neither a refusal
                // nor success would be sure.
                assert!(matches!(r, Err(CasError::OutcomeUnknown { .. })), "{r:?}");
                assert_eq!(m.next_offset, 1);
            } else {
                assert!(r.is_ok(), "{r:?}");
                assert_eq!((m.next_offset, m.version), (2, 2), "applied once");
            }
        }
    }
}
