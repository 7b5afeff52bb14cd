//! Seeded fault injection: thousands of operations through several brokers sharing one
//! store that fails before and after applying requests, answers spurious conflicts and adds
//! latency. The invariants are checked after every step and after a final drain: no
//! acknowledged produce lost, no offset with two payloads, no produce appended twice, no
//! two live leases on one message, a stale handle gets 410 and changes nothing,
//! flow-control bounds hold.
//!
//! Every random choice comes from the seed and the runtime is single-threaded with a
//! paused clock, so a failing seed replays identically:
//! `NARAD_FAULT_SEED=17 cargo test -p narad-tests --test faults`.
//!
//! Three profiles:
//! * **short**: two brokers, one operation at a time, idempotent produces;
//! * **long**: longer histories on one partition, so the commit path folds segments into
//!   index objects and spills idempotency keys into chunks under faults, mixed with replays
//!   of old offsets (read through the indexes) and garbage-collection passes with no grace
//!   period (compaction racing the brokers' commits; a named object taken for an orphan
//!   would lose messages and fail the drain);
//! * **interleaved**: four brokers on one partition, each step running up to four
//!   operations at once (produces with and without idempotency keys, consumes, settles),
//!   so produces are combined across brokers (docs/design.md §6) under faults. Now and then
//!   one broker stops mid-operation forever (its requests hang before or after they apply,
//!   [`FreezeStore`]): its operations' outcomes are unknown, and every operation on the
//!   other brokers must still finish.
//!
//! Every profile consumes through the topic's default subscription and two named ones
//! (`s1`, `s2`), each with its own model of leases and acks: no two live leases on one
//! message per subscription, an ack answered 204 is final in its own subscription, and an
//! ack never settles a message in another (the drain of each subscription delivers every
//! message it did not ack itself).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, Delivery, NewMessage, Settle};
use narad_shared::clock::{Clock, ManualClock, SequentialIds};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::maintenance;
use narad_shared::settings::SettingsInput;
use narad_shared::store::memory::MemoryStore;
use narad_shared::store::testing::fault::{FaultPlan, FaultStore};
use narad_shared::store::testing::freeze::FreezeStore;
use narad_shared::store::DynStore;
use narad_shared::stored::ReceiptError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEEDS: u64 = 24;
const VT: u64 = 1000;
const MAX_IN_FLIGHT: u64 = 6;
const MAX_ACKED_AHEAD: u64 = 3;

/// The subscriptions consumed: `None` is the default one.
const GROUPS: [Option<&str>; 3] = [None, Some("s1"), Some("s2")];

/// An operation on a frozen broker hangs; every other one must finish well within this
/// (tokio's clock is paused, so waiting costs nothing).
const HANG: Duration = Duration::from_secs(600);

/// The shape of one seeded run.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Profile {
    steps: usize,
    partitions: u32,
    /// Replays of old offsets and gc passes mixed in.
    history: bool,
    brokers: usize,
    /// Most operations one step runs at once.
    group: usize,
    /// Share of produces without an idempotency key (combinable).
    unkeyed: f64,
    /// Whether brokers may stop mid-operation forever.
    freeze: bool,
}

const SHORT: Profile = Profile {
    steps: 250,
    partitions: 2,
    history: false,
    brokers: 2,
    group: 1,
    unkeyed: 0.0,
    freeze: false,
};

const LONG: Profile = Profile {
    steps: 900,
    partitions: 1,
    history: true,
    brokers: 2,
    group: 1,
    unkeyed: 0.0,
    freeze: false,
};

const INTERLEAVED: Profile = Profile {
    steps: 300,
    partitions: 1,
    history: false,
    brokers: 4,
    group: 4,
    unkeyed: 0.6,
    freeze: true,
};

struct Held {
    handle: String,
    /// Which of [`GROUPS`] leased it.
    group: usize,
    at: (u32, u64),
    deadline: u64,
    /// An ack/nack/extend on it failed ambiguously: it may have been applied.
    maybe_gone: bool,
}

#[derive(Default)]
struct Model {
    /// payload -> where its (only) successful produce put it.
    produced: HashMap<String, (u32, u64)>,
    /// Payloads whose produce failed or whose broker froze: appended at most once.
    maybe: HashSet<String>,
    /// What each delivered offset held.
    payload_at: HashMap<(u32, u64), String>,
    held: Vec<Held>,
    /// Handles whose lease we know is over (acked, nacked, or lapsed and redelivered).
    dead: Vec<String>,
    /// Payloads in the order their produce succeeded.
    order: Vec<String>,
    /// Offsets whose ack was answered 204, per group: never delivered again there.
    acked: HashSet<(usize, u32, u64)>,
    /// Offsets whose ack failed ambiguously, per group: perhaps settled there.
    maybe_acked: HashSet<(usize, u32, u64)>,
}

/// One operation of a step, with every random choice drawn before it runs.
enum Op {
    /// With an idempotency key: through each `(broker, stop after a success)` in turn
    /// until a success says stop; without: once, through the first.
    Produce {
        payload: String,
        keyed: bool,
        tries: Vec<(usize, bool)>,
    },
    Consume {
        broker: usize,
        group: usize,
        max: usize,
    },
    Settle {
        broker: usize,
        handle: String,
        action: Settle,
        /// Where the handle's message is, and for which group.
        at: (u32, u64),
        group: usize,
    },
}

impl Op {
    fn brokers(&self) -> Vec<usize> {
        match self {
            Op::Produce { tries, .. } => tries.iter().map(|t| t.0).collect(),
            Op::Consume { broker, .. } | Op::Settle { broker, .. } => vec![*broker],
        }
    }

    /// Order in which outcomes are applied to the model: produces (a consume in the same
    /// step may deliver them), settles (a consume may take over a nacked message), consumes.
    fn rank(&self) -> u8 {
        match self {
            Op::Produce { .. } => 0,
            Op::Settle { .. } => 1,
            Op::Consume { .. } => 2,
        }
    }
}

/// What an operation returned.
enum Outcome {
    /// Where a produce landed (`None`: it never succeeded), or why the answers disagree.
    Produced(Result<Option<(u32, u64)>, String>),
    Consumed(Vec<Delivery>),
    /// What a settle got, and whether the stored manifest showed it settled as it was
    /// answered (an ack answered 204).
    Settled(Result<(), BrokerError>, bool),
}

/// Whether the ledger of `group` in `raw` (the store beneath faults and freezes: the
/// manifest, or a subscription's own object) has `at` settled.
async fn settled_in(raw: &DynStore, group: usize, (p, o): (u32, u64)) -> bool {
    let key = match GROUPS[group] {
        None => format!("topics/f/{p}.manifest.json"),
        // The one creation of the subscription: its ledgers are under its id.
        Some(s) => {
            let suffix = format!("/{p}.json");
            let keys = raw.list(&format!("topics/f/subs/{s}/")).await.unwrap();
            match keys.into_iter().find(|k| k.ends_with(&suffix)) {
                Some(k) => k,
                None => return false,
            }
        }
    };
    let Some(stored) = raw.get(&key).await.unwrap() else {
        return false;
    };
    let m: serde_json::Value =
        serde_json::from_slice(narad_shared::stored::open_json(&stored.data).unwrap()).unwrap();
    let ahead = m["acked_ahead"].as_array().unwrap();
    o < m["frontier"].as_u64().unwrap() || ahead.iter().any(|a| a.as_u64() == Some(o))
}

async fn run_op(brokers: &[Broker], raw: &DynStore, op: &Op) -> Outcome {
    match op {
        Op::Produce {
            payload,
            keyed,
            tries,
        } => {
            let mut got = None;
            for &(i, stop) in tries {
                let msg = NewMessage {
                    partition: None,
                    key: None,
                    payload: Bytes::from(payload.clone()),
                    idempotency_key: keyed.then(|| format!("key-{payload}")),
                    headers: Default::default(),
                    delay_ms: 0,
                };
                if let Ok(p) = brokers[i].produce("f", msg).await {
                    match got {
                        None => got = Some((p.partition, p.offset)),
                        Some(prev) if prev != (p.partition, p.offset) => {
                            return Outcome::Produced(Err(format!(
                                "a retried produce moved from {prev:?} to {p:?}"
                            )))
                        }
                        Some(_) => {}
                    }
                }
                // Sometimes retry even after a success, as a client whose response was lost would.
                if !keyed || (got.is_some() && stop) {
                    break;
                }
            }
            Outcome::Produced(Ok(got))
        }
        Op::Consume { broker, group, max } => Outcome::Consumed(
            brokers[*broker]
                .consume_from("f", GROUPS[*group], None, Duration::ZERO, *max)
                .await
                .unwrap_or_default(),
        ),
        Op::Settle {
            broker,
            handle,
            action,
            at,
            group,
        } => {
            let r = brokers[*broker].settle("f", handle, *action).await;
            // Checked the moment the ack is answered: nobody is answered before their
            // operation is committed.
            let committed =
                r.is_err() || *action != Settle::Ack || settled_in(raw, *group, *at).await;
            Outcome::Settled(r, committed)
        }
    }
}

fn fail(seed: u64, step: usize, what: String) -> ! {
    panic!("seed {seed}, step {step}: {what} (replay with NARAD_FAULT_SEED={seed})")
}

/// One seeded run: its store, brokers and model.
struct Run {
    seed: u64,
    profile: Profile,
    /// The store beneath the faults and the freezes, for checks.
    raw: DynStore,
    faulty: Arc<FaultStore>,
    clock: ManualClock,
    brokers: Vec<Broker>,
    freezers: Vec<Arc<FreezeStore>>,
    /// Never frozen and takes no part in the workload: it checks, and drains at the end.
    observer: Broker,
    rng: StdRng,
    m: Model,
    next_msg: usize,
    step: usize,
}

impl Run {
    async fn new(seed: u64, profile: Profile) -> Self {
        let raw: DynStore = Arc::new(MemoryStore::new());
        let faulty = FaultStore::new(raw.clone(), FaultPlan::default(), seed);
        let clock = ManualClock::new(1_000_000);
        let ids = Arc::new(SequentialIds::default());
        let opts = BrokerOptions {
            poll_interval: Duration::from_millis(10),
            ..BrokerOptions::default()
        };
        let key = vec![b"fault-test-receipt-key-0123456789".to_vec()];
        let broker = |store: DynStore| {
            let (clock, ids, key, opts) = (clock.clone(), ids.clone(), key.clone(), opts.clone());
            async move {
                Broker::new(store, Arc::new(clock) as Arc<dyn Clock>, ids, key, opts)
                    .await
                    .unwrap()
            }
        };
        // The observer starts first, with faults off: the first process on a new store
        // puts it at the newest fleet level (subscriptions need level 5). The workload's
        // brokers then start under faults, as before.
        faulty.set_enabled(false);
        let observer = broker(faulty.clone()).await;
        faulty.set_enabled(true);
        let mut brokers = Vec::new();
        let mut freezers = Vec::new();
        for _ in 0..profile.brokers {
            let f = FreezeStore::new(faulty.clone());
            brokers.push(broker(f.clone()).await);
            freezers.push(f);
        }
        faulty.set_enabled(false);
        let settings = SettingsInput::parse(
            format!(
                r#"{{"partitions":{},"visibility_timeout_ms":{VT},"max_in_flight_per_partition":{MAX_IN_FLIGHT},"max_acked_ahead_per_partition":{MAX_ACKED_AHEAD}}}"#,
                profile.partitions
            )
            .as_bytes(),
        )
        .unwrap();
        observer.create_topic("f", &settings).await.unwrap();
        for s in GROUPS.iter().flatten() {
            let input = narad_shared::subscription::SubscriptionInput::default();
            observer.create_subscription("f", s, &input).await.unwrap();
        }
        faulty.set_enabled(true);
        Self {
            seed,
            profile,
            raw,
            faulty,
            clock,
            brokers,
            freezers,
            observer,
            rng: StdRng::seed_from_u64(seed ^ 0x5eed),
            m: Model::default(),
            next_msg: 0,
            step: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        fail(self.seed, self.step, what)
    }

    /// The brokers still running.
    fn live(&self) -> Vec<usize> {
        (0..self.brokers.len())
            .filter(|&i| !self.freezers[i].is_frozen())
            .collect()
    }

    fn pick(&mut self) -> usize {
        let live = self.live();
        live[self.rng.gen_range(0..live.len())]
    }

    /// Draws one operation for `roll` in [0, 0.85); `None` when a settle has nothing to
    /// settle. `taken`: handles already settled in this step.
    fn draw_op(&mut self, roll: f64, taken: &mut HashSet<String>) -> Option<Op> {
        if roll < 0.35 {
            let payload = format!("m{}", self.next_msg);
            self.next_msg += 1;
            let keyed = !self.rng.gen_bool(self.profile.unkeyed);
            let tries = (0..60)
                .map(|_| (self.pick(), self.rng.gen_bool(0.7)))
                .collect();
            return Some(Op::Produce {
                payload,
                keyed,
                tries,
            });
        }
        let broker = self.pick();
        if roll < 0.62 {
            let max = self.rng.gen_range(1..=3);
            let group = self.rng.gen_range(0..GROUPS.len());
            return Some(Op::Consume { broker, group, max });
        }
        let free: Vec<&Held> = self
            .m
            .held
            .iter()
            .filter(|h| !taken.contains(&h.handle))
            .collect();
        if free.is_empty() {
            return None;
        }
        let held = free[self.rng.gen_range(0..free.len())];
        let (handle, at, group) = (held.handle.clone(), held.at, held.group);
        taken.insert(handle.clone());
        let action = match self.rng.gen_range(0..10) {
            0 => Settle::Nack,
            1 => Settle::Extend,
            _ => Settle::Ack,
        };
        Some(Op::Settle {
            broker,
            handle,
            action,
            at,
            group,
        })
    }

    /// One step: a group of operations run at once (and perhaps a broker frozen
    /// meanwhile), a clock advance, or a stale-handle check.
    async fn step(&mut self) {
        let now = self.clock.now_ms();
        let roll: f64 = self.rng.gen();
        if roll < 0.85 {
            let n = self.rng.gen_range(1..=self.profile.group);
            let mut taken = HashSet::new();
            let mut ops = Vec::new();
            for k in 0..n {
                let r = if k == 0 {
                    roll
                } else {
                    self.rng.gen::<f64>() * 0.85
                };
                ops.extend(self.draw_op(r, &mut taken));
            }
            let freeze = (self.profile.freeze && self.live().len() > 2 && self.rng.gen_bool(0.04))
                .then(|| {
                    // Mostly a broker with an operation in this step.
                    let busy: Vec<usize> = ops.iter().map(|op| op.brokers()[0]).collect();
                    let victim = if busy.is_empty() || self.rng.gen_bool(0.2) {
                        self.pick()
                    } else {
                        busy[self.rng.gen_range(0..busy.len())]
                    };
                    (
                        victim,
                        self.rng.gen_range(0..20_000),
                        self.rng.gen_bool(0.5),
                    )
                });
            let outcomes = self.run_group(&ops, freeze).await;
            let mut done: Vec<(Op, Option<Outcome>)> = ops.into_iter().zip(outcomes).collect();
            done.sort_by_key(|(op, _)| op.rank());
            let mut answered = Vec::new();
            for (op, outcome) in done {
                answered.extend(self.apply(now, op, outcome));
            }
            self.check_answered(&answered).await;
        } else if roll < 0.95 {
            let by = self.rng.gen_range(0..=VT + VT / 2);
            self.clock.advance(by);
        } else if !self.m.dead.is_empty() {
            self.stale_handle_changes_nothing().await;
        }
        self.check_bounds().await;
    }

    /// Runs `ops` at once; with `freeze = (broker, after µs, after applying)`, that broker
    /// stops for good meanwhile. An operation that hangs (its broker froze) yields `None`.
    async fn run_group(
        &self,
        ops: &[Op],
        freeze: Option<(usize, u64, bool)>,
    ) -> Vec<Option<Outcome>> {
        let brokers = &self.brokers;
        let runs = futures::future::join_all(ops.iter().map(|op| async move {
            tokio::time::timeout(HANG, run_op(brokers, &self.raw, op))
                .await
                .ok()
        }));
        let freezer = async {
            if let Some((b, after_us, after_applying)) = freeze {
                tokio::time::sleep(Duration::from_micros(after_us)).await;
                self.freezers[b].freeze(after_applying);
            }
        };
        tokio::join!(runs, freezer).0
    }

    /// Applies one operation's outcome to the model, checking it; returns the produce it
    /// acknowledged, if any.
    fn apply(&mut self, now: u64, op: Op, outcome: Option<Outcome>) -> Option<String> {
        let Some(outcome) = outcome else {
            if op.brokers().iter().all(|&b| !self.freezers[b].is_frozen()) {
                self.fail(format!(
                    "an operation on running brokers did not finish within {HANG:?}"
                ));
            }
            // Its broker froze mid-operation: the outcome is unknown.
            match op {
                Op::Produce { payload, .. } => {
                    self.m.maybe.insert(payload);
                }
                Op::Settle {
                    handle,
                    action,
                    at,
                    group,
                    ..
                } => {
                    for h in self.m.held.iter_mut().filter(|h| h.handle == handle) {
                        h.maybe_gone = true;
                    }
                    if action == Settle::Ack {
                        self.m.maybe_acked.insert((group, at.0, at.1));
                    }
                }
                // What it leased lapses unseen.
                Op::Consume { .. } => {}
            }
            return None;
        };
        match (op, outcome) {
            (Op::Produce { payload, keyed, .. }, Outcome::Produced(at)) => match at {
                Err(e) => self.fail(e),
                Ok(Some(at)) => {
                    self.m.produced.insert(payload.clone(), at);
                    self.m.order.push(payload.clone());
                    return Some(payload);
                }
                Ok(None) if keyed => self.fail(format!("produce of {payload} never succeeded")),
                Ok(None) => {
                    self.m.maybe.insert(payload);
                }
            },
            (Op::Consume { group, .. }, Outcome::Consumed(ds)) => {
                for d in ds {
                    self.delivered(now, group, d);
                }
            }
            (Op::Settle { handle, action, .. }, Outcome::Settled(r, committed)) => {
                if !committed {
                    self.fail(format!(
                        "an ack of {handle} was answered before it was committed"
                    ));
                }
                self.settled(now, &handle, action, r)
            }
            _ => unreachable!("outcomes match their operations"),
        }
        None
    }

    fn delivered(&mut self, now: u64, group: usize, d: Delivery) {
        let at = (d.partition, d.offset);
        let payload = String::from_utf8(d.payload.to_vec()).unwrap();
        if let Some(prev) = self.m.payload_at.insert(at, payload.clone()) {
            if prev != payload {
                self.fail(format!("offset {at:?} held {prev} and then {payload}"));
            }
        }
        if let Some(p) = self.m.produced.get(&payload) {
            if *p != at {
                self.fail(format!(
                    "{payload} produced at {p:?} was delivered from {at:?}"
                ));
            }
        }
        if self.m.acked.contains(&(group, at.0, at.1)) {
            self.fail(format!(
                "{at:?} was delivered again in group {group} after an ack answered 204"
            ));
        }
        let m = &mut self.m;
        let mine = |h: &Held| h.at == at && h.group == group;
        if let Some(other) = m
            .held
            .iter()
            .find(|h| mine(h) && h.deadline > now && !h.maybe_gone)
        {
            let what = format!(
                "two live leases on {at:?} in group {group} (first {})",
                other.handle
            );
            self.fail(what);
        }
        // Older leases on this offset in this group are dead now.
        for h in m.held.iter().filter(|h| mine(h)) {
            m.dead.push(h.handle.clone());
        }
        m.held.retain(|h| !mine(h));
        m.held.push(Held {
            handle: d.receipt_handle.unwrap(),
            group,
            at,
            deadline: now + VT,
            maybe_gone: false,
        });
    }

    fn settled(&mut self, now: u64, handle: &str, action: Settle, r: Result<(), BrokerError>) {
        let Some(i) = self.m.held.iter().position(|h| h.handle == handle) else {
            self.fail(format!("settled {handle}, which the model does not hold"));
        };
        let held = &self.m.held[i];
        let live = held.deadline > now && !held.maybe_gone;
        match r {
            Ok(()) => {
                if !live && !held.maybe_gone {
                    self.fail("a lapsed lease was settled".into());
                }
                if action == Settle::Ack {
                    let (g, at) = (self.m.held[i].group, self.m.held[i].at);
                    self.m.acked.insert((g, at.0, at.1));
                }
                if action == Settle::Extend {
                    self.m.held[i].deadline = now + VT;
                } else {
                    let h = self.m.held.remove(i);
                    self.m.dead.push(h.handle);
                }
            }
            Err(BrokerError::LeaseGone) | Err(BrokerError::Receipt(ReceiptError::Invalid)) => {
                if live {
                    self.fail("a live lease got 410".into());
                }
                let h = self.m.held.remove(i);
                self.m.dead.push(h.handle);
            }
            Err(BrokerError::AckedAheadFull) => {}
            Err(_) => {
                let (g, at) = (self.m.held[i].group, self.m.held[i].at);
                if action == Settle::Ack {
                    self.m.maybe_acked.insert((g, at.0, at.1));
                }
                self.m.held[i].maybe_gone = true
            }
        }
    }

    /// Every produce acknowledged in this step is at its offset now (faults off).
    async fn check_answered(&self, answered: &[String]) {
        self.faulty.set_enabled(false);
        for payload in answered {
            let (p, o) = self.m.produced[payload];
            match self.observer.replay("f", p, o, Duration::ZERO).await {
                Ok(Some(d)) if d.payload == payload.as_bytes() => {}
                other => self.fail(format!(
                    "acknowledged produce {payload} is not at {p}/{o}: {:?}",
                    other.map(|d| d.map(|d| d.payload))
                )),
            }
        }
        self.faulty.set_enabled(true);
    }

    /// A stale handle gets 410 and changes nothing.
    async fn stale_handle_changes_nothing(&mut self) {
        let h = self.m.dead[self.rng.gen_range(0..self.m.dead.len())].clone();
        let b = self.pick();
        // Let background commits (another broker sweeping a pending segment) finish first.
        tokio::time::sleep(Duration::from_secs(30)).await;
        self.faulty.set_enabled(false);
        let versions = |s: Vec<narad_shared::broker::PartitionStats>| {
            s.iter().map(|p| p.version).collect::<Vec<_>>()
        };
        let t = self.observer.topic("f").await.unwrap();
        let before = versions(self.observer.partition_stats(&t).await.unwrap());
        let r = self.brokers[b].settle("f", &h, Settle::Ack).await;
        let after = versions(self.observer.partition_stats(&t).await.unwrap());
        self.faulty.set_enabled(true);
        if !matches!(
            r,
            Err(BrokerError::LeaseGone) | Err(BrokerError::Receipt(ReceiptError::Invalid))
        ) {
            self.fail(format!("a stale handle got {r:?}"));
        }
        if before != after {
            self.fail("a stale handle changed the manifest".into());
        }
    }

    /// Flow-control bounds hold (faults off).
    async fn check_bounds(&self) {
        self.faulty.set_enabled(false);
        let t = self.observer.topic("f").await.unwrap();
        for p in self.observer.partition_stats(&t).await.unwrap() {
            if p.in_flight > MAX_IN_FLIGHT || p.acked_ahead > MAX_ACKED_AHEAD {
                self.fail(format!("bounds broken: {p:?}"));
            }
        }
        for s in GROUPS.iter().flatten() {
            for p in self.observer.subscription_stats(&t, s).await.unwrap() {
                if p.in_flight > MAX_IN_FLIGHT || p.acked_ahead > MAX_ACKED_AHEAD {
                    self.fail(format!("bounds broken in {s}: {p:?}"));
                }
            }
        }
        self.faulty.set_enabled(true);
    }

    /// Drains the topic with faults off (every lease lapses first, then consume and ack
    /// one at a time) and checks the partitions against the model.
    async fn drain_and_check(&self) {
        let seed = self.seed;
        self.faulty.set_enabled(false);
        self.clock.advance(10 * VT);
        let b = &self.observer;
        // Per group, the offsets its drain delivered.
        let mut delivered: Vec<HashSet<(u32, u64)>> = vec![HashSet::new(); GROUPS.len()];
        for (g, sub) in GROUPS.iter().enumerate() {
            let mut drained = 0;
            loop {
                let ds = b
                    .consume_from("f", *sub, None, Duration::ZERO, 1)
                    .await
                    .unwrap();
                let Some(d) = ds.into_iter().next() else {
                    break;
                };
                assert!(
                    !self.m.acked.contains(&(g, d.partition, d.offset)),
                    "seed {seed}: {}/{} delivered again in group {g} after an ack answered 204",
                    d.partition,
                    d.offset
                );
                delivered[g].insert((d.partition, d.offset));
                b.settle("f", d.receipt_handle.as_deref().unwrap(), Settle::Ack)
                    .await
                    .unwrap();
                drained += 1;
                assert!(
                    drained < 10 * self.profile.steps,
                    "seed {seed}: drain does not end"
                );
            }
        }
        let t = b.topic("f").await.unwrap();
        let stats = b.partition_stats(&t).await.unwrap();
        // Each group settled every message, each one only by its own acks: the drain of a
        // group delivered every offset that group had not acked (an ack in one group
        // never settles another's).
        for (g, sub) in GROUPS.iter().enumerate() {
            if let Some(s) = sub {
                for p in b.subscription_stats(&t, s).await.unwrap() {
                    assert_eq!(
                        p.frontier, p.next_offset,
                        "seed {seed}: {s} partition {} not fully settled after the drain",
                        p.partition
                    );
                }
            }
            for p in &stats {
                for o in 0..p.next_offset {
                    let k = (g, p.partition, o);
                    let acked = delivered[g].contains(&(p.partition, o))
                        || self.m.acked.contains(&k)
                        || self.m.maybe_acked.contains(&k);
                    // Or it never held a message: its segment, written beside its
                    // manifest write, was made void (its produces were refused), and the
                    // delivery that met it settled it.
                    let void = || async {
                        matches!(
                            b.replay("f", p.partition, o, Duration::ZERO).await,
                            Err(BrokerError::MessageNotFound)
                        )
                    };
                    assert!(
                        acked || void().await,
                        "seed {seed}: {}/{o} settled in group {g} without an ack there",
                        p.partition
                    );
                }
            }
        }
        if self.profile.history {
            assert!(
                stats.iter().any(|p| p.indexes > 0),
                "seed {seed}: the long profile must fold segments into indexes: {stats:?}"
            );
        }
        // Every acknowledged produce is at its offset, every offset holds one distinct
        // payload, and a payload whose produce failed is there at most once.
        let mut seen = HashSet::new();
        for p in &stats {
            assert_eq!(
                p.frontier, p.next_offset,
                "seed {seed}: partition {} not fully settled after the drain",
                p.partition
            );
            for o in 0..p.next_offset {
                let d = match b.replay("f", p.partition, o, Duration::ZERO).await {
                    // A void segment's offset (no acknowledged produce is there: below).
                    Err(BrokerError::MessageNotFound) => continue,
                    other => other.unwrap(),
                };
                let d = d.unwrap_or_else(|| {
                    panic!("seed {seed}: offset {}/{o} holds nothing", p.partition)
                });
                let payload = String::from_utf8(d.payload.to_vec()).unwrap();
                assert!(
                    seen.insert(payload.clone()),
                    "seed {seed}: {payload} appended twice"
                );
                match self.m.produced.get(&payload) {
                    Some(at) => assert_eq!(
                        *at,
                        (p.partition, o),
                        "seed {seed}: {payload} is not where its produce said"
                    ),
                    None => assert!(
                        self.m.maybe.contains(&payload),
                        "seed {seed}: {payload} at {}/{o} was never produced",
                        p.partition
                    ),
                }
            }
        }
        for (payload, at) in &self.m.produced {
            assert!(
                seen.contains(payload),
                "seed {seed}: acknowledged produce {payload} at {at:?} lost"
            );
        }
    }

    /// Faults injected so far.
    fn injected(&self) -> u64 {
        let c = &self.faulty.counts;
        [&c.before, &c.after, &c.conflicts]
            .iter()
            .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// A metric summed over the workload's brokers.
    fn metric(&self, name: &str) -> f64 {
        self.brokers
            .iter()
            .map(|b| narad_tests::metric(&b.metrics_text(), name).unwrap_or(0.0))
            .sum()
    }
}

/// What one seed's run did.
#[derive(Debug, PartialEq, Eq)]
struct Ran {
    faults: u64,
    /// Acknowledged produces.
    produced: usize,
    /// Produce batches other brokers committed, and sweeps.
    combined: u64,
    /// Intents other brokers applied: the default subscription's, and named ones'.
    intents: u64,
    ledger_intents: u64,
}

/// Runs one seed.
async fn run_seed(seed: u64, profile: Profile) -> Ran {
    let mut run = Run::new(seed, profile).await;
    for step in 0..profile.steps {
        run.step = step;
        if profile.history {
            let b = run.pick();
            if history_step(seed, step, &mut run.rng, &run.brokers[b], &run.m).await {
                continue;
            }
        }
        run.step().await;
    }
    // Frozen brokers' calls hang forever; metrics are read before the drain.
    let combined =
        run.metric("narad_combined_by_others_total") + run.metric("narad_combining_sweeps_total");
    let intents = run.metric("narad_intents_decided_by_others_total");
    let ledger_intents = run.metric("narad_ledger_intents_decided_by_others_total");
    run.drain_and_check().await;
    Ran {
        faults: run.injected(),
        produced: run.m.produced.len(),
        combined: combined as u64,
        intents: intents as u64,
        ledger_intents: ledger_intents as u64,
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn seeded_faults_keep_every_invariant() {
    if narad_tests::skip_in_repeat("a fault store over memory of its own") {
        return;
    }
    let seeds: Vec<u64> = match std::env::var("NARAD_FAULT_SEED") {
        Ok(s) => vec![s.parse().expect("NARAD_FAULT_SEED must be a number")],
        Err(_) => (1..=SEEDS).collect(),
    };
    let mut faults = 0;
    let mut produced = 0;
    for seed in seeds {
        let ran = run_seed(seed, SHORT).await;
        faults += ran.faults;
        produced += ran.produced;
    }
    println!("{faults} faults injected over {produced} acknowledged produces");
    assert!(faults > 100, "the run must actually inject faults");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn long_histories_under_faults_keep_every_invariant() {
    if narad_tests::skip_in_repeat("a fault store over memory of its own") {
        return;
    }
    let seeds: Vec<u64> = match std::env::var("NARAD_FAULT_SEED") {
        Ok(s) => vec![s.parse().expect("NARAD_FAULT_SEED must be a number")],
        Err(_) => (101..=106).collect(),
    };
    for seed in seeds {
        let r = run_seed(seed, LONG).await;
        println!(
            "seed {seed}: {} faults over {} acknowledged produces",
            r.faults, r.produced
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn interleaved_brokers_that_freeze_keep_every_invariant() {
    if narad_tests::skip_in_repeat("a fault store over memory of its own") {
        return;
    }
    let seeds: Vec<u64> = match std::env::var("NARAD_FAULT_SEED") {
        Ok(s) => vec![s.parse().expect("NARAD_FAULT_SEED must be a number")],
        Err(_) => (201..=216).collect(),
    };
    let (mut combined, mut intents, mut ledger_intents) = (0, 0, 0);
    for seed in seeds {
        let r = run_seed(seed, INTERLEAVED).await;
        println!(
            "seed {seed}: {} faults over {} acknowledged produces, {} combined, {} intents and {} ledger intents applied by other brokers",
            r.faults, r.produced, r.combined, r.intents, r.ledger_intents
        );
        combined += r.combined;
        intents += r.intents;
        ledger_intents += r.ledger_intents;
    }
    assert!(
        combined > 0,
        "the interleaved runs must combine produces across brokers"
    );
    assert!(
        intents > 0,
        "the interleaved runs must combine settles and leases across brokers"
    );
    assert!(
        ledger_intents > 0,
        "the interleaved runs must combine subscriptions' settles and leases across brokers"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_seed_replays_identically() {
    if narad_tests::skip_in_repeat("a fault store over memory of its own") {
        return;
    }
    assert_eq!(run_seed(7, SHORT).await, run_seed(7, SHORT).await);
    assert_eq!(run_seed(7, LONG).await, run_seed(7, LONG).await);
    assert_eq!(
        run_seed(7, INTERLEAVED).await,
        run_seed(7, INTERLEAVED).await
    );
}

/// Now and then, in the long profile: replay an old offset (its payload must be the one
/// produced there) or run a garbage-collection pass with no grace. Returns whether it
/// took the step.
async fn history_step(seed: u64, step: usize, rng: &mut StdRng, b: &Broker, m: &Model) -> bool {
    let roll: f64 = rng.gen();
    if roll < 0.05 && !m.order.is_empty() {
        let payload = &m.order[rng.gen_range(0..m.order.len())];
        let (p, o) = m.produced[payload];
        match b.replay("f", p, o, Duration::ZERO).await {
            Ok(Some(d)) if d.payload == payload.as_bytes() => {}
            Ok(other) => fail(
                seed,
                step,
                format!("replay of {p}/{o} got {other:?}, not {payload}"),
            ),
            Err(_) => {}
        }
        true
    } else if roll < 0.07 {
        // Errors are fine (faults); what it deletes must never be something named.
        let _ = maintenance::gc(b, Duration::ZERO, false).await;
        true
    } else {
        false
    }
}
