//! Checkpoints and repair: the way back from a corrupt manifest (docs/design.md §7).
//!
//! A commit marked to leave a checkpoint ([`Manifest::mark_checkpoint`]: the first write,
//! then at least every [`crate::partition::CHECKPOINT_EVERY`] versions or half the
//! retention) writes a copy of the manifest it landed to `…/checkpoints/{version}` and
//! deletes the one before the previous, so two are kept.
//!
//! [`Repairer::repair`] inspects a partition's manifest. One that decodes is healthy.
//! One that does not (or that the store reports damaged) is rebuilt
//! ([`crate::partition::rebuild`]) from the newest readable checkpoint of the topic's
//! incarnation and the segment objects, and written with `If-Match` on the damaged
//! object's ETag, so a repair never replaces anything but the damage it inspected (two
//! repairs racing: one lands, the other finds a healthy manifest). A missing manifest is
//! damage only when a checkpoint of the incarnation exists.
//!
//! The committer repairs by itself ([`Repairer::confirmed`]) when a commit finds the
//! manifest corrupt and a second read a moment later finds the same object still corrupt
//! (not a damaged transfer). `narad repair [--dry-run]` runs the same repair on demand.
//! Recovery is its own floor, below the committer: it reads and writes the store and
//! the objects, and calls nothing that commits.

use std::collections::HashSet;
use std::time::Duration;

use serde::Serialize;

use crate::cas::{CasError, Invalid, Stored};
use crate::clock::IdSource;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::objects::Reader;
use crate::partition::combine::{self, Combinable};
use crate::partition::index::{Entries, IndexRef};
use crate::partition::intent::Intent;
use crate::partition::rebuild::{self, Evidence, Report};
use crate::partition::{Manifest, SegmentRef};
use crate::store::{DynStore, ETag, StoreError};

/// How long a self-repair waits before reading a corrupt manifest the second time.
const CONFIRM_AFTER: Duration = Duration::from_millis(200);

/// True when a manifest read or update failed on a damaged object (it does not decode,
/// or the store reports its body damaged): what [`Repairer::confirmed`] answers.
pub(crate) fn damaged<E>(e: &CasError<E>) -> bool {
    matches!(
        e,
        CasError::Corrupt { .. } | CasError::Store(StoreError::Corrupt(_))
    )
}

/// The partition a repair works on.
pub(crate) struct Target<'a> {
    pub topic: &'a str,
    pub incarnation: &'a str,
    pub partition: u32,
    /// The manifest's key.
    pub key: &'a str,
    pub created_at_ms: u64,
    /// How long recovered idempotency keys are remembered (the topic's setting).
    pub dedup_window_ms: u64,
}

impl Target<'_> {
    /// Whether the unnamed object `id` under `segments/` may be this incarnation's: not
    /// older than the topic, nor a combinable segment tagged with another incarnation (a
    /// process whose cached topic was an earlier or a later one of the same name).
    fn owns(&self, id: &str) -> bool {
        let tag = combine::tag(self.incarnation);
        keys::segment_time(id).unwrap_or(0) >= self.created_at_ms
            && Combinable::parse(id).is_none_or(|c| c.belongs_to(&tag))
    }
}

/// Where a partition's manifest stands after a repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RepairState {
    /// Nothing wrong with it.
    Healthy,
    /// It was damaged and is rebuilt.
    Repaired,
    /// It is damaged still: a dry run, or a repair that did not write.
    Corrupt,
}

/// What a repair found and did.
#[derive(Debug, Clone, Serialize)]
pub struct Repair {
    /// Partition.
    pub partition: u32,
    /// Where the manifest stands.
    pub state: RepairState,
    /// The manifest object.
    pub object: String,
    /// What is wrong with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// What the rebuild restores and retires (with `state` `repaired`, or what it would).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
}

/// A manifest as inspected.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Healthy,
    /// Damaged: the ETag to replace (`None`: no object) and why.
    Damaged(Option<ETag>, String),
}

/// The repair of one partition's manifest: what it reads and writes through.
pub(crate) struct Repairer<'a> {
    store: &'a DynStore,
    ids: &'a dyn IdSource,
    reader: Reader<'a>,
    t: Target<'a>,
}

impl<'a> Repairer<'a> {
    /// The repair of `t`, writing to `store` with write ids from `ids`, reading objects
    /// through `reader`.
    pub(crate) fn new(
        store: &'a DynStore,
        ids: &'a dyn IdSource,
        reader: Reader<'a>,
        t: Target<'a>,
    ) -> Self {
        Self {
            store,
            ids,
            reader,
            t,
        }
    }

    /// Inspects the manifest and, unless `dry_run`, rebuilds it if it is corrupt (see
    /// the module documentation).
    ///
    /// Errors: store failures; [`BrokerError::Contention`] when the manifest changed
    /// between inspection and repair (run it again); [`BrokerError::StaleTopic`].
    pub(crate) async fn repair(&self, dry_run: bool) -> BrokerResult<Repair> {
        let found = self.inspect().await?;
        self.repair_found(found, dry_run).await
    }

    /// After a commit found the manifest corrupt: repairs it if a second read confirms
    /// the same object is still corrupt. True when the manifest was repaired (or another
    /// process repaired it meanwhile): the commit may try again.
    pub(crate) async fn confirmed(&self) -> bool {
        let Ok(first) = self.inspect().await else {
            return false;
        };
        if first == Found::Healthy {
            return true;
        }
        crate::runtime::sleep(CONFIRM_AFTER).await;
        // The same object (ETag) damaged again, however it shows it.
        match (self.inspect().await, &first) {
            (Ok(Found::Damaged(Some(again), _)), Found::Damaged(Some(etag), _))
                if again == *etag => {}
            (Ok(Found::Healthy), _) => return true,
            _ => return false,
        }
        match self.repair_found(first, false).await {
            Ok(r) => r.state == RepairState::Repaired,
            // Another process repaired it first (its write changed the ETag).
            Err(BrokerError::Contention) => matches!(self.inspect().await, Ok(Found::Healthy)),
            Err(e) => {
                let t = &self.t;
                tracing::error!(object = %t.key, error = %e,
                    "self-repair failed; run `narad repair {} {}`", t.topic, t.partition);
                false
            }
        }
    }

    async fn repair_found(&self, found: Found, dry_run: bool) -> BrokerResult<Repair> {
        let (etag, problem) = match found {
            Found::Healthy => {
                return Ok(Repair {
                    partition: self.t.partition,
                    state: RepairState::Healthy,
                    object: self.t.key.to_owned(),
                    problem: None,
                    report: None,
                })
            }
            Found::Damaged(etag, problem) => (etag, problem),
        };
        let ev = self.evidence().await?;
        let (mut m, report) = rebuild::rebuild(self.t.incarnation, ev, self.t.dedup_window_ms);
        let mut out = Repair {
            partition: self.t.partition,
            state: RepairState::Corrupt,
            object: self.t.key.to_owned(),
            problem: Some(problem),
            report: Some(report),
        };
        if dry_run {
            return Ok(out);
        }
        m.stamp(&format!("repair-{}", self.ids.new_id()));
        let body = m
            .encode()
            .map_err(|e| BrokerError::Internal(e.to_string()))?;
        let put = match &etag {
            Some(e) => self.store.put_if_match(self.t.key, body, e).await,
            None => self.store.put_if_absent(self.t.key, body).await,
        };
        match put {
            Ok(_) => {}
            Err(StoreError::Conflict) | Err(StoreError::NotFound) => {
                return Err(BrokerError::Contention)
            }
            Err(e) => return Err(e.into()),
        }
        tracing::warn!(object = %self.t.key, report = ?out.report,
            "corrupt manifest rebuilt: unsettled messages are delivered again at new offsets");
        out.state = RepairState::Repaired;
        Ok(out)
    }

    /// Reads the manifest and says whether it is damaged.
    async fn inspect(&self) -> BrokerResult<Found> {
        match self.store.get(self.t.key).await {
            Ok(Some(o)) => match Manifest::decode(&o.data, &self.t.incarnation.to_owned()) {
                Ok(_) => Ok(Found::Healthy),
                Err(Invalid::Corrupt(why)) => Ok(Found::Damaged(Some(o.etag), why)),
                Err(Invalid::Superseded) => Err(BrokerError::StaleTopic),
                // Not damage: a newer build wrote it, and only a newer build may touch it.
                Err(Invalid::Newer(newer)) => Err(BrokerError::UpgradeRequired {
                    object: self.t.key.to_owned(),
                    newer,
                }),
            },
            Ok(None) => {
                let ckpts = self
                    .store
                    .list(&keys::checkpoints_prefix(self.t.topic, self.t.partition))
                    .await?;
                let ours = self.newest_checkpoint(ckpts).await?.is_some();
                Ok(if ours {
                    Found::Damaged(None, "the manifest is missing".into())
                } else {
                    Found::Healthy
                })
            }
            Err(StoreError::Corrupt(why)) => {
                // The store reports the body damaged: take its ETag from a listing.
                let dir = self.t.key.rsplit_once('/').map_or("", |(d, _)| d);
                let listed = self.store.list_files(&format!("{dir}/")).await?;
                let etag = listed
                    .into_iter()
                    .find(|l| l.key == self.t.key)
                    .map(|l| l.etag);
                Ok(Found::Damaged(etag, why.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The newest checkpoint of the partition's incarnation among `keys` that reads.
    async fn newest_checkpoint(&self, mut keys: Vec<String>) -> BrokerResult<Option<Manifest>> {
        keys.sort_by_key(|k| std::cmp::Reverse(keys::checkpoint_version(k)));
        for k in keys {
            match self.store.get(&k).await {
                Ok(Some(o)) => match Manifest::decode_exact(&o.data, self.t.incarnation) {
                    Ok(Some(m)) => return Ok(Some(m)),
                    Ok(None) => {
                        tracing::warn!(key = %k, "checkpoint unreadable or of another incarnation; skipped")
                    }
                    // A newer build checkpointed this partition: only a newer build repairs it.
                    Err(newer) => {
                        return Err(BrokerError::UpgradeRequired { object: k, newer });
                    }
                },
                Ok(None) => {}
                Err(StoreError::Corrupt(why)) => {
                    tracing::warn!(key = %k, %why, "checkpoint damaged; skipped");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// What survives of the partition: its newest checkpoint, the checkpoint's unsettled segments,
    /// and the segments it does not name.
    async fn evidence(&self) -> BrokerResult<Evidence> {
        let reader = &self.reader;
        let ckpts = self
            .store
            .list(&keys::checkpoints_prefix(self.t.topic, self.t.partition))
            .await?;
        let checkpoint = self.newest_checkpoint(ckpts).await?;
        let mut ev = Evidence::default();
        let mut named: HashSet<String> = HashSet::new();
        if let Some(c) = &checkpoint {
            let mut all: Vec<SegmentRef> = c.segments.clone();
            let mut stack: Vec<IndexRef> = c.indexes.clone();
            while let Some(r) = stack.pop() {
                match reader.index(self.t.topic, self.t.partition, &r.id).await {
                    Ok(Some(i)) => match &i.entries {
                        Entries::Segments(list) => all.extend(list.iter().cloned()),
                        Entries::Indexes(refs) => stack.extend(refs.iter().cloned()),
                    },
                    // Its segments then count as unnamed: delivered, not lost.
                    Ok(None) => tracing::warn!(index = %r.id, "a checkpoint's index is gone"),
                    // Only a newer build may repair what a newer build wrote.
                    Err(e @ BrokerError::UpgradeRequired { .. }) => return Err(e),
                    Err(e) => {
                        tracing::warn!(index = %r.id, error = %e, "a checkpoint's index is unreadable")
                    }
                }
            }
            for s in all {
                if s.base_offset + u64::from(s.count) > c.frontier {
                    ev.unsettled.push(s.clone());
                }
                named.insert(s.id);
            }
        } else {
            // No checkpoint: every surviving index object bounds the offsets used.
            let prefix = keys::index(self.t.topic, self.t.partition, "");
            for k in self.store.list(&prefix).await? {
                let id = k.rsplit('/').next().unwrap_or_default();
                let read = match reader.index(self.t.topic, self.t.partition, id).await {
                    Err(e @ BrokerError::UpgradeRequired { .. }) => return Err(e),
                    other => other,
                };
                if let Ok(Some(i)) = read {
                    let end = match &i.entries {
                        Entries::Segments(l) => {
                            l.iter().map(|s| s.base_offset + u64::from(s.count)).max()
                        }
                        Entries::Indexes(l) => l.iter().map(|r| r.end_offset).max(),
                    };
                    ev.floor = ev.floor.max(end.unwrap_or(0));
                }
            }
        }
        for k in self
            .store
            .list(&keys::segments_prefix(self.t.topic, self.t.partition))
            .await?
        {
            let id = k.rsplit('/').next().unwrap_or_default().to_owned();
            if named.contains(&id) || !self.t.owns(&id) {
                continue;
            }
            // An intent holds no messages: only its id matters, as decided.
            if Intent::parse(&id).is_some() {
                ev.newest_intent = ev.newest_intent.max(id);
                continue;
            }
            match reader.segment(self.t.topic, self.t.partition, &id).await {
                Ok(Some(seg)) => ev.add_unnamed(id, &seg),
                Ok(None) => {}
                Err(e @ BrokerError::UpgradeRequired { .. }) => return Err(e),
                Err(e) => {
                    tracing::error!(segment = %k, error = %e, "unreadable segment left out of the repair: its messages are lost");
                    ev.unreadable.push(id);
                }
            }
        }
        ev.checkpoint = checkpoint;
        Ok(ev)
    }
}
