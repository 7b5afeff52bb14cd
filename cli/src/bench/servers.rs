//! The servers a benchmark drives: one inside the bench process, or K separate
//! `narad serve` processes on the same store (the shape users deploy: many stateless
//! instances on one bucket). Either way the storage requests are read from each server's
//! `/metrics`, so a phase's counts are the sum over every process.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use narad_shared::access::Users;
use narad_shared::broker::Broker;
use narad_shared::http;
use narad_shared::store::metered::{Counts, Outcome, StoreOp};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A directory: each `narad serve` the bench starts writes its log there
/// (`serve-{i}.log`) with [`SERVE_TRACE_FILTER`], a timeline of every request and every
/// storage request (docs/benchmarks.md, "Where a message's time goes").
const SERVE_LOG_DIR: &str = "NARAD_BENCH_SERVE_LOG";

/// The log filter of a traced `narad serve`: each HTTP request when done, each produced
/// and delivered offset, each storage request.
const SERVE_TRACE_FILTER: &str = "warn,narad_shared::http::trace=debug,\
     narad_shared::broker=debug,narad_shared::store::metered=trace";

/// What a phase's storage requests and commits add up to, over every server.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Snapshot {
    pub counts: Counts,
    pub commits: f64,
    pub committed_ops: f64,
    /// Combining: batches answered from another process's commit, segments written
    /// again, manifest reads of waiting writers.
    pub by_others: f64,
    pub rewrites: f64,
    pub polls: f64,
    pub takeovers: f64,
    pub sweeps: f64,
    /// CPU seconds (user + system) the servers have used; `None` where `/proc` cannot
    /// tell (not Linux).
    pub cpu: Option<f64>,
}

impl Snapshot {
    /// `self - earlier`.
    pub(super) fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            counts: self.counts.since(&earlier.counts),
            commits: self.commits - earlier.commits,
            committed_ops: self.committed_ops - earlier.committed_ops,
            by_others: self.by_others - earlier.by_others,
            rewrites: self.rewrites - earlier.rewrites,
            polls: self.polls - earlier.polls,
            takeovers: self.takeovers - earlier.takeovers,
            sweeps: self.sweeps - earlier.sweeps,
            cpu: self.cpu.zip(earlier.cpu).map(|(a, b)| a - b),
        }
    }

    fn add(&mut self, other: &Snapshot) {
        self.counts = self.counts.plus(&other.counts);
        self.commits += other.commits;
        self.committed_ops += other.committed_ops;
        self.by_others += other.by_others;
        self.rewrites += other.rewrites;
        self.polls += other.polls;
        self.takeovers += other.takeovers;
        self.sweeps += other.sweeps;
        self.cpu = self.cpu.zip(other.cpu).map(|(a, b)| a + b);
    }
}

/// Reads a `/metrics` text back into counts (the format of `Broker::metrics_text`).
fn parse_metrics(text: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if let Some(labels) = name.strip_prefix("narad_storage_requests_total{") {
            let field = |k: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .map(|x| x.trim_matches(|c| c == '"' || c == '}' || c == '='))
            };
            let (Some(op), Some(outcome)) = (field("op"), field("outcome")) else {
                continue;
            };
            if let (Some(op), Some(outcome)) = (StoreOp::parse(op), Outcome::parse(outcome)) {
                s.counts.add(op, outcome, v as u64);
            }
        } else if name == "narad_commits_total" || name == "narad_ledger_commits_total" {
            // A subscription's consumes and acks write its ledger, not the manifest.
            s.commits += v;
        } else if name == "narad_committed_operations_total"
            || name == "narad_ledger_committed_operations_total"
        {
            s.committed_ops += v;
        } else if name == "narad_combined_by_others_total" {
            s.by_others = v;
        } else if name == "narad_combining_rewrites_total" {
            s.rewrites = v;
        } else if name == "narad_combining_polls_total" {
            s.polls = v;
        } else if name == "narad_combining_takeovers_total" {
            s.takeovers = v;
        } else if name == "narad_combining_sweeps_total" {
            s.sweeps = v;
        }
    }
    s
}

/// CPU seconds (user + system) process `pid` has used, from `/proc/{pid}/stat`
/// (`"self"` for this process).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_of_stat(&stat)
}

/// utime + stime of a `/proc/PID/stat` line, in seconds. The fields after the command
/// name (which may hold spaces, so the split is after its closing parenthesis) start
/// at the state, field 3; utime and stime are fields 14 and 15, in USER_HZ ticks,
/// which Linux fixes at 100 per second for `/proc`.
fn cpu_of_stat(stat: &str) -> Option<f64> {
    const USER_HZ: f64 = 100.0;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// The servers under test.
pub(super) struct Servers {
    /// Base URLs, one per server.
    pub bases: Vec<String>,
    local: Option<(Arc<Broker>, tokio::task::JoinHandle<()>)>,
    children: Vec<Child>,
    http: reqwest::Client,
    /// The credentials `/metrics` of the child processes asks for.
    auth: Option<(String, String)>,
}

impl Servers {
    /// One server inside this process, on `broker`.
    pub(super) async fn in_process(broker: Broker, users: Users) -> Result<Self, String> {
        let broker = Arc::new(broker);
        let opts = narad_shared::config::HttpOptions::default();
        let app = http::router(broker.clone(), users, &opts);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let base = format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let task = tokio::spawn(async move {
            http::serve(listener, app, &opts, None, std::future::pending()).await;
        });
        Ok(Self {
            bases: vec![base],
            local: Some((broker, task)),
            children: Vec::new(),
            http: reqwest::Client::new(),
            auth: None,
        })
    }

    /// `k` separate `narad serve` processes (this executable) on `store`, each on its own
    /// loopback port, authenticating `user:password`. Killed when dropped.
    pub(super) async fn processes(k: usize, store: &str, auth: &str) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut children = Vec::new();
        let mut bases = Vec::new();
        let trace_dir = std::env::var_os(SERVE_LOG_DIR);
        for i in 0..k {
            let (filter, stderr) = match &trace_dir {
                None => ("warn", Stdio::inherit()),
                Some(dir) => {
                    let path = std::path::Path::new(dir).join(format!("serve-{i}.log"));
                    let file = std::fs::File::create(&path)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    (SERVE_TRACE_FILTER, Stdio::from(file))
                }
            };
            let mut child = Command::new(&exe)
                .args(["serve", "--listen", "127.0.0.1:0", "--store", store])
                .env("NARAD_AUTH", auth)
                .env("NARAD_LOG", filter)
                .stdout(Stdio::piped())
                .stderr(stderr)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start narad serve: {e}"))?;
            let out = child.stdout.take().ok_or("no stdout")?;
            let mut lines = BufReader::new(out).lines();
            let base = tokio::time::timeout(Duration::from_secs(60), async {
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Some(rest) = l.strip_prefix("narad: serving ") {
                        return rest.split_whitespace().next().map(str::to_owned);
                    }
                }
                None
            })
            .await
            .ok()
            .flatten()
            .ok_or("narad serve did not report its address")?;
            // Keep draining stdout so the child never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            children.push(child);
            bases.push(base);
        }
        Ok(Self {
            bases,
            local: None,
            children,
            http: reqwest::Client::new(),
            auth: auth
                .split_once(':')
                .map(|(u, p)| (u.to_owned(), p.to_owned())),
        })
    }

    /// The narad serving at `url` (a Lambda function's URL), as `k` shares of it, with
    /// `auth` (`user:password`). Its storage requests are not counted.
    pub(super) fn external(url: &str, k: usize, auth: &str) -> Self {
        Self {
            bases: vec![url.trim_end_matches('/').to_owned(); k],
            local: None,
            children: Vec::new(),
            http: reqwest::Client::new(),
            auth: auth
                .split_once(':')
                .map(|(u, p)| (u.to_owned(), p.to_owned())),
        }
    }

    /// Whether storage requests are counted (not so for [`Servers::external`]).
    pub(super) fn counted(&self) -> bool {
        self.local.is_some() || !self.children.is_empty()
    }

    /// Storage requests and commits so far, summed over every server.
    pub(super) async fn snapshot(&self) -> Result<Snapshot, String> {
        if let Some((broker, _)) = &self.local {
            let mut s = parse_metrics(&broker.metrics_text());
            s.cpu = cpu_seconds("self");
            return Ok(s);
        }
        let mut total = Snapshot {
            cpu: self.counted().then_some(0.0),
            ..Snapshot::default()
        };
        for (b, child) in self.bases.iter().zip(&self.children) {
            let mut req = self.http.get(format!("{b}/metrics"));
            if let Some((u, p)) = &self.auth {
                req = req.basic_auth(u, Some(p));
            }
            let text = req
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            let mut s = parse_metrics(&text);
            s.cpu = child.id().and_then(|pid| cpu_seconds(&pid.to_string()));
            total.add(&s);
        }
        Ok(total)
    }

    /// Stops every server.
    pub(super) async fn stop(mut self) {
        if let Some((_, task)) = self.local.take() {
            task.abort();
        }
        for c in &mut self.children {
            let _ = c.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_round_trip() {
        let text = "narad_storage_requests_total{op=\"get\",outcome=\"ok\"} 7\n\
                    narad_storage_requests_total{op=\"put_if_match\",outcome=\"conflict\"} 3\n\
                    # TYPE narad_commits_total counter\nnarad_commits_total 5\n\
                    narad_committed_operations_total 12\n";
        let s = parse_metrics(text);
        assert_eq!(s.counts.get(StoreOp::Get, Outcome::Ok), 7);
        assert_eq!(s.counts.failed_puts(), 3);
        assert_eq!((s.commits, s.committed_ops), (5.0, 12.0));
    }

    #[test]
    fn cpu_is_read_after_the_command_name() {
        // A command name with spaces and a parenthesis; utime 250, stime 50 ticks.
        let stat = "4242 (narad (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 8 0 100";
        assert_eq!(cpu_of_stat(stat), Some(3.0));
        assert_eq!(cpu_of_stat("garbage"), None);
        assert!(cpu_seconds("self").is_some_and(|c| c >= 0.0) || !cfg!(target_os = "linux"));
    }
}
