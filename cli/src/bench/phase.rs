//! One phase of the bench: workers sending requests until the phase's messages are done,
//! with the latency of every request and the servers' counters before and after.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use narad_shared::store::metered::Counts;

use super::servers::Servers;
use super::BenchArgs;

/// What a worker does once the phase's messages are all claimed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkerEnd {
    /// Nothing: it stops.
    Stop,
    /// It calls `op(w, 0)` once, inside the phase's timing (to ack what it still holds).
    Flush,
}

pub(super) struct Phase {
    pub(super) name: &'static str,
    pub(super) messages: usize,
    pub(super) elapsed: Duration,
    pub(super) latencies: Vec<Duration>,
    pub(super) counts: Counts,
    pub(super) ops_per_commit: f64,
    /// Combining figures over the phase.
    pub(super) combining: Combining,
    /// Server CPU seconds over the phase (with no `--processes`, the bench process's,
    /// clients included).
    pub(super) cpu: Option<f64>,
    pub(super) errors: usize,
}

/// How a phase's batches combined across processes (docs/design.md §6), from the
/// servers' counters (`servers::Snapshot`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Combining {
    /// Batches answered from another process's commit.
    pub(super) by_others: f64,
    /// Combinable segments written again.
    pub(super) rewrites: f64,
    /// Reads of a waiting writer.
    pub(super) polls: f64,
    /// Waiting writers that committed themselves.
    pub(super) takeovers: f64,
    /// A committer's sweeps.
    pub(super) sweeps: f64,
}

impl Combining {
    /// The combining figures of a phase's server counters `used`.
    pub(super) fn of(used: &super::servers::Snapshot) -> Self {
        Self {
            by_others: used.by_others,
            rewrites: used.rewrites,
            polls: used.polls,
            takeovers: used.takeovers,
            sweeps: used.sweeps,
        }
    }

    /// Whether anything combined.
    pub(super) fn any(&self) -> bool {
        self.by_others + self.rewrites + self.polls + self.takeovers + self.sweeps > 0.0
    }
}

/// What every worker of a phase draws from: messages claimed and done so far.
struct Work {
    total: usize,
    batch: usize,
    claimed: AtomicUsize,
    done: AtomicUsize,
}

/// Runs requests over `workers` workers until `messages` messages are done; `op(w, n)`
/// is worker `w` handling up to `n` messages, returning how many it did. Latency is per
/// request; storage requests and commits are summed over every server.
pub(super) async fn phase<F, Fut>(
    name: &'static str,
    servers: &Servers,
    workers: usize,
    args: &BenchArgs,
    end: WorkerEnd,
    op: F,
) -> Result<Phase, String>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<usize, String>> + Send + 'static,
{
    let before = servers.snapshot().await?;
    let work = Arc::new(Work {
        total: args.messages,
        batch: args.batch.max(1),
        claimed: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    let op = Arc::new(op);
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| tokio::spawn(worker(name, w, work.clone(), op.clone(), end)))
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            latencies.extend(l);
            errors += e;
        }
    }
    let elapsed = start.elapsed();
    let used = servers.snapshot().await?.since(&before);
    Ok(Phase {
        name,
        messages: work.done.load(Ordering::Relaxed),
        elapsed,
        latencies,
        counts: used.counts,
        combining: Combining::of(&used),
        cpu: used.cpu,
        ops_per_commit: if used.commits > 0.0 {
            used.committed_ops / used.commits
        } else {
            0.0
        },
        errors,
    })
}

/// Worker `w` of phase `name`: claims a batch of messages at a time and calls `op` until
/// they are done (at most 1000 requests a claim), then as `end` says; answers the latency
/// of each of its requests and how many failed.
async fn worker<F, Fut>(
    name: &'static str,
    w: usize,
    work: Arc<Work>,
    op: Arc<F>,
    end: WorkerEnd,
) -> (Vec<Duration>, usize)
where
    F: Fn(usize, usize) -> Fut,
    Fut: std::future::Future<Output = Result<usize, String>>,
{
    let mut lat = Vec::new();
    let mut errors = 0usize;
    let failed = |e: String, errors: &mut usize| {
        if *errors == 0 {
            eprintln!("narad bench: {name}: {e}");
        }
        *errors += 1;
    };
    loop {
        let from = work.claimed.fetch_add(work.batch, Ordering::Relaxed);
        if from >= work.total {
            break;
        }
        let want = work.batch.min(work.total - from);
        let mut got = 0;
        let mut tries = 0;
        while got < want && tries < 1000 {
            tries += 1;
            let t = Instant::now();
            match op(w, want - got).await {
                Ok(k) => got += k,
                Err(e) => failed(e, &mut errors),
            }
            lat.push(t.elapsed());
        }
        work.done.fetch_add(got, Ordering::Relaxed);
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
}
