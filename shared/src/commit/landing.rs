//! What one batch's commit lands besides its own produces, across attempts: other
//! processes' combinable segments and intents (when the partition is contended), and the
//! batch's own intents (its settles and lease requests, when it combines).
//!
//! Landing other processes' writes is a favour, not the batch's work: a batch whose own
//! writes another process's commit decided answers at once, and a sweep that lost a race
//! leaves the landing to the process that won it. Either way that attempt lands nothing
//! foreign, so it cannot keep losing races to a busy committer ([`listing`]).

use std::sync::atomic::Ordering;

use crate::runtime::Instant;

use super::listing::{Listed, AHEAD_FOR};
use super::{Committer, Queue};
use crate::partition::intent::{self, Ask, Decides, Intent, Status as IntentStatus};
use crate::partition::{Manifest, SegmentRef};

/// Where a batch's own writes stand at the start of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    /// The batch has produces.
    pub produces: bool,
    /// Its combinable segment landed (in another process's commit).
    pub segment_landed: bool,
    /// It has intents of its own.
    pub intents: bool,
    /// Every one of them is decided.
    pub intents_decided: bool,
    /// It holds nothing but produces (its settles and leases, if any, are intents).
    pub only_produces: bool,
    /// This attempt's number, from 1.
    pub attempt: u32,
}

/// What an attempt lands besides the batch's own produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listing {
    /// Only the batch's own intents: its writes are decided already, or it is a sweep
    /// that lost a race.
    OwnOnly,
    /// What a listing of the partition against this attempt's state finds pending.
    Afresh,
    /// What was listed before, against this same state (or nothing, not combining).
    AsListed,
}

/// What an attempt from `p` lands: a combining batch lists again whenever its listing is
/// no longer current for the attempt's state (`listed_current` false: another commit landed
/// combining writes since, or it is older than [`AHEAD_FOR`]).
pub(super) fn listing(p: Progress, combining: bool, listed_current: bool) -> Listing {
    let has_own = p.produces || p.intents;
    let own_done =
        has_own && (p.segment_landed || !p.produces) && p.intents_decided && p.only_produces;
    let sweep = p.only_produces && !has_own;
    if own_done || (sweep && p.attempt > 1) {
        Listing::OwnOnly
    } else if combining && !listed_current {
        Listing::Afresh
    } else {
        Listing::AsListed
    }
}

/// One batch's landing (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Landing {
    /// Whether to list and land other processes' writes.
    combining: bool,
    /// Other processes' combinable segments, listed against the state `listed_at` tells.
    foreign: Vec<SegmentRef>,
    /// Intents listed with them, and the batch's own.
    intents: Vec<Intent>,
    /// The batch's own intents.
    own: Vec<Intent>,
    listed_at: Option<Against>,
}

/// The state a listing was filtered against, as far as its worth goes: the ids it was
/// listed after, and when. A state that differs only by commits that landed no combining
/// writes (ordinary ones, by a process that does not combine) leaves what it lists
/// pending, so a retry against it lands what was listed instead of listing again: a LIST
/// on every attempt made each attempt's read-to-write window two round trips long, and a
/// process committing every other round trip won every race against it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Against {
    through: String,
    at: Instant,
}

impl Against {
    fn new(state: &Manifest) -> Self {
        Self {
            through: state.combined_through.clone(),
            at: crate::runtime::now(),
        }
    }

    /// Whether a listing against this is as good as one against `state`.
    fn current(&self, state: &Manifest) -> bool {
        self.through == state.combined_through && self.at.elapsed() < AHEAD_FOR
    }
}

impl Landing {
    /// A landing that lists (when `combining`) on its first attempt.
    pub(super) fn new(combining: bool) -> Self {
        Self {
            combining,
            ..Self::default()
        }
    }

    /// A combining landing starting from what a listing against `state` found, with the
    /// batch's `own` intents.
    pub(super) fn listed(listed: Listed, state: &Manifest, own: Vec<Intent>) -> Self {
        Self {
            combining: true,
            foreign: listed.segments,
            intents: listed.intents,
            own,
            listed_at: Some(Against::new(state)),
        }
    }

    /// Whether it lands other processes' writes (the partition is contended).
    pub(super) fn combining(&self) -> bool {
        self.combining
    }

    /// The batch's own intents.
    pub(super) fn own(&self) -> &[Intent] {
        &self.own
    }

    /// Other processes' segments this attempt lands.
    pub(super) fn foreign(&self) -> &[SegmentRef] {
        &self.foreign
    }

    /// The intents this attempt applies.
    pub(super) fn intents(&self) -> &[Intent] {
        &self.intents
    }

    /// Whether this attempt applies lease intents.
    pub(super) fn leases(&self) -> bool {
        self.intents
            .iter()
            .any(|i| matches!(i.ask, Ask::Lease { .. }))
    }

    /// Writes again each of the batch's own intents that `state` shows passed over (it
    /// can never land); returns whether every one is decided in `state`.
    pub(super) async fn check_own_intents(
        &mut self,
        c: &Committer,
        q: &Queue,
        state: &Manifest,
    ) -> bool {
        let mut done = true;
        for own in &mut self.own {
            match intent::status(state, &own.id) {
                IntentStatus::Decided(_) | IntentStatus::Unknown => {}
                IntentStatus::Pending => done = false,
                IntentStatus::Dead => {
                    done = false;
                    let after = state.ids_above();
                    if let Ok(again) = c.write_intent(q, after, own.ask).await {
                        c.stats.rewritten.fetch_add(1, Ordering::Relaxed);
                        *own = again;
                    }
                }
            }
        }
        done
    }

    /// Decides what the attempt from `state` lands ([`listing`]), listing the partition
    /// if it must (`own_segment`: the batch's own, left out).
    pub(super) async fn prepare(
        &mut self,
        c: &Committer,
        q: &Queue,
        state: &Manifest,
        p: Progress,
        own_segment: Option<&str>,
    ) {
        let current = self.listed_at.as_ref().is_some_and(|a| a.current(state));
        match listing(p, self.combining, current) {
            Listing::OwnOnly => {
                self.foreign.clear();
                self.intents.clone_from(&self.own);
            }
            Listing::Afresh => {
                let listed = c.list_combinable(q, state, own_segment).await;
                self.foreign = listed.segments;
                self.intents = listed.intents;
                self.intents.extend(self.own.iter().cloned());
            }
            Listing::AsListed => {
                for i in &self.own {
                    if !self.intents.iter().any(|l| l.id == i.id) {
                        self.intents.push(i.clone());
                    }
                }
                return;
            }
        }
        self.listed_at = Some(Against::new(state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress() -> Progress {
        Progress {
            produces: true,
            segment_landed: false,
            intents: false,
            intents_decided: true,
            only_produces: true,
            attempt: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_stays_current_until_combining_writes_land_or_it_ages() {
        let mut state = Manifest::empty("i");
        state.combined_through = "0000000000001-a".into();
        let against = Against::new(&state);
        // Ordinary commits meanwhile: a new version, the same `combined_through`.
        state.version += 3;
        assert!(against.current(&state));
        tokio::time::advance(AHEAD_FOR - std::time::Duration::from_millis(1)).await;
        assert!(against.current(&state));
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert!(!against.current(&state), "too old");
        let fresh = Against::new(&state);
        // Another process's commit landed combining writes.
        state.combined_through = "0000000000002-b".into();
        assert!(!fresh.current(&state));
    }

    #[test]
    fn a_combining_batch_lists_again_only_when_the_state_moved() {
        assert_eq!(listing(progress(), true, false), Listing::Afresh);
        assert_eq!(listing(progress(), true, true), Listing::AsListed);
        // Not combining: never lists, whatever the state.
        assert_eq!(listing(progress(), false, false), Listing::AsListed);
    }

    #[test]
    fn a_batch_decided_by_another_commit_lands_nothing_foreign() {
        let landed = Progress {
            segment_landed: true,
            ..progress()
        };
        assert_eq!(listing(landed, true, false), Listing::OwnOnly);
        // Its segment landed but one of its intents is still pending: it still lands.
        let pending = Progress {
            intents: true,
            intents_decided: false,
            ..landed
        };
        assert_eq!(listing(pending, true, false), Listing::Afresh);
        // Intents only, all decided.
        let settled = Progress {
            produces: false,
            intents: true,
            ..progress()
        };
        assert_eq!(listing(settled, true, true), Listing::OwnOnly);
    }

    #[test]
    fn a_sweep_lists_once_and_lands_nothing_after_losing_a_race() {
        let sweep = Progress {
            produces: false,
            ..progress()
        };
        assert_eq!(listing(sweep, true, true), Listing::AsListed);
        assert_eq!(listing(sweep, true, false), Listing::Afresh);
        let retry = Progress {
            attempt: 2,
            ..sweep
        };
        assert_eq!(listing(retry, true, false), Listing::OwnOnly);
    }

    #[test]
    fn an_ordinary_batch_of_settles_never_lists() {
        let settles = Progress {
            produces: false,
            only_produces: false,
            ..progress()
        };
        assert_eq!(listing(settles, false, false), Listing::AsListed);
        assert_eq!(
            listing(
                Progress {
                    attempt: 3,
                    ..settles
                },
                false,
                false
            ),
            Listing::AsListed
        );
    }
}
