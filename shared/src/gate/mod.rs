//! The format gate (docs/upgrades.md): which formats the builds sharing a store may write,
//! and which builds are running. Kafka's `metadata.version` and CockroachDB's cluster
//! version work the same way: a new build reads the new formats at once, and writes them
//! only once an operator has raised the fleet's level, which is refused while a build
//! that cannot read them may still be running.
//!
//! Two kinds of object, beside the topics:
//!
//! * `system/fleet.json` ([`FleetRecord`]): the fleet's [`Level`]; none means level 1,
//!   the formats of every build before the gate. Raised only by [`finalize`]
//!   (`narad upgrade finalize`), never lowered.
//! * `system/processes/{id}.json` ([`ProcessRecord`]): one per running process, naming
//!   its build and the newest level it reads, renewed every third of its lifetime
//!   (`NARAD_PROCESS_RECORD_TTL_MS`, 15 minutes) and expiring when not renewed. Builds
//!   before the gate write none; they are seen instead by their writes: every manifest
//!   write id this build records carries its newest level
//!   ([`crate::formats::stamp_write`]), and theirs carry none.
//!
//! **Joining** ([`Gate::join`], at start-up): read the fleet record, write this process's
//! record, read the fleet record again. A level above the newest this build reads, or a
//! raise to one that is under way, refuses the start (503 `upgrade_required` for a
//! Lambda function, an error for `narad serve`).
//!
//! **Raising** ([`finalize`]) is two-phase, so a process starting meanwhile is never
//! missed: mark the raise as under way in the fleet record; list the process records and
//! recent manifest writes; if nothing of a build that cannot read the target level is
//! running, commit the raise, else withdraw it. A process that wrote its record before
//! the listing is seen by it; one that wrote it after reads the fleet record after the
//! mark, and refuses to start.
//!
//! **Running**: each renewal re-reads the fleet record. A raise within what this build
//! reads takes effect there (the new formats are written from then on); a raise beyond
//! it (a process whose record had expired, and so was not seen) stops this process from
//! serving: every request answers 503 `upgrade_required`. Either way, what a newer
//! build wrote is never rewritten ([`crate::formats`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cas::{self, Cell, JsonRecord};
use crate::clock::{Clock, IdSource, SystemClock};
use crate::dispatch::{Dispatcher, Kind};
use crate::error::{BrokerError, BrokerResult};
pub use crate::formats::write_time;
use crate::formats::{Level, Newer};
use crate::keys;
use crate::store::{DynStore, ETag, StoreError};

mod raise;

pub use raise::{
    blockers, delete_expired, finalize, status, Blocker, Finalized, Scan, Status,
    DELETE_EXPIRED_AFTER_MS,
};

/// Tries of a start-up that meets a transient store failure.
const JOIN_ATTEMPTS: u32 = 8;

/// The stored fleet record, `system/fleet.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetRecord {
    /// The formats the fleet may write.
    pub level: Level,
    /// When it was raised to this level, wall-clock ms.
    #[serde(default)]
    pub raised_at_ms: u64,
    /// Who raised it (the build that ran `narad upgrade finalize`).
    #[serde(default)]
    pub raised_by: String,
    /// A raise under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raising: Option<Raising>,
    /// Fields a newer build added, kept as they are.
    #[serde(flatten)]
    pub unknown: Map<String, Value>,
}

impl JsonRecord for FleetRecord {}

/// A raise under way: processes of builds that cannot read `to` refuse to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Raising {
    /// The level being raised to.
    pub to: Level,
    /// The finalize's own id, so only it commits or withdraws the raise.
    pub id: String,
    /// When the mark stops holding (a finalize that died leaves one behind).
    pub until_ms: u64,
}

/// A running process, `system/processes/{id}.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// The build, e.g. `narad 0.1.0`.
    pub build: String,
    /// The newest level the build reads.
    pub newest: Level,
    /// The level it writes at now.
    pub level: Level,
    /// Host name and process id, for the operator.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// When it started, wall-clock ms.
    pub started_ms: u64,
    /// When it last renewed this record.
    pub renewed_ms: u64,
    /// When this record stops counting unless renewed.
    pub expires_ms: u64,
    /// Fields a newer build added.
    #[serde(flatten)]
    pub unknown: Map<String, Value>,
}

/// The level a process of a build that reads up to `newest` runs at under `fleet` (the
/// stored record, `None` when there is none) at `now_ms`, or why it may not run. A
/// joining process also yields to a raise under way beyond what it reads.
///
/// Errors: the [`Newer`] level that stops it.
pub fn admit(
    fleet: Option<&FleetRecord>,
    newest: Level,
    now_ms: u64,
    joining: bool,
) -> Result<Level, Newer> {
    let level = fleet.map_or(Level::BEFORE_GATE, |f| f.level);
    if let Some(newer) = Newer::check("fleet level", level.0.into(), newest.0.into()) {
        return Err(newer);
    }
    let raising = fleet.and_then(|f| f.raising.as_ref());
    if let Some(r) = raising.filter(|r| joining && r.until_ms > now_ms) {
        if let Some(newer) = Newer::check(
            "fleet level being raised to",
            r.to.0.into(),
            newest.0.into(),
        ) {
            return Err(newer);
        }
    }
    Ok(level)
}

/// The fleet level a process writes at, shared by the parts of it that write formats
/// (the committer, compaction). It only rises.
#[derive(Debug, Clone)]
pub struct FleetLevel(Arc<AtomicU32>);

impl FleetLevel {
    /// A level that stays at `level` (for tools and tests that join no fleet).
    pub fn fixed(level: Level) -> Self {
        Self(Arc::new(AtomicU32::new(level.0)))
    }

    /// The level now.
    pub fn get(&self) -> Level {
        Level(self.0.load(Ordering::Relaxed))
    }

    fn raise_to(&self, level: Level) -> bool {
        self.0.fetch_max(level.0, Ordering::Relaxed) < level.0
    }
}

/// The build as process records and manifests name it.
pub fn build_name() -> String {
    format!("narad {}", env!("CARGO_PKG_VERSION"))
}

/// This process's place in the fleet: its record, the level it writes at, and whether a
/// raise beyond this build has stopped it.
pub struct Gate {
    store: DynStore,
    key: String,
    ttl: Duration,
    level: FleetLevel,
    state: Mutex<State>,
}

struct State {
    record: ProcessRecord,
    etag: Option<ETag>,
    /// What stopped this process from serving: the object and its version.
    stopped: Option<(String, Newer)>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("key", &self.key)
            .field("level", &self.level.get())
            .finish()
    }
}

impl Gate {
    /// Joins the fleet on `store` (see the module documentation) with a record that
    /// lives `ttl` unless renewed, and starts renewing it. Process records and the fleet
    /// record run on the system clock, whatever clock the broker runs on: they are about
    /// real processes, and are read by `narad upgrade` in other processes.
    ///
    /// Errors: [`BrokerError::UpgradeRequired`] when the fleet is at (or being raised to)
    /// a level this build does not read; store failures.
    pub(crate) async fn join(
        store: DynStore,
        ids: &dyn IdSource,
        ttl: Duration,
        tasks: &Arc<Dispatcher>,
    ) -> BrokerResult<Arc<Self>> {
        // A start that meets a moment of throttling (or a spurious conflict, which S3 may
        // answer to a conditional write) tries again, with a new record key.
        let mut attempt = 0;
        loop {
            match Self::try_join(&store, ids, ttl).await {
                Err(BrokerError::Store(StoreError::Unavailable(_) | StoreError::Conflict))
                    if attempt < JOIN_ATTEMPTS =>
                {
                    attempt += 1;
                    cas::backoff(attempt, &format!("join-{attempt}")).await;
                }
                Ok(gate) => {
                    gate.spawn_renewals(tasks);
                    return Ok(gate);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn try_join(
        store: &DynStore,
        ids: &dyn IdSource,
        ttl: Duration,
    ) -> BrokerResult<Arc<Self>> {
        let now = SystemClock.now_ms();
        let refuse = |newer| BrokerError::UpgradeRequired {
            object: keys::FLEET.to_owned(),
            newer,
        };
        let mut fleet = read_fleet(store).await?;
        if fleet.is_none() {
            fleet = bootstrap(store, now).await?;
        }
        let level = admit(fleet.as_ref(), Level::NEWEST, now, true).map_err(refuse)?;
        let record = ProcessRecord {
            build: build_name(),
            newest: Level::NEWEST,
            level,
            host: host_name(),
            pid: crate::runtime::process_id(),
            started_ms: now,
            renewed_ms: now,
            expires_ms: now + ttl.as_millis() as u64,
            unknown: Map::new(),
        };
        let key = keys::process(&ids.new_id());
        let etag = store.put_if_absent(&key, encode(&record)?).await?;
        // Read again after the record is written: a raise that began before it is seen.
        let fleet = read_fleet(store).await?;
        if let Err(newer) = admit(fleet.as_ref(), Level::NEWEST, SystemClock.now_ms(), true) {
            let _ = store.delete(&key).await;
            return Err(refuse(newer));
        }
        let gate = Arc::new(Self {
            store: store.clone(),
            key,
            ttl,
            level: FleetLevel::fixed(level),
            state: Mutex::new(State {
                record,
                etag: Some(etag),
                stopped: None,
            }),
        });
        gate.learn(fleet.as_ref());
        Ok(gate)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The level this process writes at.
    pub fn level(&self) -> FleetLevel {
        self.level.clone()
    }

    /// This process's record key.
    pub fn record_key(&self) -> &str {
        &self.key
    }

    /// Fails when a raise beyond this build has stopped this process.
    ///
    /// Errors: [`BrokerError::UpgradeRequired`].
    pub fn check(&self) -> BrokerResult<()> {
        match &self.lock().stopped {
            None => Ok(()),
            Some((object, newer)) => Err(BrokerError::UpgradeRequired {
                object: object.clone(),
                newer: newer.clone(),
            }),
        }
    }

    /// Stops this process from serving: `object`, which every request needs, was written
    /// by a newer build (the generated receipt key of a newer format).
    pub fn stop(&self, object: &str, newer: Newer) {
        tracing::error!(%object, %newer, "a newer version of Narad wrote this object, which every \
            request needs: this process serves nothing (upgrade_required) until it is replaced \
            by a newer one (docs/upgrades.md)");
        self.lock().stopped = Some((object.to_owned(), newer));
    }

    /// Takes in a fleet record as read.
    fn learn(&self, fleet: Option<&FleetRecord>) {
        match admit(fleet, Level::NEWEST, SystemClock.now_ms(), false) {
            Ok(level) => {
                if self.level.raise_to(level) {
                    tracing::info!(%level, "the fleet level was raised: writing its formats from now on");
                }
            }
            Err(newer) => {
                let mut state = self.lock();
                if state.stopped.is_none() {
                    tracing::error!(%newer, "the fleet was raised beyond this build: it serves nothing more \
                        (upgrade_required) until it is replaced by a newer one (docs/upgrades.md)");
                }
                state.stopped = Some((keys::FLEET.to_owned(), newer));
            }
        }
    }

    /// Renews this process's record and re-reads the fleet record. Failures are logged
    /// (the next renewal tries again).
    pub async fn renew(&self) {
        let now = SystemClock.now_ms();
        let (body, etag) = {
            let mut state = self.lock();
            state.record.renewed_ms = now;
            state.record.expires_ms = now + self.ttl.as_millis() as u64;
            state.record.level = self.level.get();
            (encode(&state.record), state.etag.clone())
        };
        let Ok(body) = body else { return };
        let written = match &etag {
            Some(e) => self.store.put_if_match(&self.key, body.clone(), e).await,
            None => Err(StoreError::Conflict),
        };
        let written = match written {
            // The answer to the last write was lost (its ETag is not the one held), or gc
            // took a record that had expired: write over what is there, or afresh. Only
            // this process writes its key.
            Err(StoreError::NotFound | StoreError::Conflict) => self.rewrite(body).await,
            other => other,
        };
        match written {
            Ok(e) => self.lock().etag = Some(e),
            Err(e) => {
                self.lock().etag = None;
                tracing::warn!(key = %self.key, error = %e, "process record not renewed");
            }
        }
        match read_fleet(&self.store).await {
            Ok(fleet) => self.learn(fleet.as_ref()),
            Err(e) => tracing::warn!(error = %e, "fleet record not read"),
        }
    }

    /// Writes `body` over this process's record as it is stored now, or afresh.
    async fn rewrite(&self, body: bytes::Bytes) -> Result<ETag, StoreError> {
        match self.store.get(&self.key).await? {
            Some(o) => self.store.put_if_match(&self.key, body, &o.etag).await,
            None => self.store.put_if_absent(&self.key, body).await,
        }
    }

    /// Renews this process's record every third of its time to live, until the broker
    /// stops (the task is the dispatcher's) or the gate is dropped.
    fn spawn_renewals(self: &Arc<Self>, tasks: &Arc<Dispatcher>) {
        let weak = Arc::downgrade(self);
        let every = (self.ttl / 3).max(Duration::from_millis(100));
        let renewals = async move {
            loop {
                crate::runtime::sleep(every).await;
                let Some(gate) = weak.upgrade() else { return };
                gate.renew().await;
            }
        };
        // Refused only once the broker stopped: nothing left to renew for.
        let _ = tasks.spawn(Kind::Renewal, renewals);
    }

    /// Deletes this process's record (a clean shutdown), so it stops counting at once.
    pub async fn leave(&self) {
        if let Err(e) = self.store.delete(&self.key).await {
            tracing::debug!(key = %self.key, error = %e, "process record not deleted");
        }
    }
}

fn encode<T: Serialize>(v: &T) -> BrokerResult<bytes::Bytes> {
    serde_json::to_vec(v)
        .map(cas::seal_json)
        .map_err(|e| BrokerError::Internal(e.to_string()))
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .map(|h| h.trim().chars().take(64).collect())
        .unwrap_or_default()
}

/// A new store starts at the newest level, as a new Kafka cluster starts at the newest
/// `metadata.version`: when it holds no topic and no process record, no build that reads
/// less can have anything to misread, so this build writes the fleet record at
/// [`Level::NEWEST`] (if nobody wrote one meanwhile) and returns what is stored then.
/// A store with topics and no record stays at level 1: builds before the gate may serve
/// it unseen (docs/upgrades.md).
///
/// Errors: store failures.
async fn bootstrap(store: &DynStore, now: u64) -> BrokerResult<Option<FleetRecord>> {
    if !store
        .list_after(keys::TOPICS_PREFIX, "", 1)
        .await?
        .is_empty()
        || !store
            .list_after(keys::PROCESSES_PREFIX, "", 1)
            .await?
            .is_empty()
    {
        return Ok(None);
    }
    let record = FleetRecord {
        level: Level::NEWEST,
        raised_at_ms: now,
        raised_by: format!("{} (a new store)", build_name()),
        raising: None,
        unknown: Map::new(),
    };
    match store.put_if_absent(keys::FLEET, encode(&record)?).await {
        Ok(_) => {
            tracing::info!(level = %Level::NEWEST, "a new store: the fleet starts at the newest level");
            Ok(Some(record))
        }
        Err(StoreError::Conflict | StoreError::Unavailable(_)) => read_fleet(store).await,
        Err(e) => Err(e.into()),
    }
}

/// The fleet record as stored; `None` if there is none (level 1).
///
/// Errors: store failures, a record that does not decode.
pub async fn read_fleet(store: &DynStore) -> BrokerResult<Option<FleetRecord>> {
    let ids = crate::clock::RandomIds;
    let cell = Cell::<Option<FleetRecord>>::new(&**store, &ids, keys::FLEET, &());
    Ok(cell.read::<BrokerError>().await?.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(level: u32, raising: Option<(u32, u64)>) -> FleetRecord {
        FleetRecord {
            level: Level(level),
            raised_at_ms: 0,
            raised_by: String::new(),
            raising: raising.map(|(to, until_ms)| Raising {
                to: Level(to),
                id: "r".into(),
                until_ms,
            }),
            unknown: Map::new(),
        }
    }

    #[test]
    fn a_process_runs_at_the_fleet_level_and_never_above_what_it_reads() {
        let two = Level(2);
        assert_eq!(admit(None, two, 0, true), Ok(Level(1)));
        assert_eq!(admit(Some(&fleet(2, None)), two, 0, true), Ok(Level(2)));
        let refused = admit(Some(&fleet(3, None)), two, 0, false).unwrap_err();
        assert_eq!((refused.found, refused.known), (3, 2));
        // A raise under way beyond this build stops a joining process, not a running
        // one (the finalize saw the running one's record and will withdraw).
        let raising = fleet(2, Some((3, 500)));
        assert!(admit(Some(&raising), two, 100, true).is_err());
        assert_eq!(admit(Some(&raising), two, 100, false), Ok(Level(2)));
        // A lapsed mark (its finalize died) holds nobody back.
        assert_eq!(admit(Some(&raising), two, 600, true), Ok(Level(2)));
        // A raise within what this build reads does not stop it either.
        assert_eq!(
            admit(Some(&fleet(1, Some((2, 500)))), two, 100, true),
            Ok(Level(1))
        );
    }
}
