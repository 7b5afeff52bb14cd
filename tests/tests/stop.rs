//! Stopping a broker (`Broker::stop`, docs/design.md §6 "Background work and stopping"):
//! no background task outlives it, and a stop in the middle of commits loses nothing a
//! caller was told had landed.
//!
//! Each case runs produces and subscription consumes on a store that answers every request
//! after a delay, stops the broker while their commits are in flight, and then checks,
//! through a second broker on the same store, that every produce answered with an offset
//! holds its payload there; that every other answer is a 503 (never a 500); that no task
//! is left; and that the stopped broker sends no storage request afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, RandomIds, SystemClock};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::settings::SettingsInput;
use narad_shared::store::latency::LatencyStore;
use narad_shared::store::memory::MemoryStore;
use narad_shared::store::metered::MeteredStore;
use narad_shared::store::DynStore;
use narad_shared::subscription::SubscriptionInput;

const PRODUCERS: usize = 24;
const CONSUMERS: usize = 4;

async fn broker(store: DynStore) -> Broker {
    let opts = BrokerOptions {
        // Renewals every 100 ms: a renewal left running would show within the check.
        process_ttl: Duration::from_millis(300),
        ..BrokerOptions::default()
    };
    let key = vec![b"stop-test-key-0123456789abcdef01".to_vec()];
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    Broker::new(store, clock, Arc::new(RandomIds), key, opts)
        .await
        .unwrap()
}

fn message(payload: Bytes) -> NewMessage {
    NewMessage {
        partition: None,
        key: None,
        payload,
        idempotency_key: None,
        headers: Default::default(),
        delay_ms: 0,
    }
}

/// A produce or a consume's answer: acceptable, or the error a stop may give.
fn stopped_answer(e: &BrokerError) {
    assert!(
        matches!(
            e,
            BrokerError::OutcomeUnknown(_) | BrokerError::Contention | BrokerError::Store(_)
        ),
        "a stop answered {e:?}, which is no 503"
    );
}

/// Runs the case with `grace` for commits in flight; answers how many produces landed.
async fn stop_mid_commit(grace: Duration) -> usize {
    let raw: DynStore = Arc::new(MemoryStore::new());
    let slow: DynStore = Arc::new(LatencyStore::new(raw.clone(), Duration::from_millis(15)));
    let counted = MeteredStore::new(slow);
    let a = Arc::new(broker(counted.clone()).await);
    let settings = SettingsInput::parse(br#"{"partitions":2}"#).unwrap();
    a.create_topic("t", &settings).await.unwrap();
    a.create_subscription("t", "s", &SubscriptionInput::default())
        .await
        .unwrap();
    // Something to lease, so that the subscription's ledger commits too.
    for i in 0..8 {
        a.produce("t", message(Bytes::from(format!("seed-{i}"))))
            .await
            .unwrap();
    }
    let mut produces = Vec::new();
    for i in 0..PRODUCERS {
        let a = a.clone();
        produces.push(tokio::spawn(async move {
            // Staggered, so that some are queued behind a commit in flight at the stop.
            tokio::time::sleep(Duration::from_millis(i as u64)).await;
            let payload = Bytes::from(format!("p-{i}"));
            (payload.clone(), a.produce("t", message(payload)).await)
        }));
    }
    let mut consumes = Vec::new();
    for _ in 0..CONSUMERS {
        let a = a.clone();
        consumes.push(tokio::spawn(async move {
            let got = a
                .consume_from("t", Some("s"), None, Duration::ZERO, 1)
                .await;
            if let Ok(ds) = &got {
                for d in ds {
                    let handle = d.receipt_handle.clone().unwrap();
                    if let Err(e) = a.settle("t", &handle, Settle::Ack).await {
                        stopped_answer(&e);
                    }
                }
            }
            got.map(|_| ())
        }));
    }
    // Into the middle of the commits.
    tokio::time::sleep(Duration::from_millis(40)).await;
    a.stop(grace).await;
    assert_eq!(a.background_tasks(), 0, "a task outlived the stop");
    let mut landed: HashMap<(u32, u64), Bytes> = HashMap::new();
    for p in produces {
        let (payload, r) = p.await.unwrap();
        match r {
            Ok(at) => {
                assert!(landed.insert((at.partition, at.offset), payload).is_none());
            }
            Err(e) => stopped_answer(&e),
        }
    }
    for c in consumes {
        if let Err(e) = c.await.unwrap() {
            stopped_answer(&e);
        }
    }
    // Nothing runs any more: no renewal, no refresh, no sweep reaches the store.
    let after_stop = counted.counts();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        counted.counts().since(&after_stop).total(),
        0,
        "the stopped broker still sends storage requests"
    );
    // A request after the stop gets a 503, never a 500 or a hang.
    let late = message(Bytes::from_static(b"late"));
    match tokio::time::timeout(Duration::from_secs(5), a.produce("t", late)).await {
        Ok(Ok(_)) | Err(_) => panic!("a produce after the stop was taken, or hung"),
        Ok(Err(e)) => stopped_answer(&e),
    }
    // Every produce answered with an offset holds its payload there.
    let b = broker(raw).await;
    for ((partition, offset), payload) in &landed {
        let d = b
            .replay("t", *partition, *offset, Duration::ZERO)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{partition}/{offset} was answered 201 and is missing"));
        assert_eq!(&d.payload, payload, "{partition}/{offset}");
    }
    b.stop(Duration::from_secs(1)).await;
    landed.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_lets_queued_commits_land_and_leaves_no_task() {
    let landed = stop_mid_commit(Duration::from_secs(10)).await;
    // With time to finish, every produce queued before the stop lands.
    assert_eq!(
        landed, PRODUCERS,
        "a queued produce was dropped by a graceful stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_that_cuts_commits_short_loses_nothing_acknowledged() {
    // No grace: commits in flight are aborted mid-write.
    let landed = stop_mid_commit(Duration::ZERO).await;
    assert!(
        landed < PRODUCERS,
        "the stop cut nothing short ({landed} landed)"
    );
}
