//! The operator's side of the format gate: `narad upgrade status` ([`status`]) and
//! `narad upgrade finalize` ([`finalize`], two-phase: see the parent module), and the
//! deletion of long-expired process records by `narad gc` ([`delete_expired`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Map;

use super::{build_name, read_fleet, FleetRecord, ProcessRecord, Raising};
use crate::cas::{self, Cell, Decision, Pure};
use crate::clock::{Clock, IdSource};
use crate::error::{BrokerError, BrokerResult};
use crate::formats::{write_stamp, write_time, Level};
use crate::keys;
use crate::store::DynStore;
use crate::topic::TopicRecord;

/// How long a finalize's mark of a raise under way holds if the finalize never ends it.
const RAISING_HOLDS_MS: u64 = 120_000;
/// Topics a status or finalize looks at, at most (a store holds at most
/// `NARAD_MAX_TOPICS`, 10,000 by default).
const MAX_SCANNED_TOPICS: usize = 100_000;

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

/// What a status needs of a manifest: its write ids.
#[derive(Deserialize)]
struct Stamped {
    #[serde(default)]
    recent_writes: Vec<String>,
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
            if let Some(blocker) = recent_write(&topic, p, &stamped.recent_writes, since, target) {
                out.push(blocker);
            }
        }
    }
    Ok(out)
}

/// The newest of `writes` (a manifest's recent write ids) made at or after `since` by a
/// build that cannot read `target`, as a blocker. A write whose time cannot be read counts
/// as recent.
pub(super) fn recent_write(
    topic: &str,
    partition: u32,
    writes: &[String],
    since: u64,
    target: Level,
) -> Option<Blocker> {
    writes
        .iter()
        .rev()
        .map(|w| (w, write_time(w).unwrap_or(0), write_stamp(w)))
        .find(|(_, at, stamp)| (*at == 0 || *at >= since) && stamp.is_none_or(|s| s < target))
        .map(|(_, written_ms, stamp)| Blocker::RecentWrite {
            topic: topic.to_owned(),
            partition,
            written_ms,
            stamp,
        })
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
    use serde_json::Map;

    use super::*;

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
    fn any_recent_write_of_a_build_that_cannot_read_the_target_blocks() {
        let now = 10_000_000_000_000u64;
        let at = |ms: u64| {
            // A UUIDv7 of time `ms`.
            format!("{ms:012x}70008000000000000000")
        };
        let (two, three) = (Level(2), Level(3));
        let old = at(now - 1000);
        let ours = crate::formats::stamp_write(&at(now - 10));
        // The last write is this build's; one before it is an old build's: blocked.
        let writes = vec![at(now - 90_000_000), old.clone(), ours.clone()];
        let b = recent_write("t", 0, &writes, now - 60_000, two).unwrap();
        assert_eq!(
            b,
            Blocker::RecentWrite {
                topic: "t".into(),
                partition: 0,
                written_ms: now - 1000,
                stamp: None
            }
        );
        // Out of the window, or only writes of builds that read the target: not blocked.
        assert_eq!(recent_write("t", 0, &writes, now - 500, two), None);
        assert_eq!(
            recent_write("t", 0, std::slice::from_ref(&ours), 0, two),
            None
        );
        // This build's writes block a raise beyond it.
        let beyond = Level(Level::NEWEST.0 + 1);
        assert!(recent_write("t", 0, &[ours], 0, beyond).is_some());
        // A level-2 build's writes block a raise to 3.
        let level_two = format!("g2-{}", at(now - 10));
        assert!(recent_write("t", 0, &[level_two], 0, three).is_some());
        // A write of unknown time counts as recent.
        assert!(recent_write("t", 0, &["id-000001".into()], now, two).is_some());
    }
}
