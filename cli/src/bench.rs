//! `narad bench`: drives a real Narad HTTP server and reports throughput, latency and the
//! storage requests each message costs.
//!
//! The server runs in this process (the same router as `narad serve`) on 127.0.0.1, on
//! the store given by `--store`, wrapped in a request counter. Clients are real HTTP
//! connections. Phases run one after another so each one's storage requests are
//! attributed to it: produce N messages, consume N (leases held), ack N. Before them the
//! store's own serial compare-and-swap rate is measured, so every result can be read as a
//! ratio of what one partition's manifest can absorb.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_shared::api;
use narad_shared::clock::{IdSource, RandomIds, SystemClock};
use narad_shared::config::{Config, Credential};
use narad_shared::engine::Broker;
use narad_shared::store::metered::{Counts, MeteredStore};
use narad_shared::store::{self, DynStore, StoreError};

/// S3 Standard prices, dollars per request.
const PUT_PRICE: f64 = 0.005 / 1000.0;
const GET_PRICE: f64 = 0.0004 / 1000.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    pub store: String,
    pub messages: usize,
    pub connections: usize,
    pub partitions: u32,
    pub payload_bytes: usize,
    pub cas_ops: usize,
}

struct Phase {
    name: &'static str,
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    counts: Counts,
    errors: usize,
}

pub async fn run(args: BenchArgs) -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let inner = store::open(&args.store)
        .await
        .map_err(|e| format!("cannot open store {}: {e}", args.store))?;
    let metered = MeteredStore::new(inner);
    let store: DynStore = metered.clone();
    let cas_rate = serial_cas_rate(&store, args.cas_ops).await?;

    let broker = Broker::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        cfg.receipt_keys.clone(),
        cfg.broker.clone(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let users = [Credential {
        user: "bench".into(),
        password: "bench".into(),
    }];
    let app = api::router(Arc::new(broker), &users);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let topic = format!("bench-{}", RandomIds.new_id());
    let settings = serde_json::json!({
        "partitions": args.partitions,
        "visibility_timeout_ms": 600_000,
        "max_in_flight_per_partition": 10_000,
        "max_acked_ahead_per_partition": 10_000,
    });
    let r = http
        .put(format!("{base}/v1/topics/{topic}"))
        .basic_auth("bench", Some("bench"))
        .body(settings.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("create topic: {}", r.status()));
    }

    let payload = Bytes::from(format!(
        "{{\"pad\":\"{}\"}}",
        "x".repeat(args.payload_bytes.saturating_sub(10))
    ));
    let c = Client {
        http,
        base: base.clone(),
        topic: topic.clone(),
    };

    let produce = phase("produce", &metered, &args, {
        let c = c.clone();
        move |_| {
            let (c, payload) = (c.clone(), payload.clone());
            async move { c.produce(payload).await.map(|_| ()) }
        }
    })
    .await;

    let handles = Arc::new(std::sync::Mutex::new(Vec::with_capacity(args.messages)));
    let consume = phase("consume", &metered, &args, {
        let (c, handles) = (c.clone(), handles.clone());
        move |_| {
            let (c, handles) = (c.clone(), handles.clone());
            async move {
                let h = c.consume().await?;
                handles.lock().unwrap_or_else(|p| p.into_inner()).push(h);
                Ok(())
            }
        }
    })
    .await;

    let handles: Arc<Vec<String>> = Arc::new(std::mem::take(
        &mut *handles.lock().unwrap_or_else(|p| p.into_inner()),
    ));
    let ack = phase("ack", &metered, &args, {
        let (c, handles) = (c.clone(), handles.clone());
        move |i| {
            let (c, h) = (c.clone(), handles.get(i).cloned());
            async move {
                match h {
                    Some(h) => c.ack(&h).await,
                    None => Err("no handle".into()),
                }
            }
        }
    })
    .await;

    let _ = c
        .http
        .delete(format!("{base}/v1/topics/{topic}"))
        .basic_auth("bench", Some("bench"))
        .send()
        .await;
    server.abort();

    println!(
        "narad bench: store {} | {} messages of {} bytes | {} connection(s) | {} partition(s)",
        store.describe(),
        args.messages,
        payload_len(args.payload_bytes),
        args.connections,
        args.partitions
    );
    println!("store serial CAS rate: {cas_rate:.1} commits/s (one writer, read + conditional PUT per commit)");
    println!();
    println!(
        "{:<8} {:>9} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>10}",
        "phase",
        "msgs/s",
        "xCAS",
        "p50 ms",
        "p99 ms",
        "GET/msg",
        "PUT/msg",
        "412/msg",
        "req/msg",
        "errors",
        "$/M msgs"
    );
    let mut total = Counts::default();
    for p in [&produce, &consume, &ack] {
        print_phase(p, cas_rate);
        for i in 0..5 {
            for j in 0..5 {
                total.0[i][j] += p.counts.0[i][j];
            }
        }
    }
    let n = args.messages as f64;
    let dollars = (total.puts() as f64 * PUT_PRICE + total.gets() as f64 * GET_PRICE) / n * 1e6;
    println!();
    println!(
        "end to end (produce + consume + ack): {:.2} PUT/msg, {:.2} GET/msg, {:.2} requests/msg, ${dollars:.2} per million messages at S3 Standard prices",
        total.puts() as f64 / n,
        total.gets() as f64 / n,
        total.total() as f64 / n
    );
    Ok(())
}

fn payload_len(n: usize) -> usize {
    n.max(10)
}

fn print_phase(p: &Phase, cas_rate: f64) {
    let mut l = p.latencies.clone();
    l.sort();
    let pct = |q: f64| -> f64 {
        if l.is_empty() {
            return 0.0;
        }
        let i = ((l.len() as f64 * q).ceil() as usize).clamp(1, l.len()) - 1;
        l[i].as_secs_f64() * 1000.0
    };
    let rate = p.ops as f64 / p.elapsed.as_secs_f64().max(1e-9);
    let n = p.ops.max(1) as f64;
    let dollars =
        (p.counts.puts() as f64 * PUT_PRICE + p.counts.gets() as f64 * GET_PRICE) / n * 1e6;
    println!(
        "{:<8} {:>9.1} {:>7.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>10.2}",
        p.name,
        rate,
        rate / cas_rate.max(1e-9),
        pct(0.5),
        pct(0.99),
        p.counts.gets() as f64 / n,
        p.counts.puts() as f64 / n,
        p.counts.failed_puts() as f64 / n,
        p.counts.total() as f64 / n,
        p.errors,
        dollars
    );
}

/// Runs `op(i)` for i in 0..messages over `connections` concurrent workers.
async fn phase<F, Fut>(
    name: &'static str,
    metered: &Arc<MeteredStore>,
    args: &BenchArgs,
    op: F,
) -> Phase
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let before = metered.counts();
    let next = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.connections.max(1) {
        let (next, op, total) = (next.clone(), op.clone(), args.messages);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let t = Instant::now();
                if op(i).await.is_err() {
                    errors += 1;
                }
                lat.push(t.elapsed());
            }
            (lat, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            latencies.extend(l);
            errors += e;
        }
    }
    let elapsed = start.elapsed();
    Phase {
        name,
        ops: args.messages,
        elapsed,
        latencies,
        counts: metered.counts().since(&before),
        errors,
    }
}

/// Commits per second one writer gets from the store: read + conditional PUT, serially.
async fn serial_cas_rate(store: &DynStore, ops: usize) -> Result<f64, String> {
    let key = format!("bench/cas-{}", RandomIds.new_id());
    let mut etag = store
        .put_if_absent(&key, Bytes::from_static(b"0"))
        .await
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    for i in 0..ops {
        let _ = store.get(&key).await.map_err(|e| e.to_string())?;
        match store
            .put_if_match(&key, Bytes::from((i + 1).to_string()), &etag)
            .await
        {
            Ok(e) => etag = e,
            Err(StoreError::Conflict) => {
                return Err("unexpected conflict measuring the CAS rate".into())
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let rate = ops as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let _ = store.delete(&key).await;
    Ok(rate)
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    topic: String,
}

impl Client {
    async fn produce(&self, body: Bytes) -> Result<String, String> {
        let r = self
            .http
            .post(format!("{}/v1/topics/{}/produce", self.base, self.topic))
            .basic_auth("bench", Some("bench"))
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status().as_u16() != 201 {
            return Err(format!("produce: {}", r.status()));
        }
        r.text().await.map_err(|e| e.to_string())
    }

    async fn consume(&self) -> Result<String, String> {
        for _ in 0..100 {
            let r = self
                .http
                .get(format!("{}/v1/topics/{}/consume", self.base, self.topic))
                .basic_auth("bench", Some("bench"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            match r.status().as_u16() {
                200 => {
                    let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
                    return v["receipt_handle"]
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| "no handle".into());
                }
                204 | 503 => continue,
                s => return Err(format!("consume: {s}")),
            }
        }
        Err("consume: nothing after 100 tries".into())
    }

    async fn ack(&self, handle: &str) -> Result<(), String> {
        for _ in 0..100 {
            let r = self
                .http
                .post(format!("{}/v1/topics/{}/ack", self.base, self.topic))
                .query(&[("receipt_handle", handle)])
                .basic_auth("bench", Some("bench"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            match r.status().as_u16() {
                204 => return Ok(()),
                503 => continue,
                s => return Err(format!("ack: {s}")),
            }
        }
        Err("ack: still 503 after 100 tries".into())
    }
}
