//! `GET /metrics`: this process's counters in the Prometheus text format (storage
//! requests by operation and outcome, commits, operations per commit, conflicts,
//! long-poll waiters, dead-lettered messages), and per topic this process serves its
//! backlog, in-flight count and the age of its oldest unsettled message, and per named
//! subscription its backlog, in flight, delayed and lost ([`Broker::topic_metrics`]). No
//! payloads; topic names only where the caller may see them.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::Broker;
use crate::commit::{Figures, Summary};

/// One topic's figures for `/metrics`: backlog, in flight, delayed, and the oldest
/// unsettled age in ms (if known).
type TopicFigures = (u64, u64, u64, Option<u64>);

/// One per-subscription series: name, help, and its value from a subscription's figures.
type SubscriptionSeries = (&'static str, &'static str, fn(&Figures) -> u64);

/// One per-topic series: name, help, and its value from a topic's figures.
type Series = (&'static str, &'static str, fn(&TopicFigures) -> Option<f64>);

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
        for (op, outcome, n) in c.iter() {
            let (op, outcome) = (op.name(), outcome.name());
            let _ = writeln!(
                out,
                "narad_storage_requests_total{{op=\"{op}\",outcome=\"{outcome}\"}} {n}"
            );
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
                "narad_ledger_commits_total",
                "counter",
                "Subscriptions' ledger writes that landed.",
                s.ledger_commits.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_ledger_committed_operations_total",
                "counter",
                "Operations carried by those writes (other processes' intents among them).",
                s.ledger_committed_ops.load(Ordering::Relaxed) as f64,
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
            (
                "narad_upgrade_required_total",
                "counter",
                "Requests answered upgrade_required: they needed an object a newer version \
                 of Narad wrote (the log names each object once).",
                crate::error::NEWER_SEEN.load(Ordering::Relaxed) as f64,
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

    /// Per topic this process has committed to or read (its cached snapshots, no storage
    /// request), for the topics `visible` admits: `narad_topic_backlog_messages` (unsettled,
    /// no live lease), `narad_topic_in_flight_messages`,
    /// `narad_topic_delayed_messages`, and `narad_topic_oldest_unsettled_age_seconds` where the frontier message's segment is
    /// cached here (else absent). Values are as of this process's last commit or read of
    /// each partition.
    pub fn topic_metrics(&self, visible: impl Fn(&str) -> bool) -> String {
        let now = self.clock.now_ms();
        let mut topics: std::collections::BTreeMap<String, TopicFigures> =
            std::collections::BTreeMap::new();
        let summaries = self.committer.summaries();
        for s in &summaries {
            if !visible(&s.topic) || s.subscription.is_some() {
                continue;
            }
            let age = s.frontier.as_ref().and_then(|(frontier, seg)| {
                let key = crate::keys::segment(&s.topic, s.partition, &seg.id);
                let cached = self.segments.get(&key)?;
                let i = usize::try_from(frontier.checked_sub(seg.base_offset)?).ok()?;
                Some(now.saturating_sub(cached.messages.get(i)?.produced_at_ms))
            });
            let e = topics.entry(s.topic.clone()).or_insert((0, 0, 0, None));
            e.0 += s.figures.available;
            e.1 += s.figures.in_flight;
            e.2 += s.figures.delayed;
            e.3 = e.3.max(age);
        }
        let mut out = String::new();
        let series: [Series; 4] = [
            (
                "narad_topic_backlog_messages",
                "Unsettled messages with no live lease, per topic, as this process last saw it.",
                |v| Some(v.0 as f64),
            ),
            (
                "narad_topic_in_flight_messages",
                "Live leases per topic, as this process last saw it.",
                |v| Some(v.1 as f64),
            ),
            (
                "narad_topic_delayed_messages",
                "Messages produced with a delay not over yet, per topic, as this process last saw it.",
                |v| Some(v.2 as f64),
            ),
            (
                "narad_topic_oldest_unsettled_age_seconds",
                "Age of the oldest unsettled message per topic (where this process has it cached).",
                |v| v.3.map(|ms| ms as f64 / 1000.0),
            ),
        ];
        for (name, help, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (topic, v) in &topics {
                // Topic names are [A-Za-z0-9._-]: nothing to escape in a label value.
                if let Some(x) = value(v) {
                    let _ = writeln!(out, "{name}{{topic=\"{topic}\"}} {x}");
                }
            }
        }
        Self::subscription_metrics(&summaries, &visible, &mut out);
        out
    }

    /// Per named subscription of the topics `visible` admits, from `summaries`, summed
    /// over its partitions as this process's ledger commits last left them (no storage
    /// request): `narad_subscription_backlog_messages`, `_in_flight_messages`,
    /// `_delayed_messages` and `_lost_messages`, labelled `topic` and `subscription`.
    fn subscription_metrics(
        summaries: &[Summary],
        visible: &impl Fn(&str) -> bool,
        out: &mut String,
    ) {
        let mut subs: std::collections::BTreeMap<(String, String), Figures> =
            std::collections::BTreeMap::new();
        for s in summaries {
            let Some(sub) = s.subscription.clone().filter(|_| visible(&s.topic)) else {
                continue;
            };
            let e = subs.entry((s.topic.clone(), sub)).or_default();
            e.available += s.figures.available;
            e.in_flight += s.figures.in_flight;
            e.delayed += s.figures.delayed;
            e.lost += s.figures.lost;
        }
        let series: [SubscriptionSeries; 4] = [
            (
                "narad_subscription_backlog_messages",
                "Unsettled messages with no live lease, per subscription, as this process last saw it.",
                |f| f.available,
            ),
            (
                "narad_subscription_in_flight_messages",
                "Live leases per subscription, as this process last saw it.",
                |f| f.in_flight,
            ),
            (
                "narad_subscription_delayed_messages",
                "Delayed messages not due yet, per subscription, as this process last saw it.",
                |f| f.delayed,
            ),
            (
                "narad_subscription_lost_messages",
                "Messages retention or a topic purge removed before the subscription settled them.",
                |f| f.lost,
            ),
        ];
        for (name, help, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for ((topic, sub), f) in &subs {
                // Names are [A-Za-z0-9._-]: nothing to escape in a label value.
                let _ = writeln!(
                    out,
                    "{name}{{topic=\"{topic}\",subscription=\"{sub}\"}} {}",
                    value(f)
                );
            }
        }
    }

    /// The counters of combining produces across processes (commit/combine.rs).
    fn combining_counters(&self) -> [(&'static str, &'static str, &'static str, f64); 12] {
        let s = &self.committer.stats;
        [
            (
                "narad_combined_by_others_total",
                "counter",
                "Combining batches (produces, settles, leases) another process committed.",
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
                "narad_combining_switches_total",
                "counter",
                "Ordinary batches that lost races and turned to combining.",
                s.switched.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_combining_looks_total",
                "counter",
                "Listings of a process that kept winning at the first try, looking for other processes' combining writes.",
                s.looks.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_combining_looks_found_total",
                "counter",
                "Looks that found other processes' combining writes pending (the partition then counts as contended).",
                s.looks_found.load(Ordering::Relaxed) as f64,
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
                "Manifest reads of combining batches waiting for another process's commit.",
                s.polls.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_intents_written_total",
                "counter",
                "Settles and lease requests written as intents (combining, fleet level 3).",
                s.intents.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_intents_decided_by_others_total",
                "counter",
                "Intents of this process that another process's commit applied.",
                s.intents_by_others.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_ledger_intents_written_total",
                "counter",
                "Subscriptions' settles and lease requests written as intents (fleet level 6).",
                s.ledger_intents.load(Ordering::Relaxed) as f64,
            ),
            (
                "narad_ledger_intents_decided_by_others_total",
                "counter",
                "Ledger intents of this process that another process's commit applied.",
                s.ledger_intents_by_others.load(Ordering::Relaxed) as f64,
            ),
        ]
    }
}
