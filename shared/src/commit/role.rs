//! The part one process plays on one partition that many processes write
//! ([`super::combine`]): whether the partition counts as contended, whether this process
//! is its committer (it sweeps other processes' writes while its own queue is empty), and
//! what the last commit taught about the snapshot it caches.
//!
//! The state is private: the drain loop, a batch and a sweep each report what they saw
//! through one method, and the transitions are plain code tested below without a store.

use std::time::Duration;

use crate::runtime::Instant;

use crate::partition::Rules;
use crate::store::ETag;

/// How long a partition counts as contended after the last sign of another writer.
pub(super) const CONTENDED_FOR: Duration = Duration::from_secs(5);

/// Consecutive sweeps a committer makes with its queue empty.
pub(super) const MAX_SWEEPS: u32 = 256;

/// Listings in a row that may find nothing pending before a committer stops sweeping:
/// with few writers the next segment is often a round trip away.
pub(super) const IDLE_SWEEPS: u32 = 3;

/// How often at most a process that keeps winning its manifest writes at the first try
/// looks for other processes' combining writes ([`Role::look_due`]).
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Commits in a row, none a race lost and each within [`LOOK_GAP`] of the one before,
/// after which a process looks ([`Role::look_due`]).
pub(super) const LOOK_AFTER: u32 = 4;

/// The longest gap between two commits of such a run. A lone client whose requests rotate
/// over processes reaches each only every few hundred milliseconds, so its processes never
/// make such runs and never pay the listing.
pub(super) const LOOK_GAP: Duration = Duration::from_millis(200);

/// How long after the idle watch confirmed the cached snapshot a commit trusts it without
/// confirming it again: about one round trip, the time a woken waiter takes to queue its
/// lease.
pub(super) const WATCHED_FOR: Duration = Duration::from_millis(100);

/// Whether a batch confirmed its cached snapshot with a conditional GET before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Confirmed {
    /// It wrote against the cache as it was.
    No,
    /// The store answered 304: the cache was current.
    Unchanged,
    /// The store held a newer manifest: the cache was out of date again.
    Changed,
}

/// How one batch's manifest write went, as the role needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Attempts {
    /// Conditional writes tried (more than one: the snapshot was out of date).
    pub tries: u32,
    /// Whether the cached snapshot was confirmed first, and what that found.
    pub confirmed: Confirmed,
    /// Whether the batch had callers (a sweep has none).
    pub callers: bool,
}

impl Attempts {
    /// Whether another writer raced this one: one conflict on a cache not confirmed first
    /// is a stale cache (a lone client whose requests rotate over processes), not a race.
    pub(super) fn raced(&self) -> bool {
        self.tries
            > if self.confirmed == Confirmed::No {
                2
            } else {
                1
            }
    }

    /// Whether the cache turned out out of date (so the next batch confirms it first).
    pub(super) fn found_stale(&self) -> bool {
        self.tries > 1 || self.confirmed == Confirmed::Changed
    }
}

/// What the drain loop does when its queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Idle {
    /// Sweep once more.
    Sweep,
    /// Stop: the task ends until the next operation is queued.
    Stop,
}

/// This process's role on one partition (see the module documentation); `W` is what
/// its sweeps commit under: the rules and topic ETag of the last batch for a manifest,
/// the rules for a subscription's ledger.
#[derive(Debug)]
pub(super) struct Role<W = (Rules, ETag)> {
    /// Until when the partition counts as contended.
    contended_until: Option<Instant>,
    /// Whether the last commit found the cached snapshot out of date: the next one
    /// confirms it before writing.
    stale_cache: bool,
    /// Whether this process is the partition's committer.
    sweeping: bool,
    /// Sweeps since the queue last held operations.
    sweeps: u32,
    /// Sweeps in a row that found nothing pending.
    idle_sweeps: u32,
    /// What sweeps commit under (the last batch's).
    sweep_with: Option<W>,
    /// Commits in a row of a run that may look ([`LOOK_AFTER`]), and when the last ended.
    run: u32,
    last_commit: Option<Instant>,
    /// When this process last looked for other processes' combining writes.
    looked_at: Option<Instant>,
    /// When the idle watch last confirmed the cached snapshot current
    /// ([`super::Committer::refresh`]).
    watched_at: Option<Instant>,
}

impl<W> Default for Role<W> {
    fn default() -> Self {
        Self {
            contended_until: None,
            stale_cache: false,
            sweeping: false,
            sweeps: 0,
            idle_sweeps: 0,
            sweep_with: None,
            run: 0,
            last_commit: None,
            looked_at: None,
            watched_at: None,
        }
    }
}

impl<W: Clone> Role<W> {
    /// Whether the partition counts as contended at `now`.
    pub(super) fn contended(&self, now: Instant) -> bool {
        self.contended_until.is_some_and(|t| now < t)
    }

    /// Records a sign of another writer, seen at `now`.
    pub(super) fn mark_contended(&mut self, now: Instant) {
        self.contended_until = Some(now + CONTENDED_FOR);
    }

    /// Whether this process is the partition's committer: it commits its own operations
    /// at once, as they are, and sweeps while idle.
    pub(super) fn is_committer(&self) -> bool {
        self.sweeping
    }

    /// Makes this process the partition's committer (it took over a combining commit).
    pub(super) fn become_committer(&mut self) {
        self.sweeping = true;
        self.sweeps = 0;
        self.idle_sweeps = 0;
    }

    /// Whether the next commit, starting at `now`, confirms the cached snapshot first: the
    /// last commit found it out of date, and the idle watch did not confirm it within
    /// [`WATCHED_FOR`].
    pub(super) fn confirm_cache_first(&self, now: Instant) -> bool {
        self.stale_cache
            && self
                .watched_at
                .is_none_or(|t| now.saturating_duration_since(t) > WATCHED_FOR)
    }

    /// The held snapshot was confirmed current at `now`: the idle watch or a combining
    /// commit read it, or found it unchanged.
    pub(super) fn watched(&mut self, now: Instant) {
        self.watched_at = Some(now);
    }

    /// A batch of queued operations was taken, to commit under `with` (the rules, and
    /// for a manifest the ETag of the topic record): sweeps after it commit the same way.
    pub(super) fn took_batch(&mut self, with: W) {
        self.sweeps = 0;
        self.sweep_with = Some(with);
    }

    /// What a sweep commits under; `None` before any batch.
    pub(super) fn sweep_with(&self) -> Option<W> {
        self.sweep_with.clone()
    }

    /// The queue is empty: sweep again, or stop (and stop being the committer).
    pub(super) fn idle(&mut self) -> Idle {
        if !self.sweeping || self.sweeps >= MAX_SWEEPS {
            self.sweeping = false;
            return Idle::Stop;
        }
        self.sweeps += 1;
        Idle::Sweep
    }

    /// A sweep ended at `now`, having landed something or not.
    pub(super) fn swept(&mut self, landed: bool, now: Instant) {
        if landed {
            self.idle_sweeps = 0;
            self.mark_contended(now);
        } else {
            self.idle_sweeps += 1;
        }
        self.sweeping &= self.idle_sweeps <= IDLE_SWEEPS;
    }

    /// Whether an ordinary commit starting at `now` should list the partition beside its
    /// write, looking for other processes' combining writes.
    ///
    /// A process that commits back to back wins every race (or loses one to a stale
    /// cache), so it never sees a sign of the others, while theirs lose every race to it:
    /// its write goes out a round trip before theirs can, every time. They turn to
    /// combining (a batch that lost two races does), and this look is how it learns of
    /// them: at most every [`LOOK_EVERY`], after [`LOOK_AFTER`] commits in a row.
    pub(super) fn look_due(&self, now: Instant) -> bool {
        self.run >= LOOK_AFTER
            && self
                .looked_at
                .is_none_or(|t| now.saturating_duration_since(t) >= LOOK_EVERY)
    }

    /// A look started at `now`; `others` when it found other processes' writes pending
    /// (the partition is contended).
    pub(super) fn looked(&mut self, others: bool, now: Instant) {
        self.looked_at = Some(now);
        if others {
            self.mark_contended(now);
        }
    }

    /// A batch's (or sweep's) manifest write ended at `now` after `a`.
    pub(super) fn committed(&mut self, a: Attempts, now: Instant) {
        self.stale_cache = a.found_stale();
        let close = self
            .last_commit
            .is_some_and(|t| now.saturating_duration_since(t) <= LOOK_GAP);
        self.run = match (a.callers && !a.raced(), close) {
            (false, _) => 0,
            (true, true) => self.run.saturating_add(1),
            (true, false) => 1,
        };
        self.last_commit = Some(now);
        if a.raced() {
            self.mark_contended(now);
        }
        if a.tries > 1 && !a.callers {
            // A sweep lost a race: another process commits; leave the sweeping to it.
            self.sweeping = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tried(tries: u32, refreshed: bool, callers: bool) -> Attempts {
        let confirmed = match refreshed {
            true => Confirmed::Unchanged,
            false => Confirmed::No,
        };
        Attempts {
            tries,
            confirmed,
            callers,
        }
    }

    #[test]
    fn contention_lasts_for_a_while_after_its_last_sign() {
        let t0 = crate::runtime::now();
        let mut r: Role = Role::default();
        assert!(!r.contended(t0));
        r.mark_contended(t0);
        assert!(r.contended(t0 + CONTENDED_FOR / 2));
        assert!(!r.contended(t0 + CONTENDED_FOR));
    }

    #[test]
    fn a_stale_cache_alone_is_not_a_race() {
        let t0 = crate::runtime::now();
        let mut r: Role = Role::default();
        // One conflict on an unconfirmed cache: stale, confirm next time, not contended.
        r.committed(tried(2, false, true), t0);
        assert!(r.confirm_cache_first(t0) && !r.contended(t0));
        // A conflict after confirming it: another writer.
        r.committed(tried(2, true, true), t0);
        assert!(r.contended(t0));
        let mut r: Role = Role::default();
        r.committed(tried(3, false, true), t0);
        assert!(r.contended(t0));
        r.committed(tried(1, true, true), t0);
        assert!(!r.confirm_cache_first(t0));
        // Confirmed first and found out of date again (requests rotating over processes):
        // keep confirming first, rather than alternate with a failed write.
        let rotating = Attempts {
            tries: 1,
            confirmed: Confirmed::Changed,
            callers: true,
        };
        r.committed(rotating, t0);
        assert!(r.confirm_cache_first(t0) && !rotating.raced());
        // Unless the idle watch just confirmed it: trusted for about a round trip.
        r.watched(t0);
        assert!(!r.confirm_cache_first(t0 + WATCHED_FOR));
        assert!(r.confirm_cache_first(t0 + WATCHED_FOR + Duration::from_millis(1)));
    }

    #[test]
    fn a_committer_sweeps_until_idle_or_spent_and_a_lost_sweep_stops_it() {
        let t0 = crate::runtime::now();
        let mut r: Role = Role::default();
        assert_eq!(r.idle(), Idle::Stop, "not the committer: nothing to sweep");
        r.become_committer();
        for _ in 0..=IDLE_SWEEPS {
            assert_eq!(r.idle(), Idle::Sweep);
            r.swept(false, t0);
        }
        assert_eq!(r.idle(), Idle::Stop, "idle listings in a row end the role");
        assert!(!r.is_committer());

        r.become_committer();
        for _ in 0..MAX_SWEEPS {
            assert_eq!(r.idle(), Idle::Sweep);
            r.swept(true, t0);
        }
        assert_eq!(
            r.idle(),
            Idle::Stop,
            "a busy committer stops after MAX_SWEEPS"
        );

        r.become_committer();
        assert_eq!(r.idle(), Idle::Sweep);
        r.committed(tried(2, false, false), t0);
        assert!(
            !r.is_committer(),
            "a sweep that lost a race leaves it to the winner"
        );
        r.become_committer();
        r.committed(tried(2, false, true), t0);
        assert!(
            r.is_committer(),
            "a batch with callers that retried keeps the role"
        );
    }

    #[test]
    fn a_process_that_commits_back_to_back_looks_now_and_then() {
        let t0 = crate::runtime::now();
        let step = LOOK_GAP / 2;
        let mut r: Role = Role::default();
        let mut t = t0;
        for _ in 0..LOOK_AFTER - 1 {
            t += step;
            r.committed(tried(1, false, true), t);
        }
        assert!(!r.look_due(t), "too few commits in a row");
        t += step;
        r.committed(tried(1, false, true), t);
        assert!(r.look_due(t));
        r.looked(false, t);
        assert!(!r.look_due(t + LOOK_EVERY / 2) && !r.contended(t));
        assert!(r.look_due(t + LOOK_EVERY));
        r.looked(true, t + LOOK_EVERY);
        assert!(r.contended(t + LOOK_EVERY));
        // Confirmed first and found changed (another writer between two of its commits)
        // still counts: a winner alternating a confirmation and a write looks too.
        let mut r: Role = Role::default();
        let changed = Attempts {
            tries: 1,
            confirmed: Confirmed::Changed,
            callers: true,
        };
        for _ in 0..LOOK_AFTER {
            t += step;
            r.committed(changed, t);
        }
        assert!(r.look_due(t));
        // A lone client rotating over processes reaches each only now and then: no run.
        let mut r: Role = Role::default();
        for _ in 0..LOOK_AFTER * 4 {
            t += LOOK_GAP * 3;
            r.committed(changed, t);
        }
        assert!(!r.look_due(t));
    }

    #[test]
    fn a_batch_restarts_the_sweep_count_and_sets_what_sweeps_commit_under() {
        let mut r: Role = Role::default();
        assert!(r.sweep_with().is_none());
        r.become_committer();
        for _ in 0..MAX_SWEEPS {
            r.idle();
        }
        let rules = Rules::from(&crate::settings::TopicSettings::default());
        r.took_batch((rules, ETag::new("e1")));
        assert_eq!(r.idle(), Idle::Sweep);
        assert_eq!(r.sweep_with().map(|(_, e)| e), Some(ETag::new("e1")));
    }
}
