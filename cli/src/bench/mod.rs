//! `narad bench`: drives a real Narad HTTP server and reports throughput, latency and the
//! storage requests each message costs.
//!
//! The server runs in this process (the same router as `narad serve`) on 127.0.0.1, on
//! the store given by `--store`, or with `--processes K` as K separate `narad serve`
//! processes on that store (the deployed shape: many instances on one bucket). Storage
//! requests are summed from every server's `/metrics`. Clients are real HTTP connections
//! (`--connections` per server), each sending `--batch` messages per request.
//! Phases run one after another so each one's storage requests are attributed to it:
//! produce N messages, then consume+ack N (or, with `--split`, consume N then ack N).
//! Before them the store's own serial compare-and-swap rate is measured, so every
//! throughput is also printed as a ratio of what one partition's manifest can absorb
//! without group commit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_shared::access::Users;
use narad_shared::broker::Broker;
use narad_shared::clock::{IdSource, RandomIds, SystemClock};
use narad_shared::config::{Config, Credential};
use narad_shared::store::metered::{Counts, MeteredStore, StoreOp};

mod servers;
use narad_shared::store::{self, DynStore, StoreError};
use serde_json::{json, Value};
use servers::Servers;

/// S3 Standard prices, dollars per request (LIST is billed as a PUT).
const PUT_PRICE: f64 = 0.005 / 1000.0;
const GET_PRICE: f64 = 0.0004 / 1000.0;

/// What to run (the flags of `narad bench`).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Store URL to benchmark (file://PATH, memory://, s3://BUCKET[/PREFIX]).
    #[arg(long, default_value = "file://./narad-bench-data")]
    pub store: String,
    /// Messages per phase.
    #[arg(long, default_value_t = 500)]
    pub messages: usize,
    /// Concurrent HTTP clients (per server process with `--processes`).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Separate `narad serve` processes on the store, each driven by `--connections`
    /// clients; 0 runs one server inside the bench process.
    #[arg(long, default_value_t = 0)]
    pub processes: usize,
    /// Partitions of the benchmark topic.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Serial compare-and-swap operations for the store's baseline rate.
    #[arg(long, default_value_t = 200)]
    pub cas_ops: usize,
    /// Messages per request: 1 uses the single-message API; more uses produce-batch,
    /// consume?max=N and batch acks.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Run consume and ack as separate phases (per-operation request counts) instead of
    /// one consume+ack phase.
    #[arg(long)]
    pub split: bool,
    /// Give messages keys, round-robin over this many (0: no keys).
    #[arg(long, default_value_t = 0)]
    pub keys: usize,
    /// The topic's `ordering` setting: `none`, or `key` (per-key ordering; use `--keys`).
    #[arg(long, default_value = "none", value_parser = ["none", "key"])]
    pub ordering: String,
    /// With `--processes`: run `--connections` clients in all (not per process), each
    /// sending its requests to the processes in turn, as a client of Lambda instances
    /// behind one endpoint does (a lone client: `--connections 1`).
    #[arg(long)]
    pub rotate: bool,
    /// In the consume+ack phase, each client acks what it leased with its next consume
    /// (`POST /v1/topics/{t}/consume`, one commit for both) instead of a separate ack.
    #[arg(long, conflicts_with = "split")]
    pub piggyback: bool,
    /// After the phases on the benchmark topic, run produce and consume+ack again on a
    /// second topic with this many subscriptions, consuming and acking one of them
    /// (`produce/subs`, `c+a/sub`): what a produce costs with subscriptions, and one
    /// subscription's throughput beside the default subscription's.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["split", "piggyback"])]
    pub subscriptions: usize,
}

/// What a worker does once the phase's messages are all claimed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WorkerEnd {
    /// Nothing: it stops.
    Stop,
    /// It calls `op(w, 0)` once, inside the phase's timing (to ack what it still holds).
    Flush,
}

struct Phase {
    name: &'static str,
    messages: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    counts: Counts,
    ops_per_commit: f64,
    /// Combining figures over the phase.
    combining: Combining,
    /// Server CPU seconds over the phase (with no `--processes`, the bench process's,
    /// clients included).
    cpu: Option<f64>,
    errors: usize,
}

/// How a phase's batches combined across processes (docs/design.md §6), from the
/// servers' counters (`servers::Snapshot`).
#[derive(Debug, Clone, Copy, Default)]
struct Combining {
    /// Batches answered from another process's commit.
    by_others: f64,
    /// Combinable segments written again.
    rewrites: f64,
    /// Reads of a waiting writer.
    polls: f64,
    /// Waiting writers that committed themselves.
    takeovers: f64,
    /// A committer's sweeps.
    sweeps: f64,
}

impl Combining {
    /// Whether anything combined.
    fn any(&self) -> bool {
        self.by_others + self.rewrites + self.polls + self.takeovers + self.sweeps > 0.0
    }
}

type Handles = Arc<Mutex<Vec<String>>>;

/// What every phase runs against: the store (metered, and beneath the meter), the
/// servers, the clients and the benchmark topic.
struct Bench {
    cfg: Config,
    /// The store beneath the meter: reads that cost no counted request.
    inner: DynStore,
    /// The metered store.
    store: DynStore,
    servers: Servers,
    /// `--rotate` over several processes.
    rotate: bool,
    /// Concurrent workers in each phase.
    workers: usize,
    clients: Arc<Vec<Client>>,
    topic: String,
    settings: Value,
    payload: String,
    /// The store's serial CAS rate and concurrent PUT rate, measured first.
    cas_rate: f64,
    put_rate: f64,
}

impl Bench {
    /// Measures the store's baselines, starts the servers and creates the topic.
    async fn start(args: &BenchArgs) -> Result<Self, String> {
        let cfg = Config::from_env().map_err(|e| e.to_string())?;
        let inner = store::open_with_latency(&args.store, cfg.store_latency)
            .await
            .map_err(|e| format!("cannot open store {}: {e}", args.store))?;
        let metered = MeteredStore::new(inner.clone());
        let store: DynStore = metered.clone();
        let cas_rate = serial_cas_rate(&store, args.cas_ops).await?;
        let put_rate = concurrent_put_rate(&store, 8, Duration::from_secs(2)).await?;
        let users = [Credential {
            user: "bench".into(),
            password: "bench".into(),
        }];
        // A users file (NARAD_USERS or NARAD_USERS_FILE) that admits bench:bench measures
        // the Argon2 path with its cache; otherwise bench:bench has every right.
        let admitted = match Users::from_config(&cfg).map_err(|e| e.to_string())? {
            Some(u) => u,
            None => Users::full_rights(&users),
        };
        let servers = if args.processes == 0 {
            Servers::in_process(broker_on(store.clone(), &cfg).await?, admitted).await?
        } else {
            Servers::processes(args.processes, &args.store, "bench:bench").await?
        };
        let rotate = args.rotate && servers.bases.len() > 1;
        let workers = match rotate {
            true => args.connections.max(1),
            false => args.connections.max(1) * servers.bases.len(),
        };
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(workers)
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string())?;
        let topic = format!("bench-{}", RandomIds.new_id());
        let settings = json!({
            "partitions": args.partitions,
            "visibility_timeout_ms": 600_000,
            "max_in_flight_per_partition": 10_000,
            "max_acked_ahead_per_partition": 10_000,
            "ordering": args.ordering,
        });
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let clients: Vec<Client> = servers
            .bases
            .iter()
            .map(|base| Client {
                http: http.clone(),
                base: base.clone(),
                rotation: rotate.then(|| Rotation {
                    bases: Arc::new(servers.bases.clone()),
                    next: Arc::default(),
                }),
                topic: topic.clone(),
                subscription: None,
                batch: args.batch.max(1),
                keys: args.keys,
                sent: sent.clone(),
            })
            .collect();
        let payload = format!(
            "{{\"pad\":\"{}\"}}",
            "x".repeat(args.payload_bytes.saturating_sub(10))
        );
        let b = Bench {
            cfg,
            inner,
            store,
            servers,
            rotate,
            workers,
            clients: Arc::new(clients),
            topic,
            settings,
            payload,
            cas_rate,
            put_rate,
        };
        b.put(&format!("/v1/topics/{}", b.topic), b.settings.to_string())
            .await
            .map_err(|e| format!("create topic: {e}"))?;
        Ok(b)
    }

    /// Worker `w`'s client, for a phase's closure.
    fn picker(&self) -> impl Fn(usize) -> Client + Clone + Send + Sync + 'static {
        let clients = self.clients.clone();
        move |w| clients[w % clients.len()].clone()
    }

    /// A `PUT` of `body` to `path` through the first client.
    ///
    /// Errors: the request's, or the status and body of an answer that is no success.
    async fn put(&self, path: &str, body: String) -> Result<(), String> {
        let r = self.clients[0]
            .send(reqwest::Method::PUT, path, body)
            .await?;
        if r.status().is_success() {
            return Ok(());
        }
        let status = r.status();
        Err(format!("{status} {}", r.text().await.unwrap_or_default()))
    }

    /// Deletes `topic`, whatever the answer.
    async fn delete_topic(&self, topic: &str) {
        let path = format!("/v1/topics/{topic}");
        let _ = self.clients[0]
            .send(reqwest::Method::DELETE, &path, String::new())
            .await;
    }
}

pub async fn run(args: BenchArgs) -> Result<(), String> {
    let b = Bench::start(&args).await?;
    let sizes = ManifestSizes::new(b.inner.clone(), &b.topic, args.partitions);
    let mut phases = vec![produce_phase(&b, &args).await?];
    let mut replay_probe = None;
    if args.split {
        phases.extend(split_phases(&b, &args).await?);
    } else {
        sizes.record().await;
        replay_probe = Some(replay_cost(&b.inner, &b.cfg, &b.topic).await?);
        let sampler = sizes.sample_every(Duration::from_millis(200));
        phases.push(consume_ack_phase(&b, &args).await?);
        sampler.abort();
    }
    if args.subscriptions > 0 {
        phases.extend(subscription_phases(&b, &args).await?);
    }
    sizes.record().await;
    b.delete_topic(&b.topic).await;
    print_report(&b, &args, &phases);
    println!("{}", sizes.report());
    if let Some((topic_gets, cold, warm)) = replay_probe {
        println!(
            "replay of partition 0 offset 0 from a fresh process after the produce phase: \
             {cold} GET cold, {warm} GET warm (plus {topic_gets} GET for the topic record, \
             cached per process)"
        );
    }
    b.servers.stop().await;
    let errors: usize = phases.iter().map(|p| p.errors).sum();
    if errors > 0 {
        return Err(format!("{errors} requests failed"));
    }
    Ok(())
}

/// Single produces (or batches of `--batch`) to the benchmark topic.
async fn produce_phase(b: &Bench, args: &BenchArgs) -> Result<Phase, String> {
    let (pick, payload) = (b.picker(), b.payload.clone());
    phase("produce", &b.servers, b.workers, args, WorkerEnd::Stop, {
        move |w, n| {
            let (c, payload) = (pick(w), payload.clone());
            async move { c.produce(&payload, n).await }
        }
    })
    .await
}

/// `--split`: a consume phase, then an ack phase of the handles it leased.
async fn split_phases(b: &Bench, args: &BenchArgs) -> Result<Vec<Phase>, String> {
    let handles: Handles = Arc::default();
    let consume = phase("consume", &b.servers, b.workers, args, WorkerEnd::Stop, {
        let (pick, handles) = (b.picker(), handles.clone());
        move |w, n| {
            let (c, handles) = (pick(w), handles.clone());
            async move {
                let got = c.consume(n).await?;
                let k = got.len();
                handles
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(got);
                Ok(k)
            }
        }
    })
    .await?;
    let ack = phase("ack", &b.servers, b.workers, args, WorkerEnd::Stop, {
        let pick = b.picker();
        move |w, n| {
            let (c, handles) = (pick(w), handles.clone());
            async move {
                let mine: Vec<String> = {
                    let mut h = handles.lock().unwrap_or_else(|p| p.into_inner());
                    let k = n.min(h.len());
                    h.drain(..k).collect()
                };
                c.ack(&mine).await
            }
        }
    })
    .await?;
    Ok(vec![consume, ack])
}

/// Consume and ack each message (with `--piggyback`, the acks ride on the next consume).
async fn consume_ack_phase(b: &Bench, args: &BenchArgs) -> Result<Phase, String> {
    let pick = b.picker();
    if !args.piggyback {
        return phase(
            "consume+ack",
            &b.servers,
            b.workers,
            args,
            WorkerEnd::Stop,
            move |w, n| {
                let c = pick(w);
                async move {
                    let got = c.consume(n).await?;
                    c.ack(&got).await
                }
            },
        )
        .await;
    }
    // Each worker's handles not yet acked, acked with its next consume.
    let held: Arc<Vec<Mutex<Vec<String>>>> =
        Arc::new((0..b.workers).map(|_| Mutex::default()).collect());
    phase(
        "consume+ack",
        &b.servers,
        b.workers,
        args,
        WorkerEnd::Flush,
        move |w, n| {
            let (c, held) = (pick(w), held.clone());
            async move {
                let mine = std::mem::take(&mut *held[w].lock().unwrap_or_else(|p| p.into_inner()));
                if n == 0 {
                    c.ack(&mine).await?;
                    return Ok(0);
                }
                let (leased, unsettled) = match c.consume_acking(n, &mine).await {
                    Ok(done) => done,
                    Err(e) => {
                        *held[w].lock().unwrap_or_else(|p| p.into_inner()) = mine;
                        return Err(e);
                    }
                };
                c.ack(&unsettled).await?;
                let k = leased.len();
                *held[w].lock().unwrap_or_else(|p| p.into_inner()) = leased;
                Ok(k)
            }
        },
    )
    .await
}

/// `--subscriptions N`: a second topic with N subscriptions; produces to it, then consumes
/// and acks one of them.
async fn subscription_phases(b: &Bench, args: &BenchArgs) -> Result<Vec<Phase>, String> {
    let with_subs = format!("{}-subs", b.topic);
    let producers: Arc<Vec<Client>> = Arc::new(
        b.clients
            .iter()
            .map(|cl| Client {
                topic: with_subs.clone(),
                ..cl.clone()
            })
            .collect(),
    );
    let consumers: Arc<Vec<Client>> = Arc::new(
        producers
            .iter()
            .map(|cl| Client {
                subscription: Some("s0".into()),
                ..cl.clone()
            })
            .collect(),
    );
    b.put(&format!("/v1/topics/{with_subs}"), b.settings.to_string())
        .await
        .map_err(|e| format!("create topic: {e}"))?;
    for i in 0..args.subscriptions {
        let path = format!("/v1/topics/{with_subs}/subscriptions/s{i}");
        b.put(&path, String::new())
            .await
            .map_err(|e| format!("create subscription: {e}"))?;
    }
    let produce = phase(
        "produce/subs",
        &b.servers,
        b.workers,
        args,
        WorkerEnd::Stop,
        {
            let payload = b.payload.clone();
            move |w, n| {
                let (c, payload) = (producers[w % producers.len()].clone(), payload.clone());
                async move { c.produce(&payload, n).await }
            }
        },
    )
    .await?;
    let consume = phase("c+a/sub", &b.servers, b.workers, args, WorkerEnd::Stop, {
        move |w, n| {
            let c = consumers[w % consumers.len()].clone();
            async move {
                let got = c.consume(n).await?;
                c.ack(&got).await
            }
        }
    })
    .await?;
    b.delete_topic(&with_subs).await;
    Ok(vec![produce, consume])
}

/// Prints the run's shape, one line per phase, and the end-to-end figures.
fn print_report(b: &Bench, args: &BenchArgs, phases: &[Phase]) {
    let shape = if args.processes == 0 {
        format!("{} connection(s)", args.connections)
    } else if b.rotate {
        format!(
            "{} narad serve processes, {} connection(s) rotating over them",
            args.processes, args.connections
        )
    } else {
        format!(
            "{} narad serve processes x {} connection(s)",
            args.processes, args.connections
        )
    };
    println!(
        "narad bench: store {} | {} messages of {} bytes | {shape} | batch {} | {} partition(s)",
        b.store.describe(),
        args.messages,
        b.payload.len(),
        args.batch.max(1),
        args.partitions
    );
    if args.piggyback {
        println!(
            "acks piggybacked: each consume carries the acks of what the client leased before"
        );
    }
    if args.subscriptions > 0 {
        println!(
            "produce/subs, c+a/sub: a second topic with {} subscriptions; c+a/sub consumes and acks one of them",
            args.subscriptions
        );
    }
    let cas_rate = b.cas_rate;
    println!("store serial CAS rate: {cas_rate:.1} commits/s (one writer: GET + conditional PUT per commit)");
    println!(
        "store request capacity: {:.1} PUT/s (8 concurrent writers of small new objects, from this process)",
        b.put_rate
    );
    println!();
    println!(
        "{:<12} {:>9} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>8} {:>10} {:>10}",
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
        "$/M msgs",
        "LIST/msg",
        "ops/commit",
        "CPU us/msg"
    );
    let mut total = Counts::default();
    for p in phases {
        print_phase(p, cas_rate);
        total = total.plus(&p.counts);
    }
    for p in phases {
        let c = &p.combining;
        if c.any() {
            let n = p.messages.max(1) as f64;
            println!(
                "{}: combining across processes: {:.2} of messages answered from another process's commit, {:.3} segment rewrites/msg, {:.2} manifest polls/msg, {:.3} takeovers/msg, {:.3} sweeps/msg",
                p.name,
                c.by_others / n,
                c.rewrites / n,
                c.polls / n,
                c.takeovers / n,
                c.sweeps / n
            );
        }
    }
    if !b.cfg.store_latency.is_zero() {
        // Every storage request waits the delay, so a request's latency over the delay
        // counts the round trips it made one after another (plus its CPU and any queueing).
        let delay = b.cfg.store_latency.as_secs_f64() * 1000.0;
        for p in phases {
            println!(
                "{}: p50 {:.1} ms = {:.2} sequential store round trips of {delay:.0} ms",
                p.name,
                percentile_ms(&p.latencies, 0.5),
                percentile_ms(&p.latencies, 0.5) / delay
            );
        }
    }
    if args.processes == 0 {
        println!("CPU us/msg: this process's CPU (server and clients) per message; with --processes, the servers' alone");
    } else {
        println!("CPU us/msg: the narad serve processes' CPU (user + system) per message");
    }
    let n = args.messages.max(1) as f64;
    let dollars = ((total.puts() + total.op(StoreOp::List)) as f64 * PUT_PRICE
        + total.gets() as f64 * GET_PRICE)
        / n
        * 1e6;
    println!();
    println!(
        "end to end (produce + consume + ack): {:.3} PUT/msg, {:.3} GET/msg, {:.3} failed PUT/msg, {:.3} requests/msg, ${dollars:.2} per million messages at S3 Standard prices",
        total.puts() as f64 / n,
        total.gets() as f64 / n,
        total.failed_puts() as f64 / n,
        total.total() as f64 / n
    );
}

/// The `q` quantile of `latencies`, in milliseconds (0 when there are none).
fn percentile_ms(latencies: &[Duration], q: f64) -> f64 {
    let mut l = latencies.to_vec();
    l.sort();
    if l.is_empty() {
        return 0.0;
    }
    let i = ((l.len() as f64 * q).ceil() as usize).clamp(1, l.len()) - 1;
    l[i].as_secs_f64() * 1000.0
}

fn print_phase(p: &Phase, cas_rate: f64) {
    let pct = |q: f64| percentile_ms(&p.latencies, q);
    let rate = p.messages as f64 / p.elapsed.as_secs_f64().max(1e-9);
    let n = p.messages.max(1) as f64;
    let dollars = ((p.counts.puts() + p.counts.op(StoreOp::List)) as f64 * PUT_PRICE
        + p.counts.gets() as f64 * GET_PRICE)
        / n
        * 1e6;
    println!(
        "{:<12} {:>9.1} {:>7.2} {:>9.2} {:>9.2} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>7} {:>9.2} {:>8.3} {:>10.2} {:>10}",
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
        dollars,
        p.counts.op(StoreOp::List) as f64 / n,
        p.ops_per_commit,
        p.cpu
            .map_or_else(|| "-".to_owned(), |c| format!("{:.1}", c / n * 1e6))
    );
}

/// Runs requests over `workers` workers until `messages` messages are done; `op(w, n)`
/// is worker `w` handling up to `n` messages, returning how many it did. Latency is per
/// request; storage requests and commits are summed over every server.
async fn phase<F, Fut>(
    name: &'static str,
    servers: &Servers,
    workers: usize,
    args: &BenchArgs,
    end: WorkerEnd,
    op: F,
) -> Result<Phase, String>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<usize, String>> + Send,
{
    let before = servers.snapshot().await?;
    let done = Arc::new(AtomicUsize::new(0));
    let claimed = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let batch = args.batch.max(1);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (done, claimed, op, total) = (done.clone(), claimed.clone(), op.clone(), args.messages);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0usize;
            loop {
                let from = claimed.fetch_add(batch, Ordering::Relaxed);
                if from >= total {
                    break;
                }
                let want = batch.min(total - from);
                let mut got = 0;
                let mut tries = 0;
                while got < want && tries < 1000 {
                    tries += 1;
                    let t = Instant::now();
                    match op(w, want - got).await {
                        Ok(k) => got += k,
                        Err(e) => {
                            if errors == 0 {
                                eprintln!("narad bench: {name}: {e}");
                            }
                            errors += 1;
                        }
                    }
                    lat.push(t.elapsed());
                }
                done.fetch_add(got, Ordering::Relaxed);
            }
            if end == WorkerEnd::Flush {
                let t = Instant::now();
                if let Err(e) = op(w, 0).await {
                    eprintln!("narad bench: {name}: {e}");
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
    let messages = done.load(Ordering::Relaxed);
    let used = servers.snapshot().await?.since(&before);
    Ok(Phase {
        name,
        messages,
        elapsed,
        latencies,
        counts: used.counts,
        combining: Combining {
            by_others: used.by_others,
            rewrites: used.rewrites,
            polls: used.polls,
            takeovers: used.takeovers,
            sweeps: used.sweeps,
        },
        cpu: used.cpu,
        ops_per_commit: if used.commits > 0.0 {
            used.committed_ops / used.commits
        } else {
            0.0
        },
        errors,
    })
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

/// PUTs per second the store absorbs from `writers` concurrent writers of small new
/// objects: the ceiling on requests per second every server together can spend.
async fn concurrent_put_rate(
    store: &DynStore,
    writers: usize,
    period: Duration,
) -> Result<f64, String> {
    let prefix = format!("bench/capacity-{}", RandomIds.new_id());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (store, prefix) = (store.clone(), prefix.clone());
        tasks.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            while start.elapsed() < period {
                let key = format!("{prefix}/{w}-{}", keys.len());
                if store
                    .put_if_absent(&key, Bytes::from_static(&[b'x'; 100]))
                    .await
                    .is_err()
                {
                    break;
                }
                keys.push(key);
            }
            keys
        }));
    }
    let mut keys = Vec::new();
    for t in tasks {
        keys.extend(t.await.map_err(|e| e.to_string())?);
    }
    let rate = keys.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    for k in keys {
        let _ = store.delete(&k).await;
    }
    Ok(rate)
}

/// The processes a rotating client sends its requests to in turn.
#[derive(Clone)]
struct Rotation {
    bases: Arc<Vec<String>>,
    next: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    /// `--rotate`: every request goes to the next process instead of `base`.
    rotation: Option<Rotation>,
    topic: String,
    /// The subscription consumes lease for (`None`: the topic's default one).
    subscription: Option<String>,
    batch: usize,
    /// Keys to give messages, round-robin (0: none), counted over all clients by `sent`.
    keys: usize,
    sent: Arc<std::sync::atomic::AtomicUsize>,
}

impl Client {
    /// Where the next request goes.
    fn base(&self) -> &str {
        match &self.rotation {
            None => &self.base,
            Some(r) => {
                let n = r.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                &r.bases[n % r.bases.len()]
            }
        }
    }

    /// The key of the next message, if messages get keys.
    fn next_key(&self) -> Option<String> {
        let n = self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (self.keys > 0).then(|| format!("k{}", n % self.keys))
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: String,
    ) -> Result<reqwest::Response, String> {
        self.http
            .request(method, format!("{}{path}", self.base()))
            .basic_auth("bench", Some("bench"))
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())
    }

    /// Produces `n` messages (one request); returns how many were accepted.
    async fn produce(&self, payload: &str, n: usize) -> Result<usize, String> {
        if self.batch == 1 {
            let query = self
                .next_key()
                .map_or_else(String::new, |k| format!("?key={k}"));
            let r = self
                .send(
                    reqwest::Method::POST,
                    &format!("/v1/topics/{}/produce{query}", self.topic),
                    payload.to_owned(),
                )
                .await?;
            let status = r.status();
            return if status.as_u16() == 201 {
                Ok(1)
            } else {
                Err(format!(
                    "produce: {status} {}",
                    r.text().await.unwrap_or_default()
                ))
            };
        }
        let msgs: Vec<String> = (0..n)
            .map(|_| match self.next_key() {
                Some(k) => format!("{{\"payload\":{payload},\"key\":\"{k}\"}}"),
                None => format!("{{\"payload\":{payload}}}"),
            })
            .collect();
        let body = format!("{{\"messages\":[{}]}}", msgs.join(","));
        let r = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/topics/{}/produce-batch", self.topic),
                body,
            )
            .await?;
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        let ok = v["results"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|x| x["status"] == 201).count());
        if ok == 0 {
            return Err(format!("produce-batch: {v}"));
        }
        Ok(ok)
    }

    /// Consumes up to `n` messages (one request); returns their receipt handles.
    async fn consume(&self, n: usize) -> Result<Vec<String>, String> {
        let mut q = if self.batch == 1 {
            String::new()
        } else {
            format!("?max={n}")
        };
        if let Some(sub) = &self.subscription {
            q.push(if q.is_empty() { '?' } else { '&' });
            q.push_str(&format!("subscription={sub}"));
        }
        let r = self
            .send(
                reqwest::Method::GET,
                &format!("/v1/topics/{}/consume{q}", self.topic),
                String::new(),
            )
            .await?;
        match r.status().as_u16() {
            200 => {
                let v: Value = r.json().await.map_err(|e| e.to_string())?;
                let handles = match v.get("messages").and_then(Value::as_array) {
                    Some(list) => list
                        .iter()
                        .filter_map(|m| m["receipt_handle"].as_str().map(str::to_owned))
                        .collect(),
                    None => v["receipt_handle"]
                        .as_str()
                        .map(str::to_owned)
                        .into_iter()
                        .collect(),
                };
                Ok(handles)
            }
            204 | 503 => Ok(Vec::new()),
            s => Err(format!("consume: {s}")),
        }
    }

    /// Acks `acks` and leases up to `n` messages in one request; returns the new
    /// messages' handles and the acks whose outcome is unknown (503: ack them again).
    async fn consume_acking(
        &self,
        n: usize,
        acks: &[String],
    ) -> Result<(Vec<String>, Vec<String>), String> {
        let q = if self.batch == 1 {
            String::new()
        } else {
            format!("?max={n}")
        };
        let r = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/topics/{}/consume{q}", self.topic),
                json!({ "ack": acks }).to_string(),
            )
            .await?;
        match r.status().as_u16() {
            200 => {}
            // Nothing acked for sure: ack them again, on their own.
            503 => return Ok((Vec::new(), acks.to_vec())),
            s => return Err(format!("consume: {s}")),
        }
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        let leased = v["messages"]
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|m| m["receipt_handle"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let answers = v["acks"].as_array().cloned().unwrap_or_default();
        let unsettled = acks
            .iter()
            .enumerate()
            .filter(|(i, _)| answers.get(*i).is_none_or(|a| a["status"] == 503))
            .map(|(_, h)| h.clone())
            .collect();
        Ok((leased, unsettled))
    }

    /// Acks `handles`, retrying 503s; returns how many were acked.
    async fn ack(&self, handles: &[String]) -> Result<usize, String> {
        if handles.is_empty() {
            return Ok(0);
        }
        for _ in 0..100 {
            let r = if self.batch == 1 && handles.len() == 1 {
                self.http
                    .post(format!("{}/v1/topics/{}/ack", self.base(), self.topic))
                    .query(&[("receipt_handle", handles[0].as_str())])
                    .basic_auth("bench", Some("bench"))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?
            } else {
                let body = json!({ "receipt_handles": handles }).to_string();
                self.send(
                    reqwest::Method::POST,
                    &format!("/v1/topics/{}/ack", self.topic),
                    body,
                )
                .await?
            };
            match r.status().as_u16() {
                204 => return Ok(1),
                200 => {
                    let v: Value = r.json().await.map_err(|e| e.to_string())?;
                    let all = v["results"].as_array().cloned().unwrap_or_default();
                    if all.iter().any(|x| x["status"] == 503) {
                        continue;
                    }
                    return Ok(all.iter().filter(|x| x["status"] == 204).count());
                }
                503 => continue,
                s => return Err(format!("ack: {s}")),
            }
        }
        Err("ack: still 503 after 100 tries".into())
    }
}

/// The largest manifest of the benchmark's topic, sampled during the run and recorded
/// after each phase, with the number of index objects it named.
#[derive(Clone)]
struct ManifestSizes {
    store: DynStore,
    keys: Vec<String>,
    /// (bytes, indexes) after each recorded phase.
    after: Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
    /// Largest size seen while sampling.
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

impl ManifestSizes {
    fn new(store: DynStore, topic: &str, partitions: u32) -> Self {
        Self {
            store,
            keys: (0..partitions)
                .map(|p| narad_shared::keys::manifest(topic, narad_shared::keys::LAYOUT_FLAT, p))
                .collect(),
            after: Arc::default(),
            peak: Arc::default(),
        }
    }

    /// The largest manifest now, in bytes, and its number of index refs.
    async fn largest(&self) -> (usize, usize) {
        let mut out = (0, 0);
        for k in &self.keys {
            if let Ok(Some(o)) = self.store.get(k).await {
                let json = narad_shared::cas::open_json(&o.data).unwrap_or(&o.data);
                let indexes = serde_json::from_slice::<Value>(json)
                    .ok()
                    .and_then(|v| v["indexes"].as_array().map(Vec::len))
                    .unwrap_or(0);
                out = out.max((o.data.len(), indexes));
            }
        }
        self.peak
            .fetch_max(out.0, std::sync::atomic::Ordering::Relaxed);
        out
    }

    async fn record(&self) {
        let now = self.largest().await;
        self.after
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(now);
    }

    fn sample_every(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                me.largest().await;
            }
        })
    }

    fn report(&self) -> String {
        let after = self.after.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let parts: Vec<String> = after
            .iter()
            .map(|(b, i)| format!("{b} bytes ({i} index refs)"))
            .collect();
        format!(
            "largest manifest: {} after each phase; peak {} bytes",
            parts.join(", then "),
            self.peak.load(std::sync::atomic::Ordering::Relaxed)
        )
    }
}

/// Storage GETs a fresh process spends to replay partition 0, offset 0 of `topic`: for
/// loading the topic record, then for the replay cold, then for the same replay again.
async fn replay_cost(
    inner: &DynStore,
    cfg: &Config,
    topic: &str,
) -> Result<(u64, u64, u64), String> {
    let metered = MeteredStore::new(inner.clone());
    let broker = broker_on(metered.clone(), cfg).await?;
    let gets = || metered.counts().gets();
    let start = gets();
    broker.topic(topic).await.map_err(|e| e.to_string())?;
    let loaded = gets();
    let replay = || broker.replay(topic, 0, 0, Duration::ZERO);
    let first = replay().await.map_err(|e| e.to_string())?;
    let cold = gets();
    replay().await.map_err(|e| e.to_string())?;
    let warm = gets();
    if first.is_none() {
        return Err("offset 0 was not found".into());
    }
    Ok((loaded - start, cold - loaded, warm - cold))
}

/// A broker on `store` with the configured receipt keys and limits, on the system clock.
async fn broker_on(store: DynStore, cfg: &Config) -> Result<Broker, String> {
    Broker::new(
        store,
        Arc::new(SystemClock),
        Arc::new(RandomIds),
        cfg.receipt_keys.clone(),
        cfg.broker.clone(),
    )
    .await
    .map_err(|e| e.to_string())
}
