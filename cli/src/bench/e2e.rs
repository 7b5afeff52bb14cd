//! `narad bench --e2e`: how long a message takes from its producer to a consumer waiting
//! on another process, the shape every message has behind Lambda (docs/design.md §5).
//!
//! Producers send through the first half of the `--processes` (rounded down, at least
//! one); `--connections` consumers per process long-poll (`wait=10s`) on the others, and
//! ack what they get. Every payload carries its send time, taken in this process, so
//! produce-sent → consume-answered needs no shared clock. Three phases:
//!
//! 1. **sparse**: `--e2e-sparse` messages, one every `--e2e-gap-ms`, the consumers idle
//!    in between (what a quiet queue's next message waits);
//! 2. **steady**: `--e2e-rate` messages a second for `--e2e-seconds` (open loop: sent on
//!    schedule whatever the answers);
//! 3. **idle**: nothing sent for `--e2e-idle-seconds` while the consumers wait: what
//!    waiting costs in storage requests.
//!
//! Each phase prints the end-to-end p50 / p90 / p99 / max, the produce latency, how busy
//! the consumers were (the share of consume requests that found a message, and of their
//! time spent between a message and their next wait), and storage requests by kind per
//! message (per second for idle).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_client::{ConsumeOptions, ProduceOptions};
use narad_shared::store::metered::{Counts, StoreOp};
use tokio::time::Instant;

use super::phase::Combining;
use super::report::{percentile_ms, print_combining};
use super::{Bench, BenchArgs};

/// How long a consume waits.
const WAIT: Duration = Duration::from_secs(10);

/// What the consumers saw and did, over the whole run.
#[derive(Default)]
struct Seen {
    /// End-to-end latency of each message by id, first delivery only.
    latency: Mutex<Vec<Option<Duration>>>,
    /// Consume requests answered with a message, and without.
    hits: AtomicUsize,
    misses: AtomicUsize,
    /// Microseconds consumers spent between a message and their next consume.
    busy_us: AtomicUsize,
    /// Deliveries of a message already delivered once.
    again: AtomicUsize,
    errors: AtomicUsize,
}

/// One phase's figures.
struct Figures {
    name: &'static str,
    messages: usize,
    elapsed: Duration,
    e2e: Vec<Duration>,
    produce: Vec<Duration>,
    missing: usize,
    hits: usize,
    misses: usize,
    busy: Duration,
    counts: Counts,
    /// How the phase's batches combined across processes.
    combining: Combining,
    cpu: Option<f64>,
}

/// Runs the three phases and prints them.
///
/// Errors: too few processes, or a server's metrics failing.
pub(super) async fn run(b: &Bench, args: &BenchArgs) -> Result<(), String> {
    let k = b.servers.bases.len();
    if k < 2 {
        return Err("--e2e needs --processes 2 or more (producers and consumers apart)".into());
    }
    let producers = (k / 2).max(1);
    let consumer_count = args.connections.max(1) * (k - producers);
    let total = args.e2e_sparse + steady_messages(args);
    let seen = Arc::new(Seen {
        latency: Mutex::new(vec![None; total]),
        ..Seen::default()
    });
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let consumers: Vec<_> = (0..consumer_count)
        .map(|i| {
            let api = b.clients[0].servers[producers + i % (k - producers)].clone();
            let (topic, seen, stop) = (b.topic.clone(), seen.clone(), stop.clone());
            tokio::spawn(consumer(api, topic, start, seen, stop))
        })
        .collect();
    // Let every consumer reach its first wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut phases = Vec::new();
    let gap = Duration::from_millis(args.e2e_gap_ms);
    phases.push(
        send_phase(
            b,
            "sparse",
            0..args.e2e_sparse,
            gap,
            producers,
            start,
            &seen,
        )
        .await?,
    );
    let rate = args.e2e_rate.max(0.001);
    let steady = args.e2e_sparse..total;
    let every = Duration::from_secs_f64(1.0 / rate);
    phases.push(send_phase(b, "steady", steady, every, producers, start, &seen).await?);
    phases.push(idle_phase(b, args, &seen).await?);
    stop.store(true, Ordering::Relaxed);
    for c in consumers {
        c.abort();
    }
    print(b, args, producers, consumer_count, &phases, &seen);
    let missing: usize = phases.iter().map(|p| p.missing).sum();
    let errors = seen.errors.load(Ordering::Relaxed);
    if missing > 0 || errors > 0 {
        return Err(format!(
            "{missing} messages never reached a consumer, {errors} requests failed"
        ));
    }
    Ok(())
}

fn steady_messages(args: &BenchArgs) -> usize {
    (args.e2e_rate * args.e2e_seconds as f64).round() as usize
}

/// A consumer: waits for a message, records its latency, acks it, and waits again.
async fn consumer(
    api: narad_client::Client,
    topic: String,
    start: Instant,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) {
    let opts = ConsumeOptions {
        wait: Some(WAIT),
        ..ConsumeOptions::default()
    };
    while !stop.load(Ordering::Relaxed) {
        let got = match api.consume(&topic, &opts).await {
            Ok(got) => got,
            Err(e) => {
                if !matches!(e.status().map(|s| s.as_u16()), Some(503 | 429)) {
                    seen.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("narad bench: e2e consume: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let answered = start.elapsed();
        let Some(m) = got.into_iter().next() else {
            seen.misses.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        seen.hits.fetch_add(1, Ordering::Relaxed);
        if let Some((id, sent)) = stamp_of(m.payload.get()) {
            let mut lat = seen.latency.lock().unwrap_or_else(|p| p.into_inner());
            match lat.get_mut(id) {
                Some(slot @ None) => *slot = Some(answered.saturating_sub(sent)),
                Some(Some(_)) => {
                    seen.again.fetch_add(1, Ordering::Relaxed);
                }
                None => {}
            }
        }
        if let Some(h) = m.receipt_handle {
            for _ in 0..50 {
                match api.ack(&topic, &h).await {
                    Err(e) if matches!(e.status().map(|s| s.as_u16()), Some(503 | 429)) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    _ => break,
                }
            }
        }
        let busy = start.elapsed().saturating_sub(answered);
        seen.busy_us
            .fetch_add(busy.as_micros() as usize, Ordering::Relaxed);
    }
}

/// The id and send time (since `start`) a payload carries.
fn stamp_of(payload: &str) -> Option<(usize, Duration)> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    let id = usize::try_from(v.get("id")?.as_u64()?).ok()?;
    let sent = Duration::from_micros(v.get("sent_us")?.as_u64()?);
    Some((id, sent))
}

/// Sends the messages `ids`, one every `every`, through the producer processes in turn,
/// then waits until each reached a consumer (at most 30 s after the last was sent).
async fn send_phase(
    b: &Bench,
    name: &'static str,
    ids: std::ops::Range<usize>,
    every: Duration,
    producers: usize,
    start: Instant,
    seen: &Arc<Seen>,
) -> Result<Figures, String> {
    let before = b.servers.snapshot().await?;
    let (hits, misses, busy) = consumer_counts(seen);
    let began = Instant::now();
    let produce_latency = Arc::new(Mutex::new(Vec::new()));
    let mut sends = Vec::new();
    for (n, id) in ids.clone().enumerate() {
        tokio::time::sleep_until(began + every * n as u32).await;
        let api = b.clients[0].servers[id % producers].clone();
        let topic = b.topic.clone();
        let lat = produce_latency.clone();
        let pad = "x".repeat(b.payload.len().saturating_sub(40));
        sends.push(tokio::spawn(async move {
            let sent = start.elapsed();
            let payload = format!(
                r#"{{"id":{id},"sent_us":{},"pad":"{pad}"}}"#,
                sent.as_micros()
            );
            send_one(&api, &topic, payload, &lat).await
        }));
    }
    for s in sends {
        s.await.map_err(|e| e.to_string())??;
    }
    let sent_all = Instant::now();
    let arrived = |seen: &Seen| {
        let lat = seen.latency.lock().unwrap_or_else(|p| p.into_inner());
        ids.clone().filter(|&i| lat[i].is_some()).count()
    };
    while arrived(seen) < ids.len() && sent_all.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = began.elapsed();
    let used = b.servers.snapshot().await?.since(&before);
    let (hits2, misses2, busy2) = consumer_counts(seen);
    let e2e: Vec<Duration> = {
        let lat = seen.latency.lock().unwrap_or_else(|p| p.into_inner());
        ids.clone().filter_map(|i| lat[i]).collect()
    };
    let produce = std::mem::take(&mut *produce_latency.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(Figures {
        name,
        messages: ids.len(),
        elapsed,
        missing: ids.len() - e2e.len(),
        e2e,
        produce,
        hits: hits2 - hits,
        misses: misses2 - misses,
        busy: busy2.saturating_sub(busy),
        counts: used.counts,
        combining: Combining::of(&used),
        cpu: used.cpu,
    })
}

/// Produces `payload` to `topic` through `api`, again after a 503 or 429 (up to 50 tries),
/// and records the successful request's latency in `lat`.
async fn send_one(
    api: &narad_client::Client,
    topic: &str,
    payload: String,
    lat: &Mutex<Vec<Duration>>,
) -> Result<(), String> {
    for _ in 0..50 {
        let t = Instant::now();
        match api
            .produce(topic, payload.clone(), &ProduceOptions::default())
            .await
        {
            Ok(_) => {
                lat.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t.elapsed());
                return Ok(());
            }
            Err(e) if matches!(e.status().map(|s| s.as_u16()), Some(503 | 429)) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("e2e produce: {e}")),
        }
    }
    Err("e2e produce: still 503 after 50 tries".into())
}

/// Nothing sent for `--e2e-idle-seconds` while the consumers wait.
async fn idle_phase(b: &Bench, args: &BenchArgs, seen: &Arc<Seen>) -> Result<Figures, String> {
    // Let the steady phase's last commits and acks settle first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = b.servers.snapshot().await?;
    let (hits, misses, busy) = consumer_counts(seen);
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.e2e_idle_seconds)).await;
    let used = b.servers.snapshot().await?.since(&before);
    let (hits2, misses2, busy2) = consumer_counts(seen);
    Ok(Figures {
        name: "idle",
        messages: 0,
        elapsed: began.elapsed(),
        e2e: Vec::new(),
        produce: Vec::new(),
        missing: 0,
        hits: hits2 - hits,
        misses: misses2 - misses,
        busy: busy2.saturating_sub(busy),
        counts: used.counts,
        combining: Combining::of(&used),
        cpu: used.cpu,
    })
}

fn consumer_counts(seen: &Seen) -> (usize, usize, Duration) {
    (
        seen.hits.load(Ordering::Relaxed),
        seen.misses.load(Ordering::Relaxed),
        Duration::from_micros(seen.busy_us.load(Ordering::Relaxed) as u64),
    )
}

fn print(
    b: &Bench,
    args: &BenchArgs,
    producers: usize,
    consumers: usize,
    phases: &[Figures],
    seen: &Seen,
) {
    print_shape(b, args, producers, consumers);
    for p in phases.iter().filter(|p| p.messages > 0) {
        print_phase(p, consumers);
    }
    for p in phases.iter().filter(|p| p.messages == 0) {
        print_idle(p, consumers);
    }
    for p in phases.iter().filter(|p| p.messages > 0) {
        print_combining(p.name, p.messages, &p.combining);
    }
    println!(
        "e2e: produce sent (in this process) to consume answered, first delivery; found: consume requests that got a message; busy: consumers' time between a message and their next wait; messages delivered more than once: {}",
        seen.again.load(Ordering::Relaxed)
    );
}

/// The run's shape and the table's header.
fn print_shape(b: &Bench, args: &BenchArgs, producers: usize, consumers: usize) {
    let k = b.servers.bases.len();
    println!(
        "narad bench --e2e: store {}{} | {k} narad serve processes: producers through {producers}, {consumers} consumers waiting (wait={}s) on the other {} | {} partition(s)",
        args.store,
        if b.cfg.emulation.latency.is_zero() {
            String::new()
        } else {
            format!(" (+{} ms emulated latency per request)", b.cfg.emulation.latency.as_millis())
        },
        WAIT.as_secs(),
        k - producers,
        args.partitions
    );
    println!(
        "sparse: {} messages, one every {} ms; steady: {} msg/s for {} s; idle: {} s",
        args.e2e_sparse, args.e2e_gap_ms, args.e2e_rate, args.e2e_seconds, args.e2e_idle_seconds
    );
    if let Some(url) = args.url.as_deref().filter(|_| !b.servers.counted()) {
        println!(
            "servers: {url}, {k} shares of it; storage requests and CPU not counted (0 below)"
        );
    }
    println!();
    println!(
        "{:<7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>14} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "phase",
        "msgs",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "missing",
        "produce p50/99",
        "found",
        "busy",
        "GET/msg",
        "PUT/msg",
        "LIST/msg",
        "412/msg",
        "req/msg",
        "CPU us/msg"
    );
}

/// One line of a phase that sent messages.
fn print_phase(p: &Figures, consumers: usize) {
    let n = p.messages as f64;
    let c = &p.counts;
    let found = p.hits as f64 / (p.hits + p.misses).max(1) as f64;
    let busy = p.busy.as_secs_f64() / (p.elapsed.as_secs_f64() * consumers as f64);
    println!(
        "{:<7} {:>6} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8} {:>6.0} / {:<5.0} {:>8.0}% {:>6.1}% {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>10.0}",
        p.name,
        p.messages,
        percentile_ms(&p.e2e, 0.5),
        percentile_ms(&p.e2e, 0.9),
        percentile_ms(&p.e2e, 0.99),
        percentile_ms(&p.e2e, 1.0),
        p.missing,
        percentile_ms(&p.produce, 0.5),
        percentile_ms(&p.produce, 0.99),
        found * 100.0,
        busy * 100.0,
        c.gets() as f64 / n,
        c.puts() as f64 / n,
        c.op(StoreOp::List) as f64 / n,
        c.failed_puts() as f64 / n,
        c.total() as f64 / n,
        p.cpu.map_or(0.0, |s| s * 1e6 / n),
    );
}

/// The idle phase: requests per second and their monthly price.
fn print_idle(p: &Figures, consumers: usize) {
    let s = p.elapsed.as_secs_f64().max(0.001);
    let c = &p.counts;
    let per_month = c.s3_standard_dollars() / s * 30.0 * 24.0 * 3600.0;
    println!(
        "{}: {:.1} s, {consumers} consumers waiting: {:.2} GET/s, {:.2} PUT/s, {:.2} LIST/s, {:.2} requests/s; ${per_month:.2} a month at S3 Standard prices (LIST as PUT); consumes answered empty: {}",
        p.name,
        s,
        c.gets() as f64 / s,
        c.puts() as f64 / s,
        c.op(StoreOp::List) as f64 / s,
        c.total() as f64 / s,
        p.misses,
    );
}
