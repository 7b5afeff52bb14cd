//! Stores written by an earlier manifest format are read correctly: a copy of
//! `tests/fixtures/store-v1` (written by format 1, see its README) is opened with today's
//! code, and every message, lease, acked-ahead offset and idempotency key reads back as
//! written. New writes then carry on from it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, ManualClock, RandomIds};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::store;

/// Just after the fixture was written: its lease (deadline 1796039479185) and its
/// idempotency keys (window 5 min) are live.
const NOW: u64 = 1_796_039_460_000;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

async fn open_fixture(clock: &ManualClock) -> (Broker, tempfile::TempDir) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/store-v1");
    let dir = tempfile::tempdir().unwrap();
    for sub in ["system", "topics"] {
        copy_dir(&fixture.join(sub), &dir.path().join(sub));
    }
    let url = format!("file://{}", dir.path().display());
    let b = Broker::new(
        store::open(&url).await.unwrap(),
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        Arc::new(RandomIds),
        Vec::new(), // the receipt key stored in the fixture signs and verifies
        BrokerOptions::default(),
    )
    .await
    .unwrap();
    (b, dir)
}

fn handle() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/store-v1/HANDLE-offset-1.txt");
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_store_reads_back_as_written() {
    let clock = ManualClock::new(NOW);
    let (b, _dir) = open_fixture(&clock).await;
    let topic = b.topic("orders").await.unwrap();
    let stats = b.partition_stats(&topic).await.unwrap();
    let p0 = &stats[0];
    assert_eq!(
        (p0.start_offset, p0.frontier, p0.next_offset),
        (0, 1, 10),
        "{p0:?}"
    );
    assert_eq!((p0.in_flight, p0.acked_ahead, p0.available), (1, 1, 7));
    assert_eq!((stats[1].next_offset, stats[1].frontier), (3, 0));

    // Every message replays as written.
    for o in 0..10u64 {
        let d = b
            .replay("orders", 0, o, std::time::Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.payload, Bytes::from(format!("{{\"n\":{o}}}")));
    }
    let bin = b
        .replay("orders", 1, 2, std::time::Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (bin.payload.as_ref(), bin.key.as_deref()),
        (&[0u8, 0xff][..], Some("bin"))
    );

    // The idempotency keys are remembered: a retry appends nothing.
    let retry = NewMessage {
        partition: None,
        key: None,
        payload: Bytes::from_static(b"{\"n\":3}"),
        idempotency_key: Some("k3".into()),
        headers: Default::default(),
        delay_ms: 0,
    };
    let p = b.produce("orders", retry).await.unwrap();
    assert_eq!((p.partition, p.offset), (0, 3));

    // The lease on offset 1 is live: only its handle settles it, and the frontier then
    // moves over the acked-ahead offset 2.
    let got = b
        .consume("orders", Some(0), std::time::Duration::ZERO, 10)
        .await
        .unwrap();
    let offsets: Vec<u64> = got.iter().map(|d| d.offset).collect();
    assert_eq!(
        offsets,
        (3..10).collect::<Vec<_>>(),
        "1 is leased, 0 and 2 settled"
    );
    b.settle("orders", &handle(), Settle::Ack).await.unwrap();
    let again = b.settle("orders", &handle(), Settle::Ack).await;
    assert!(matches!(again, Err(BrokerError::LeaseGone)), "{again:?}");
    let topic = b.topic("orders").await.unwrap();
    let p0 = &b.partition_stats(&topic).await.unwrap()[0];
    assert_eq!((p0.frontier, p0.acked_ahead), (3, 0));

    // New writes carry on after the old ones.
    let p = b
        .produce(
            "orders",
            NewMessage {
                partition: Some(0),
                key: None,
                payload: Bytes::from_static(b"new"),
                idempotency_key: None,
                headers: Default::default(),
                delay_ms: 0,
            },
        )
        .await
        .unwrap();
    assert_eq!(p.offset, 10);
}
