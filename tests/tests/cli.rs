//! The client subcommands of `narad` against a real `narad serve` (system clock, the test
//! store): topics, produce (one and `--lines`), consume (print and `--exec`), replay. The
//! `--exec` worker loop: payloads reach the command, exit 0 acks, exit 1 gives the message
//! back, a command slower than the visibility timeout keeps its lease by heartbeats, and
//! SIGTERM lets a running command finish and be acked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;

use narad_tests::{free_port, narad_binary, Process, PASS, USER};
use serde_json::Value;

/// Runs `narad ARGS` against `base` in `dir`; returns (success, stdout).
async fn narad(base: &str, dir: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(narad_binary());
    cmd.args(args)
        .current_dir(dir)
        .env("NARAD_URL", base)
        .env("NARAD_AUTH", format!("{USER}:{PASS}"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).await.unwrap();
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("narad did not finish within 60 s")
        .unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

/// Starts `narad ARGS` against `base` in `dir`, in the background.
fn spawn(base: &str, dir: &Path, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(narad_binary())
        .args(args)
        .current_dir(dir)
        .env("NARAD_URL", base)
        .env("NARAD_AUTH", format!("{USER}:{PASS}"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// A `narad serve` child on the test store, and a working directory for the commands.
struct Served {
    server: Process,
    work: tempfile::TempDir,
    _store: Option<tempfile::TempDir>,
}

impl Served {
    /// `None` in external mode, where the tests cannot start a child server.
    async fn start() -> Option<Served> {
        if narad_tests::skip_in_external_mode("a narad serve child process with the system clock") {
            return None;
        }
        let (url, store) = narad_tests::test_store_url();
        Some(Served {
            server: Process::start(&url, free_port(), &[]).await,
            work: tempfile::tempdir().unwrap(),
            _store: store,
        })
    }
}

/// Sums a per-partition field of `narad topics get`.
async fn total(base: &str, dir: &Path, topic: &str, field: &str) -> u64 {
    let (ok, out) = narad(base, dir, &["topics", "get", topic], None).await;
    assert!(ok, "topics get {topic}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[field].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_client_produces_consumes_and_runs_workers() {
    let Some(served) = Served::start().await else {
        return;
    };
    let (base, dir) = (served.server.base.clone(), served.work.path());

    // Topics.
    let (ok, _) = narad(
        &base,
        dir,
        &[
            "topics",
            "create",
            "jobs",
            r#"{"partitions":2,"visibility_timeout_ms":1500}"#,
        ],
        None,
    )
    .await;
    assert!(ok);
    let (ok, out) = narad(&base, dir, &["topics", "list"], None).await;
    assert!(ok && out.contains("\"jobs\""), "{out}");

    // Five messages, then a worker that appends each payload to a file.
    for i in 0..5 {
        let (ok, out) = narad(&base, dir, &["produce", "jobs", &format!("job-{i}")], None).await;
        assert!(ok && out.contains("\"offset\""), "{out}");
    }
    let (ok, _) = narad(
        &base,
        dir,
        &[
            "consume",
            "jobs",
            "--exec",
            "cat >> out.txt; echo >> out.txt",
            "--count",
            "5",
            "--wait",
            "1s",
        ],
        None,
    )
    .await;
    assert!(ok);
    let text = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["job-0", "job-1", "job-2", "job-3", "job-4"]);
    assert_eq!(total(&base, dir, "jobs", "available").await, 0);
    assert_eq!(total(&base, dir, "jobs", "in_flight").await, 0);

    // A failing command gives its message back at once.
    narad(&base, dir, &["produce", "jobs", "fail-me"], None).await;
    let (ok, _) = narad(
        &base,
        dir,
        &[
            "consume", "jobs", "--exec", "exit 1", "--count", "1", "--wait", "1s",
        ],
        None,
    )
    .await;
    assert!(ok);
    assert_eq!(total(&base, dir, "jobs", "available").await, 1);
    assert_eq!(total(&base, dir, "jobs", "in_flight").await, 0);
    let (ok, out) = narad(
        &base,
        dir,
        &["consume", "jobs", "--count", "1", "--wait", "1s"],
        None,
    )
    .await;
    assert!(ok && out.contains("fail-me"), "{out}");
    let delivered: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        delivered["delivery_count"], 2,
        "the nack counted a delivery"
    );

    // A command that runs 4 s, past the 1.5 s visibility timeout, keeps its lease.
    narad(&base, dir, &["produce", "jobs", "slow"], None).await;
    let mut slow = spawn(
        &base,
        dir,
        &[
            "consume",
            "jobs",
            "--exec",
            "sleep 4; cat > slow.txt",
            "--count",
            "1",
            "--wait",
            "1s",
        ],
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let (ok, out) = narad(
            &base,
            dir,
            &["consume", "jobs", "--max", "1", "--wait", "0", "--no-ack"],
            None,
        )
        .await;
        assert!(ok);
        assert!(
            out.trim().is_empty(),
            "redelivered while its command still ran: {out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(slow.wait().await.unwrap().success());
    assert_eq!(
        std::fs::read_to_string(dir.join("slow.txt")).unwrap(),
        "slow"
    );
    assert_eq!(total(&base, dir, "jobs", "in_flight").await, 0);
    assert_eq!(total(&base, dir, "jobs", "available").await, 0);

    // SIGTERM: the running command finishes and its message is acked.
    narad(&base, dir, &["produce", "jobs", "last"], None).await;
    let mut worker = spawn(
        &base,
        dir,
        &[
            "consume",
            "jobs",
            "--exec",
            "sleep 1; cat > last.txt",
            "--wait",
            "1s",
        ],
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let pid = worker.id().unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let status = tokio::time::timeout(Duration::from_secs(10), worker.wait())
        .await
        .expect("the worker did not stop after SIGTERM")
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(dir.join("last.txt")).unwrap(),
        "last"
    );
    assert_eq!(total(&base, dir, "jobs", "in_flight").await, 0);
    assert_eq!(total(&base, dir, "jobs", "available").await, 0);

    // Lines in batches, printed by consume, then replayed read-only.
    narad(&base, dir, &["topics", "create", "lines"], None).await;
    let (ok, out) = narad(
        &base,
        dir,
        &["produce", "lines", "--lines"],
        Some("alpha\n{\"n\":2}\n\nbeta\n"),
    )
    .await;
    assert!(ok && out.contains("\"sent\":3"), "{out}");
    let (ok, out) = narad(
        &base,
        dir,
        &["consume", "lines", "--count", "3", "--wait", "1s"],
        None,
    )
    .await;
    assert!(ok);
    let payloads: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["payload"].clone())
        .collect();
    assert_eq!(
        payloads,
        [
            Value::from("alpha"),
            serde_json::json!({"n": 2}),
            Value::from("beta")
        ]
    );
    let (ok, out) = narad(
        &base,
        dir,
        &["replay", "lines", "--partition", "0", "--from", "1"],
        None,
    )
    .await;
    assert!(ok);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        !out.contains("receipt_handle"),
        "replays lease nothing: {out}"
    );

    let (ok, _) = narad(&base, dir, &["topics", "delete", "lines"], None).await;
    assert!(ok);
    let (ok, _) = narad(&base, dir, &["topics", "get", "lines"], None).await;
    assert!(!ok, "a deleted topic is gone");
    served.server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_client_manages_subscriptions_and_cancels() {
    let Some(served) = Served::start().await else {
        return;
    };
    let (base, dir) = (served.server.base.clone(), served.work.path());
    let run = |args: &'static [&'static str]| narad(&base, dir, args, None);
    assert!(run(&["topics", "create", "fan"]).await.0);
    let (ok, out) = run(&["subscriptions", "create", "fan", "billing"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["name"].as_str(), v["start"].as_str()),
        (Some("billing"), Some("latest"))
    );
    assert!(
        run(&[
            "subscriptions",
            "create",
            "fan",
            "audit",
            r#"{"visibility_timeout_ms":5000}"#
        ])
        .await
        .0
    );
    for m in ["a", "b", "c"] {
        assert!(narad(&base, dir, &["produce", "fan", m], None).await.0);
    }
    // Each subscription gets every message; the default one too.
    for sub in ["billing", "audit"] {
        let (ok, out) = narad(
            &base,
            dir,
            &["consume", "fan", "--subscription", sub, "--wait", "0"],
            None,
        )
        .await;
        assert!(ok, "{sub}");
        assert_eq!(out.lines().count(), 3, "{sub}: {out}");
    }
    // A cancelled message reaches no subscription.
    assert!(
        run(&["cancel", "fan", "--partition", "0", "--offset", "1"])
            .await
            .0
    );
    let (ok, out) = run(&["consume", "fan", "--wait", "0"]).await;
    assert!(ok);
    let payloads: Vec<String> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["payload"].to_string())
        .collect();
    assert_eq!(payloads, [r#""a""#, r#""c""#], "{out}");
    assert!(
        !run(&["cancel", "fan", "--partition", "0", "--offset", "99"])
            .await
            .0
    );
    let (ok, out) = run(&["subscriptions", "get", "fan", "audit"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["effective"]["visibility_timeout_ms"], 5000, "{v}");
    assert_eq!(v["partitions"][0]["frontier"], 3, "{v}");
    let (ok, out) = run(&["subscriptions", "list", "fan"]).await;
    assert!(ok);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(run(&["subscriptions", "delete", "fan", "audit"]).await.0);
    assert!(!run(&["subscriptions", "get", "fan", "audit"]).await.0);
    served.server.kill().await;
}

/// `narad whoami` prints the caller and its grants; `narad topics redrive` moves a dead
/// letter back to its topic, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_client_says_who_calls_and_redrives_dead_letters() {
    let Some(served) = Served::start().await else {
        return;
    };
    let (base, dir) = (served.server.base.clone(), served.work.path());
    let run = |args: &'static [&'static str]| narad(&base, dir, args, None);
    let (ok, out) = run(&["whoami"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["user"], USER, "{v}");
    assert_eq!(
        v["grants"],
        serde_json::json!([{"topics": "*", "actions": ["produce", "consume", "admin"]}]),
        "{v}"
    );
    assert!(run(&["topics", "create", "jobs-dlq"]).await.0);
    assert!(
        run(&[
            "topics",
            "create",
            "jobs",
            r#"{"max_deliveries":1,"dead_letter_topic":"jobs-dlq"}"#
        ])
        .await
        .0
    );
    assert!(run(&["produce", "jobs", "poison"]).await.0);
    // The command fails, so the message goes back; its next lease parks it.
    assert!(
        run(&["consume", "jobs", "--exec", "exit 1", "--count", "1"])
            .await
            .0
    );
    let (ok, out) = run(&["consume", "jobs", "--wait", "0"]).await;
    assert!(ok);
    assert_eq!(out, "", "parked, not delivered");
    assert_eq!(total(&base, dir, "jobs-dlq", "available").await, 1);
    let (ok, out) = run(&["topics", "redrive", "jobs-dlq", "--max", "10"]).await;
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        serde_json::json!({"moved": 1, "failed": 0})
    );
    let (ok, out) = run(&["topics", "redrive", "jobs-dlq"]).await;
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        serde_json::json!({"moved": 0, "failed": 0}),
        "nothing moves twice"
    );
    assert!(
        !run(&["topics", "redrive", "jobs-dlq", "--max", "0"])
            .await
            .0
    );
    let (ok, out) = run(&["consume", "jobs", "--wait", "0"]).await;
    assert!(ok);
    let m: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(m["payload"], "poison", "{out}");
    served.server.kill().await;
}
