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
//!   this build writes carries its newest level (`gate`), and theirs carry none.
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

use crate::cas::{self, Cell, Decision, JsonRecord, Pure};
use crate::clock::{Clock, IdSource, SystemClock};
use crate::error::{BrokerError, BrokerResult};
use crate::formats::{Level, Newer};
use crate::keys;
use crate::store::{DynStore, ETag, StoreError};
use crate::topic::TopicRecord;

/// Tries of a start-up that meets a transient store failure.
const JOIN_ATTEMPTS: u32 = 8;
/// How long a finalize's mark of a raise under way holds if the finalize never ends it.
const RAISING_HOLDS_MS: u64 = 120_000;
/// Topics a status or finalize looks at, at most (a store holds at most
/// `NARAD_MAX_TOPICS`, 10,000 by default).
const MAX_SCANNED_TOPICS: usize = 100_000;

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
    pub async fn join(
        store: DynStore,
        ids: &dyn IdSource,
        ttl: Duration,
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
                    gate.spawn_renewals();
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
        let level =
            admit(read_fleet(store).await?.as_ref(), Level::NEWEST, now, true).map_err(refuse)?;
        let record = ProcessRecord {
            build: build_name(),
            newest: Level::NEWEST,
            level,
            host: host_name(),
            pid: std::process::id(),
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
            Some(e) => match self.store.put_if_match(&self.key, body.clone(), e).await {
                // Deleted (gc takes expired records) or replaced: write it afresh.
                Err(StoreError::NotFound | StoreError::Conflict) => {
                    self.store.put_if_absent(&self.key, body).await
                }
                other => other,
            },
            None => self.store.put_if_absent(&self.key, body).await,
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

    fn spawn_renewals(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = (self.ttl / 3).max(Duration::from_millis(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(gate) = weak.upgrade() else { return };
                gate.renew().await;
            }
        });
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

/// The fleet record as stored; `None` if there is none (level 1).
///
/// Errors: store failures, a record that does not decode.
pub async fn read_fleet(store: &DynStore) -> BrokerResult<Option<FleetRecord>> {
    let ids = crate::clock::RandomIds;
    let cell = Cell::<Option<FleetRecord>>::new(&**store, &ids, keys::FLEET, &());
    Ok(cell.read::<BrokerError>().await?.value)
}

/// Why the fleet cannot be raised to a level now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Blocker {
    /// This build does not read the level asked for.
    BeyondThisBuild {
        /// The level asked for.
        to: Level,
        /// The newest this build reads.
        newest: Level,
    },
    /// Another finalize has a raise under way.
    RaiseUnderWay {
        /// The level it raises to.
        to: Level,
        /// Until when its mark holds.
        until_ms: u64,
    },
    /// A live process of a build that cannot read the level.
    Process {
        /// Its build.
        build: String,
        /// The newest level it reads.
        newest: Level,
        /// Where it runs.
        host: String,
    },
    /// A partition a build that cannot read the level wrote within the window: a build
    /// before the gate (no stamp) or one that reads less.
    RecentWrite {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// When, from the write's id (0: unknown, taken as recent).
        written_ms: u64,
        /// The newest level its writer reads (`None`: a build before the gate).
        stamp: Option<Level>,
    },
    /// Builds before the gate write no process record; the operator confirms none runs.
    Unconfirmed,
}

/// What `narad upgrade status` shows, and `finalize` decides on.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The fleet level.
    pub level: Level,
    /// The newest level this build reads.
    pub this_build: Level,
    /// A raise under way, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raising: Option<Raising>,
    /// Live process records.
    pub processes: Vec<ProcessRecord>,
    /// Process records that expired (gc deletes them).
    pub expired_processes: usize,
    /// The level a raise would go to.
    pub target: Level,
    /// Why it cannot happen now; empty: it can.
    pub blockers: Vec<Blocker>,
}

/// How a status or finalize looks.
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    /// The level to raise to; `None`: the newest this build reads.
    pub to: Option<Level>,
    /// How far back a manifest write by a build that cannot read the target counts.
    pub window: Duration,
    /// The operator confirmed that no build before the gate runs.
    pub confirmed: bool,
}

/// The fleet's status for raising it as `scan` says, read now.
///
/// Errors: store failures.
pub async fn status(store: &DynStore, clock: &dyn Clock, scan: Scan) -> BrokerResult<Status> {
    let fleet = read_fleet(store).await?;
    let now = clock.now_ms();
    let level = fleet.as_ref().map_or(Level::BEFORE_GATE, |f| f.level);
    let target = scan.to.unwrap_or(Level::NEWEST).max(level);
    let (processes, expired) = processes(store, now).await?;
    let writes = if target > level {
        recent_writes(store, now, scan.window, target).await?
    } else {
        Vec::new()
    };
    let raising = fleet
        .as_ref()
        .and_then(|f| f.raising.clone())
        .filter(|r| r.until_ms > now);
    let blockers = blockers(
        level,
        target,
        raising.as_ref(),
        &processes,
        writes,
        scan.confirmed,
    );
    Ok(Status {
        level,
        this_build: Level::NEWEST,
        raising,
        processes,
        expired_processes: expired,
        target,
        blockers,
    })
}

/// Why raising the fleet from `level` to `target` cannot happen now (empty: it can),
/// given the raise under way, the live processes, and the recent writes of builds that
/// cannot read `target`.
pub fn blockers(
    level: Level,
    target: Level,
    raising: Option<&Raising>,
    processes: &[ProcessRecord],
    writes: Vec<Blocker>,
    confirmed: bool,
) -> Vec<Blocker> {
    let mut out = Vec::new();
    if target <= level {
        return out;
    }
    if target > Level::NEWEST {
        out.push(Blocker::BeyondThisBuild {
            to: target,
            newest: Level::NEWEST,
        });
    }
    if let Some(r) = raising {
        out.push(Blocker::RaiseUnderWay {
            to: r.to,
            until_ms: r.until_ms,
        });
    }
    out.extend(
        processes
            .iter()
            .filter(|p| p.newest < target)
            .map(|p| Blocker::Process {
                build: p.build.clone(),
                newest: p.newest,
                host: format!("{} pid {}", p.host, p.pid),
            }),
    );
    out.extend(writes);
    if level == Level::BEFORE_GATE && !confirmed {
        out.push(Blocker::Unconfirmed);
    }
    out
}

/// The live process records and how many expired ones there are.
async fn processes(store: &DynStore, now: u64) -> BrokerResult<(Vec<ProcessRecord>, usize)> {
    let mut live = Vec::new();
    let mut expired = 0;
    for key in store.list(keys::PROCESSES_PREFIX).await? {
        let Some(o) = store.get(&key).await? else {
            continue;
        };
        let record = cas::open_json(&o.data)
            .ok()
            .and_then(|j| serde_json::from_slice::<ProcessRecord>(j).ok());
        match record {
            Some(r) if r.expires_ms > now => live.push(r),
            Some(_) => expired += 1,
            None => tracing::warn!(%key, "unreadable process record; ignored"),
        }
    }
    Ok((live, expired))
}

/// How long after it expired a process record is deleted by `narad gc`.
pub const DELETE_EXPIRED_AFTER_MS: u64 = 3_600_000;

/// Deletes the process records that expired more than [`DELETE_EXPIRED_AFTER_MS`] ago
/// (and unreadable ones as old); with `dry_run`, only counts them.
///
/// Errors: store failures.
pub async fn delete_expired(store: &DynStore, now: u64, dry_run: bool) -> BrokerResult<u64> {
    let mut deleted = 0;
    for key in store.list(keys::PROCESSES_PREFIX).await? {
        let Some(o) = store.get(&key).await? else {
            continue;
        };
        let expires = cas::open_json(&o.data)
            .ok()
            .and_then(|j| serde_json::from_slice::<ProcessRecord>(j).ok())
            .map_or(0, |r| r.expires_ms);
        if expires + DELETE_EXPIRED_AFTER_MS < now {
            if !dry_run {
                store.delete(&key).await?;
            }
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// What a status needs of a manifest: its writer's stamp and its write ids.
#[derive(Deserialize)]
struct Stamped {
    #[serde(default)]
    gate: Option<Level>,
    #[serde(default)]
    recent_writes: Vec<String>,
}

/// The write time of a write id (a UUIDv7 at its end), if it has one.
pub fn write_time(id: &str) -> Option<u64> {
    let hex = id.get(id.len().checked_sub(32)?..)?;
    let v = u128::from_str_radix(hex, 16).ok()?;
    let version = (v >> 76) & 0xf;
    (version == 7).then_some((v >> 80) as u64)
}

/// Partitions whose manifest a build that cannot read `target` wrote within `window`.
async fn recent_writes(
    store: &DynStore,
    now: u64,
    window: Duration,
    target: Level,
) -> BrokerResult<Vec<Blocker>> {
    let since = now.saturating_sub(window.as_millis() as u64);
    let mut out = Vec::new();
    let topics = store
        .list_dirs(keys::TOPICS_PREFIX, "", MAX_SCANNED_TOPICS)
        .await?;
    for topic in topics {
        let Some(o) = store.get(&keys::topic_settings(&topic)).await? else {
            continue;
        };
        // A newer build's topic (or damage): nothing of this build's to judge there.
        let Ok(Some(rec)) = <Option<TopicRecord> as cas::Stored>::decode(&o.data, &()) else {
            continue;
        };
        for p in 0..rec.settings.partitions {
            let key = keys::manifest(&topic, rec.layout, p);
            let Some(m) = store.get(&key).await? else {
                continue;
            };
            let Some(stamped) = cas::open_json(&m.data)
                .ok()
                .and_then(|j| serde_json::from_slice::<Stamped>(j).ok())
            else {
                continue;
            };
            if stamped.gate.is_some_and(|g| g >= target) {
                continue;
            }
            let written = stamped
                .recent_writes
                .last()
                .map_or(Some(0), |w| write_time(w));
            let written_ms = written.unwrap_or(0);
            if written_ms == 0 || written_ms >= since {
                out.push(Blocker::RecentWrite {
                    topic: topic.clone(),
                    partition: p,
                    written_ms,
                    stamp: stamped.gate,
                });
            }
        }
    }
    Ok(out)
}

/// How a finalize ended.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Finalized {
    /// The fleet is now at `level` (or already was).
    Raised {
        /// The level.
        level: Level,
    },
    /// Not raised; the status says why.
    Refused {
        /// What was found.
        status: Box<Status>,
    },
}

/// Raises the fleet as `scan` says, two-phase (see the module documentation).
///
/// Errors: store failures; [`BrokerError::Contention`] when another finalize changed the
/// fleet record meanwhile (run it again).
pub async fn finalize(
    store: &DynStore,
    clock: &dyn Clock,
    ids: &dyn IdSource,
    scan: Scan,
) -> BrokerResult<Finalized> {
    let first = status(store, clock, scan).await?;
    if first.target <= first.level {
        return Ok(Finalized::Raised { level: first.level });
    }
    if !first.blockers.is_empty() {
        return Ok(Finalized::Refused {
            status: Box::new(first),
        });
    }
    let target = first.target;
    let id = ids.new_id();
    let cell = Cell::<Option<FleetRecord>>::new(&**store, ids, keys::FLEET, &());
    let mark = Raising {
        to: target,
        id: id.clone(),
        until_ms: clock.now_ms() + RAISING_HOLDS_MS,
    };
    let now = clock.now_ms();
    let (marked, _) = cell
        .update(Pure(|cur: &mut Option<FleetRecord>| {
            let rec = cur.get_or_insert_with(|| FleetRecord {
                level: Level::BEFORE_GATE,
                raised_at_ms: 0,
                raised_by: String::new(),
                raising: None,
                unknown: Map::new(),
            });
            let busy = rec.raising.as_ref().is_some_and(|r| r.until_ms > now);
            if busy || rec.level != first.level {
                return Ok::<_, BrokerError>(Decision::Keep(false));
            }
            rec.raising = Some(mark.clone());
            Ok(Decision::Commit(true))
        }))
        .await?;
    if !marked {
        return Err(BrokerError::Contention);
    }
    // Everything that started before the mark is listed now.
    let second = status(store, clock, scan).await;
    let ok = matches!(&second, Ok(s) if only_our_mark(&s.blockers));
    let raised_by = build_name();
    let (landed, _) = cell
        .update(Pure(|cur: &mut Option<FleetRecord>| {
            let Some(rec) = cur else {
                return Ok::<_, BrokerError>(Decision::Keep(false));
            };
            if rec.raising.as_ref().map(|r| r.id.as_str()) != Some(id.as_str()) {
                return Ok(Decision::Keep(false));
            }
            rec.raising = None;
            if ok {
                rec.level = target;
                rec.raised_at_ms = clock.now_ms();
                rec.raised_by = raised_by.clone();
            }
            Ok(Decision::Commit(ok))
        }))
        .await?;
    match second? {
        _ if landed => Ok(Finalized::Raised { level: target }),
        s if !ok => Ok(Finalized::Refused {
            status: Box::new(s),
        }),
        // Our mark was gone (it lapsed and another finalize took over): not raised here.
        _ => Err(BrokerError::Contention),
    }
}

/// True when the only thing in the way is the raise this finalize marked itself.
fn only_our_mark(blockers: &[Blocker]) -> bool {
    blockers
        .iter()
        .all(|b| matches!(b, Blocker::RaiseUnderWay { .. }))
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

    fn process(newest: u32) -> ProcessRecord {
        ProcessRecord {
            build: "narad 0.0.9".into(),
            newest: Level(newest),
            level: Level(1),
            host: "h".into(),
            pid: 7,
            started_ms: 0,
            renewed_ms: 0,
            expires_ms: 1000,
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

    #[test]
    fn a_raise_waits_for_every_build_that_cannot_read_it() {
        let (one, two) = (Level(1), Level(2));
        assert!(blockers(two, two, None, &[process(1)], vec![], false).is_empty());
        let b = blockers(one, two, None, &[process(2), process(1)], vec![], true);
        assert!(
            matches!(&b[..], [Blocker::Process { newest, .. }] if *newest == one),
            "{b:?}"
        );
        let b = blockers(one, two, None, &[process(2)], vec![], false);
        assert_eq!(
            b,
            vec![Blocker::Unconfirmed],
            "builds before the gate are invisible"
        );
        assert!(blockers(one, two, None, &[process(2)], vec![], true).is_empty());
        // From level 2 up every build writes a record: no confirmation.
        assert!(blockers(two, Level(3), None, &[], vec![], false)
            .iter()
            .all(|b| matches!(b, Blocker::BeyondThisBuild { .. })));
        let write = Blocker::RecentWrite {
            topic: "t".into(),
            partition: 0,
            written_ms: 5,
            stamp: None,
        };
        let b = blockers(one, two, None, &[], vec![write.clone()], true);
        assert_eq!(b, vec![write]);
        let mark = Raising {
            to: two,
            id: "x".into(),
            until_ms: 9,
        };
        let b = blockers(one, two, Some(&mark), &[], vec![], true);
        assert!(only_our_mark(&b) && !b.is_empty());
    }

    #[test]
    fn write_ids_tell_their_time() {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let t = write_time(&id).unwrap();
        assert!(t <= now && now - t < 5000, "{t} {now}");
        assert_eq!(write_time(&format!("repair-{id}")), Some(t));
        assert_eq!(write_time("id-000001"), None);
        assert_eq!(write_time(&uuid::Uuid::new_v4().simple().to_string()), None);
    }
}
