//! Where a message with no partition, key or idempotency key goes, and which partition a
//! consume without `partition` tries first: the process's sticky cursor of the topic
//! (docs/design.md §6, "Sticky partitions").
//!
//! Operations on one partition share a commit only when they arrive while its previous
//! commit is in flight. Spread one by one over 16 partitions, 32 clients leave each commit
//! with one operation and pay a manifest write per message; kept on one partition they
//! share commits as on a one-partition topic. So, like Kafka's sticky partitioner, a
//! cursor stays on its partition while that partition is committing (the next operation
//! joins the batch forming there) and moves on as soon as it is idle (there is nothing to
//! join), or after [`STICK_FOR`] operations, so that over time every partition gets its
//! share. A lone client's operations therefore still visit the partitions one after
//! another, and busy ones stay together.
//!
//! A cursor moves through the partitions in shuffled rounds (each partition once per
//! round, in a fresh random order each round), so that two processes that once met on one
//! partition do not keep moving in step.

use std::collections::HashMap;
use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Operations a cursor sends to one partition before it moves on, busy or not.
pub(super) const STICK_FOR: u32 = 256;

/// Cursors kept at most (one per topic and [`Kind`]); past that they start afresh.
const MAX_CURSORS: usize = 4096;

/// Which cursor of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// Produces with no partition, key or idempotency key.
    Produce,
    /// Consumes with no partition: the partition tried first.
    Consume,
}

/// Whose cursor: the produces of a topic, or the consumes of one of its subscriptions
/// (`None`: the default one), each placed by where its own commits are busy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CursorKey {
    kind: Kind,
    topic: String,
    subscription: Option<String>,
}

impl CursorKey {
    fn new(kind: Kind, (topic, subscription): (&str, Option<&str>)) -> Self {
        Self {
            kind,
            topic: topic.to_owned(),
            subscription: subscription.map(str::to_owned),
        }
    }
}

/// Every topic's cursors in this process.
#[derive(Debug)]
pub(super) struct Sticky {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    cursors: HashMap<CursorKey, Cursor>,
    /// Shuffles the rounds: seeded per process (from its id source, so a seeded test
    /// replays), so that processes draw different rounds.
    rng: StdRng,
}

impl Sticky {
    /// Cursors whose rounds are drawn from `seed`.
    pub(super) fn new(seed: &str) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(seed.as_bytes());
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(&digest);
        Self {
            state: Mutex::new(State {
                cursors: HashMap::new(),
                rng: StdRng::from_seed(bytes),
            }),
        }
    }

    /// The partition (of `n`) for the next `take` operations of `kind` on `topic`, for
    /// one of its subscriptions (`None`: the default one); `busy(p)` tells whether
    /// partition `p` has a commit of them in flight or queued here.
    pub(super) fn pick(
        &self,
        kind: Kind,
        of: (&str, Option<&str>),
        n: u32,
        take: u32,
        busy: impl FnOnce(u32) -> bool,
    ) -> u32 {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State { cursors, rng } = &mut *guard;
        let key = CursorKey::new(kind, of);
        if cursors.len() >= MAX_CURSORS && !cursors.contains_key(&key) {
            cursors.clear();
        }
        let cursor = cursors.entry(key).or_default();
        cursor.step(n, take, busy, rng)
    }

    /// A consume found nothing where the cursor pointed and was served by `partition`:
    /// the next ones start there.
    pub(super) fn served(&self, kind: Kind, of: (&str, Option<&str>), partition: u32) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = state.cursors.get_mut(&CursorKey::new(kind, of)) {
            c.partition = partition;
        }
    }
}

/// One topic's cursor.
#[derive(Debug, Default)]
struct Cursor {
    /// The partition count it was made for (0: not placed yet).
    n: u32,
    partition: u32,
    /// Operations sent to `partition` since the cursor moved there.
    count: u32,
    /// The partitions still to visit in this round, the next last.
    round: Vec<u32>,
}

impl Cursor {
    /// Where the next `take` operations go (see the module documentation).
    fn step(
        &mut self,
        n: u32,
        take: u32,
        busy: impl FnOnce(u32) -> bool,
        rng: &mut impl Rng,
    ) -> u32 {
        if n <= 1 {
            return 0;
        }
        if self.n != n {
            // New, or the topic's partition count changed: start a round afresh.
            *self = Cursor {
                n,
                ..Cursor::default()
            };
            self.move_on(rng);
        } else if self.count >= STICK_FOR || !busy(self.partition) {
            self.move_on(rng);
        }
        self.count = self.count.saturating_add(take);
        self.partition
    }

    /// Moves to the next partition of the round, drawing a new round when it is done
    /// (never starting it with the partition just left).
    fn move_on(&mut self, rng: &mut impl Rng) {
        if self.round.is_empty() {
            self.round = (0..self.n).collect();
            self.round.shuffle(rng);
            let last = self.round.len() - 1;
            if self.round[last] == self.partition && self.count > 0 {
                self.round.swap(0, last);
            }
        }
        self.partition = self.round.pop().unwrap_or(0);
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cursor() -> (Cursor, StdRng) {
        (Cursor::default(), StdRng::seed_from_u64(7))
    }

    #[test]
    fn a_lone_client_visits_every_partition_each_round() {
        // Nothing is ever in flight when its next operation comes.
        let (mut c, mut rng) = cursor();
        for _round in 0..5 {
            let mut seen: Vec<u32> = (0..4).map(|_| c.step(4, 1, |_| false, &mut rng)).collect();
            seen.sort_unstable();
            assert_eq!(seen, vec![0, 1, 2, 3]);
        }
    }

    #[test]
    fn never_the_same_partition_twice_in_a_row_when_idle() {
        let (mut c, mut rng) = cursor();
        let mut last = c.step(3, 1, |_| false, &mut rng);
        for _ in 0..300 {
            let p = c.step(3, 1, |_| false, &mut rng);
            assert_ne!(p, last);
            last = p;
        }
    }

    #[test]
    fn busy_partitions_keep_their_clients_for_stick_for_operations() {
        let (mut c, mut rng) = cursor();
        let first = c.step(16, 1, |_| true, &mut rng);
        for _ in 1..STICK_FOR {
            assert_eq!(c.step(16, 1, |_| true, &mut rng), first);
        }
        assert_ne!(
            c.step(16, 1, |_| true, &mut rng),
            first,
            "moves on at STICK_FOR"
        );
    }

    #[test]
    fn a_batch_counts_its_messages() {
        let (mut c, mut rng) = cursor();
        let first = c.step(8, STICK_FOR, |_| true, &mut rng);
        assert_ne!(c.step(8, 1, |_| true, &mut rng), first);
    }

    #[test]
    fn busy_traffic_spreads_evenly_over_time() {
        let (mut c, mut rng) = cursor();
        let mut per = [0u32; 16];
        for _ in 0..16 * STICK_FOR * 8 {
            per[c.step(16, 1, |_| true, &mut rng) as usize] += 1;
        }
        assert!(per.iter().all(|&k| k == STICK_FOR * 8), "{per:?}");
    }

    #[test]
    fn one_partition_and_a_changed_count() {
        let (mut c, mut rng) = cursor();
        assert_eq!(c.step(1, 1, |_| true, &mut rng), 0);
        assert!(c.step(8, 1, |_| true, &mut rng) < 8);
        for _ in 0..50 {
            assert!(
                c.step(2, 1, |_| true, &mut rng) < 2,
                "a shrunk count is obeyed"
            );
        }
    }

    #[test]
    fn a_served_consume_moves_the_cursor_and_the_map_is_bounded() {
        let s = Sticky::new("process");
        let p = s.pick(Kind::Consume, ("t", None), 8, 1, |_| true);
        let q = (p + 3) % 8;
        s.served(Kind::Consume, ("t", None), q);
        assert_eq!(s.pick(Kind::Consume, ("t", None), 8, 1, |_| true), q);
        // A subscription's consumes have a cursor of their own.
        let sub = s.pick(Kind::Consume, ("t", Some("s")), 8, 1, |_| true);
        s.served(Kind::Consume, ("t", Some("s")), (sub + 1) % 8);
        assert_eq!(s.pick(Kind::Consume, ("t", None), 8, 1, |_| true), q);
        for i in 0..MAX_CURSORS + 10 {
            s.pick(Kind::Produce, (&format!("t{i}"), None), 4, 1, |_| false);
        }
        assert!(s.state.lock().unwrap().cursors.len() <= MAX_CURSORS);
    }
}
