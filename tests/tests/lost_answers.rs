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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
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
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
    let (r, p) = ledger_ack_after(PAST).await;
    assert!(
        matches!(r, Err(BrokerError::OutcomeUnknown(_))),
        "past the window: {r:?}"
    );
    let t = p.b.topic("t").await.unwrap();
    let s = &p.b.subscription_stats(&t, "s").await.unwrap()[0];
    assert_eq!((s.frontier, s.in_flight), (PAST / 2 + 1, 0), "{s:?}");
}

/// What A does while its answer is lost, in the seeded variant.
#[derive(Debug, Clone, Copy)]
enum Lost {
    Settle(Option<&'static str>, Settle),
    Consume,
    ProduceBatch,
}

/// The case above, seeded: a random operation of A (an ack, extend or nack in the
/// default subscription or a named one (an extend by 20 minutes: one that changes the
/// lease), a consume, a produce-batch), a random number of
/// commits through B (16 to 160: keyed and keyless produces, or leases and acks of the
/// named subscription) before A's recovery read, and every invariant checked after a
/// drain. `NARAD_FAULT_SEED=N` replays one seed.
#[tokio::test]
async fn seeded_lost_answers_then_many_commits_keep_every_invariant() {
    if narad_tests::skip_in_repeat("a memory store of its own that loses answers") {
        return;
    }
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let seeds: Vec<u64> = match std::env::var("NARAD_FAULT_SEED") {
        Ok(s) => vec![s.parse().expect("NARAD_FAULT_SEED must be a number")],
        Err(_) => (301..=324).collect(),
    };
    let ops = [
        Lost::Settle(None, Settle::Ack),
        Lost::Settle(None, Settle::ExtendFor(1_200_000)),
        Lost::Settle(None, Settle::Nack),
        Lost::Settle(Some("s"), Settle::Ack),
        Lost::Settle(Some("s"), Settle::ExtendFor(1_200_000)),
        Lost::Settle(Some("s"), Settle::Nack),
        Lost::Consume,
        Lost::ProduceBatch,
    ];
    let mut unknown = 0;
    for seed in seeds {
        let mut rng = StdRng::seed_from_u64(seed);
        let op = ops[rng.gen_range(0..ops.len())];
        let n: u64 = rng.gen_range(16..=160);
        let mut p = pair().await;
        p.b.produce("t", message("m0", Some("m0"))).await.unwrap();
        let group = match op {
            Lost::Settle(group, _) => group,
            _ => None,
        };
        if group.is_some() {
            for _ in 0..n {
                p.fill().await;
            }
        }
        let handle = match op {
            Lost::Settle(g, _) => {
                let d =
                    p.a.consume_from("t", g, None, Duration::ZERO, 1)
                        .await
                        .unwrap();
                assert_eq!(d[0].offset, 0);
                d[0].receipt_handle.clone()
            }
            _ => None,
        };
        let a = p.a.clone();
        let which: fn(&str) -> bool = if group.is_some() { ledger } else { manifest };
        // B's commits: produces on the manifest, leases and acks (two each) on a ledger.
        let commits = if group.is_some() { n / 2 } else { n };
        let b_got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let keyless = rng.gen_bool(0.5);
        let got = b_got.clone();
        let answer = p
            .lose(
                which,
                commits,
                async move {
                    match op {
                        Lost::Settle(_, action) => a
                            .settle("t", handle.as_deref().unwrap(), action)
                            .await
                            .map(|()| 0),
                        Lost::Consume => a
                            .consume_from("t", None, None, Duration::ZERO, 1)
                            .await
                            .map(|d| d.len()),
                        Lost::ProduceBatch => {
                            let batch =
                                vec![message("keyed", Some("k1")), message("keyless", None)];
                            let r = a.produce_batch("t", batch).await.unwrap();
                            r.into_iter().find_map(Result::err).map_or(Ok(2), Err)
                        }
                    }
                },
                move |p: &mut Pair| {
                    let got = got.clone();
                    Box::pin(async move {
                        if group.is_some() {
                            let d =
                                p.b.consume_from("t", group, None, Duration::ZERO, 1)
                                    .await
                                    .unwrap();
                            got.lock().unwrap().push((d[0].offset, d[0].delivery_count));
                            let h = d[0].receipt_handle.clone().unwrap();
                            p.b.settle("t", &h, Settle::Ack).await.unwrap();
                        } else if keyless {
                            p.filler += 1;
                            let name = format!("filler-{}", p.filler);
                            p.b.produce("t", message(&name, None)).await.unwrap();
                        } else {
                            p.fill().await;
                        }
                    })
                },
            )
            .await;
        let writes = if group.is_some() {
            commits * 2
        } else {
            commits
        };
        let ctx = format!("seed {seed}: {op:?} after {writes} commits: {answer:?}");
        match &answer {
            Ok(_) => {}
            // Only past the window (128 ids here; A's own write and B's stale first
            // attempt leave room for a few less).
            Err(BrokerError::OutcomeUnknown(_)) if writes >= 120 => unknown += 1,
            Err(_) => panic!("{ctx}"),
        }
        // Drain what B can still lease, then check.
        let mut drained = b_got.lock().unwrap().clone();
        loop {
            let d =
                p.b.consume_from("t", group, None, Duration::ZERO, 1)
                    .await
                    .unwrap();
            let Some(d) = d.into_iter().next() else { break };
            drained.push((d.offset, d.delivery_count));
            let h = d.receipt_handle.unwrap();
            p.b.settle("t", &h, Settle::Ack).await.unwrap();
        }
        let m0: Vec<_> = drained.iter().filter(|(o, _)| *o == 0).collect();
        match op {
            // Acked, or leased for another 10 minutes: never delivered again.
            Lost::Settle(_, Settle::Ack | Settle::ExtendFor(_)) | Lost::Consume => {
                assert!(m0.is_empty(), "{ctx}: m0 delivered again: {m0:?}")
            }
            // Given back once: delivered once more, its second delivery.
            Lost::Settle(_, _) => assert_eq!(m0, [&(0, 2)], "{ctx}"),
            Lost::ProduceBatch => {}
        }
        let payloads = p.payloads().await;
        for m in ["keyed", "keyless", "m0"] {
            let count = payloads.iter().filter(|p| *p == m).count();
            let want = usize::from(m == "m0" || matches!(op, Lost::ProduceBatch));
            assert_eq!(count, want, "{ctx}: {m} stored {count} times");
        }
        let mut offsets: Vec<u64> = drained.iter().map(|(o, _)| *o).collect();
        offsets.sort_unstable();
        let before = offsets.len();
        offsets.dedup();
        assert!(
            before == offsets.len() || matches!(op, Lost::Settle(_, Settle::Nack)),
            "{ctx}: an offset delivered twice"
        );
        println!("{ctx}");
    }
    println!("{unknown} answered 503, the outcome unknown");
}
