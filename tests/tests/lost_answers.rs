//! A write whose answer was lost is applied once, however many commits land before its
//! writer looks again (docs/design.md §3, "Lost-response recovery").
//!
//! Process A's next conditional write of a manifest (or of a subscription's ledger) is
//! applied and its answer lost, and A's recovery read is held while process B commits
//! `n` times to the same object ([`LostAnswerStore`]). Then:
//! * an ack through A that landed answers 204, never 410, and the message is settled
//!   once;
//! * a produce-batch through A of one keyed and one keyless message answers both, and
//!   the keyless message is stored once;
//! * a consume through A gets its message, and no lease is left on a message nobody got;
//! * when more commits land than the object remembers write ids for, A answers 503 (the
//!   outcome unknown) and still applies nothing twice.
//!
//! The manifest keeps at least 16 write ids (every one of the last 10 s, at most 128):
//! before that, a writer past 16 commits took its landed write for lost and applied it
//! again. Ids in these tests carry no time, so the window is its upper bound, 128.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, ManualClock, SequentialIds};
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::settings::SettingsInput;
use narad_shared::store::memory::MemoryStore;
use narad_shared::store::testing::lost::LostAnswerStore;
use narad_shared::store::DynStore;
use narad_shared::subscription::SubscriptionInput;

/// Commits within the window, and past it.
const WITHIN: [u64; 3] = [16, 24, 64];
const PAST: u64 = 200;

struct Pair {
    lost: Arc<LostAnswerStore>,
    a: Arc<Broker>,
    b: Broker,
    filler: u64,
}

async fn pair() -> Pair {
    let raw: DynStore = Arc::new(MemoryStore::new());
    let lost = LostAnswerStore::new(raw.clone());
    let clock = ManualClock::new(1_000_000);
    let ids = Arc::new(SequentialIds::default());
    let key = vec![b"lost-answer-test-key-0123456789ab".to_vec()];
    let opts = BrokerOptions::default();
    let broker = |store: DynStore| {
        let (clock, ids, key, opts) = (clock.clone(), ids.clone(), key.clone(), opts.clone());
        async move {
            Broker::new(store, Arc::new(clock) as Arc<dyn Clock>, ids, key, opts)
                .await
                .unwrap()
        }
    };
    let b = broker(raw).await;
    let a = Arc::new(broker(lost.clone()).await);
    let settings =
        SettingsInput::parse(br#"{"partitions":1,"visibility_timeout_ms":600000}"#).unwrap();
    b.create_topic("t", &settings).await.unwrap();
    b.create_subscription("t", "s", &SubscriptionInput::default())
        .await
        .unwrap();
    Pair {
        lost,
        a,
        b,
        filler: 0,
    }
}

fn message(payload: &str, key: Option<&str>) -> NewMessage {
    NewMessage {
        partition: None,
        key: None,
        payload: Bytes::from(payload.to_owned()),
        idempotency_key: key.map(str::to_owned),
        headers: Default::default(),
        delay_ms: 0,
    }
}

fn manifest(key: &str) -> bool {
    key.ends_with(".manifest.json")
}

fn ledger(key: &str) -> bool {
    key.contains("/subs/") && key.ends_with(".json")
}

impl Pair {
    /// A filler message through B (with an idempotency key: one ordinary commit each).
    async fn fill(&mut self) {
        self.filler += 1;
        let name = format!("filler-{}", self.filler);
        self.b
            .produce("t", message(&name, Some(&name)))
            .await
            .unwrap();
    }

    /// Runs `op` on A with the answer to its next write of an object `which` accepts
    /// lost, and `n` commits through B (`commit`) before A's recovery read.
    async fn lose<T: Send + 'static>(
        &mut self,
        which: fn(&str) -> bool,
        n: u64,
        op: impl std::future::Future<Output = T> + Send + 'static,
        mut commit: impl FnMut(
            &mut Self,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>,
    ) -> T {
        self.lost.lose_next_write(which);
        let task = tokio::spawn(op);
        tokio::time::timeout(Duration::from_secs(20), self.lost.holding())
            .await
            .expect("A's write lost its answer and A read again");
        for _ in 0..n {
            commit(self).await;
        }
        self.lost.release();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("A answered")
            .unwrap()
    }

    /// Every payload the partition holds, by replay.
    async fn payloads(&self) -> Vec<String> {
        let t = self.b.topic("t").await.unwrap();
        let next = self.b.partition_stats(&t).await.unwrap()[0].next_offset;
        let mut out = Vec::new();
        for o in 0..next {
            if let Some(d) = self.b.replay("t", 0, o, Duration::ZERO).await.unwrap() {
                out.push(String::from_utf8(d.payload.to_vec()).unwrap());
            }
        }
        out
    }
}

fn fill(p: &mut Pair) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>> {
    Box::pin(p.fill())
}

/// A leases `m0`, then acks it with the answer lost and `n` produces through B before
/// it looks again.
async fn ack_after(n: u64) -> (Result<(), BrokerError>, Pair) {
    let mut p = pair().await;
    p.b.produce("t", message("m0", Some("m0"))).await.unwrap();
    let d =
        p.a.consume_from("t", None, None, Duration::ZERO, 1)
            .await
            .unwrap();
    let handle = d[0].receipt_handle.clone().unwrap();
    let a = p.a.clone();
    let r = p
        .lose(
            manifest,
            n,
            async move { a.settle("t", &handle, Settle::Ack).await },
            fill,
        )
        .await;
    (r, p)
}

#[tokio::test]
async fn a_landed_ack_answers_204_however_many_commits_land_before_the_writer_looks() {
    for n in WITHIN {
        let (r, p) = ack_after(n).await;
        assert!(r.is_ok(), "n = {n}: a landed ack answered {r:?}");
        let t = p.b.topic("t").await.unwrap();
        let s = &p.b.partition_stats(&t).await.unwrap()[0];
        assert_eq!((s.frontier, s.in_flight), (1, 0), "n = {n}: {s:?}");
    }
}

#[tokio::test]
async fn an_ack_past_the_window_answers_503_and_is_applied_once() {
    let (r, p) = ack_after(PAST).await;
    assert!(
        matches!(r, Err(BrokerError::OutcomeUnknown(_))),
        "past the window: {r:?}"
    );
    let t = p.b.topic("t").await.unwrap();
    let s = &p.b.partition_stats(&t).await.unwrap()[0];
    assert_eq!((s.frontier, s.in_flight), (1, 0), "{s:?}");
}

/// A produce-batch of one keyed and one keyless message through A, with the answer
/// lost and `n` produces through B before A looks again.
async fn batch_after(n: u64) -> (Vec<Result<u64, BrokerError>>, Vec<String>) {
    let mut p = pair().await;
    let a = p.a.clone();
    let r = p
        .lose(
            manifest,
            n,
            async move {
                let batch = vec![message("keyed", Some("k1")), message("keyless", None)];
                a.produce_batch("t", batch).await.unwrap()
            },
            fill,
        )
        .await;
    let offsets = r.into_iter().map(|r| r.map(|p| p.offset)).collect();
    (offsets, p.payloads().await)
}

#[tokio::test]
async fn a_landed_produce_batch_stores_its_keyless_message_once() {
    for n in WITHIN {
        let (r, payloads) = batch_after(n).await;
        assert!(r.iter().all(Result::is_ok), "n = {n}: {r:?}");
        for m in ["keyed", "keyless"] {
            let count = payloads.iter().filter(|p| *p == m).count();
            assert_eq!(count, 1, "n = {n}: {m} stored {count} times");
        }
        // Answered with the offsets it holds.
        assert_eq!(payloads[r[0].clone().unwrap() as usize], "keyed");
        assert_eq!(payloads[r[1].clone().unwrap() as usize], "keyless");
    }
}

#[tokio::test]
async fn a_produce_batch_past_the_window_answers_503_and_stores_nothing_twice() {
    let (r, payloads) = batch_after(PAST).await;
    assert!(
        r.iter()
            .all(|r| matches!(r, Err(BrokerError::OutcomeUnknown(_)))),
        "{r:?}"
    );
    for m in ["keyed", "keyless"] {
        let count = payloads.iter().filter(|p| *p == m).count();
        assert_eq!(count, 1, "{m} stored {count} times");
    }
}

#[tokio::test]
async fn a_landed_consume_gets_its_message_and_leaves_no_other_lease() {
    for n in WITHIN {
        let mut p = pair().await;
        p.b.produce("t", message("m0", Some("m0"))).await.unwrap();
        let a = p.a.clone();
        let got = p
            .lose(
                manifest,
                n,
                async move { a.consume_from("t", None, None, Duration::ZERO, 1).await },
                fill,
            )
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "n = {n}");
        assert_eq!((got[0].offset, got[0].delivery_count), (0, 1), "n = {n}");
        let t = p.b.topic("t").await.unwrap();
        let s = &p.b.partition_stats(&t).await.unwrap()[0];
        assert_eq!(s.in_flight, 1, "n = {n}: one lease, the one A handed out");
    }
}

/// B leases and acks a filler message of the subscription: two ledger commits.
fn lease_and_ack(p: &mut Pair) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>> {
    Box::pin(async move {
        let d =
            p.b.consume_from("t", Some("s"), None, Duration::ZERO, 1)
                .await
                .unwrap();
        let h = d[0].receipt_handle.clone().unwrap();
        p.b.settle("t", &h, Settle::Ack).await.unwrap();
    })
}

/// A leases `m0` in subscription `s`, then acks it with the answer to the ledger write
/// lost and `2 n` ledger commits through B before it looks again.
async fn ledger_ack_after(n: u64) -> (Result<(), BrokerError>, Pair) {
    let mut p = pair().await;
    p.b.produce("t", message("m0", Some("m0"))).await.unwrap();
    for _ in 0..n {
        p.fill().await;
    }
    let d =
        p.a.consume_from("t", Some("s"), None, Duration::ZERO, 1)
            .await
            .unwrap();
    let handle = d[0].receipt_handle.clone().unwrap();
    let a = p.a.clone();
    let r = p
        .lose(
            ledger,
            n / 2,
            async move { a.settle("t", &handle, Settle::Ack).await },
            lease_and_ack,
        )
        .await;
    (r, p)
}

#[tokio::test]
async fn a_landed_ack_in_a_subscription_answers_204() {
    for n in WITHIN {
        let (r, p) = ledger_ack_after(n).await;
        assert!(r.is_ok(), "n = {n}: a landed ack answered {r:?}");
        let t = p.b.topic("t").await.unwrap();
        let s = &p.b.subscription_stats(&t, "s").await.unwrap()[0];
        assert_eq!((s.frontier, s.in_flight), (n / 2 + 1, 0), "n = {n}: {s:?}");
    }
}

#[tokio::test]
async fn an_ack_in_a_subscription_past_the_window_answers_503_and_is_applied_once() {
    let (r, p) = ledger_ack_after(PAST).await;
    assert!(
        matches!(r, Err(BrokerError::OutcomeUnknown(_))),
        "past the window: {r:?}"
    );
    let t = p.b.topic("t").await.unwrap();
    let s = &p.b.subscription_stats(&t, "s").await.unwrap()[0];
    assert_eq!((s.frontier, s.in_flight), (PAST / 2 + 1, 0), "{s:?}");
}
