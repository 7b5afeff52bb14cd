//! The client subcommands: `narad topics|subscriptions|produce|consume|replay|cancel|whoami`, on
//! [`narad_client`], against the server at `--url` / `NARAD_URL` with `--auth` /
//! `NARAD_AUTH`. `narad consume --exec` runs in [`crate::exec`]. docs/decisions.md ("The command-line client") records the choices.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use crate::exec;
use clap::{Args, Subcommand};
use narad_client::{BatchMessage, Client, ConsumeOptions, ProduceOptions};
use serde_json::Value;

/// Where the server is.
#[derive(Args, Clone)]
pub(crate) struct Conn {
    /// The server's base URL.
    #[arg(
        long,
        env = "NARAD_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    url: String,
    /// `user:password` (the first pair, if a list).
    #[arg(long, env = "NARAD_AUTH", hide_env_values = true, global = true)]
    auth: Option<String>,
}

impl Conn {
    fn client(&self) -> Result<Client, String> {
        let auth = match &self.auth {
            Some(a) => {
                let first = a.split(',').next().unwrap_or_default();
                let (u, p) = first
                    .split_once(':')
                    .ok_or("--auth / NARAD_AUTH must be user:password")?;
                Some((u.to_owned(), p.to_owned()))
            }
            None => None,
        };
        Client::new(
            &self.url,
            auth.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
        )
        .map_err(|e| e.to_string())
    }
}

/// `narad topics ...`
#[derive(Subcommand)]
pub(crate) enum TopicsCmd {
    /// Every topic, one JSON line each.
    List,
    /// A topic's settings and per-partition state.
    Get {
        /// Topic.
        topic: String,
    },
    /// Create a topic; SETTINGS is a JSON object (e.g. '{"partitions":4}').
    Create {
        /// Topic.
        topic: String,
        /// Settings, every field optional.
        settings: Option<String>,
    },
    /// Change the settings that can change; SETTINGS is a JSON object.
    Patch {
        /// Topic.
        topic: String,
        /// Settings to change.
        settings: String,
    },
    /// Delete a topic and every message in it.
    Delete {
        /// Topic.
        topic: String,
    },
    /// Remove every retained message (available and in flight); the topic stays.
    Purge {
        /// Topic.
        topic: String,
    },
    /// Move dead letters back to the topic, partition and subscription their
    /// `narad-source-*` headers name; prints `{"moved":M,"failed":F}`.
    Redrive {
        /// The dead-letter topic.
        topic: String,
        /// At most this many messages (1–1000; the server's default is 1000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        max: Option<u32>,
    },
}

/// `narad subscriptions ...`
#[derive(Subcommand)]
pub(crate) enum SubscriptionsCmd {
    /// A topic's subscriptions, one JSON line each.
    List {
        /// Topic.
        topic: String,
    },
    /// A subscription's settings and per-partition figures.
    Get {
        /// Topic.
        topic: String,
        /// Subscription.
        name: String,
    },
    /// Create a subscription; SETTINGS is a JSON object (e.g. '{"start":"earliest"}').
    Create {
        /// Topic.
        topic: String,
        /// Subscription.
        name: String,
        /// Settings, every field optional.
        settings: Option<String>,
    },
    /// Change a subscription's settings; SETTINGS is a JSON object.
    Patch {
        /// Topic.
        topic: String,
        /// Subscription.
        name: String,
        /// Settings to change.
        settings: String,
    },
    /// Delete a subscription and its state.
    Delete {
        /// Topic.
        topic: String,
        /// Subscription.
        name: String,
    },
}

/// `narad cancel ...`
#[derive(Args)]
pub(crate) struct CancelArgs {
    /// Topic.
    topic: String,
    /// Partition.
    #[arg(long)]
    partition: u32,
    /// Offset.
    #[arg(long)]
    offset: u64,
    /// Only for this subscription (default: for every subscription).
    #[arg(long)]
    subscription: Option<String>,
    #[command(flatten)]
    conn: Conn,
}

/// `narad produce ...`
#[derive(Args)]
pub(crate) struct ProduceArgs {
    /// Topic.
    topic: String,
    /// The message; read from stdin when absent.
    message: Option<String>,
    /// Key (routes by hash; comes back on consume).
    #[arg(long)]
    key: Option<String>,
    /// Partition.
    #[arg(long)]
    partition: Option<u32>,
    /// Idempotency key: a retry within the dedup window appends nothing (and lets the
    /// client retry a 503 safely).
    #[arg(long)]
    idempotency_key: Option<String>,
    /// A header NAME=VALUE (repeatable); returned on consume as `headers`.
    #[arg(long = "header", value_name = "NAME=VALUE")]
    headers: Vec<String>,
    /// Deliver no sooner than this long from now: 500ms, 30s, 5m, 2h (up to 12h).
    #[arg(long)]
    delay: Option<String>,
    /// Send each line of stdin as a message, in batches (empty lines are skipped).
    #[arg(long, conflicts_with_all = ["message", "idempotency_key"])]
    lines: bool,
    /// Messages per batch with --lines (1–1000).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
    #[command(flatten)]
    conn: Conn,
}

/// `narad consume ...`
#[derive(Args)]
pub(crate) struct ConsumeArgs {
    /// Topic.
    topic: String,
    /// Stop after this many messages, waiting for them as long as it takes (default: stop
    /// at the first wait that brings nothing; with --exec, run until SIGINT or SIGTERM).
    #[arg(long)]
    count: Option<u64>,
    /// How long each request long-polls: 0, 500ms, 10s, 1m.
    #[arg(long, default_value = "10s")]
    wait: String,
    /// Messages per request (1–100; --exec takes one per command).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    max: u32,
    /// Only this partition.
    #[arg(long)]
    partition: Option<u32>,
    /// Consume this subscription (default: the topic's own).
    #[arg(long)]
    subscription: Option<String>,
    /// Print without acking (the leases then lapse after the visibility timeout).
    #[arg(long, conflicts_with = "exec")]
    no_ack: bool,
    /// Run this shell command per message: payload on stdin, exit 0 acks, else nacks.
    #[arg(long)]
    exec: Option<String>,
    /// Commands running at once with --exec.
    #[arg(long, default_value_t = 1, requires = "exec")]
    concurrency: u32,
    #[command(flatten)]
    conn: Conn,
}

/// `narad replay ...`
#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// Topic.
    topic: String,
    /// Partition.
    #[arg(long)]
    partition: u32,
    /// First offset.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Keep waiting for new messages instead of stopping at the end.
    #[arg(long)]
    follow: bool,
    #[command(flatten)]
    conn: Conn,
}

fn print_json(v: &impl serde::Serialize) -> Result<(), String> {
    let line = serde_json::to_string(v).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
}

fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("settings must be a JSON object: {e}"))
}

/// `narad subscriptions ...`
pub(crate) async fn subscriptions(cmd: SubscriptionsCmd, conn: Conn) -> Result<(), String> {
    let c = conn.client()?;
    let e = |e: narad_client::Error| e.to_string();
    match cmd {
        SubscriptionsCmd::List { topic } => {
            for s in c.list_subscriptions(&topic).await.map_err(e)? {
                print_json(&s)?;
            }
        }
        SubscriptionsCmd::Get { topic, name } => {
            print_json(&c.get_subscription(&topic, &name).await.map_err(e)?)?
        }
        SubscriptionsCmd::Create {
            topic,
            name,
            settings,
        } => {
            let settings = match settings {
                Some(s) => parse_json(&s)?,
                None => Value::Object(Default::default()),
            };
            let s = c
                .create_subscription(&topic, &name, &settings)
                .await
                .map_err(e)?;
            print_json(&s.value)?;
        }
        SubscriptionsCmd::Patch {
            topic,
            name,
            settings,
        } => print_json(
            &c.patch_subscription(&topic, &name, &parse_json(&settings)?)
                .await
                .map_err(e)?,
        )?,
        SubscriptionsCmd::Delete { topic, name } => {
            c.delete_subscription(&topic, &name).await.map_err(e)?
        }
    }
    Ok(())
}

/// `narad cancel ...`
pub(crate) async fn cancel(a: CancelArgs) -> Result<(), String> {
    let c = a.conn.client()?;
    c.cancel(&a.topic, a.partition, a.offset, a.subscription.as_deref())
        .await
        .map_err(|e| e.to_string())
}

/// `narad topics ...`
pub(crate) async fn topics(cmd: TopicsCmd, conn: Conn) -> Result<(), String> {
    let c = conn.client()?;
    let e = |e: narad_client::Error| e.to_string();
    match cmd {
        TopicsCmd::List => {
            for t in c.all_topics().await.map_err(e)? {
                print_json(&t)?;
            }
        }
        TopicsCmd::Get { topic } => print_json(&c.get_topic(&topic).await.map_err(e)?)?,
        TopicsCmd::Create { topic, settings } => {
            let s = parse_json(settings.as_deref().unwrap_or("{}"))?;
            let done = c.create_topic(&topic, &s).await.map_err(e)?;
            if !done.created {
                eprintln!("narad: {topic} already existed with these settings");
            }
            print_json(&done.value)?;
        }
        TopicsCmd::Patch { topic, settings } => print_json(
            &c.patch_topic(&topic, &parse_json(&settings)?)
                .await
                .map_err(e)?,
        )?,
        TopicsCmd::Delete { topic } => c.delete_topic(&topic).await.map_err(e)?,
        TopicsCmd::Purge { topic } => {
            let purged = c.purge_topic(&topic).await.map_err(e)?;
            print_json(&serde_json::json!({ "purged": purged }))?;
        }
        TopicsCmd::Redrive { topic, max } => print_json(&c.redrive(&topic, max).await.map_err(e)?)?,
    }
    Ok(())
}

/// `narad whoami`: the caller's user name and grants, as the server sees them.
pub(crate) async fn whoami(conn: Conn) -> Result<(), String> {
    let c = conn.client()?;
    print_json(&c.whoami().await.map_err(|e| e.to_string())?)
}

/// `narad produce ...`
pub(crate) async fn produce(a: ProduceArgs) -> Result<(), String> {
    let c = a.conn.client()?;
    if a.lines {
        return produce_lines(&c, &a).await;
    }
    let payload = match a.message {
        Some(m) => m.into_bytes(),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("stdin: {e}"))?;
            buf
        }
    };
    let opts = ProduceOptions {
        key: a.key,
        partition: a.partition,
        idempotency_key: a.idempotency_key,
        headers: parse_headers(&a.headers)?,
        delay: a.delay.clone(),
    };
    let p = c
        .produce(&a.topic, payload, &opts)
        .await
        .map_err(|e| e.to_string())?;
    print_json(&serde_json::json!({"partition": p.partition, "offset": p.offset}))
}

/// Sends stdin's lines in batches; a progress line on a terminal.
async fn produce_lines(c: &Client, a: &ProduceArgs) -> Result<(), String> {
    let progress = std::io::stderr().is_terminal();
    let delay_ms = match &a.delay {
        None => 0,
        Some(d) => humantime::parse_duration(d)
            .map_err(|e| format!("--delay {d:?}: {e}"))?
            .as_millis()
            .try_into()
            .map_err(|_| format!("--delay {d:?}: too long"))?,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4096);
    // Reading stdin blocks: a thread feeds the batches.
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut lock = stdin.lock();
        let mut line = Vec::new();
        loop {
            line.clear();
            match std::io::BufRead::read_until(&mut lock, b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                        line.pop();
                    }
                    if !line.is_empty() && tx.blocking_send(line.clone()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let (mut sent, mut failed) = (0u64, 0u64);
    let mut batch: Vec<BatchMessage> = Vec::new();
    let mut bytes = 0usize;
    loop {
        let next = rx.recv().await;
        if let Some(line) = &next {
            let mut m = BatchMessage::from_bytes(line).map_err(|e| e.to_string())?;
            m.key = a.key.clone();
            m.partition = a.partition;
            m.headers = parse_headers(&a.headers)?;
            m.delay_ms = delay_ms;
            bytes += line.len() * 4 / 3 + 64;
            batch.push(m);
        }
        // The server takes 1000 messages and 10 MiB per batch; stay well inside.
        let full = batch.len() >= a.batch as usize || bytes >= 6 << 20;
        if !batch.is_empty() && (full || next.is_none()) {
            let results = c
                .produce_batch(&a.topic, &batch)
                .await
                .map_err(|e| format!("after {sent} messages: {e}"))?;
            for r in results {
                if r.status == 201 {
                    sent += 1;
                } else {
                    failed += 1;
                    eprintln!("narad: a message failed: {}", r.error.unwrap_or_default());
                }
            }
            batch.clear();
            bytes = 0;
            if progress {
                eprint!("\rnarad: {sent} messages sent");
            }
        }
        if next.is_none() {
            break;
        }
    }
    if progress {
        eprintln!();
    }
    print_json(&serde_json::json!({"sent": sent, "failed": failed}))?;
    if failed > 0 {
        return Err(format!("{failed} messages failed"));
    }
    Ok(())
}

/// `--header NAME=VALUE` flags as headers.
fn parse_headers(flags: &[String]) -> Result<narad_client::Headers, String> {
    flags
        .iter()
        .map(|f| {
            f.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("--header {f:?}: expected NAME=VALUE"))
        })
        .collect()
}

/// `narad consume ...`
pub(crate) async fn consume(a: ConsumeArgs) -> Result<(), String> {
    let c = a.conn.client()?;
    let wait = narad_shared::http::parse_wait(&a.wait).map_err(|e| e.message)?;
    match &a.exec {
        Some(cmd) => {
            let exec = exec::Exec {
                topic: a.topic.clone(),
                cmd: cmd.clone(),
                wait,
                partition: a.partition,
                count: a.count,
                subscription: a.subscription.clone(),
                concurrency: a.concurrency,
            };
            exec.run(&c).await
        }
        None => print_messages(&c, &a, wait).await,
    }
}

/// Prints leased messages as JSON lines, acking each once printed (unless --no-ack).
async fn print_messages(c: &Client, a: &ConsumeArgs, wait: Duration) -> Result<(), String> {
    let mut seen = 0u64;
    loop {
        let left = a.count.map_or(u64::from(a.max), |n| n - seen);
        if left == 0 {
            return Ok(());
        }
        let opts = ConsumeOptions {
            wait: Some(wait),
            partition: a.partition,
            max: Some(left.min(u64::from(a.max)) as u32),
            subscription: a.subscription.clone(),
        };
        let got = c
            .consume(&a.topic, &opts)
            .await
            .map_err(|e| e.to_string())?;
        if got.is_empty() && a.count.is_none() {
            return Ok(());
        }
        for m in got {
            print_json(&m)?;
            seen += 1;
            if !a.no_ack {
                exec::settle_logged(c, &a.topic, &m, narad_client::Settle::Ack).await;
            }
        }
    }
}

/// `narad replay ...`
pub(crate) async fn replay(a: ReplayArgs) -> Result<(), String> {
    let c = a.conn.client()?;
    let mut offset = a.from;
    let wait = a.follow.then_some(Duration::from_secs(10));
    loop {
        match c.replay(&a.topic, a.partition, offset, wait).await {
            Ok(Some(m)) => {
                print_json(&m)?;
                offset = m.offset + 1;
            }
            Ok(None) if a.follow => {}
            Ok(None) => return Ok(()),
            Err(e) if e.is_gone() => {
                // Retention removed it: go on from the oldest retained offset.
                let t = c.get_topic(&a.topic).await.map_err(|e| e.to_string())?;
                let start = t.partition(a.partition).map_or(offset, |s| s.start_offset);
                eprintln!("narad: offsets {offset}..{start} expired; going on from {start}");
                if start <= offset {
                    return Err(format!("offset {offset} expired and nothing follows it"));
                }
                offset = start;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
