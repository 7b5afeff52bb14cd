//! Stores written by every earlier format read correctly with today's code. Each fixture
//! in `tests/fixtures/` was written by `narad serve` of an earlier commit following one
//! recipe (`tests/fixtures/make.sh`, `tests/fixtures/README.md`), so one check serves
//! them all, run once per fixture on a copy: every message, lease, acked-ahead offset and
//! idempotency key reads back as written, the old receipt handles ack (a live lease) or
//! answer 410 (a spent one), every unsettled message is delivered (again once its lease
//! lapses), settled ones are not, and new writes carry on after the old ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, ManualClock, RandomIds};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::store;
use serde_json::Value;

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

struct Fixture {
    dir: PathBuf,
    /// When the recipe ran: the lease on offset 1 (30 s) and the keys (5 min) are live
    /// a few seconds after.
    written_at_ms: u64,
    /// What the writing build had beyond the base recipe: `header`, `delay`.
    extras: Vec<String>,
}

impl Fixture {
    fn load(name: &str) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name);
        let meta: Value =
            serde_json::from_slice(&std::fs::read(dir.join("fixture.json")).unwrap()).unwrap();
        Self {
            written_at_ms: meta["written_at_ms"].as_u64().unwrap(),
            extras: meta["extras"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap().to_owned())
                .collect(),
            dir,
        }
    }

    fn has(&self, extra: &str) -> bool {
        self.extras.iter().any(|e| e == extra)
    }

    fn handle(&self, file: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        Some(text.trim().to_owned())
    }

    /// A broker of today's build on a copy of the fixture.
    async fn open(&self, clock: &ManualClock) -> (Broker, tempfile::TempDir) {
        let copy = tempfile::tempdir().unwrap();
        for sub in ["system", "topics"] {
            copy_dir(&self.dir.join(sub), &copy.path().join(sub));
        }
        let url = format!("file://{}", copy.path().display());
        let b = Broker::new(
            store::open(&url).await.unwrap(),
            Arc::new(clock.clone()) as Arc<dyn Clock>,
            Arc::new(RandomIds),
            Vec::new(), // the receipt key stored in the fixture signs and verifies
            BrokerOptions::default(),
        )
        .await
        .unwrap();
        (b, copy)
    }
}

fn message(partition: u32, payload: &'static [u8], key: Option<&str>) -> NewMessage {
    NewMessage {
        partition: Some(partition),
        key: None,
        payload: Bytes::from_static(payload),
        idempotency_key: key.map(str::to_owned),
        headers: Default::default(),
        delay_ms: 0,
    }
}

async fn offsets(b: &Broker, partition: u32) -> Vec<u64> {
    let got = b
        .consume("orders", Some(partition), Duration::ZERO, 50)
        .await
        .unwrap();
    got.iter().map(|d| d.offset).collect()
}

async fn reads_back_as_written(name: &str) {
    let f = Fixture::load(name);
    let clock = ManualClock::new(f.written_at_ms + 5_000);
    let (b, _copy) = f.open(&clock).await;
    let topic = b.topic("orders").await.unwrap();
    let stats = b.partition_stats(&topic).await.unwrap();
    let p0 = &stats[0];
    assert_eq!(
        (p0.start_offset, p0.frontier, p0.next_offset),
        (0, 1, 10),
        "{p0:?}"
    );
    assert_eq!((p0.in_flight, p0.acked_ahead, p0.available), (1, 1, 7));
    let extra = u64::from(f.has("header")) + u64::from(f.has("delay"));
    assert_eq!((stats[1].next_offset, stats[1].frontier), (3 + extra, 0));

    // Every message replays as written.
    for o in 0..10u64 {
        let d = b
            .replay("orders", 0, o, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.payload, Bytes::from(format!("{{\"n\":{o}}}")));
    }
    let bin = b
        .replay("orders", 1, 2, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (bin.payload.as_ref(), bin.key.as_deref()),
        (&[0u8, 0xff][..], Some("bin"))
    );
    if f.has("header") {
        let h = b
            .replay("orders", 1, 3, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h.headers.get("trace-id").map(String::as_str), Some("t-1"));
    }

    // The idempotency keys are remembered: a retry appends nothing.
    let p = b
        .produce("orders", message(0, b"{\"n\":3}", Some("k3")))
        .await
        .unwrap();
    assert_eq!((p.partition, p.offset), (0, 3));

    // Offset 1 is leased, 0 and 2 settled: the rest is delivered.
    assert_eq!(offsets(&b, 0).await, (3..10).collect::<Vec<_>>());
    // The old handles: the spent one is 410, the live one acks once.
    if let Some(spent) = f.handle("HANDLE-offset-0-acked.txt") {
        let r = b.settle("orders", &spent, Settle::Ack).await;
        assert!(matches!(r, Err(BrokerError::LeaseGone)), "{r:?}");
    }
    let live = f.handle("HANDLE-offset-1.txt").unwrap();
    b.settle("orders", &live, Settle::Ack).await.unwrap();
    let again = b.settle("orders", &live, Settle::Ack).await;
    assert!(matches!(again, Err(BrokerError::LeaseGone)), "{again:?}");
    let p0 = &b.partition_stats(&topic).await.unwrap()[0];
    assert_eq!((p0.frontier, p0.acked_ahead), (3, 0));

    // Partition 1: all but a delayed message, which comes when due.
    let now: Vec<u64> = (0..3 + u64::from(f.has("header"))).collect();
    assert_eq!(offsets(&b, 1).await, now);
    // Leases lapse (30 s): the unsettled messages come again, the settled ones do not.
    clock.advance(31_000);
    assert_eq!(offsets(&b, 0).await, (3..10).collect::<Vec<_>>());
    if f.has("delay") {
        clock.advance(3_660_000);
        let mut due = now.clone();
        due.push(4);
        assert_eq!(
            offsets(&b, 1).await,
            due,
            "the delayed message comes when due"
        );
    }

    // New writes carry on after the old ones.
    let p = b.produce("orders", message(0, b"new", None)).await.unwrap();
    assert_eq!(p.offset, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_store_reads_back_as_written() {
    reads_back_as_written("store-v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_2_store_reads_back_as_written() {
    reads_back_as_written("store-f2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_3_store_reads_back_as_written() {
    reads_back_as_written("store-f3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_format_4_store_of_layout_1_reads_back_as_written() {
    reads_back_as_written("store-f4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_build_before_the_gate_reads_back_as_written() {
    reads_back_as_written("store-c3661c8").await;
}
