//! Garbage collection: orphan segments are collected after the grace period and never
//! before; retention runs on idle partitions; leftovers of deleted topics go.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, ManualClock, RandomIds};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::maintenance::{self, DEFAULT_GRACE};
use narad_shared::settings::SettingsInput;
use narad_shared::store::testing::fault::{FaultPlan, FaultStore};
use narad_shared::store::DynStore;
use narad_shared::stored::keys;
use narad_tests::{test_store, T0};

const MIN: u64 = 60_000;

async fn broker(store: DynStore, clock: &ManualClock) -> Broker {
    Broker::new(
        store,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        Arc::new(RandomIds),
        vec![b"gc-test-receipt-key-0123456789".to_vec()],
        BrokerOptions::default(),
    )
    .await
    .unwrap()
}

fn msg(s: &str) -> NewMessage {
    NewMessage {
        partition: Some(0),
        key: None,
        payload: Bytes::from(s.to_owned()),
        idempotency_key: None,
        headers: Default::default(),
        delay_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_collected_after_the_grace_period_and_never_before() {
    let (inner, _dir) = test_store().await;
    // Every conditional write on this store loses (as if another writer always won), so
    // a produce writes its segment and never commits it: a real orphan.
    let always_conflict = FaultPlan {
        error_before: 0.0,
        error_after: 0.0,
        conflict: 1.0,
        max_latency: Duration::ZERO,
    };
    let faulty = FaultStore::new(inner.clone(), always_conflict, 1);
    faulty.set_enabled(false);
    let clock = ManualClock::new(T0);
    let b = broker(faulty.clone(), &clock).await;
    b.create_topic("t", &SettingsInput::default())
        .await
        .unwrap();
    b.produce("t", msg("kept-1")).await.unwrap();
    b.produce("t", msg("kept-2")).await.unwrap();

    faulty.set_enabled(true);
    let r = b.produce("t", msg("never-committed")).await;
    assert!(matches!(r, Err(BrokerError::Contention)), "{r:?}");
    faulty.set_enabled(false);
    // A second orphan written straight into the store, as a crashed process would leave it.
    let stray = keys::segment("t", 0, &keys::segment_id(clock.now_ms(), "crashed"));
    inner
        .put_if_absent(&stray, Bytes::from_static(b"NSG1"))
        .await
        .unwrap();
    let segments = || async { inner.list("topics/t/0/segments/").await.unwrap().len() };
    assert_eq!(segments().await, 4);

    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(
        (g.orphans_deleted, g.orphans_kept),
        (0, 2),
        "young orphans are kept: {g:?}"
    );
    clock.advance(29 * MIN);
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(
        (g.orphans_deleted, g.orphans_kept),
        (0, 2),
        "still inside the grace period: {g:?}"
    );
    assert_eq!(segments().await, 4);
    clock.advance(2 * MIN);
    let dry = maintenance::gc(&b, DEFAULT_GRACE, true).await.unwrap();
    assert_eq!(dry.orphans_deleted, 2);
    assert_eq!(segments().await, 4, "a dry run deletes nothing");
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!((g.orphans_deleted, g.orphans_kept), (2, 0), "{g:?}");
    assert_eq!(segments().await, 2, "only referenced segments remain");
    // Referenced segments are never touched, however old.
    clock.advance(24 * 60 * MIN);
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.orphans_deleted, 0);
    for want in ["kept-1", "kept-2"] {
        let d = b
            .consume("t", None, Duration::ZERO, 1)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(&d.payload[..], want.as_bytes());
        b.settle("t", d.receipt_handle.as_deref().unwrap(), Settle::Ack)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_runs_on_idle_partitions_and_leftovers_go() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    let settings = SettingsInput::parse(br#"{"retention_ms":60000}"#).unwrap();
    b.create_topic("r", &settings).await.unwrap();
    b.produce("r", msg("old")).await.unwrap();
    clock.advance(2 * MIN);
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.expired_segments, 1, "{g:?}");
    assert!(matches!(
        b.replay("r", 0, 0, Duration::ZERO).await,
        Err(BrokerError::OffsetExpired(0))
    ));
    assert!(store.list("topics/r/0/segments/").await.unwrap().is_empty());

    // An interrupted delete leaves objects without topic.json behind.
    b.create_topic("gone", &SettingsInput::default())
        .await
        .unwrap();
    b.produce("gone", msg("x")).await.unwrap();
    // The first checkpoint is written after the produce is answered (off its latency): wait
    // for it, or a slower store (SeaweedFS) may write it after the pass has listed.
    let checkpoints = "topics/gone/0/checkpoints/";
    for _ in 0..500 {
        if !store.list(checkpoints).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.delete(&keys::topic_settings("gone")).await.unwrap();
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(
        g.leftovers_deleted, 3,
        "manifest, its first checkpoint and segment: {g:?}"
    );
    assert!(store.list("topics/gone/").await.unwrap().is_empty());
    assert_eq!(g.topics, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_small_segments_without_losing_anything() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    b.create_topic("c", &SettingsInput::default())
        .await
        .unwrap();
    for i in 0..40 {
        let m = NewMessage {
            partition: Some(0),
            key: (i % 2 == 0).then(|| format!("k{i}")),
            payload: Bytes::from(format!("m{i}")),
            idempotency_key: None,
            headers: Default::default(),
            delay_ms: 0,
        };
        b.produce("c", m).await.unwrap();
    }
    // Settle the first five, lease the next three: compaction must keep both intact.
    for _ in 0..5 {
        let d = b
            .consume("c", None, Duration::ZERO, 1)
            .await
            .unwrap()
            .pop()
            .unwrap();
        b.settle("c", d.receipt_handle.as_deref().unwrap(), Settle::Ack)
            .await
            .unwrap();
    }
    let held = b.consume("c", None, Duration::ZERO, 3).await.unwrap();
    let segments = || async {
        let t = b.topic("c").await.unwrap();
        b.partition_stats(&t).await.unwrap()[0].segments
    };
    assert_eq!(segments().await, 40);

    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.segments_compacted, 40, "{g:?}");
    assert_eq!(segments().await, 1);
    for o in 0..40u64 {
        let d = b.replay("c", 0, o, Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(d.payload, Bytes::from(format!("m{o}")));
        assert_eq!(d.key, (o % 2 == 0).then(|| format!("k{o}")));
    }
    // Leases taken before compaction still settle; the rest is delivered in order.
    for d in held {
        b.settle("c", d.receipt_handle.as_deref().unwrap(), Settle::Ack)
            .await
            .unwrap();
    }
    for want in 8..40 {
        let d = b
            .consume("c", None, Duration::ZERO, 1)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(d.payload, Bytes::from(format!("m{want}")));
        b.settle("c", d.receipt_handle.as_deref().unwrap(), Settle::Ack)
            .await
            .unwrap();
    }
    // The replaced segments are orphans now; the next pass past the grace period deletes them.
    clock.advance(31 * MIN);
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.orphans_deleted, 40, "{g:?}");
    assert_eq!(store.list("topics/c/0/segments/").await.unwrap().len(), 1);
    let d = b.replay("c", 0, 39, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.payload, Bytes::from("m39"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_a_failed_delete_left_behind_are_collected_and_the_two_newest_kept() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    b.create_topic("k", &SettingsInput::default())
        .await
        .unwrap();
    // Checkpoints come at the first write and then every 16 versions: 40 writes leave three
    // of which the committer kept the two newest. (The 41st write follows the 40th's
    // checkpoint, which is written after its produce is answered.)
    for i in 0..41 {
        b.produce("k", msg(&format!("m{i}"))).await.unwrap();
    }
    let prefix = keys::checkpoints_prefix("k", 0);
    let kept = store.list(&prefix).await.unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    // Deletes that failed: older checkpoints still there.
    let body = store.get(&kept[0]).await.unwrap().unwrap().data;
    for v in [1, 2] {
        store
            .put_if_absent(&keys::checkpoint("k", 0, v), body.clone())
            .await
            .unwrap();
    }
    let dry = maintenance::gc(&b, DEFAULT_GRACE, true).await.unwrap();
    assert_eq!(dry.checkpoints_deleted, 2, "{dry:?}");
    assert_eq!(
        store.list(&prefix).await.unwrap().len(),
        4,
        "a dry run deletes nothing"
    );
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.checkpoints_deleted, 2, "{g:?}");
    assert_eq!(store.list(&prefix).await.unwrap(), kept);
    let again = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(again.checkpoints_deleted, 0, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledgers_of_deleted_subscriptions_go_and_current_ones_stay() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    b.create_topic("subs", &SettingsInput::default())
        .await
        .unwrap();
    let input = narad_shared::subscription::SubscriptionInput::default();
    b.create_subscription("subs", "keep", &input).await.unwrap();
    let (_, t) = b.create_subscription("subs", "gone", &input).await.unwrap();
    let gone_id = t.subscription("gone").unwrap().id.clone();
    b.produce("subs", msg("m")).await.unwrap();
    for sub in ["keep", "gone"] {
        let d = b
            .consume_from("subs", Some(sub), None, Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(d.len(), 1, "{sub}");
    }
    let ledgers = || async {
        let mut k = store
            .list(&keys::subscriptions_prefix("subs"))
            .await
            .unwrap();
        k.sort();
        k
    };
    assert_eq!(ledgers().await.len(), 2);
    // An interrupted delete: the record is gone, its ledger left behind (written back
    // here as a commit that landed after the delete would have).
    let key = keys::subscription_ledger("subs", "gone", &gone_id, 0);
    let left = store.get(&key).await.unwrap().unwrap().data;
    b.delete_subscription("subs", "gone").await.unwrap();
    assert_eq!(ledgers().await.len(), 1, "the delete took its ledger");
    store.put_if_absent(&key, left).await.unwrap();
    // A new subscription of the same name starts afresh, under its own id.
    b.create_subscription("subs", "gone", &input).await.unwrap();
    b.produce("subs", msg("m2")).await.unwrap();
    let d = b
        .consume_from("subs", Some("gone"), None, Duration::ZERO, 9)
        .await
        .unwrap();
    let got: Vec<&[u8]> = d.iter().map(|d| &d.payload[..]).collect();
    assert_eq!(
        got,
        [b"m2"],
        "a new subscription starts at the latest offset"
    );
    let dry = maintenance::gc(&b, DEFAULT_GRACE, true).await.unwrap();
    assert_eq!(dry.subscription_ledgers_deleted, 1);
    assert_eq!(ledgers().await.len(), 3, "a dry run deletes nothing");
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.subscription_ledgers_deleted, 1);
    let left: Vec<String> = ledgers().await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|k| !k.contains(&gone_id)), "{left:?}");
    // The current subscriptions' ledgers still hold their leases.
    let t = b.topic("subs").await.unwrap();
    let keep = b.subscription_stats(&t, "keep").await.unwrap();
    assert_eq!(keep[0].in_flight, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_intents_go_after_the_grace_period_or_with_their_subscription() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    b.create_topic("li", &SettingsInput::default())
        .await
        .unwrap();
    let input = narad_shared::subscription::SubscriptionInput::default();
    let (_, t) = b.create_subscription("li", "keep", &input).await.unwrap();
    let keep = t.subscription("keep").unwrap().id.clone();
    let grace_ms = DEFAULT_GRACE.as_millis() as u64;
    let intent = |sub: &str, id: &str, written: u64| {
        let ask = narad_shared::stored::Ask::Lease {
            max: 1,
            max_bytes: 1,
        };
        let name = narad_shared::stored::Intent::id(written, "", "u1", ask);
        format!("{}{name}", keys::ledger_intents("li", sub, id, 0))
    };
    let old = intent("keep", &keep, T0 - grace_ms - 60_000);
    let young = intent("keep", &keep, T0 - 60_000);
    let orphan = intent("gone", "0190aaaa", T0 - 60_000);
    for k in [&old, &young, &orphan] {
        store.put_if_absent(k, Bytes::new()).await.unwrap();
    }
    let dry = maintenance::gc(&b, DEFAULT_GRACE, true).await.unwrap();
    assert_eq!(dry.ledger_intents_deleted, 2, "{dry:?}");
    let g = maintenance::gc(&b, DEFAULT_GRACE, false).await.unwrap();
    assert_eq!(g.ledger_intents_deleted, 2, "{g:?}");
    let left = store.list(&keys::subscriptions_prefix("li")).await.unwrap();
    assert_eq!(
        left,
        vec![young],
        "only the young intent of a live subscription stays"
    );
}

/// A fold's index object is written ahead of the commit that names it (by the queue's
/// chore beside an earlier commit): a pass with no grace period leaves an unnamed index
/// object until it is as old as a commit may name it (5 minutes), so a fold never names an
/// object that is gone (the seeded fault run's drain found offsets it could no longer read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_object_written_ahead_of_its_fold_is_not_an_orphan() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    b.create_topic("t", &SettingsInput::default())
        .await
        .unwrap();
    b.produce("t", msg("m0")).await.unwrap();
    // What the chore writes ahead of a fold: an index object no manifest names yet.
    let id = keys::segment_id(clock.now_ms(), "ahead");
    let key = keys::index("t", 0, &id);
    store
        .put_if_absent(&key, Bytes::from_static(b"an index"))
        .await
        .unwrap();
    clock.advance(4 * MIN);
    let report = maintenance::gc(&b, Duration::ZERO, false).await.unwrap();
    assert!(store.get(&key).await.unwrap().is_some(), "{report:?}");
    assert_eq!(report.orphans_kept, 1, "{report:?}");
    // Older than any commit may name it: an orphan.
    clock.advance(MIN + 1);
    let report = maintenance::gc(&b, Duration::ZERO, false).await.unwrap();
    assert!(store.get(&key).await.unwrap().is_none(), "{report:?}");
    assert_eq!(report.orphans_deleted, 1, "{report:?}");
    let m = b.replay("t", 0, 0, Duration::ZERO).await.unwrap();
    assert_eq!(m.map(|m| m.payload), Some(Bytes::from("m0")));
}
