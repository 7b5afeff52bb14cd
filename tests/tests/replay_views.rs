//! Replays in one process see that process's own writes at once, though replay keeps the
//! partition layouts it read (docs/design.md §4): a layout older than the newest manifest
//! version this process's committer answered from is not used.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, RandomIds, SystemClock};
use narad_shared::config::BrokerOptions;
use narad_shared::settings::SettingsInput;
use narad_shared::store::memory::MemoryStore;

fn msg(p: &str) -> NewMessage {
    NewMessage {
        partition: Some(0),
        key: None,
        payload: Bytes::from(p.to_owned()),
        idempotency_key: None,
        headers: Default::default(),
        delay_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_replays_its_own_writes_at_once() {
    let b = Broker::new(
        Arc::new(MemoryStore::new()),
        Arc::new(SystemClock) as Arc<dyn Clock>,
        Arc::new(RandomIds),
        vec![b"replay-views-test-receipt-key-0123456789".to_vec()],
        BrokerOptions::default(),
    )
    .await
    .unwrap();
    b.create_topic("r", &SettingsInput::parse(br#"{"partitions":1}"#).unwrap())
        .await
        .unwrap();
    assert_eq!(b.produce("r", msg("m0")).await.unwrap().offset, 0);
    let first = b.replay("r", 0, 0, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((&first.payload[..], first.delivery_count), (&b"m0"[..], 0));
    // The layout kept by that replay ends at offset 1; this process's next produce is
    // seen at once, well within the period a kept layout is otherwise trusted.
    assert_eq!(b.produce("r", msg("m1")).await.unwrap().offset, 1);
    let second = b.replay("r", 0, 1, Duration::ZERO).await.unwrap();
    assert_eq!(second.map(|d| d.payload), Some(Bytes::from("m1")));
    // A lease of this process shows in the delivery count a replay answers.
    let got = b.consume("r", Some(0), Duration::ZERO, 1).await.unwrap();
    assert_eq!(got[0].offset, 0);
    let again = b.replay("r", 0, 0, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(again.delivery_count, 1);
    let handle = got[0].receipt_handle.clone().unwrap();
    b.settle("r", &handle, Settle::Ack).await.unwrap();
    let settled = b.replay("r", 0, 0, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        &settled.payload[..],
        b"m0",
        "a settled offset still replays"
    );
}
