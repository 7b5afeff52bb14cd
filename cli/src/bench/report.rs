//! What the bench prints: the run's shape, one line per phase, the combining figures,
//! round trips per operation, and the end-to-end cost at S3 Standard prices.

use std::time::Duration;

use narad_shared::store::metered::{Counts, StoreOp};

use super::phase::Combining;
use super::{Bench, BenchArgs, Phase};

/// Prints the run's shape, one line per phase, and the end-to-end figures.
pub(super) fn print_report(b: &Bench, args: &BenchArgs, phases: &[Phase]) {
    print_shape(b, args);
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
        print_combining(p.name, p.messages, &p.combining);
    }
    if !b.cfg.emulation.latency.is_zero() {
        // Every storage request waits the delay, so a request's latency over the delay
        // counts the round trips it made one after another (plus its CPU and any queueing).
        let delay = b.cfg.emulation.latency.as_secs_f64() * 1000.0;
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
    let dollars = total.s3_standard_dollars() / n * 1e6;
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
pub(super) fn percentile_ms(latencies: &[Duration], q: f64) -> f64 {
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
    let dollars = p.counts.s3_standard_dollars() / n * 1e6;
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

/// The run's shape: store, messages, processes and connections, what the extra phases are.
fn print_shape(b: &Bench, args: &BenchArgs) {
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
}

/// The combining line of phase `name` of `messages` messages, when anything combined.
pub(super) fn print_combining(name: &str, messages: usize, c: &Combining) {
    if !c.any() {
        return;
    }
    let n = messages.max(1) as f64;
    println!(
        "{name}: combining across processes: {:.2} of messages answered from another process's commit, {:.3} segment rewrites/msg, {:.2} manifest polls/msg, {:.3} takeovers/msg, {:.3} sweeps/msg",
        c.by_others / n,
        c.rewrites / n,
        c.polls / n,
        c.takeovers / n,
        c.sweeps / n
    );
}
