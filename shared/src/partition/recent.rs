//! Recent write ids: how a writer whose answer was lost learns whether its write landed
//! (docs/design.md §3, "Lost-response recovery").
//!
//! A manifest (and a subscription's ledger) keeps the ids of its last writes, newest
//! last: at least [`KEEP_AT_LEAST`], every one of the last [`KEEP_FOR_MS`] (by the time
//! in the newest id), at most [`KEEP_AT_MOST`]. Every write adds one to the version and
//! one id, and a write that makes the version jump (a repair) starts the list afresh, so
//! the `i`-th newest id (from 0) is the write that made version `version - i`: the list
//! *covers* the versions `version - len + 1 ..= version`. A writer that got no answer
//! knows the version its write would have made, and [`fate`] tells it:
//!
//! * its id is there: it landed ([`WriteFate::Landed`]);
//! * the state is older than that version: nothing was written over the state it was
//!   based on, and the write may still arrive ([`WriteFate::NotYet`]);
//! * the version is covered and the id is not there: another write made that version,
//!   and this one can never land, since its condition was the ETag that write replaced
//!   ([`WriteFate::Superseded`]);
//! * the version is older than the list covers: the writer fell out of the window and
//!   cannot tell ([`WriteFate::Unknown`]). It must answer that the outcome is unknown
//!   (503), never apply its change again.

use std::collections::VecDeque;

use crate::cas::{WriteFate, WriteMark};
use crate::formats::{stamp_write, write_time};

/// Write ids kept whatever their age.
pub(crate) const KEEP_AT_LEAST: usize = 16;

/// Write ids kept at most.
pub(crate) const KEEP_AT_MOST: usize = 128;

/// Write ids younger than this (than the newest one) are kept, up to [`KEEP_AT_MOST`].
pub(crate) const KEEP_FOR_MS: u64 = 10_000;

/// Records the write `write_id` that makes `version` in `recent`, forgets what the
/// window no longer keeps, and returns how the write is found again.
pub(crate) fn record(recent: &mut VecDeque<String>, write_id: &str, version: u64) -> WriteMark {
    let stamped = stamp_write(write_id);
    let newest = write_time(&stamped);
    recent.push_back(stamped.clone());
    while recent.len() > KEEP_AT_LEAST {
        let aged = match (newest, recent.front().and_then(|w| write_time(w))) {
            (Some(newest), Some(t)) => newest.saturating_sub(t) > KEEP_FOR_MS,
            // Ids without a time (tests' ids): kept up to the limit.
            _ => false,
        };
        if !aged && recent.len() <= KEEP_AT_MOST {
            break;
        }
        recent.pop_front();
    }
    WriteMark { stamped, version }
}

/// What a state at `version` whose recent write ids are `recent` tells of the write
/// `mark`.
pub(crate) fn fate(recent: &VecDeque<String>, version: u64, mark: &WriteMark) -> WriteFate {
    if recent.iter().any(|w| *w == mark.stamped) {
        return WriteFate::Landed;
    }
    if version < mark.version {
        return WriteFate::NotYet;
    }
    let covered_from = (version + 1).saturating_sub(recent.len() as u64);
    if recent.is_empty() || mark.version < covered_from {
        WriteFate::Unknown
    } else {
        WriteFate::Superseded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state after `writes` writes with ids `w1`, `w2`, …
    fn after(writes: u64) -> (VecDeque<String>, Vec<WriteMark>) {
        let mut recent = VecDeque::new();
        let marks = (1..=writes)
            .map(|v| record(&mut recent, &format!("w{v}"), v))
            .collect();
        (recent, marks)
    }

    #[test]
    fn a_write_in_the_window_is_found_or_known_superseded() {
        let (recent, marks) = after(40);
        assert_eq!(
            recent.len(),
            40,
            "ids without a time are kept up to the limit"
        );
        for m in &marks {
            assert_eq!(fate(&recent, 40, m), WriteFate::Landed, "{}", m.stamped);
        }
        // Another writer's write made version 30: the one based on 29 lost.
        let rival = WriteMark {
            stamped: stamp_write("mine"),
            version: 30,
        };
        assert_eq!(fate(&recent, 40, &rival), WriteFate::Superseded);
        // Nothing was written over version 40 yet.
        let ahead = WriteMark {
            stamped: stamp_write("mine"),
            version: 41,
        };
        assert_eq!(fate(&recent, 40, &ahead), WriteFate::NotYet);
    }

    #[test]
    fn a_writer_that_fell_out_of_the_window_cannot_tell() {
        let (recent, marks) = after(KEEP_AT_MOST as u64 + 20);
        assert_eq!(recent.len(), KEEP_AT_MOST);
        let top = KEEP_AT_MOST as u64 + 20;
        // Versions 1..=20 left the list: landed or not, their writers cannot tell.
        for m in &marks[..20] {
            assert_eq!(fate(&recent, top, m), WriteFate::Unknown, "{}", m.stamped);
        }
        let lost = WriteMark {
            stamped: stamp_write("mine"),
            version: 20,
        };
        assert_eq!(fate(&recent, top, &lost), WriteFate::Unknown);
        let lost = WriteMark {
            stamped: stamp_write("mine"),
            version: 21,
        };
        assert_eq!(fate(&recent, top, &lost), WriteFate::Superseded);
        assert_eq!(fate(&recent, top, &marks[20]), WriteFate::Landed);
    }

    #[test]
    fn a_state_that_jumped_or_kept_nothing_covers_only_its_own_ids() {
        // A repair: the version jumps, the list starts afresh with the repair's id.
        let mut recent = VecDeque::new();
        record(&mut recent, "repair", 1 << 20);
        let before = WriteMark {
            stamped: stamp_write("mine"),
            version: 100,
        };
        assert_eq!(fate(&recent, 1 << 20, &before), WriteFate::Unknown);
        // A deleted topic's leftover read as empty keeps its version and no ids.
        assert_eq!(fate(&VecDeque::new(), 7, &before), WriteFate::NotYet);
        let at = WriteMark {
            stamped: stamp_write("mine"),
            version: 7,
        };
        assert_eq!(fate(&VecDeque::new(), 7, &at), WriteFate::Unknown);
        // Hostile: more ids than versions.
        let (recent, _) = after(30);
        assert_eq!(fate(&recent, 3, &at), WriteFate::NotYet);
        assert_eq!(fate(&recent, 9, &at), WriteFate::Superseded);
    }

    #[test]
    fn ids_are_kept_for_ten_seconds_of_writes_between_the_bounds() {
        let id = |ms: u64| format!("{:012x}7000800000000000000a", ms);
        assert_eq!(write_time(&id(5)), Some(5));
        let mut recent = VecDeque::new();
        // One write a second: only the last 16 stay.
        for s in 0..40u64 {
            record(&mut recent, &id(s * 1000), s + 1);
        }
        assert_eq!(recent.len(), KEEP_AT_LEAST);
        // A hundred writes a second: the last ten seconds, up to the limit.
        let mut recent = VecDeque::new();
        for i in 0..2000u64 {
            record(&mut recent, &id(1_000_000 + i * 10), i + 1);
        }
        assert_eq!(recent.len(), KEEP_AT_MOST);
        // Five a second: the ten seconds before the newest, both ends included.
        let mut recent = VecDeque::new();
        for i in 0..500u64 {
            record(&mut recent, &id(1_000_000 + i * 200), i + 1);
        }
        assert_eq!(recent.len(), 51);
    }
}
