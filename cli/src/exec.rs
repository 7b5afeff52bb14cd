//! `narad consume TOPIC --exec CMD` is the consumer loop of the consumer documentation for
//! any program: each message's payload goes to the command's stdin, its coordinates to the
//! environment (`NARAD_TOPIC`, `NARAD_PARTITION`, `NARAD_OFFSET`, `NARAD_DELIVERY_COUNT`,
//! `NARAD_KEY`); the lease is extended every third of the visibility timeout while the
//! command runs; exit 0 acks (the ack rides on the worker's next consume, `POST
//! /v1/topics/{t}/consume`, one commit for both), anything else nacks. A 410 on a heartbeat means the lease
//! lapsed: the command is stopped and the message left to whoever has it now. SIGINT or
//! SIGTERM stops taking messages; running commands finish and are settled first.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_client::{Client, ConsumeOptions, EntryResult, Message};
use tokio::io::AsyncWriteExt;

/// Acks or nacks `m`, telling stderr (not failing) when the lease was gone.
pub(crate) async fn settle_logged(
    c: &Client,
    topic: &str,
    m: &Message,
    action: narad_client::Settle,
) {
    let Some(handle) = &m.receipt_handle else {
        return;
    };
    if let Err(e) = c.settle(topic, handle, action).await {
        let what = gone_or(&e);
        eprintln!(
            "narad: {action:?} of partition {} offset {}: {what}",
            m.partition, m.offset
        );
    }
}

/// Shared state of the --exec workers.
struct Workers {
    stop: AtomicBool,
    /// Messages taken so far (against --count).
    taken: AtomicU64,
    stopped: tokio::sync::Notify,
}

/// `narad consume TOPIC --exec CMD`: what it consumes, and how.
pub(crate) struct Exec {
    pub topic: String,
    /// The shell command run per message.
    pub cmd: String,
    /// How long each consume long-polls.
    pub wait: Duration,
    pub partition: Option<u32>,
    /// Stop after this many messages (default: run until SIGINT or SIGTERM).
    pub count: Option<u64>,
    pub subscription: Option<String>,
    /// Commands running at once.
    pub concurrency: u32,
}

impl Exec {
    /// Runs `concurrency` workers until SIGINT, SIGTERM or `count` messages.
    pub(crate) async fn run(self, c: &Client) -> Result<(), String> {
        let timeout = match &self.subscription {
            None => c
                .get_topic(&self.topic)
                .await
                .map_err(|e| e.to_string())?
                .visibility_timeout(),
            Some(s) => c
                .get_subscription(&self.topic, s)
                .await
                .map_err(|e| e.to_string())?
                .effective
                .visibility_timeout(),
        }
        .unwrap_or(Duration::from_secs(30));
        let heartbeat = (timeout / 3).max(Duration::from_millis(100));
        let shared = Arc::new(Workers {
            stop: AtomicBool::new(false),
            taken: AtomicU64::new(0),
            stopped: tokio::sync::Notify::new(),
        });
        {
            let shared = shared.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                eprintln!("narad: stopping: no new messages; letting running commands finish");
                shared.stop.store(true, Ordering::SeqCst);
                shared.stopped.notify_waiters();
            });
        }
        let exec = Arc::new(self);
        let tasks: Vec<_> = (0..exec.concurrency.max(1))
            .map(|_| {
                let work = worker(c.clone(), exec.clone(), shared.clone(), heartbeat);
                tokio::spawn(work)
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    }
}

/// One worker: consume one message (acking the one before with it), run the command on
/// it, until asked to stop or `count` is taken.
async fn worker(c: Client, exec: Arc<Exec>, shared: Arc<Workers>, heartbeat: Duration) {
    let topic = exec.topic.as_str();
    let job = Job {
        client: &c,
        topic,
        cmd: &exec.cmd,
        heartbeat,
    };
    // The handle of the last message done, acked with the next consume.
    let mut done: Vec<String> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        // A slot against --count before asking, given back if nothing came.
        let slot = shared.taken.fetch_add(1, Ordering::SeqCst);
        if exec.count.is_some_and(|n| slot >= n) {
            shared.taken.fetch_sub(1, Ordering::SeqCst);
            break;
        }
        let opts = ConsumeOptions {
            wait: Some(exec.wait),
            partition: exec.partition,
            max: None,
            subscription: exec.subscription.clone(),
        };
        let got = match c.consume_acking(topic, &opts, &done).await {
            Ok(g) => g,
            Err(e) => {
                shared.taken.fetch_sub(1, Ordering::SeqCst);
                eprintln!("narad: consume: {e}");
                // The acks' outcome is unknown: ack them on their own.
                ack_all(&c, topic, std::mem::take(&mut done)).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        acks_answered(&c, topic, std::mem::take(&mut done), &got.acks).await;
        let Some(m) = got.messages.into_iter().next() else {
            shared.taken.fetch_sub(1, Ordering::SeqCst);
            continue;
        };
        if shared.stop.load(Ordering::SeqCst) {
            // Asked to stop while this was on its way: give it back at once.
            settle_logged(&c, topic, &m, narad_client::Settle::Nack).await;
            break;
        }
        done.extend(job.run(&m).await);
    }
    ack_all(&c, topic, done).await;
}

/// Acks each handle on its own (retrying 503s), telling stderr of those gone.
async fn ack_all(c: &Client, topic: &str, handles: Vec<String>) {
    for h in handles {
        if let Err(e) = c.ack(topic, &h).await {
            eprintln!("narad: ack: {}", gone_or(&e));
        }
    }
}

/// Tells stderr of the piggybacked acks that found their lease gone, and acks again on
/// their own those whose outcome is unknown (503).
async fn acks_answered(c: &Client, topic: &str, handles: Vec<String>, acks: &[EntryResult]) {
    let mut again = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        match acks.get(i).map(|a| a.status) {
            Some(204) => {}
            Some(410) => eprintln!("narad: ack: the lease was gone (it may be processed again)"),
            Some(s) => {
                if s != 503 {
                    eprintln!("narad: ack answered {s}; acking again on its own");
                }
                again.push(h);
            }
            None => again.push(h),
        }
    }
    ack_all(c, topic, again).await;
}

fn gone_or(e: &narad_client::Error) -> String {
    if e.is_gone() {
        "the lease was gone (it may be processed again)".to_owned()
    } else {
        e.to_string()
    }
}

/// One --exec command run.
struct Job<'a> {
    client: &'a Client,
    topic: &'a str,
    cmd: &'a str,
    heartbeat: Duration,
}

impl Job<'_> {
    /// Runs the command on `m`, heartbeating the lease; nacks it when the command fails,
    /// and answers its handle when it succeeded (the caller acks it, with its next
    /// consume).
    async fn run(&self, m: &Message) -> Option<String> {
        let where_ = format!("partition {} offset {}", m.partition, m.offset);
        let payload = match m.payload_bytes() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("narad: {where_}: {e}; giving it back");
                settle_logged(self.client, self.topic, m, narad_client::Settle::Nack).await;
                return None;
            }
        };
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(self.cmd)
            .stdin(Stdio::piped())
            .env("NARAD_TOPIC", &m.topic)
            .env("NARAD_PARTITION", m.partition.to_string())
            .env("NARAD_OFFSET", m.offset.to_string())
            .env("NARAD_DELIVERY_COUNT", m.delivery_count.to_string())
            .kill_on_drop(true);
        match &m.key {
            Some(k) => command.env("NARAD_KEY", k),
            None => command.env_remove("NARAD_KEY"),
        };
        match serde_json::to_string(&m.headers) {
            Ok(h) if !m.headers.is_empty() => command.env("NARAD_HEADERS", h),
            _ => command.env_remove("NARAD_HEADERS"),
        };
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("narad: {where_}: cannot run the command: {e}; giving it back");
                settle_logged(self.client, self.topic, m, narad_client::Settle::Nack).await;
                return None;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            // A command that does not read its stdin is fine: the write just fails.
            tokio::spawn(async move {
                let _ = stdin.write_all(&payload).await;
            });
        }
        let Some(handle) = &m.receipt_handle else {
            return None;
        };
        let mut beat = tokio::time::interval(self.heartbeat);
        beat.tick().await;
        let status = loop {
            tokio::select! {
                s = child.wait() => break s,
                _ = beat.tick() => {
                    match self.client.extend(self.topic, handle).await {
                        Ok(()) => {}
                        Err(e) if e.is_gone() => {
                            eprintln!("narad: {where_}: the lease lapsed; stopping the command (the message is someone else's now)");
                            let _ = child.kill().await;
                            return None;
                        }
                        Err(e) => eprintln!("narad: {where_}: heartbeat: {e}"),
                    }
                }
            }
        };
        match status {
            Ok(s) if s.success() => return Some(handle.clone()),
            Ok(s) => {
                eprintln!("narad: {where_}: the command failed ({s}); giving the message back");
            }
            Err(e) => {
                eprintln!("narad: {where_}: waiting for the command: {e}; giving it back");
            }
        }
        settle_logged(self.client, self.topic, m, narad_client::Settle::Nack).await;
        None
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn wait_for_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
