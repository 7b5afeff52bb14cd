//! Many brokers producing to one partition at once (the shape of classic Lambda: one
//! request per instance): their segments are combined into shared commits, and nothing is
//! lost, duplicated or answered falsely, with and without injected storage faults.
//!
//! Each broker is a separate `Broker` (its own committer, caches and queues) on one store,
//! as separate processes would be; every one produces single messages as fast as it can.
//! Afterwards every offset of the partition is replayed: each successful produce's
//! payload sits at exactly the offset it was answered with, no payload appears twice, and
//! no offset is empty. A produce that failed (503) may or may not have landed.
//!
//! The same brokers consuming and acking one named subscription at once combine its
//! ledger's operations through intents (docs/design.md §5): every message is delivered
//! once and acked once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::Settle;
use narad_shared::broker::{Broker, NewMessage};
use narad_shared::clock::{Clock, RandomIds, SystemClock};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::settings::SettingsInput;
use narad_shared::store::latency::LatencyStore;
use narad_shared::store::memory::MemoryStore;
use narad_shared::store::testing::fault::{FaultPlan, FaultStore};
use narad_shared::store::DynStore;
use narad_shared::subscription::SubscriptionInput;

const BROKERS: usize = 6;
const EACH: usize = 40;

async fn broker(store: DynStore) -> Broker {
    Broker::new(
        store,
        Arc::new(SystemClock) as Arc<dyn Clock>,
        Arc::new(RandomIds),
        vec![b"combining-test-receipt-key-0123456789".to_vec()],
        BrokerOptions::default(),
    )
    .await
    .unwrap()
}

/// Commits and committed operations over every broker, from `/metrics`.
fn commits(brokers: &[Arc<Broker>]) -> (f64, f64) {
    let mut out = (0.0, 0.0);
    for b in brokers {
        let text = b.metrics_text();
        out.0 += narad_tests::metric(&text, "narad_commits_total").unwrap_or(0.0);
        out.1 += narad_tests::metric(&text, "narad_committed_operations_total").unwrap_or(0.0);
    }
    out
}

/// Runs the workload on `store`; returns (successful produces, failed produces,
/// operations per commit).
async fn run(store: DynStore, faulty: Option<&Arc<FaultStore>>) -> (usize, usize, f64) {
    if let Some(f) = faulty {
        f.set_enabled(false);
    }
    let mut brokers = Vec::new();
    for _ in 0..BROKERS {
        brokers.push(Arc::new(broker(store.clone()).await));
    }
    let settings = SettingsInput::parse(br#"{"partitions":1}"#).unwrap();
    brokers[0].create_topic("c", &settings).await.unwrap();
    if let Some(f) = faulty {
        f.set_enabled(true);
    }
    let mut tasks = Vec::new();
    for (i, b) in brokers.iter().enumerate() {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let mut answered = Vec::new();
            let mut failed = Vec::new();
            for j in 0..EACH {
                let payload = format!("b{i}-m{j}");
                let msg = NewMessage {
                    partition: Some(0),
                    key: None,
                    payload: Bytes::from(payload.clone()),
                    idempotency_key: None,
                    headers: Default::default(),
                    delay_ms: 0,
                };
                match b.produce("c", msg).await {
                    Ok(p) => answered.push((payload, p.offset)),
                    Err(e) => {
                        println!("{payload}: {e}");
                        failed.push(payload)
                    }
                }
            }
            (answered, failed)
        }));
    }
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    for t in tasks {
        let (a, f) = t.await.unwrap();
        answered.extend(a);
        failed.extend(f);
    }
    if let Some(f) = faulty {
        f.set_enabled(false);
    }
    let (c, ops) = commits(&brokers);

    // Replay the whole partition through a fresh broker.
    let reader = broker(store.clone()).await;
    let t = reader.load_topic("c").await.unwrap();
    let next = reader.partition_stats(&t).await.unwrap()[0].next_offset;
    let mut at: HashMap<String, u64> = HashMap::new();
    let mut void = 0;
    for o in 0..next {
        let d = match reader.replay("c", 0, o, Duration::ZERO).await {
            // A segment written beside its manifest write and never stored (a fault
            // failed its PUT): its offsets hold no message, and its produces were refused.
            // Void, or not yet (undecided until a reader may give up on it, 10 s on).
            Err(BrokerError::MessageNotFound) | Ok(None) if faulty.is_some() => {
                void += 1;
                continue;
            }
            other => other.unwrap(),
        };
        let d = d.unwrap_or_else(|| panic!("offset {o} below next_offset {next} holds nothing"));
        let payload = String::from_utf8(d.payload.to_vec()).unwrap();
        if let Some(first) = at.insert(payload.clone(), o) {
            panic!("{payload} sits at offsets {first} and {o}");
        }
    }
    for (payload, offset) in &answered {
        assert_eq!(
            at.get(payload),
            Some(offset),
            "{payload} was answered with offset {offset}"
        );
    }
    if void > 0 {
        println!("{void} offsets of void or undecided segments");
    }
    for payload in at.keys() {
        assert!(
            answered.iter().any(|(p, _)| p == payload) || failed.contains(payload),
            "{payload} was never produced"
        );
    }
    (
        answered.len(),
        failed.len(),
        if c > 0.0 { ops / c } else { 0.0 },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_producing_at_once_share_commits_and_lose_nothing() {
    if narad_tests::skip_in_repeat("brokers on a memory store of their own") {
        return;
    }
    // A little latency per request, as a remote store has, so that requests overlap.
    let store: DynStore = Arc::new(LatencyStore::new(
        Arc::new(MemoryStore::new()),
        Duration::from_millis(2),
    ));
    let (ok, failed, per_commit) = run(store, None).await;
    println!("{ok} produced, {failed} failed, {per_commit:.2} operations per commit");
    assert_eq!(failed, 0, "nothing fails on a healthy store");
    assert!(
        per_commit > 1.2,
        "six brokers at once share commits: {per_commit:.2} operations per commit"
    );
}

/// Six processes on a store that refuses a second write of one key within 100 ms, as R2
/// does within a second (`store/keyrate.rs`). Each paces its own writes
/// (`store/paced.rs`); they do not coordinate, so one's write may be refused after
/// another's, and that is a failed write like any other: nothing is lost or stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_producing_at_once_behind_a_per_key_write_limit_lose_nothing() {
    if narad_tests::skip_in_repeat("brokers on a memory store of their own") {
        return;
    }
    let limited = Arc::new(narad_shared::store::keyrate::KeyRateStore::new(
        Arc::new(LatencyStore::new(
            Arc::new(MemoryStore::new()),
            Duration::from_millis(2),
        )),
        Duration::from_millis(100),
    ));
    let (ok, failed, per_commit) = run(limited.clone(), None).await;
    println!(
        "{ok} produced, {failed} failed, {per_commit:.2} operations per commit, {} writes refused",
        limited.refused()
    );
    assert!(ok > BROKERS * EACH / 2, "most produces succeed");
    // How much more a paced commit carries depends on the machine's load (1.98 to about
    // 3 seen): the figure is printed above, and only sharing itself is asserted, as for
    // brokers that are not paced.
    assert!(
        per_commit > 1.2,
        "paced brokers share commits: {per_commit:.2} operations per commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_producing_at_once_under_faults_lose_nothing_and_duplicate_nothing() {
    if narad_tests::skip_in_repeat("brokers on a memory store of their own") {
        return;
    }
    for seed in 0..4u64 {
        let faulty = FaultStore::new(Arc::new(MemoryStore::new()), FaultPlan::default(), seed);
        let store: DynStore = faulty.clone();
        let (ok, failed, per_commit) = run(store, Some(&faulty)).await;
        println!(
            "seed {seed}: {ok} produced, {failed} failed, {per_commit:.2} operations per commit"
        );
        assert!(
            ok > BROKERS * EACH / 2,
            "seed {seed}: most produces succeed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_consuming_one_subscription_at_once_combine_its_ledger_and_lose_nothing() {
    if narad_tests::skip_in_repeat("brokers on a memory store of their own") {
        return;
    }
    const TOTAL: usize = BROKERS * EACH;
    let store: DynStore = Arc::new(LatencyStore::new(
        Arc::new(MemoryStore::new()),
        Duration::from_millis(2),
    ));
    let mut brokers = Vec::new();
    for _ in 0..BROKERS {
        brokers.push(Arc::new(broker(store.clone()).await));
    }
    let settings = SettingsInput::parse(br#"{"partitions":1}"#).unwrap();
    brokers[0].create_topic("c", &settings).await.unwrap();
    let input = SubscriptionInput::default();
    brokers[0]
        .create_subscription("c", "billing", &input)
        .await
        .unwrap();
    let messages: Vec<NewMessage> = (0..TOTAL)
        .map(|j| NewMessage {
            partition: Some(0),
            key: None,
            payload: Bytes::from(format!("m{j}")),
            idempotency_key: None,
            headers: Default::default(),
            delay_ms: 0,
        })
        .collect();
    for chunk in messages.chunks(100) {
        let r = brokers[0].produce_batch("c", chunk.to_vec()).await.unwrap();
        assert!(r.iter().all(|m| m.is_ok()));
    }
    let delivered: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for b in &brokers {
        let (b, delivered, acked) = (b.clone(), delivered.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut empty = 0;
            while acked.load(Ordering::SeqCst) < TOTAL && empty < 400 {
                let got = b
                    .consume_from("c", Some("billing"), Some(0), Duration::ZERO, 1)
                    .await;
                let ds = match got {
                    Ok(ds) => ds,
                    Err(e) => {
                        errors.push(format!("consume: {e}"));
                        continue;
                    }
                };
                if ds.is_empty() {
                    empty += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                for d in ds {
                    *delivered.lock().unwrap().entry(d.offset).or_default() += 1;
                    let handle = d.receipt_handle.unwrap();
                    match b.settle("c", &handle, Settle::Ack).await {
                        Ok(()) => {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => errors.push(format!("ack of {}: {e}", d.offset)),
                    }
                }
            }
            errors
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.unwrap());
    }
    assert!(
        errors.is_empty(),
        "nothing fails on a healthy store: {errors:?}"
    );
    let delivered = delivered.lock().unwrap().clone();
    for o in 0..TOTAL as u64 {
        // Within the visibility timeout and without nacks, a second delivery would be a
        // second live lease on one message.
        assert_eq!(delivered.get(&o), Some(&1), "offset {o} delivered once");
    }
    assert_eq!(
        acked.load(Ordering::SeqCst),
        TOTAL,
        "every ack answered 204"
    );
    let (mut written, mut by_others) = (0.0, 0.0);
    for b in &brokers {
        let text = b.metrics_text();
        let m = |name| narad_tests::metric(&text, name).unwrap_or(0.0);
        written += m("narad_ledger_intents_written_total");
        by_others += m("narad_ledger_intents_decided_by_others_total");
    }
    println!("{written} ledger intents written, {by_others} decided by another broker's commit");
    assert!(
        by_others > 0.0,
        "six brokers on one ledger combine their operations"
    );
    // The subscription's ledger agrees: everything settled.
    let t = brokers[0].load_topic("c").await.unwrap();
    let stats = brokers[0].subscription_stats(&t, "billing").await.unwrap();
    assert_eq!(
        (stats[0].frontier, stats[0].in_flight),
        (TOTAL as u64, 0),
        "{stats:?}"
    );
}

/// A segment written beside its manifest write whose PUT failed is made void by its
/// writer, which refuses its produce. Another process meets it: its subscription's lease
/// decides from the objects at their keys what the writer's manifest still names
/// undecided (the void one settled, the stored one delivered), its consume settles the
/// void offset and delivers the message behind it in the same call, and a replay of the
/// void offset is 404 `message_not_found`, never a 500 or an empty read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_settles_a_void_segment_and_delivers_what_follows() {
    if narad_tests::skip_in_repeat("brokers on a memory store of their own") {
        return;
    }
    let store: DynStore = Arc::new(MemoryStore::new());
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failing = armed.clone();
    let hooked =
        narad_shared::store::testing::hook::ReplaceHook::creates(store.clone(), move |k| {
            (k.starts_with("topics/c/0/segments/") && failing.swap(false, Ordering::SeqCst))
                .then(|| narad_shared::store::StoreError::Unavailable("injected".into()))
        });
    let writer = broker(hooked).await;
    let reader = broker(store.clone()).await;
    let settings = SettingsInput::parse(br#"{"partitions":1}"#).unwrap();
    writer.create_topic("c", &settings).await.unwrap();
    let input = SubscriptionInput::default();
    writer
        .create_subscription("c", "billing", &input)
        .await
        .unwrap();
    let msg = |p: &str| NewMessage {
        partition: Some(0),
        key: None,
        payload: Bytes::from(p.to_owned()),
        idempotency_key: None,
        headers: Default::default(),
        delay_ms: 0,
    };
    assert_eq!(writer.produce("c", msg("m0")).await.unwrap().offset, 0);
    armed.store(true, Ordering::SeqCst);
    let refused = writer.produce("c", msg("m1")).await;
    assert!(matches!(refused, Err(BrokerError::Store(_))), "{refused:?}");
    // Its segment decides offset 1 void; m2's is undecided until a reader looks.
    assert_eq!(writer.produce("c", msg("m2")).await.unwrap().offset, 2);
    let payloads = |ds: Vec<narad_shared::broker::Delivery>| -> Vec<(u64, String)> {
        ds.into_iter()
            .map(|d| (d.offset, String::from_utf8(d.payload.to_vec()).unwrap()))
            .collect()
    };
    let got = reader
        .consume_from("c", Some("billing"), None, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(payloads(got), [(0, "m0".into()), (2, "m2".into())]);
    let first = reader
        .consume_from("c", None, None, Duration::ZERO, 1)
        .await
        .unwrap();
    assert_eq!(payloads(first), [(0, "m0".into())]);
    let next = reader
        .consume_from("c", None, None, Duration::ZERO, 1)
        .await
        .unwrap();
    assert_eq!(
        payloads(next),
        [(2, "m2".into())],
        "the void offset is passed"
    );
    assert!(matches!(
        reader.replay("c", 0, 1, Duration::ZERO).await,
        Err(BrokerError::MessageNotFound)
    ));
    let t = reader.load_topic("c").await.unwrap();
    let stats = &reader.partition_stats(&t).await.unwrap()[0];
    assert_eq!((stats.frontier, stats.in_flight), (0, 2), "{stats:?}");
}
