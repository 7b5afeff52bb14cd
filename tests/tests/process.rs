//! The real `narad serve` binary: restarts keep state, the README commands work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use narad_tests::{free_port, serde_urlencoded_pair, test_store_url, Process, PASS, USER};
use reqwest::StatusCode;
use serde_json::Value;

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn send(&self, method: reqwest::Method, path: &str, body: &str) -> reqwest::Response {
        self.http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(USER, Some(PASS))
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart() {
    if narad_tests::skip_in_external_mode("narad serve processes of its own") {
        return;
    }
    let (url, _dir) = test_store_url();
    let port = free_port();
    let p = Process::start(&url, port, &[]).await;
    let c = Client {
        http: reqwest::Client::new(),
        base: p.base.clone(),
    };
    let r = c
        .send(
            reqwest::Method::PUT,
            "/v1/topics/jobs",
            r#"{"visibility_timeout_ms":1500}"#,
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    for i in 0..10 {
        let r = c
            .send(
                reqwest::Method::POST,
                "/v1/topics/jobs/produce",
                &format!("job-{i}"),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let mut handles = Vec::new();
    for _ in 0..5 {
        let m: Value = c
            .send(reqwest::Method::GET, "/v1/topics/jobs/consume", "")
            .await
            .json()
            .await
            .unwrap();
        handles.push(m["receipt_handle"].as_str().unwrap().to_owned());
    }
    for h in &handles[..3] {
        let q = serde_urlencoded_pair("receipt_handle", h);
        assert_eq!(
            c.send(
                reqwest::Method::POST,
                &format!("/v1/topics/jobs/ack?{q}"),
                ""
            )
            .await
            .status(),
            StatusCode::NO_CONTENT
        );
    }
    // SIGKILL: no graceful shutdown.
    p.kill().await;

    let p = Process::start(&url, port, &[]).await;
    // The generated receipt key lives in the store, so a handle from before the restart
    // is still accepted by the new process while its lease is live.
    let q = serde_urlencoded_pair("receipt_handle", &handles[3]);
    assert_eq!(
        c.send(
            reqwest::Method::POST,
            &format!("/v1/topics/jobs/ack?{q}"),
            ""
        )
        .await
        .status(),
        StatusCode::NO_CONTENT
    );
    tokio::time::sleep(Duration::from_millis(1600)).await; // the 5th lease lapses
    let mut got = BTreeSet::new();
    loop {
        let r = c
            .send(reqwest::Method::GET, "/v1/topics/jobs/consume", "")
            .await;
        if r.status() == StatusCode::NO_CONTENT {
            break;
        }
        let m: Value = r.json().await.unwrap();
        got.insert(m["payload"].as_str().unwrap().to_owned());
        assert!(got.len() <= 10);
    }
    let want: BTreeSet<String> = (4..10).map(|i| format!("job-{i}")).collect();
    assert_eq!(got, want, "unacked messages come back, acked ones do not");
    p.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_auth_generates_and_prints_a_password() {
    if narad_tests::skip_in_external_mode("narad serve processes of its own") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(narad_tests::narad_binary())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            &format!("file://{}", dir.path().display()),
        ])
        .env_remove("NARAD_AUTH")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut password = None;
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
    {
        if let Some(rest) = line.split("password: ").nth(1) {
            password = Some(rest.trim().to_owned());
        }
        if line.contains("serving http://") {
            break;
        }
    }
    let password = password.expect("a generated password is printed");
    let http = reqwest::Client::new();
    let r = http
        .get(format!("http://127.0.0.1:{port}/v1/topics"))
        .basic_auth("narad", Some(&password))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .get(format!("http://127.0.0.1:{port}/v1/topics"))
        .basic_auth("narad", Some("guess"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let _ = child.kill().await;
}

/// Every log line of a request names it (the id the client sent, or one the response
/// carries back), its route and topic, and the commit that carried its operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_name_their_request_and_its_commit() {
    if narad_tests::skip_in_external_mode("narad serve processes of its own") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("file://{}", dir.path().display());
    // An operator's access log: warnings, plus each finished request.
    let env = [("NARAD_LOG", "warn,narad_shared::http::trace=debug")];
    let (p, log) = Process::start_logged(&url, port, &env).await;
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(log).lines();
    let base = p.base.clone();
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, id: &str, pass: &str| {
        http.request(method, format!("{base}{path}"))
            .basic_auth(USER, Some(pass))
            .header("x-request-id", id)
            .body("hello")
    };
    let r = send(reqwest::Method::PUT, "/v1/topics/traced", "t-create", PASS)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = send(
        reqwest::Method::POST,
        "/v1/topics/traced/produce",
        "t-produce-1",
        PASS,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["x-request-id"], "t-produce-1");
    let r = send(
        reqwest::Method::GET,
        "/v1/topics/traced",
        "t-login-2",
        "guess",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["x-request-id"], "t-login-2");
    // An id that is not well-formed is replaced, and the fresh one answered.
    let r = send(reqwest::Method::GET, "/health", "no spaces allowed", PASS)
        .send()
        .await
        .unwrap();
    let fresh = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(fresh.len(), 32, "a fresh id: {fresh}");

    let (mut produced, mut refused, mut health) = (None, None, None);
    while produced.is_none() || refused.is_none() || health.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the log names every request")
            .unwrap()
            .expect("stderr open");
        if line.contains("id=t-produce-1") && line.contains("request done") {
            produced = Some(line);
        } else if line.contains("id=t-login-2") && line.contains("failed login") {
            refused = Some(line);
        } else if line.contains(&format!("id={fresh}")) {
            health = Some(line);
        }
    }
    let produced = produced.unwrap();
    for want in [
        "method=POST",
        "route=/v1/topics/{topic}/produce",
        "topic=traced",
        "status=201",
    ] {
        assert!(produced.contains(want), "{want} in {produced}");
    }
    let commit: u64 = produced
        .split("commit=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a commit id in {produced}"));
    assert!(commit >= 1);
    assert!(refused.unwrap().contains("route=/v1/topics/{topic}"));
    assert!(health.unwrap().contains("route=/health"));
    p.kill().await;
}
