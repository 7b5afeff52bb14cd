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
//! With `--e2e` the phases are instead end-to-end latency across processes: producers on
//! some, waiting consumers on the others (module `e2e`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_shared::access::Users;
use narad_shared::broker::Broker;
use narad_shared::clock::{IdSource, RandomIds, SystemClock};
use narad_shared::config::{Config, Credential};
use narad_shared::store::metered::MeteredStore;

mod client;
mod e2e;
mod phase;
mod probes;
mod report;
mod servers;
use client::Client;
use narad_shared::store::{self, DynStore};
use phase::{phase, Phase, WorkerEnd};
use probes::{concurrent_put_rate, replay_cost, serial_cas_rate, ManifestSizes};
use report::print_report;
use serde_json::{json, Value};
use servers::Servers;

/// What to run (the flags of `narad bench`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchArgs {
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
    /// End-to-end latency instead of the throughput phases: producers send through the
    /// first half of `--processes`, `--connections` consumers per process wait on the
    /// others (module `e2e`).
    #[arg(long, conflicts_with_all = ["split", "piggyback", "rotate"])]
    pub e2e: bool,
    /// `--e2e`: messages of the sparse phase.
    #[arg(long, default_value_t = 6)]
    pub e2e_sparse: usize,
    /// `--e2e`: milliseconds between the sparse phase's messages.
    #[arg(long, default_value_t = 8000)]
    pub e2e_gap_ms: u64,
    /// `--e2e`: messages a second in the steady phase.
    #[arg(long, default_value_t = 20.0)]
    pub e2e_rate: f64,
    /// `--e2e`: seconds of the steady phase.
    #[arg(long, default_value_t = 30)]
    pub e2e_seconds: u64,
    /// `--e2e`: seconds of the idle phase.
    #[arg(long, default_value_t = 30)]
    pub e2e_idle_seconds: u64,
    /// `--e2e`: drive the narad already serving at this URL (a Lambda function's URL)
    /// instead of starting `narad serve` processes; `--processes` then counts shares of
    /// it (producers through the first half, consumers waiting on the rest), and storage
    /// requests are not counted (its instances' metrics cannot be summed from here).
    #[arg(long, requires = "e2e")]
    pub url: Option<String>,
    /// `--url`: the credentials, `user:password`.
    #[arg(
        long,
        env = "NARAD_BENCH_AUTH",
        default_value = "bench:bench",
        hide_env_values = true
    )]
    pub auth: String,
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
        let inner = store::open_emulated(&args.store, cfg.emulation)
            .await
            .map_err(|e| format!("cannot open store {}: {e}", args.store))?;
        let metered = MeteredStore::new(inner.clone());
        // Paced as a broker paces it: on R2, the serial CAS rate is what one key allows.
        let store: DynStore = store::paced::paced(metered.clone());
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
        let servers = match (&args.url, args.processes) {
            (Some(url), k) => Servers::external(url, k.max(2), &args.auth),
            (None, 0) => {
                Servers::in_process(broker_on(store.clone(), &cfg).await?, admitted).await?
            }
            (None, k) => Servers::processes(k, &args.store, "bench:bench").await?,
        };
        let rotate = args.rotate && servers.bases.len() > 1;
        let workers = match rotate {
            true => args.connections.max(1),
            false => args.connections.max(1) * servers.bases.len(),
        };
        let topic = format!("bench-{}", RandomIds.new_id());
        let settings = json!({
            "partitions": args.partitions,
            "visibility_timeout_ms": 600_000,
            "max_in_flight_per_partition": 10_000,
            "max_acked_ahead_per_partition": 10_000,
            "ordering": args.ordering,
        });
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let auth = match args.url {
            Some(_) => args.auth.as_str(),
            None => "bench:bench",
        };
        let api = Arc::new(client::api_clients(&servers.bases, auth)?);
        let rotation = rotate.then(Arc::default);
        let clients: Vec<Client> = (0..servers.bases.len())
            .map(|home| Client {
                servers: api.clone(),
                home,
                rotation: rotation.clone(),
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
        b.create_topic(&b.topic).await?;
        Ok(b)
    }

    /// Worker `w`'s client, for a phase's closure.
    fn picker(&self) -> impl Fn(usize) -> Client + Clone + Send + Sync + 'static {
        let clients = self.clients.clone();
        move |w| clients[w % clients.len()].clone()
    }

    /// Creates `topic` with the bench's settings, through the first server.
    ///
    /// Errors: the request's.
    async fn create_topic(&self, topic: &str) -> Result<(), String> {
        self.clients[0].servers[0]
            .create_topic(topic, &self.settings)
            .await
            .map(|_| ())
            .map_err(|e| format!("create topic: {e}"))
    }

    /// Deletes `topic`, whatever the answer.
    async fn delete_topic(&self, topic: &str) {
        let _ = self.clients[0].servers[0].delete_topic(topic).await;
    }
}

pub(crate) async fn run(args: BenchArgs) -> Result<(), String> {
    let b = Bench::start(&args).await?;
    if args.e2e {
        let r = e2e::run(&b, &args).await;
        b.delete_topic(&b.topic).await;
        b.servers.stop().await;
        return r;
    }
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
    b.create_topic(&with_subs).await?;
    for i in 0..args.subscriptions {
        b.clients[0].servers[0]
            .create_subscription(&with_subs, &format!("s{i}"), &json!({}))
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

/// A broker on `store` with the configured receipt keys and limits, on the system clock.
pub(super) async fn broker_on(store: DynStore, cfg: &Config) -> Result<Broker, String> {
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
