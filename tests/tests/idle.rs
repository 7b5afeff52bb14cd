//! What waiting consumers cost while nothing happens (docs/design.md §5, "Idle topics"),
//! with the default settings users run: 16 consumers long-polling a drained 4-partition
//! topic in one process share one round of conditional GETs per interval, and cost no
//! more than one does, and a message produced through
//! another process (a second broker on the same store) still reaches them within 5 s. On
//! the test store: the file store, or LocalStack in the S3 run (not through Lambda: it
//! counts one process's requests).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use narad_shared::broker::{Broker, NewMessage, Settle};
use narad_shared::clock::{Clock, RandomIds, SystemClock};
use narad_shared::config::BrokerOptions;
use narad_shared::settings::SettingsInput;
use narad_shared::store::metered::{Counts, MeteredStore, StoreOp};
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

/// A broker on the test store, counting its requests; `None` through Lambda (it counts
/// one process's requests).
async fn metered_broker() -> Option<(
    Arc<MeteredStore>,
    DynStore,
    Arc<Broker>,
    Option<tempfile::TempDir>,
)> {
    if narad_tests::external_url().is_some() {
        return None;
    }
    let (inner, dir) = narad_tests::test_store().await;
    let metered = MeteredStore::new(inner);
    let store: DynStore = metered.clone();
    let a = broker(store.clone()).await;
    Some((metered, store, a, dir))
}

/// `n` consumers long-polling `topic` until stopped; each sends what it gets (with when)
/// and acks it.
struct Waiters {
    stop: Arc<AtomicBool>,
    rx: tokio::sync::mpsc::UnboundedReceiver<(Instant, Bytes)>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl Waiters {
    fn spawn(a: &Arc<Broker>, topic: &'static str, n: usize) -> Self {
        Self::spawn_on(a, (topic, None), n)
    }

    /// As [`Waiters::spawn`], consuming the subscription `sub` (`None`: the default one).
    fn spawn_on(
        a: &Arc<Broker>,
        (topic, sub): (&'static str, Option<&'static str>),
        n: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let handles = (0..n)
            .map(|_| {
                let (a, stop, tx) = (a.clone(), stop.clone(), tx.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let got = a
                            .consume_from(topic, sub, None, Duration::from_secs(10), 10)
                            .await
                            .unwrap();
                        for d in got {
                            let _ = tx.send((Instant::now(), d.payload));
                            a.settle(topic, &d.receipt_handle.unwrap(), Settle::Ack)
                                .await
                                .unwrap();
                        }
                    }
                })
            })
            .collect();
        Self { stop, rx, handles }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.handles {
            w.abort();
            if let Err(e) = w.await {
                assert!(e.is_cancelled(), "a waiter failed: {e}");
            }
        }
    }
}

/// Produces to `topic` through a second broker on `store`: one of `waiters` must get it
/// within 5 s.
async fn news_through_another_process(store: &DynStore, topic: &str, waiters: &mut Waiters) {
    let b = broker(store.clone()).await;
    let sent = Instant::now();
    b.produce(topic, message("news")).await.unwrap();
    let (at, payload) = tokio::time::timeout(Duration::from_secs(10), waiters.rx.recv())
        .await
        .expect("an idle waiter never got the message")
        .unwrap();
    let latency = at.duration_since(sent);
    eprintln!("produced through another broker, delivered after {latency:?}");
    assert_eq!(payload, Bytes::from_static(b"news"));
    assert!(latency <= Duration::from_secs(5), "took {latency:?}");
}

/// Lets the watch's interval grow to its cap, then counts the requests of a steady
/// `stretch`; answers them and their rate per minute.
async fn steady(metered: &MeteredStore, stretch: Duration, what: &str) -> (Counts, f64) {
    tokio::time::sleep(Duration::from_secs(8)).await;
    let before = metered.counts();
    tokio::time::sleep(stretch).await;
    let used = metered.counts().since(&before);
    let per_minute = used.total() as f64 * 60.0 / stretch.as_secs_f64();
    eprintln!(
        "{what}: {} requests in {stretch:?} ({per_minute:.1}/min; {} lists, {} gets)",
        used.total(),
        used.op(StoreOp::List),
        used.gets()
    );
    (used, per_minute)
}

/// Dollars a month at S3 Standard prices, were `used` spent every `stretch`.
fn monthly(used: &Counts, stretch: Duration) -> f64 {
    used.s3_standard_dollars() * (30.0 * 86_400.0) / stretch.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_consumers_cost_under_3_25_a_month_however_many_and_still_get_news_within_5s() {
    let Some((metered, store, a, _dir)) = metered_broker().await else {
        return;
    };
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

    let stretch = Duration::from_secs(16);
    let one = Waiters::spawn(&a, "idle", 1);
    let (alone, _) = steady(&metered, stretch, "1 idle consumer, 4 partitions").await;
    one.stop().await;
    let mut waiters = Waiters::spawn(&a, "idle", 16);
    let what = "16 idle consumers, 4 partitions";
    let (used, _) = steady(&metered, stretch, what).await;
    let (one_costs, sixteen_cost) = (monthly(&alone, stretch), monthly(&used, stretch));
    eprintln!("a month at S3 Standard prices: ${one_costs:.2} for 1, ${sixteen_cost:.2} for 16");
    // A conditional GET of each manifest about every 1.5 s, topic.json every 4 s: $3.03.
    assert!(
        sixteen_cost <= 3.25,
        "idle consumers cost ${sixteen_cost:.2} a month ({used:?})"
    );
    assert!(
        sixteen_cost <= 1.5 * one_costs,
        "16 idle consumers cost ${sixteen_cost:.2} a month, 1 costs ${one_costs:.2}"
    );
    assert_eq!(used.puts(), 0, "an idle consume writes nothing");

    // News through another process: the waiters hear of it within one interval.
    news_through_another_process(&store, "idle", &mut waiters).await;

    waiters.stop().await;
}

/// An ordered topic whose next message waits behind its key's message in flight is as
/// quiet as a drained one: the committer remembers the keys it read, so a waiting consume
/// sees that nothing can be leased before the lease lapses without reading the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_behind_a_key_in_flight_costs_no_reads() {
    let Some((metered, _, a, _dir)) = metered_broker().await else {
        return;
    };
    let input =
        SettingsInput::parse(br#"{"ordering":"key","visibility_timeout_ms":120000}"#).unwrap();
    a.create_topic("held", &input).await.unwrap();
    for i in 0..3 {
        let m = NewMessage {
            key: Some("account-7".into()),
            ..message(&format!("m{i}"))
        };
        a.produce("held", m).await.unwrap();
    }
    let first = a.consume("held", None, Duration::ZERO, 1).await.unwrap();
    assert_eq!(first.len(), 1, "the key's first message");

    let mut waiters = Waiters::spawn(&a, "held", 4);
    let what = "4 consumers waiting behind a key";
    let stretch = Duration::from_secs(12);
    let (used, _) = steady(&metered, stretch, what).await;
    // The watch's conditional GETs only: no lease is tried, so nothing is written.
    assert_eq!(
        used.puts(),
        0,
        "a partition whose keys are known is not leased"
    );
    let cost = monthly(&used, stretch);
    assert!(cost <= 3.25, "${cost:.2} a month ({used:?})");

    assert!(
        waiters.rx.try_recv().is_err(),
        "delivered while its key was in flight"
    );

    // Acking the key's message lets the next one go at once.
    let handle = first[0].receipt_handle.clone().unwrap();
    a.settle("held", &handle, Settle::Ack).await.unwrap();
    let (_, next) = tokio::time::timeout(Duration::from_secs(2), waiters.rx.recv())
        .await
        .expect("the key's next message, once the first was acked")
        .unwrap();
    assert_eq!(next, Bytes::from_static(b"m1"));
    waiters.stop().await;
}

/// A named subscription's waiting consumers share the same watch, and skip a partition
/// whose manifest it shows unchanged while the subscription's ledger, as this process
/// knows it, offers nothing: they read the ledger (and the manifest) again only when that
/// knowledge is 4 s old, which bounds how late they see a nack made through another
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_idle_consumers_of_a_subscription_read_each_partition_only_every_few_seconds() {
    let Some((metered, store, a, _dir)) = metered_broker().await else {
        return;
    };
    let input = SettingsInput {
        partitions: Some(4),
        ..SettingsInput::default()
    };
    a.create_topic("fan-idle", &input).await.unwrap();
    let sub = narad_shared::subscription::SubscriptionInput::default();
    a.create_subscription("fan-idle", "audit", &sub)
        .await
        .unwrap();
    for i in 0..8 {
        a.produce("fan-idle", message(&format!("m{i}")))
            .await
            .unwrap();
    }
    let mut acked = 0;
    while acked < 8 {
        let got = a
            .consume_from("fan-idle", Some("audit"), None, Duration::ZERO, 100)
            .await
            .unwrap();
        for d in got {
            let handle = d.receipt_handle.unwrap();
            a.settle("fan-idle", &handle, Settle::Ack).await.unwrap();
            acked += 1;
        }
    }

    let mut waiters = Waiters::spawn_on(&a, ("fan-idle", Some("audit")), 16);
    let what = "16 idle consumers of a subscription, 4 partitions";
    let stretch = Duration::from_secs(16);
    let (used, _) = steady(&metered, stretch, what).await;
    // The watch's GETs ($2.77 a month), topic.json every 4 s, and per partition a ledger
    // and a manifest read about every 4 s: about 295 GETs a minute, $5.10 a month ($5.57
    // with a listing every 4 s instead, as before; $14 before the waiters skipped
    // partitions).
    let cost = monthly(&used, stretch);
    assert!(
        cost <= 5.5,
        "idle consumers of a subscription cost ${cost:.2} a month ({used:?})"
    );
    assert_eq!(used.puts(), 0, "an idle consume writes nothing");

    // News through another process reaches them within one interval.
    news_through_another_process(&store, "fan-idle", &mut waiters).await;

    waiters.stop().await;
}
