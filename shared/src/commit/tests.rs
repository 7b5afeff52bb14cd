//! Committers driven over the memory store, the fault store and a manual clock, with
//! tokio's time paused (it moves only when every task waits): two committers on one
//! store are two processes. The test holds each process where it wants it by marking
//! roles itself and calling the sweep directly.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{lock, Caches, Committer, Queue};
use crate::cas::Stored;
use crate::clock::{Clock, ManualClock, RandomIds};
use crate::error::BrokerError;
use crate::formats::Level;
use crate::gate::FleetLevel;
use crate::keys;
use crate::partition::combine::{self, Combinable};
use crate::partition::intent::{Decides, Intent};
use crate::partition::produce::NewStored;
use crate::partition::{Manifest, Settle};
use crate::segment::StoredMessage;
use crate::settings::TopicSettings;
use crate::store::memory::MemoryStore;
use crate::store::testing::fault::{FaultPlan, FaultStore};
use crate::store::testing::hook::ReplaceHook;
use crate::store::DynStore;
use crate::topic::Group;
use crate::topic::{Topic, TopicRecord};

const START_MS: u64 = 1_800_000_000_000;

/// One store, one clock, one topic.
struct World {
    store: DynStore,
    clock: ManualClock,
    topic: Topic,
}

async fn world() -> World {
    let store: DynStore = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(START_MS);
    let rec = TopicRecord {
        settings: TopicSettings::default(),
        incarnation: "inc-1".into(),
        created_at_ms: START_MS,
        layout: keys::LAYOUT_FLAT,
        subscriptions: Default::default(),
        unknown: serde_json::Map::new(),
    };
    let body = Some(rec.clone()).encode().unwrap();
    let etag = store
        .put_if_absent(&keys::topic_settings("t"), body)
        .await
        .unwrap();
    let topic = Topic::from_record("t", rec, etag);
    World {
        store,
        clock,
        topic,
    }
}

/// A view of the world's store for one process that, once enabled, fails every
/// conditional write as if another writer had won the race (disabled at first).
fn losing_store(w: &World) -> Arc<FaultStore> {
    let plan = FaultPlan {
        error_before: 0.0,
        error_after: 0.0,
        conflict: 1.0,
        max_latency: Duration::ZERO,
    };
    let store = FaultStore::new(w.store.clone(), plan, 7);
    store.set_enabled(false);
    store
}

/// A process: a committer of its own over `store`.
fn process(w: &World, store: DynStore) -> Arc<Committer> {
    process_at(w, store, Level::NEWEST)
}

/// A process at fleet level `level`.
fn process_at(w: &World, store: DynStore, level: Level) -> Arc<Committer> {
    Arc::new(Committer::new(
        store,
        Arc::new(RandomIds),
        Arc::new(w.clock.clone()),
        Caches::new(1 << 20),
        Duration::ZERO,
        (FleetLevel::fixed(level), Arc::default()),
    ))
}

fn message(w: &World) -> Vec<NewStored> {
    vec![NewStored {
        message: StoredMessage::new(w.clock.now_ms(), None, b"m".to_vec()),
        idempotency_key: None,
        delay_ms: 0,
    }]
}

/// `c`'s queue of partition 0, once its drain task has stopped.
async fn idle_queue(c: &Committer, t: &Topic) -> Arc<Queue> {
    let key = (t.name.clone(), t.incarnation.clone(), 0);
    loop {
        let q = lock(&c.queues).get(&key).cloned().unwrap();
        if !lock(&q.state).running {
            return q;
        }
        tokio::task::yield_now().await;
    }
}

/// The ids under the partition's `segments/` prefix.
async fn segment_ids(w: &World) -> Vec<String> {
    let prefix = keys::segments_prefix("t", 0);
    let keys = w.store.list_after(&prefix, "", 1000).await.unwrap();
    keys.iter()
        .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

/// Yields until an object not in `before` whose id `pending` accepts is under the
/// partition's segments.
async fn written(w: &World, before: &[String], pending: impl Fn(&str) -> bool) {
    for _ in 0..1000 {
        let ids = segment_ids(w).await;
        if ids.iter().any(|id| !before.contains(id) && pending(id)) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the waiting writer wrote nothing");
}

/// A process that produced one message, its queue and the manifest it cached.
async fn one_message(w: &World) -> (Arc<Committer>, Arc<Queue>, Manifest) {
    let b = process(w, w.store.clone());
    b.produce(&w.topic, 0, message(w)).await.unwrap();
    let q = idle_queue(&b, &w.topic).await;
    let state = lock(&q.state).held.clone().unwrap().value;
    (b, q, state)
}

/// Another process's combinable segment, written above what `c`'s cached manifest knows
/// and waiting for a combining commit; the clock then moves on 5 ms. Returns its id.
async fn waiting_segment(w: &World, c: &Committer) -> String {
    let q = idle_queue(c, &w.topic).await;
    let state = lock(&q.state).held.clone().unwrap().value;
    let theirs = Combinable::tagged_id(
        w.clock.now_ms(),
        state.ids_above(),
        "u1",
        (1, 1),
        &combine::tag("inc-1"),
    );
    put_empty(w, &[&theirs]).await;
    w.clock.advance(5);
    theirs
}

/// Writes an empty object under each of `ids` in the partition's segments (a combinable
/// id says all a commit needs).
async fn put_empty(w: &World, ids: &[&String]) {
    for id in ids {
        let key = keys::segment("t", 0, id);
        w.store
            .put_if_absent(&key, bytes::Bytes::new())
            .await
            .unwrap();
    }
}

/// Marks `c`'s partition contended (another process was seen writing it).
async fn contended(c: &Committer, t: &Topic) {
    lock(&idle_queue(c, t).await.state)
        .role
        .mark_contended(crate::runtime::now());
}

/// Runs one sweep of `c` as its drain loop would, from its cached snapshot.
async fn sweep(c: &Committer, t: &Topic) -> bool {
    let q = idle_queue(c, t).await;
    let (cache, with) = {
        let mut st = lock(&q.state);
        (st.held.take(), st.role.sweep_with())
    };
    let Some(with) = with else {
        lock(&q.state).held = cache;
        return false;
    };
    let (cache, landed) = c.sweep(&q, with, cache).await;
    let mut st = lock(&q.state);
    st.held = cache;
    st.role.swept(landed, crate::runtime::now());
    landed
}

async fn manifest(w: &World) -> Manifest {
    crate::cas::Cell::<Manifest>::new(
        &*w.store,
        &RandomIds,
        &w.topic.manifest_key(0),
        &w.topic.incarnation,
    )
    .read::<BrokerError>()
    .await
    .unwrap()
    .value
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_writer_answers_from_another_processes_commit() {
    let w = world().await;
    let (a, b) = (process(&w, w.store.clone()), process(&w, w.store.clone()));
    assert_eq!(a.produce(&w.topic, 0, message(&w)).await.unwrap(), [0]);
    assert_eq!(b.produce(&w.topic, 0, message(&w)).await.unwrap(), [1]);
    contended(&a, &w.topic).await;
    let commits_before = a.stats.commits.load(Ordering::Relaxed);

    let before = segment_ids(&w).await;
    let waiting = tokio::spawn({
        let (a, topic, m) = (a.clone(), w.topic.clone(), message(&w));
        async move { a.produce(&topic, 0, m).await }
    });
    written(&w, &before, |id| Combinable::parse(id).is_some()).await;
    lock(&idle_queue(&b, &w.topic).await.state)
        .role
        .become_committer();
    assert!(
        sweep(&b, &w.topic).await,
        "the sweep lands the waiting segment"
    );

    assert_eq!(waiting.await.unwrap().unwrap(), [2]);
    assert_eq!(a.stats.landed_by_others.load(Ordering::Relaxed), 1);
    assert_eq!(a.stats.takeovers.load(Ordering::Relaxed), 0);
    assert_eq!(a.stats.commits.load(Ordering::Relaxed), commits_before);
    assert_eq!(manifest(&w).await.next_offset, 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sweep_that_loses_a_race_stops_and_the_writer_takes_over() {
    let w = world().await;
    let b_store = losing_store(&w);
    let a = process(&w, w.store.clone());
    let b = process(&w, b_store.clone());
    assert_eq!(a.produce(&w.topic, 0, message(&w)).await.unwrap(), [0]);
    assert_eq!(b.produce(&w.topic, 0, message(&w)).await.unwrap(), [1]);
    contended(&a, &w.topic).await;

    let before = segment_ids(&w).await;
    let waiting = tokio::spawn({
        let (a, topic, m) = (a.clone(), w.topic.clone(), message(&w));
        async move { a.produce(&topic, 0, m).await }
    });
    written(&w, &before, |id| Combinable::parse(id).is_some()).await;
    let qb = idle_queue(&b, &w.topic).await;
    lock(&qb.state).role.become_committer();
    // Every manifest write of b's meets another writer's.
    b_store.set_enabled(true);
    assert!(
        !sweep(&b, &w.topic).await,
        "a sweep that lost its race lands nothing"
    );
    b_store.set_enabled(false);
    assert!(
        !lock(&qb.state).role.is_committer(),
        "and leaves the sweeping"
    );

    // Nobody else commits: the waiting writer takes over.
    assert_eq!(waiting.await.unwrap().unwrap(), [2]);
    assert_eq!(a.stats.takeovers.load(Ordering::Relaxed), 1);
    assert_eq!(manifest(&w).await.next_offset, 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_ack_intent_whose_lease_lapsed_before_it_landed_answers_410_and_changes_nothing() {
    let w = world().await;
    let (a, b) = (process(&w, w.store.clone()), process(&w, w.store.clone()));
    a.produce(&w.topic, 0, message(&w)).await.unwrap();
    let got = a
        .lease((&w.topic, Group::Default), 0, (1, 1 << 20))
        .await
        .unwrap();
    let grant = got.leased.grants[0].clone();
    assert_eq!(grant.offset, 0);
    b.produce(&w.topic, 0, message(&w)).await.unwrap();
    contended(&a, &w.topic).await;

    let before = segment_ids(&w).await;
    let acking = tokio::spawn({
        let (a, topic) = (a.clone(), w.topic.clone());
        async move { a.settle(&topic, 0, 0, grant.lease_id, Settle::Ack).await }
    });
    written(&w, &before, |id| Intent::parse(id).is_some()).await;
    // The lease lapses while the intent waits for a commit.
    w.clock.advance(w.topic.settings.visibility_timeout_ms + 1);
    lock(&idle_queue(&b, &w.topic).await.state)
        .role
        .become_committer();
    assert!(sweep(&b, &w.topic).await, "the sweep decides the intent");

    assert!(matches!(acking.await.unwrap(), Err(BrokerError::LeaseGone)));
    let m = manifest(&w).await;
    assert_eq!(m.frontier, 0, "nothing was acked");
    assert!(
        m.is_available(0, w.clock.now_ms()),
        "the message is leasable again"
    );
    assert_eq!(m.available_count(w.clock.now_ms()), 2);
    assert_eq!(a.stats.intents_by_others.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_commit_lands_no_segment_tagged_with_another_incarnation() {
    let w = world().await;
    let (b, q, state) = one_message(&w).await;
    let now = w.clock.now_ms() + 5;
    let after = state.ids_above().to_owned();
    let ours = Combinable::tagged_id(now, &after, "u1", (1, 1), &combine::tag("inc-1"));
    let theirs = Combinable::tagged_id(now, &after, "u2", (1, 1), &combine::tag("inc-2"));
    let untagged = Combinable::id(now, &after, "u3", 1, 1);
    put_empty(&w, &[&ours, &theirs, &untagged]).await;
    let listed = b.list_combinable(&q, &state, None).await;
    let ids: Vec<&str> = listed.segments.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [ours.as_str(), untagged.as_str()]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_listing_made_ahead_lands_only_what_is_still_pending_and_only_while_fresh() {
    let w = world().await;
    let (b, q, state) = one_message(&w).await;
    let now = w.clock.now_ms() + 5;
    let after = state.ids_above().to_owned();
    let tag = combine::tag("inc-1");
    let first = Combinable::tagged_id(now, &after, "u1", (1, 1), &tag);
    let second = Combinable::tagged_id(now, &after, "u2", (1, 1), &tag);
    put_empty(&w, &[&first, &second]).await;
    // Listed beside a commit that lands the first one.
    b.list_ahead(&*q, &state.combined_through).await;
    let mut landed = state.clone();
    combine::land(&mut landed, &[Combinable::parse(&first).unwrap().to_ref()]);
    let next = b
        .take_ahead(&*q, &landed)
        .expect("a fresh listing is taken");
    let ids: Vec<&str> = next.segments.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [second.as_str()],
        "what that commit landed is left out"
    );
    assert!(b.take_ahead(&*q, &landed).is_none(), "it is used once");

    b.list_ahead(&*q, &state.combined_through).await;
    tokio::time::advance(super::listing::AHEAD_FOR).await;
    assert!(
        b.take_ahead(&*q, &landed).is_none(),
        "an old one is listed again instead"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn settles_queued_with_a_lease_commit_with_it_and_free_its_place() {
    let mut w = world().await;
    w.topic.settings.max_in_flight_per_partition = 1;
    let c = process(&w, w.store.clone());
    for _ in 0..3 {
        c.produce(&w.topic, 0, message(&w)).await.unwrap();
    }
    let first = c
        .lease((&w.topic, Group::Default), 0, (1, u64::MAX))
        .await
        .unwrap();
    let g = first.leased.grants[0].clone();
    // In flight is full: a lease alone gets nothing.
    let none = c
        .lease((&w.topic, Group::Default), 0, (1, u64::MAX))
        .await
        .unwrap();
    assert!(none.leased.grants.is_empty());

    let commits = c.stats.commits.load(Ordering::Relaxed);
    let stale = (g.offset, g.lease_id + 1, Settle::Ack);
    let ack = (g.offset, g.lease_id, Settle::Ack);
    let (leased, settled) = c
        .lease_settling(&w.topic, 0, (1, u64::MAX), &[stale, ack])
        .await;
    assert!(matches!(settled[0], Err(BrokerError::LeaseGone)));
    assert!(settled[1].is_ok());
    // The ack freed the one place in flight for the lease, in one commit.
    let leased = leased.unwrap();
    assert_eq!(leased.leased.grants.len(), 1);
    assert_eq!(leased.leased.grants[0].offset, g.offset + 1);
    assert_eq!(c.stats.commits.load(Ordering::Relaxed), commits + 1);
    let m = manifest(&w).await;
    assert_eq!(m.frontier, g.offset + 1);
    assert!(m.leases.contains_key(&(g.offset + 1)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_ordinary_batch_that_keeps_losing_races_turns_to_combining() {
    let w = world().await;
    let a_store = losing_store(&w);
    let (a, b) = (process(&w, a_store.clone()), process(&w, w.store.clone()));
    assert_eq!(a.produce(&w.topic, 0, message(&w)).await.unwrap(), [0]);
    assert_eq!(b.produce(&w.topic, 0, message(&w)).await.unwrap(), [1]);

    // Not contended: a's next batch goes the ordinary way, and every manifest write of
    // a's meets another writer's (as a process a round trip behind the winner's does).
    a_store.set_enabled(true);
    let before = segment_ids(&w).await;
    let producing = tokio::spawn({
        let (a, topic, m) = (a.clone(), w.topic.clone(), message(&w));
        async move { a.produce(&topic, 0, m).await }
    });
    // Sleeping, not yielding: the paused clock moves only while every task waits, and
    // the losing batch backs off between its attempts.
    for _ in 0..10_000 {
        if a.stats.switched.load(Ordering::Relaxed) > 0 {
            break;
        }
        crate::runtime::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(a.stats.switched.load(Ordering::Relaxed), 1, "it switched");
    written(&w, &before, |id| Combinable::parse(id).is_some()).await;
    let new: Vec<String> = segment_ids(&w)
        .await
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    assert_eq!(
        new.len(),
        1,
        "the ordinary segment was deleted first: {new:?}"
    );

    lock(&idle_queue(&b, &w.topic).await.state)
        .role
        .become_committer();
    assert!(
        sweep(&b, &w.topic).await,
        "the sweep lands the switched batch"
    );
    assert_eq!(producing.await.unwrap().unwrap(), [2]);
    assert_eq!(a.stats.landed_by_others.load(Ordering::Relaxed), 1);
    assert_eq!(manifest(&w).await.next_offset, 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_process_that_keeps_winning_looks_and_finds_the_others_waiting() {
    let w = world().await;
    let a = process(&w, w.store.clone());
    for i in 0..super::role::LOOK_AFTER {
        assert_eq!(
            a.produce(&w.topic, 0, message(&w)).await.unwrap(),
            [u64::from(i)]
        );
    }
    let q = idle_queue(&a, &w.topic).await;
    assert!(!lock(&q.state).role.contended(crate::runtime::now()));
    // Another process waits for a combining commit.
    waiting_segment(&w, &a).await;

    a.produce(&w.topic, 0, message(&w)).await.unwrap();
    let q = idle_queue(&a, &w.topic).await;
    assert_eq!(a.stats.looks.load(Ordering::Relaxed), 1);
    assert_eq!(a.stats.looks_found.load(Ordering::Relaxed), 1);
    assert!(
        lock(&q.state).role.contended(crate::runtime::now()),
        "its next batch combines, landing the other's"
    );
}

/// An ordinary commit lands its own segment alone, under an ordinary id: another
/// process's combinable segment waiting below it stays pending (a combinable id would have
/// raised `combined_through` past it, and its writer would write it again).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_ordinary_commit_passes_over_no_combining_write() {
    let w = world().await;
    let a = process(&w, w.store.clone());
    assert_eq!(a.produce(&w.topic, 0, message(&w)).await.unwrap(), [0]);
    let theirs = waiting_segment(&w, &a).await;

    assert_eq!(a.produce(&w.topic, 0, message(&w)).await.unwrap(), [1]);
    let m = manifest(&w).await;
    let own = &m.segments.last().unwrap().id;
    assert!(Combinable::parse(own).is_none(), "an ordinary id: {own}");
    assert!(own.as_str() > theirs.as_str(), "written after theirs");
    assert_eq!(combine::status(&m, &theirs), combine::Status::Pending);
}

/// A combinable segment its own writer landed carries its messages' produce time, earlier
/// than its id's time. Once the manifest no longer remembers it and it is the newest
/// segment of the index it was folded into, the lookup still finds it there (it once
/// skipped that index and answered 503, "fate can no longer be told").
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_segment_its_writer_landed_is_found_in_the_index_it_was_folded_into() {
    use crate::partition::combine::Status;
    use crate::partition::index::{Entries, Index, IndexRef, INDEX_FORMAT};
    use crate::partition::SegmentRef;

    let w = world().await;
    let (b, q, mut state) = one_message(&w).await;
    let produced = w.clock.now_ms();
    let seg = SegmentRef {
        id: Combinable::id(produced + 300, "", "own", 1, 1),
        base_offset: 7,
        count: 1,
        last_produced_ms: produced,
        bytes: 1,
    };
    let index = Index {
        format: INDEX_FORMAT,
        entries: Entries::Segments(vec![seg.clone()]),
    };
    let index_id = keys::segment_id(produced + 400, "");
    w.store
        .put_if_absent(&keys::index("t", 0, &index_id), index.encode().unwrap())
        .await
        .unwrap();
    state.indexes.push(IndexRef {
        id: index_id,
        level: 0,
        base_offset: 7,
        end_offset: 8,
        segments: 1,
        last_produced_ms: produced,
        bytes: 1,
    });
    // Folded, with every segment before it (none is hot), and many landed after it: the
    // manifest's own memory has moved past it.
    state.segments.clear();
    let later = Combinable::id(produced + 5_000, "", "later", 1, 1);
    (state.landed_floor, state.combined_through) = (later.clone(), later);
    assert_eq!(combine::status(&state, &seg.id), Status::Unknown);
    assert_eq!(b.segment_status(&q, &state, &seg).await, Status::Landed(7));
}

/// A batch whose segment is older than the segment age when it could commit gives up
/// (503) and never names it: garbage collection may already take it for an orphan.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_segment_older_than_the_segment_age_is_never_committed() {
    let w = world().await;
    let (_, _, before) = one_message(&w).await;
    // The first conditional replace of the manifest loses, as if another writer had won,
    // and the clock moves past the segment age meanwhile: a process that stalled that long.
    let (clock, stalled) = (w.clock.clone(), std::sync::atomic::AtomicBool::new(false));
    let store: DynStore = ReplaceHook::new(w.store.clone(), move |key| {
        let first = key.ends_with(".manifest.json") && !stalled.swap(true, Ordering::SeqCst);
        first.then(|| {
            clock.advance(super::MAX_SEGMENT_AGE_AT_COMMIT_MS + 1);
            crate::store::StoreError::Conflict
        })
    });
    let p = process(&w, store);
    let segments_before = segment_ids(&w).await;
    let r = p.produce(&w.topic, 0, message(&w)).await;
    assert!(matches!(r, Err(BrokerError::Contention)), "{r:?}");
    let m = manifest(&w).await;
    assert_eq!(m.next_offset, before.next_offset, "nothing committed");
    let written: Vec<_> = segment_ids(&w)
        .await
        .into_iter()
        .filter(|id| !segments_before.contains(id))
        .collect();
    assert_eq!(written.len(), 1, "its segment was written: {written:?}");
    assert!(m.segments.iter().all(|s| s.id != written[0]));
}

/// A produce that arrives while a commit is in flight starts its own commit the moment
/// that one lands, before it is answered, and is answered one manifest write after it,
/// in order. Below fleet level 7 it is taken ahead: its segment is written beside that
/// commit's manifest write (`commit/queue.rs`), not a segment write and a manifest write
/// after. At level 7 both commits are one round trip each, the segment beside the
/// manifest write, and nothing is taken ahead: a segment written ahead would end a round
/// trip after its produce arrived, later than the commit it waits for.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_produce_arriving_during_a_commit_starts_its_own_before_that_commit_answers() {
    const RTT: Duration = Duration::from_millis(20);
    for level in [Level(6), Level(7)] {
        let w = world().await;
        let store = crate::store::latency::LatencyStore::new(w.store.clone(), RTT);
        let p = process_at(&w, Arc::new(store), level);
        // The manifest exists and this process holds it.
        p.produce(&w.topic, 0, message(&w)).await.unwrap();
        let before = segment_ids(&w).await;
        let produce = |p: &Arc<Committer>| {
            let (p, t, m) = (p.clone(), w.topic.clone(), message(&w));
            tokio::spawn(async move { p.produce(&t, 0, m).await })
        };
        let start = tokio::time::Instant::now();
        let first = produce(&p);
        // The first batch is writing its segment.
        tokio::time::sleep(RTT / 4).await;
        let second = produce(&p);
        let a = first.await.unwrap().unwrap();
        let first_at = start.elapsed();
        let written = segment_ids(&w).await.len() - before.len();
        let b = second.await.unwrap().unwrap();
        let second_at = start.elapsed();
        assert_eq!(b[0], a[0] + 1, "in order");
        if level.writes_beside() {
            assert_eq!(first_at, RTT, "one round trip");
            assert_eq!(written, 1, "nothing was taken ahead");
        } else {
            assert_eq!(first_at, RTT * 2, "a segment write, then a manifest write");
            assert_eq!(
                written, 2,
                "the second produce's segment was written before the first was answered"
            );
        }
        assert!(
            second_at - first_at <= RTT + RTT / 4,
            "level {level}: answered {:?} after the first: one manifest write",
            second_at - first_at
        );
        assert_eq!(manifest(&w).await.next_offset, b[0] + 1);
    }
}

/// A first batch reads the manifest before it is taken (`commit/cold.rs`): produces that
/// arrive during that read ride in its commit, and are answered with the first one, two
/// round trips after it arrived (the read, then the writes), not a commit after it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn produces_arriving_during_a_first_read_share_its_commit() {
    const RTT: Duration = Duration::from_millis(20);
    for level in [Level(6), Level(7)] {
        let w = world().await;
        let store = crate::store::latency::LatencyStore::new(w.store.clone(), RTT);
        let p = process_at(&w, Arc::new(store), level);
        let produce = |p: &Arc<Committer>| {
            let (p, t, m) = (p.clone(), w.topic.clone(), message(&w));
            tokio::spawn(async move { p.produce(&t, 0, m).await })
        };
        let start = tokio::time::Instant::now();
        let first = produce(&p);
        tokio::time::sleep(RTT / 2).await;
        let others: Vec<_> = (0..31).map(|_| produce(&p)).collect();
        first.await.unwrap().unwrap();
        let first_at = start.elapsed();
        for o in others {
            o.await.unwrap().unwrap();
        }
        let writes = if level.writes_beside() { 1 } else { 2 };
        assert_eq!(
            first_at,
            RTT * (1 + writes),
            "level {level}: a read, then the writes"
        );
        assert_eq!(
            start.elapsed(),
            first_at,
            "level {level}: all in the first commit"
        );
        let m = manifest(&w).await;
        assert_eq!((m.next_offset, m.version), (32, 1), "level {level}");
    }
}

/// A commit whose retention drops segments deletes them beside the next commit (the
/// queue's chore), a few at a time, not one after another before it: behind a store that
/// answers in 20 ms, ten dropped segments held the next produce for ten round trips.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_deletes_of_what_retention_dropped_do_not_hold_the_next_commit() {
    const RTT: Duration = Duration::from_millis(20);
    let mut w = world().await;
    w.topic.settings.retention_ms = 60_000;
    let store = crate::store::latency::LatencyStore::new(w.store.clone(), RTT);
    let p = process(&w, Arc::new(store));
    for _ in 0..10 {
        p.produce(&w.topic, 0, message(&w)).await.unwrap();
    }
    let old = segment_ids(&w).await;
    assert_eq!(old.len(), 10);
    w.clock.advance(61_000);
    // This produce's commit drops the ten; the next one is answered a segment write and a
    // manifest write later (waiting for the deletes, two rounds of eight, beside them).
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    let start = tokio::time::Instant::now();
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    let took = start.elapsed();
    assert!(took < RTT * 3, "the next produce took {took:?}");
    let left = segment_ids(&w).await;
    assert!(old.iter().all(|id| !left.contains(id)), "deleted: {left:?}");
    assert_eq!(manifest(&w).await.start_offset, 10);
}

/// A checkpoint's chore is its PUT alone: the delete of the checkpoint before the
/// previous follows as a task of its own, so the next commit, which waits for the chore
/// before it answers, does not wait a second round trip for it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_next_commit_waits_for_a_checkpoint_write_but_not_for_the_old_ones_delete() {
    const RTT: Duration = Duration::from_millis(20);
    let w = world().await;
    let store = crate::store::latency::LatencyStore::new(w.store.clone(), RTT);
    let p = process(&w, Arc::new(store));
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    let q = idle_queue(&p, &w.topic).await;
    q.chore.done().await;
    let prefix = keys::checkpoints_prefix(&w.topic.name, 0);
    let old = w.store.list(&prefix).await.unwrap();
    assert_eq!(old.len(), 1, "the first write's checkpoint: {old:?}");
    let expired = keys::checkpoint_version(&old[0]).unwrap();
    let mut m = manifest(&w).await;
    m.version += 1;
    let chore = p.checkpoint_write(&q, &m, expired).unwrap();
    let start = tokio::time::Instant::now();
    chore.await;
    assert_eq!(start.elapsed(), RTT, "the checkpoint's PUT alone");
    let written = keys::checkpoint(&w.topic.name, 0, m.version);
    assert!(w.store.get(&written).await.unwrap().is_some());
    tokio::time::sleep(RTT * 2).await;
    let left = w.store.list(&prefix).await.unwrap();
    assert_eq!(left, vec![written], "the old one deleted");
}

/// A process at fleet level 7, where segments may be written beside the manifest write.
fn process_at_7(w: &World, store: DynStore) -> Arc<Committer> {
    process_at(w, store, Level(7))
}

/// At fleet level 7 a produce writes its segment beside the manifest write (to a
/// manifest that exists, or creating one for a request that read the topic record
/// itself): one round trip, not two. The manifest names the segment undecided until the
/// writer's next commit, which decides it; its producer is answered only once the
/// segment is stored, and a lease in the writer's process decides it too.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_level_7_a_produce_commits_in_one_round_trip_and_its_next_commit_decides_it() {
    const RTT: Duration = Duration::from_millis(20);
    let w = world().await;
    let store = crate::store::latency::LatencyStore::new(w.store.clone(), RTT);
    let p = process_at_7(&w, Arc::new(store));
    // The first produce reads that there is no manifest, then creates it with its segment
    // beside (its request read the topic record itself: nothing to confirm).
    let start = tokio::time::Instant::now();
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    assert_eq!(start.elapsed(), RTT * 2, "a read, then both writes at once");
    assert_eq!(manifest(&w).await.beside.len(), 1);
    let start = tokio::time::Instant::now();
    let second = p.produce(&w.topic, 0, message(&w)).await.unwrap();
    assert_eq!(start.elapsed(), RTT, "segment and manifest written at once");
    let m = manifest(&w).await;
    let id = &m.segments[1].id;
    assert_eq!(m.beside.iter().collect::<Vec<_>>(), vec![id], "{m:?}");
    assert!(raw_manifest(&w).await.contains("\"format\":7,"));
    assert!(w
        .store
        .get(&keys::segment("t", 0, id))
        .await
        .unwrap()
        .is_some());
    assert_eq!(second, vec![1]);
    // The writer's lease decides it and leases both messages.
    let got = p
        .lease((&w.topic, Group::Default), 0, (10, u64::MAX))
        .await
        .unwrap();
    let offsets: Vec<u64> = got.leased.grants.iter().map(|g| g.offset).collect();
    assert_eq!(offsets, vec![0, 1]);
    let m = manifest(&w).await;
    assert!(m.beside.is_empty(), "{m:?}");
    let raw = raw_manifest(&w).await;
    assert!(
        raw.contains("\"format\":4,"),
        "none undecided: the older format again"
    );
}

/// A process that just created the topic confirms the record beside its first read of the
/// missing manifest, then creates the manifest with its segment beside: two round trips.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_process_that_created_the_topic_confirms_it_beside_reading_its_manifest() {
    const RTT: Duration = Duration::from_millis(20);
    let w = world().await;
    let store: DynStore = Arc::new(crate::store::latency::LatencyStore::new(
        w.store.clone(),
        RTT,
    ));
    // Its requests take the record from the topic cache.
    let mut topic = w.topic.clone();
    topic.from_cache = true;
    let creator = process_at_7(&w, store.clone());
    creator.created(&topic);
    let start = tokio::time::Instant::now();
    assert_eq!(creator.produce(&topic, 0, message(&w)).await.unwrap(), [0]);
    assert_eq!(
        start.elapsed(),
        RTT * 2,
        "both reads, then both writes at once"
    );
    // Another process confirms the record beside its segment, then creates nothing.
    let other = process_at_7(&w, store);
    let start = tokio::time::Instant::now();
    assert_eq!(other.produce(&topic, 0, message(&w)).await.unwrap(), [1]);
    assert_eq!(start.elapsed(), RTT * 2, "a read, then both writes at once");
    assert_eq!(manifest(&w).await.next_offset, 2);
}

/// A fold's index object is written by the queue's chore beside the next commit, and the
/// commit after it applies the fold: behind a store that answers in 20 ms no produce
/// waits for an index write before its manifest write (one in 65 commits of a 32 × 1 run
/// did, and set its p99).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fold_costs_no_commit_a_round_trip() {
    const RTT: Duration = Duration::from_millis(20);
    let w = world().await;
    let store = crate::store::latency::LatencyStore::new(w.store.clone(), RTT);
    let p = process_at_7(&w, Arc::new(store));
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    let folds_at = crate::partition::index::FOLD_ABOVE + 3;
    for i in 1..folds_at {
        let start = tokio::time::Instant::now();
        p.produce(&w.topic, 0, message(&w)).await.unwrap();
        assert_eq!(start.elapsed(), RTT, "produce {i}: one round trip");
    }
    let m = manifest(&w).await;
    assert_eq!(m.indexes.len(), 1, "folded: {m:?}");
    assert_eq!(
        m.segments.len(),
        folds_at - m.indexes[0].segments as usize,
        "every segment hot or folded"
    );
}

/// The partition's manifest as stored.
async fn raw_manifest(w: &World) -> String {
    let key = w.topic.manifest_key(0);
    let o = w.store.get(&key).await.unwrap().unwrap();
    String::from_utf8(o.data.to_vec()).unwrap()
}

/// A segment written beside its manifest write whose PUT fails is given up by its writer:
/// a void marker goes to its key (so that a late PUT can never land) and its producer
/// hears that nothing was stored; the manifest names it undecided until the writer's next
/// commit decides it, after which nothing is stored at its offset.
#[tokio::test(flavor = "current_thread")]
async fn at_level_7_a_segment_whose_put_failed_is_made_void_and_its_produce_refused() {
    let w = world().await;
    let segments = keys::segments_prefix("t", 0);
    // Once armed, the next segment write fails (as a timeout that did not apply); the
    // void marker's write goes through.
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failing = fail.clone();
    let store = crate::store::testing::hook::ReplaceHook::creates(w.store.clone(), move |k| {
        (k.starts_with(&segments) && failing.swap(false, Ordering::SeqCst))
            .then(|| crate::store::StoreError::Unavailable("injected".into()))
    });
    let p = process_at_7(&w, store.clone());
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    fail.store(true, Ordering::SeqCst);
    let refused = p.produce(&w.topic, 0, message(&w)).await;
    assert!(
        matches!(&refused, Err(BrokerError::Store(_))),
        "{refused:?}"
    );
    let m = manifest(&w).await;
    let id = m.segments[1].id.clone();
    assert!(m.beside.contains(&id), "named undecided: {m:?}");
    let marker = w
        .store
        .get(&keys::segment("t", 0, &id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&marker.data[..], b"NSG4", "a void marker at its key");
    // A late PUT of the segment can no longer land.
    let late = w
        .store
        .put_if_absent(&keys::segment("t", 0, &id), "x".into())
        .await;
    assert!(matches!(late, Err(crate::store::StoreError::Conflict)));
    // The next commit decides it.
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    let m = manifest(&w).await;
    assert!(!m.beside.contains(&id), "{m:?}");
}

/// A lease commit of another process looks at the undecided segments it would lease
/// from: one stored is decided and leased at once; one with nothing at its key waits
/// while it may be on its way, and once older than `beside::DECIDE_AFTER_MS` is made void
/// (a marker at its key, so that its writer's PUT can never land) and decided.
#[tokio::test(flavor = "current_thread")]
async fn at_level_7_a_lease_of_another_process_decides_what_it_finds() {
    let w = world().await;
    let segments = keys::segments_prefix("t", 0);
    let (fail, failing) = {
        let f = Arc::new(std::sync::atomic::AtomicBool::new(false));
        (f.clone(), f)
    };
    let store = crate::store::testing::hook::ReplaceHook::creates(w.store.clone(), move |k| {
        (k.starts_with(&segments) && failing.load(Ordering::SeqCst))
            .then(|| crate::store::StoreError::Unavailable("injected".into()))
    });
    let writer = process_at_7(&w, store);
    let reader = process_at_7(&w, w.store.clone());
    writer.produce(&w.topic, 0, message(&w)).await.unwrap();
    writer.produce(&w.topic, 0, message(&w)).await.unwrap();
    assert_eq!(manifest(&w).await.beside.len(), 1);
    let lease = |max| reader.lease((&w.topic, Group::Default), 0, (max, u64::MAX));
    let offsets =
        |a: super::LeaseAnswer| -> Vec<u64> { a.leased.grants.iter().map(|g| g.offset).collect() };
    assert_eq!(
        offsets(lease(10).await.unwrap()),
        vec![0, 1],
        "found stored"
    );
    assert!(manifest(&w).await.beside.is_empty());

    // A segment whose PUT failed and whose writer could not write the marker either.
    fail.store(true, Ordering::SeqCst);
    let lost = writer.produce(&w.topic, 0, message(&w)).await;
    assert!(lost.is_err(), "{lost:?}");
    fail.store(false, Ordering::SeqCst);
    let m = manifest(&w).await;
    let id = m.segments[2].id.clone();
    assert!(m.beside.contains(&id) && m.next_offset == 3, "{m:?}");
    let key = keys::segment("t", 0, &id);
    assert!(w.store.get(&key).await.unwrap().is_none());
    assert!(
        offsets(lease(10).await.unwrap()).is_empty(),
        "young: waited for"
    );
    assert!(manifest(&w).await.beside.contains(&id));
    w.clock.advance(crate::partition::beside::DECIDE_AFTER_MS);
    // Decided void: its offset is an ordinary one now (a delivery meets the marker).
    assert_eq!(offsets(lease(10).await.unwrap()), vec![2]);
    assert!(manifest(&w).await.beside.is_empty());
    let marker = w.store.get(&key).await.unwrap().unwrap();
    assert_eq!(&marker.data[..], b"NSG4");
}

/// A produce with an idempotency key is never written beside its manifest write: its key
/// is remembered at its offset the moment the manifest lands, and a retry would be
/// answered from an offset whose segment might turn out void (the seeded fault suite at
/// level 7 found exactly that).
#[tokio::test(flavor = "current_thread")]
async fn at_level_7_a_produce_with_an_idempotency_key_writes_its_segment_first() {
    let w = world().await;
    let p = process_at_7(&w, w.store.clone());
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    let mut keyed = message(&w);
    keyed[0].idempotency_key = Some("k1".into());
    p.produce(&w.topic, 0, keyed).await.unwrap();
    assert!(manifest(&w).await.beside.is_empty(), "the ordinary way");
    p.produce(&w.topic, 0, message(&w)).await.unwrap();
    assert_eq!(manifest(&w).await.beside.len(), 1, "keyless: beside");
}
