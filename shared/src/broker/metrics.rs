//! `GET /metrics`: this process's counters in the Prometheus text format (storage
//! requests by operation and outcome, commits, operations per commit, conflicts,
//! long-poll waiters, dead-lettered messages). No topic names or payloads.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::Broker;
use crate::store::metered::{OPS, OUTCOMES};

impl Broker {
    /// Counters in the Prometheus text format: storage requests by operation and outcome,
    /// commits, operations per commit, long-poll waiters.
    pub fn metrics_text(&self) -> String {
        let c = self.metered.counts();
        let s = &self.committer.stats;
        let mut out = String::new();
        out.push_str(
            "# HELP narad_storage_requests_total Storage requests by operation and outcome.\n",
        );
        out.push_str("# TYPE narad_storage_requests_total counter\n");
        for (i, op) in OPS.iter().enumerate() {
            for (j, outcome) in OUTCOMES.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "narad_storage_requests_total{{op=\"{op}\",outcome=\"{outcome}\"}} {}",
                    c.0[i][j]
                );
            }
        }
        let commits = s.commits.load(Ordering::Relaxed);
        let ops = s.committed_ops.load(Ordering::Relaxed);
        let gauges = [
            (
                "narad_commits_total",
                "counter",
                "Manifest writes that landed.",
                commits as f64,
            ),
            (
                "narad_committed_operations_total",
                "counter",
                "Operations carried by those writes.",
                ops as f64,
            ),
            (
                "narad_commit_batches_total",
                "counter",
                "Group-commit batches processed.",
                s.batches.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_conflicts_total",
                "counter",
                "Conditional writes that lost a race (412/409).",
                c.failed_puts() as f64,
            ),
            (
                "narad_operations_per_commit",
                "gauge",
                "Average operations per landed commit.",
                if commits == 0 {
                    0.0
                } else {
                    ops as f64 / commits as f64
                },
            ),
            (
                "narad_long_poll_waiters",
                "gauge",
                "Consumers waiting in a long poll now.",
                self.waiting.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_dead_lettered_total",
                "counter",
                "Messages moved to a dead-letter topic.",
                self.dead_lettered.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_corrupt_objects_total",
                "counter",
                "Requests answered partition_corrupt (the log names each object).",
                crate::error::CORRUPT_SEEN.load(Ordering::Relaxed) as f64,
            ),
        ];
        for (name, kind, help, v) in gauges.into_iter().chain(self.combining_counters()) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        out
    }

    /// The counters of combining produces across processes (commit/combine.rs).
    fn combining_counters(&self) -> [(&'static str, &'static str, &'static str, f64); 5] {
        let s = &self.committer.stats;
        [
            (
                "narad_combined_by_others_total",
                "counter",
                "Produce batches another process committed (combining).",
                s.landed_by_others.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_combining_rewrites_total",
                "counter",
                "Segments written again because a commit passed them over (combining).",
                s.rewritten.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_combining_takeovers_total",
                "counter",
                "Waiting produces that committed themselves because nobody else did (combining).",
                s.takeovers.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_combining_sweeps_total",
                "counter",
                "Commits of other processes' segments made while this process's queue was empty.",
                s.sweeps.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_combining_polls_total",
                "counter",
                "Manifest reads of produces waiting for another process's commit.",
                s.polls.load(Ordering::Relaxed) as f64,
            ),
        ]
    }
}
