//! What waiting consumers cost while nothing happens (docs/design.md §5, "Idle topics"),
//! with the default settings users run: 16 consumers long-polling a drained 4-partition
//! topic in one process share one listing per interval, and a message produced through
//! another process (a second broker on the same store) still reaches them within 5 s. On
//! the test store: the file store, or LocalStack in the S3 run (not through Lambda: it
//! counts one process's requests).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, RandomIds, SystemClock};
use narad_shared::config::BrokerOptions;
use narad_shared::settings::SettingsInput;
use narad_shared::store::metered::MeteredStore;
use narad_shared::store::DynStore;

async fn broker(store: DynStore) -> Arc<Broker> {
    let key = vec![b"idle-test-receipt-key-0123456789".to_vec()];
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    Arc::new(
        Broker::new(
            store,
            clock,
            Arc::new(RandomIds),
            key,
            BrokerOptions::default(),
        )
        .await
        .unwrap(),
    )
}

fn message(text: &str) -> NewMessage {
    NewMessage {
        partition: None,
        key: None,
        payload: Bytes::from(text.to_owned()),
        idempotency_key: None,
        headers: Default::default(),
        delay_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_idle_consumers_cost_one_listing_per_interval_and_still_get_news_within_5s() {
    if narad_tests::external_url().is_some() {
        return;
    }
    let (inner, _dir) = narad_tests::test_store().await;
    let metered = MeteredStore::new(inner);
    let store: DynStore = metered.clone();
    let a = broker(store.clone()).await;
    let input = SettingsInput {
        partitions: Some(4),
        ..SettingsInput::default()
    };
    a.create_topic("idle", &input).await.unwrap();
    // Traffic first, so every manifest exists (the usual idle topic: drained, not new).
    for i in 0..8 {
        a.produce("idle", message(&format!("m{i}"))).await.unwrap();
    }
    let mut acked = 0;
    while acked < 8 {
        for d in a.consume("idle", None, Duration::ZERO, 100).await.unwrap() {
            let handle = d.receipt_handle.unwrap();
            a.settle("idle", &handle, Settle::Ack).await.unwrap();
            acked += 1;
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for _ in 0..16 {
        let (a, stop, tx) = (a.clone(), stop.clone(), tx.clone());
        waiters.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let got = a
                    .consume("idle", None, Duration::from_secs(10), 10)
                    .await
                    .unwrap();
                for d in got {
                    let _ = tx.send((Instant::now(), d.payload));
                    a.settle("idle", &d.receipt_handle.unwrap(), Settle::Ack)
                        .await
                        .unwrap();
                }
            }
        }));
    }
    // Let the listing interval grow to its cap, then count a steady stretch.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let before = metered.counts();
    let stretch = Duration::from_secs(16);
    tokio::time::sleep(stretch).await;
    let used = metered.counts().since(&before);
    let per_minute = used.total() as f64 * 60.0 / stretch.as_secs_f64();
    eprintln!(
        "16 idle consumers, 4 partitions: {} requests in {:?} ({per_minute:.1}/min; {} lists, {} gets)",
        used.total(),
        stretch,
        used.op("list"),
        used.gets()
    );
    assert!(
        per_minute <= 30.0,
        "idle consumers cost {per_minute:.1} requests a minute ({:?})",
        used.0
    );
    assert_eq!(used.gets(), 0, "an unchanged partition is not read");

    // News through another process: the waiters hear of it within one interval.
    let b = broker(store.clone()).await;
    let sent = Instant::now();
    b.produce("idle", message("news")).await.unwrap();
    let (at, payload) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an idle waiter never got the message")
        .unwrap();
    let latency = at.duration_since(sent);
    eprintln!("produced through another broker, delivered after {latency:?}");
    assert_eq!(payload, Bytes::from_static(b"news"));
    assert!(latency <= Duration::from_secs(5), "took {latency:?}");

    stop.store(true, Ordering::SeqCst);
    for w in waiters {
        w.abort();
        if let Err(e) = w.await {
            assert!(e.is_cancelled(), "a waiter failed: {e}");
        }
    }
}
