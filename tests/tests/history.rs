//! A partition's history outside its manifest (manifest format 2): older segments move
//! into index objects and idempotency keys into chunk objects on the commit path, so the
//! manifest stays small; replay, dedup, retention and garbage collection keep working
//! through them, from a fresh process too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, ManualClock, RandomIds};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::maintenance;
use narad_shared::settings::SettingsInput;
use narad_shared::store::DynStore;
use narad_tests::{test_store, T0};

async fn broker(store: DynStore, clock: &ManualClock) -> Arc<Broker> {
    let b = Broker::new(
        store,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        Arc::new(RandomIds),
        vec![b"history-test-receipt-key-0123".to_vec()],
        BrokerOptions::default(),
    )
    .await
    .unwrap();
    Arc::new(b)
}

fn msg(payload: String, key: Option<String>) -> NewMessage {
    NewMessage {
        partition: Some(0),
        key: None,
        payload: Bytes::from(payload),
        idempotency_key: key,
        headers: Default::default(),
        delay_ms: 0,
    }
}

async fn produce_concurrently(b: &Arc<Broker>, n: usize, keyed: bool) -> Vec<u64> {
    let mut tasks = Vec::new();
    for w in 0..8 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in (w..n).step_by(8) {
                let key = keyed.then(|| format!("key-{i}"));
                let p = b.produce("h", msg(format!("m{i}"), key)).await.unwrap();
                got.push((i, p.offset));
            }
            got
        }));
    }
    let mut offsets = vec![0; n];
    for t in tasks {
        for (i, o) in t.await.unwrap() {
            offsets[i] = o;
        }
    }
    offsets
}

async fn stats(b: &Broker) -> narad_shared::broker::PartitionStats {
    let t = b.load_topic("h").await.unwrap();
    b.partition_stats(&t).await.unwrap().remove(0)
}

async fn replay(b: &Broker, o: u64) -> Result<Option<Bytes>, BrokerError> {
    let d = b.replay("h", 0, o, Duration::ZERO).await?;
    Ok(d.map(|d| d.payload))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_history_lives_in_index_objects_and_stays_readable() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    let input: SettingsInput = serde_json::from_str(r#"{"retention_ms":3600000}"#).unwrap();
    b.create_topic("h", &input).await.unwrap();
    let n = 1500;
    let offsets = produce_concurrently(&b, n, false).await;
    let s = stats(&b).await;
    println!("after {n} produces: {s:?}");
    assert_eq!(s.next_offset, n as u64);
    assert!(
        s.indexes > 0,
        "older segments were folded into indexes: {s:?}"
    );
    assert!(s.manifest_bytes < 16 * 1024, "{s:?}");

    // A fresh process finds every message through the indexes.
    let fresh = broker(store.clone(), &clock).await;
    for i in [0, 1, n / 2, n - 1] {
        let got = replay(&fresh, offsets[i]).await.unwrap();
        assert_eq!(
            got,
            Some(Bytes::from(format!("m{i}"))),
            "offset {}",
            offsets[i]
        );
    }

    // Consume the backlog from the oldest offset up, through another fresh process.
    let consumer = broker(store.clone(), &clock).await;
    let mut seen = 0;
    loop {
        let got = consumer
            .consume("h", None, Duration::ZERO, 100)
            .await
            .unwrap();
        if got.is_empty() {
            break;
        }
        for d in got {
            assert_eq!(d.offset, seen as u64, "lowest offsets first");
            let h = d.receipt_handle.unwrap();
            consumer.settle("h", &h, Settle::Ack).await.unwrap();
            seen += 1;
        }
    }
    assert_eq!(seen, n);

    // A reader keeps the layouts it replayed from (every offset is settled now).
    let reader = broker(store.clone(), &clock).await;
    for i in [0, n - 1] {
        assert!(replay(&reader, offsets[i]).await.unwrap().is_some());
    }
    // Garbage collection with no grace at all keeps everything the manifest names. The
    // first pass compacts the hot segments, the second deletes the ones it replaced.
    let report = maintenance::gc(&b, Duration::ZERO, false).await.unwrap();
    println!("gc: {report:?}");
    assert!(report.segments_compacted > 0, "{report:?}");
    clock.advance(1);
    let report = maintenance::gc(&b, Duration::ZERO, false).await.unwrap();
    println!("gc: {report:?}");
    assert!(report.orphans_deleted > 0, "{report:?}");
    // The reader's kept layout names deleted segments now: reading one it has not cached,
    // it reads the manifest afresh rather than answer 410.
    for i in (0..n).rev().step_by(7).take(40) {
        let got = replay(&reader, offsets[i]).await.unwrap();
        assert_eq!(
            got,
            Some(Bytes::from(format!("m{i}"))),
            "offset {}",
            offsets[i]
        );
    }
    let after_gc = broker(store.clone(), &clock).await;
    for i in [0, n / 3, n - 1] {
        assert!(replay(&after_gc, offsets[i]).await.unwrap().is_some());
    }

    // Retention drops whole indexes; their objects go.
    let before = store.list("topics/h/0/").await.unwrap().len();
    clock.advance(2 * 3_600_000);
    maintenance::gc(&b, Duration::ZERO, false).await.unwrap();
    let left = store.list("topics/h/0/").await.unwrap();
    assert!(
        left.len() < 5,
        "{} of {before} objects left: {left:?}",
        left.len()
    );
    let expired = replay(&after_gc, 0).await;
    assert!(
        matches!(expired, Err(BrokerError::OffsetExpired(0))),
        "{expired:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_keys_spill_into_chunks_and_still_deduplicate() {
    let (store, _dir) = test_store().await;
    let clock = ManualClock::new(T0);
    let b = broker(store.clone(), &clock).await;
    b.create_topic("h", &SettingsInput::default())
        .await
        .unwrap();
    let n = 700;
    let first = produce_concurrently(&b, n, true).await;
    let s = stats(&b).await;
    println!("after {n} keyed produces: {s:?}");
    assert!(
        s.manifest_bytes < 24 * 1024,
        "keys spilled out of the manifest: {s:?}"
    );
    // Retries, from this process and from a fresh one, append nothing.
    let again = produce_concurrently(&b, n, true).await;
    assert_eq!(again, first);
    let fresh = broker(store.clone(), &clock).await;
    let retry = produce_concurrently(&fresh, n, true).await;
    assert_eq!(retry, first);
    assert_eq!(stats(&b).await.next_offset, n as u64);

    // After the window the keys are forgotten, and their chunks deleted.
    clock.advance(5 * 60_000 + 1);
    let p = b
        .produce("h", msg("late".into(), Some("key-0".into())))
        .await
        .unwrap();
    assert_eq!(p.offset, n as u64, "a key past its window is new again");
    // (They are deleted right after the commit is answered.)
    let mut chunks = store.list("topics/h/0/dedup/").await.unwrap();
    for _ in 0..50 {
        if chunks.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        chunks = store.list("topics/h/0/dedup/").await.unwrap();
    }
    assert!(chunks.is_empty(), "expired chunks are deleted: {chunks:?}");
}
