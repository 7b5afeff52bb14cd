//! `narad`: the broker as one process.
//!
//! `narad serve [--listen 127.0.0.1:8080] [--store file://./narad-data] [--users FILE]`
//! runs every route of the HTTP API on one store. Flags override `NARAD_LISTEN`,
//! `NARAD_STORE` and `NARAD_USERS_FILE`; every other setting comes from the environment
//! (see `narad_shared::config`). `narad hash-password` makes a users file's password hash.
//! `narad gc` and `narad repair` maintain a store; `narad upgrade status|finalize` shows and
//! raises its fleet level (docs/upgrades.md).
//! `narad topics|produce|consume|replay` are clients of a running server ([`remote`]).

mod bench;
mod exec;
mod remote;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use narad_shared::access::Users;
use narad_shared::broker::Broker;
use narad_shared::config::{Config, Credential};
use narad_shared::http;
use narad_shared::maintenance;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's allocator: a request allocates and frees its buffers on
/// whichever worker thread polls it, and glibc's per-arena locks and free-list consolidation
/// took about a sixth of the server's CPU per request (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "narad",
    version,
    about = "Narad: a pull-based message broker on object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker's HTTP API in this process.
    Serve {
        /// Address to listen on [env: NARAD_LISTEN; default 127.0.0.1:8080].
        #[arg(long)]
        listen: Option<String>,
        /// Store URL: file://PATH, memory:// or s3://BUCKET[/PREFIX]
        /// [env: NARAD_STORE; default file://./narad-data].
        #[arg(long)]
        store: Option<String>,
        /// Users file with password hashes and per-topic grants [env: NARAD_USERS_FILE].
        #[arg(long)]
        users: Option<std::path::PathBuf>,
        /// PEM certificate chain: serve HTTPS [env: NARAD_TLS_CERT]; needs --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        /// PEM private key of --tls-cert [env: NARAD_TLS_KEY].
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<std::path::PathBuf>,
    },
    /// Read a password from stdin (one line) and print its Argon2id hash for a users file.
    HashPassword,
    /// Garbage-collect a store: apply retention everywhere, delete orphan segments older
    /// than the grace period, leftovers of deleted topics and checkpoints past the two
    /// kept, compact small segments. Prints a JSON report.
    Gc {
        /// Store URL [env: NARAD_STORE; default file://./narad-data].
        #[arg(long)]
        store: Option<String>,
        /// How old an unreferenced segment must be before it is deleted (e.g. 30m, 2h).
        #[arg(long, default_value = "30m")]
        grace: String,
        /// Report what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Inspect a topic's partitions and rebuild each one whose manifest is corrupt, from
    /// its newest checkpoint and its segments (docs/design.md §7). Prints one JSON line
    /// per partition: healthy, repaired (with what was restored and what is delivered
    /// again), or corrupt (with --dry-run).
    Repair {
        /// Store URL [env: NARAD_STORE; default file://./narad-data].
        #[arg(long)]
        store: Option<String>,
        /// Report what a repair would restore, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Topic.
        topic: String,
        /// Only this partition.
        partition: Option<u32>,
    },
    /// The format gate (docs/upgrades.md): `status` shows the fleet level, the running
    /// processes and what stands in the way of raising it; `finalize` raises it, so the
    /// newer formats are written, and refuses while a build that cannot read them may
    /// still run.
    Upgrade {
        #[command(subcommand)]
        cmd: UpgradeCmd,
    },
    /// Benchmark a server on a store: throughput, latency, storage requests per message.
    Bench(bench::BenchArgs),
    /// Topics on a server (NARAD_URL, NARAD_AUTH): list, get, create, patch, delete, purge,
    /// redrive.
    Topics {
        #[command(subcommand)]
        cmd: remote::TopicsCmd,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// A topic's subscriptions (NARAD_URL, NARAD_AUTH): list, get, create, patch, delete.
    Subscriptions {
        #[command(subcommand)]
        cmd: remote::SubscriptionsCmd,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// Send a message to a topic (stdin when none is given; --lines: each line, batched).
    Produce(remote::ProduceArgs),
    /// Lease messages: print them as JSON lines and ack them, or run a command per
    /// message (--exec: exit 0 acks, else nacks; the lease is extended while it runs).
    Consume(remote::ConsumeArgs),
    /// Read a partition's messages by offset, read-only, as JSON lines.
    Replay(remote::ReplayArgs),
    /// Cancel one retained message (by partition and offset) for every subscription, or
    /// one (--subscription): a delayed message is then never delivered.
    Cancel(remote::CancelArgs),
    /// Who the server takes the caller for, and the caller's grants, as JSON.
    Whoami {
        #[command(flatten)]
        conn: remote::Conn,
    },
}

#[derive(Subcommand)]
enum UpgradeCmd {
    /// Print the fleet level, the live processes and what blocks a raise, as JSON.
    Status(UpgradeArgs),
    /// Raise the fleet level (to the newest this build reads, or --to): prints the
    /// outcome as JSON; exits non-zero when refused, naming what is in the way.
    Finalize {
        #[command(flatten)]
        args: UpgradeArgs,
        /// Confirm that no process of a build before the gate (main at commit c3661c8 or
        /// earlier; they write no process record) still runs. Needed for the first raise.
        #[arg(long)]
        confirm_old_builds_stopped: bool,
    },
}

#[derive(clap::Args)]
struct UpgradeArgs {
    /// Store URL [env: NARAD_STORE; default file://./narad-data].
    #[arg(long)]
    store: Option<String>,
    /// The level to raise to (default: the newest this build reads).
    #[arg(long)]
    to: Option<u32>,
    /// How far back a manifest written by a build that cannot read that level counts
    /// against a raise (e.g. 15m, 30s).
    #[arg(long, default_value = "15m")]
    window: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("NARAD_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            listen,
            store,
            users,
            tls_cert,
            tls_key,
        } => serve(listen, store, users, tls_cert.zip(tls_key)).await,
        Command::HashPassword => hash_password(),
        Command::Gc {
            store,
            grace,
            dry_run,
        } => gc(store, &grace, dry_run).await,
        Command::Repair {
            store,
            dry_run,
            topic,
            partition,
        } => repair(store, dry_run, &topic, partition).await,
        Command::Upgrade { cmd } => upgrade(cmd).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Topics { cmd, conn } => remote::topics(cmd, conn).await,
        Command::Produce(args) => remote::produce(args).await,
        Command::Consume(args) => remote::consume(args).await,
        Command::Replay(args) => remote::replay(args).await,
        Command::Subscriptions { cmd, conn } => remote::subscriptions(cmd, conn).await,
        Command::Cancel(args) => remote::cancel(args).await,
        Command::Whoami { conn } => remote::whoami(conn).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How long a stopping `narad serve` lets commits already queued land, after its
/// connections are drained.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

async fn serve(
    listen: Option<String>,
    store_url: Option<String>,
    users_file: Option<std::path::PathBuf>,
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<(), String> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(l) = listen {
        cfg.listen = l;
    }
    if let Some(s) = store_url {
        cfg.store = s;
    }
    if let Some(f) = users_file {
        cfg.users_file = Some(f);
    }
    if tls.is_some() {
        cfg.http.tls = tls;
    }
    let acceptor = match &cfg.http.tls {
        Some((cert, key)) => Some(http::tls::acceptor(cert, key)?),
        None => None,
    };
    let users = match Users::from_config(&cfg).map_err(|e| e.to_string())? {
        Some(u) => u,
        None => {
            let password = narad_shared::config::generate_password();
            println!("narad: NARAD_AUTH is not set; generated credentials for this run:");
            println!("narad:   user: narad   password: {password}");
            println!("narad:   export AUTH=narad:{password}   # then: curl -u $AUTH ...");
            Users::full_rights(&[Credential {
                user: "narad".into(),
                password,
            }])
        }
    };
    let broker = Arc::new(open_broker(&cfg).await?);
    let described = broker.store_description();
    let app = http::router(broker.clone(), users, &cfg.http);
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    println!("narad: serving {scheme}://{addr} on {described}");
    tracing::info!(%addr, store = %described, "narad serve started");
    http::serve(listener, app, &cfg.http, acceptor, shutdown_signal()).await;
    // Every request is answered: commits still queued land (or are cut short after the
    // grace), and no background task outlives the broker.
    broker.stop(STOP_GRACE).await;
    // A clean stop: this process no longer counts against `narad upgrade finalize`.
    broker.gate().leave().await;
    Ok(())
}

fn hash_password() -> Result<(), String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
    let password = line.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err("the password is empty".into());
    }
    println!("{}", narad_shared::access::hash_password(password)?);
    Ok(())
}

async fn open_broker(cfg: &Config) -> Result<Broker, String> {
    Broker::from_config(cfg)
        .await
        .map_err(|e| format!("cannot start on store {}: {e}", cfg.store))
}

async fn gc(store_url: Option<String>, grace: &str, dry_run: bool) -> Result<(), String> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(s) = store_url {
        cfg.store = s;
    }
    let grace = humantime::parse_duration(grace).map_err(|e| format!("--grace {grace:?}: {e}"))?;
    let broker = open_broker(&cfg).await?;
    let report = maintenance::gc(&broker, grace, dry_run).await;
    broker.gate().leave().await;
    let report = report.map_err(|e| format!("gc failed: {e}"))?;
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}

async fn repair(
    store_url: Option<String>,
    dry_run: bool,
    topic: &str,
    partition: Option<u32>,
) -> Result<(), String> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(s) = store_url {
        cfg.store = s;
    }
    let broker = open_broker(&cfg).await?;
    let found = broker.repair(topic, partition, dry_run).await;
    broker.gate().leave().await;
    let found = found.map_err(|e| format!("repair of {topic} failed: {e}"))?;
    for r in found {
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// `narad upgrade status|finalize`: on the store itself, as no process of the fleet (it
/// writes no process record of its own).
async fn upgrade(cmd: UpgradeCmd) -> Result<(), String> {
    use narad_shared::gate::{self, Finalized, Scan};
    let (args, confirmed, finalize) = match cmd {
        UpgradeCmd::Status(args) => (args, false, false),
        UpgradeCmd::Finalize {
            args,
            confirm_old_builds_stopped,
        } => (args, confirm_old_builds_stopped, true),
    };
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(s) = args.store {
        cfg.store = s;
    }
    let window = humantime::parse_duration(&args.window)
        .map_err(|e| format!("--window {:?}: {e}", args.window))?;
    let scan = Scan {
        to: args.to.map(narad_shared::formats::Level),
        window,
        confirmed,
    };
    let store = narad_shared::store::open_emulated(&cfg.store, cfg.emulation)
        .await
        .map_err(|e| format!("cannot open store {}: {e}", cfg.store))?;
    // The gate's records run on the system clock (narad_shared::gate).
    let clock = narad_shared::clock::SystemClock;
    if !finalize {
        let status = gate::status(&store, &clock, scan)
            .await
            .map_err(|e| format!("upgrade status failed: {e}"))?;
        println!("{}", json(&status)?);
        return Ok(());
    }
    let ids = narad_shared::clock::RandomIds;
    let done = gate::finalize(&store, &clock, &ids, scan)
        .await
        .map_err(|e| format!("upgrade finalize failed: {e}"))?;
    println!("{}", json(&done)?);
    match done {
        Finalized::Raised { .. } => Ok(()),
        Finalized::Refused { status } => Err(format!(
            "the fleet stays at level {}: {} thing(s) in the way (see blockers above; docs/upgrades.md)",
            status.level,
            status.blockers.len()
        )),
    }
}

/// `v` as one line of JSON.
fn json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
