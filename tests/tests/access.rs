//! Users, per-topic grants and the failed-login throttle, through `narad serve` with a
//! users file whose hashes `narad hash-password` made (docs/security.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use narad_tests::{free_port, narad_binary, test_store_url, Process, PASS, USER};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// `narad hash-password` of `password`.
fn hash(password: &str) -> String {
    let mut child = Command::new(narad_binary())
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let h = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(h.starts_with("$argon2id$"), "{h}");
    h
}

/// A server whose users file holds alice (produce and consume on `orders*`, admin on
/// `audit*`) and bob (no grants), plus the full-rights test user from `NARAD_AUTH`.
async fn server(dir: &tempfile::TempDir) -> Process {
    let h = hash("alice-pw");
    let users = json!({"users": [
        {"name": "alice", "password_hash": h, "grants": [
            {"topics": "orders*", "actions": ["produce", "consume"]},
            {"topics": "audit*", "actions": ["admin"]}]},
        {"name": "bob", "password_hash": hash("bob-pw")}
    ]});
    let path = dir.path().join("users.json");
    std::fs::write(&path, users.to_string()).unwrap();
    let (url, _) = test_store_url();
    let url = if url.starts_with("file://") {
        format!("file://{}", dir.path().join("data").display())
    } else {
        url
    };
    Process::start(
        &url,
        free_port(),
        &[("NARAD_USERS_FILE", path.to_str().unwrap())],
    )
    .await
}

struct Client {
    http: reqwest::Client,
    base: String,
    user: &'static str,
    pass: &'static str,
}

impl Client {
    async fn call(&self, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(self.user, Some(self.pass))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_the_callers_grants() {
    if narad_tests::skip_in_external_mode("a narad serve process with a users file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = server(&dir).await;
    let http = reqwest::Client::new();
    let client = |user, pass| Client {
        http: http.clone(),
        base: p.base.clone(),
        user,
        pass,
    };
    let (root, alice, bob) = (
        client(USER, PASS),
        client("alice", "alice-pw"),
        client("bob", "bob-pw"),
    );
    // Each caller reads its own grants, as its users file wrote them.
    let all = json!(["produce", "consume", "admin"]);
    assert_eq!(
        root.call(Method::GET, "/v1/whoami", "").await,
        (
            StatusCode::OK,
            json!({"user": USER, "grants": [{"topics": "*", "actions": all}]})
        )
    );
    assert_eq!(
        alice.call(Method::GET, "/v1/whoami", "").await,
        (
            StatusCode::OK,
            json!({"user": "alice", "grants": [
                {"topics": "orders*", "actions": ["produce", "consume"]},
                {"topics": "audit*", "actions": ["admin"]}]})
        )
    );
    assert_eq!(
        bob.call(Method::GET, "/v1/whoami", "").await,
        (StatusCode::OK, json!({"user": "bob", "grants": []}))
    );
    for t in ["orders", "payroll"] {
        assert_eq!(
            root.call(Method::PUT, &format!("/v1/topics/{t}"), "{}")
                .await
                .0,
            StatusCode::CREATED
        );
    }
    let (_, m) = root
        .call(Method::POST, "/v1/topics/payroll/produce", "salary")
        .await;
    assert_eq!(m["offset"], 0);
    let (_, leased) = root
        .call(Method::GET, "/v1/topics/payroll/consume", "")
        .await;
    let handle = leased["receipt_handle"].as_str().unwrap().to_owned();
    let q = |h: &str| narad_tests::serde_urlencoded_pair("receipt_handle", h);

    // Every route on a topic without a grant: 403, and nothing touches storage.
    let forbidden = [
        (Method::PUT, "/v1/topics/payroll".to_owned(), "{}"),
        (Method::GET, "/v1/topics/payroll".to_owned(), ""),
        (
            Method::PATCH,
            "/v1/topics/payroll".to_owned(),
            r#"{"retention_ms":60000}"#,
        ),
        (Method::DELETE, "/v1/topics/payroll".to_owned(), ""),
        (Method::POST, "/v1/topics/payroll/produce".to_owned(), "x"),
        (
            Method::POST,
            "/v1/topics/payroll/produce-batch".to_owned(),
            r#"{"messages":[{"payload":1}]}"#,
        ),
        (Method::GET, "/v1/topics/payroll/consume".to_owned(), ""),
        (
            Method::GET,
            "/v1/topics/payroll/consume?partition=0&offset=0".to_owned(),
            "",
        ),
        (
            Method::POST,
            format!("/v1/topics/payroll/ack?{}", q(&handle)),
            "",
        ),
        (
            Method::POST,
            "/v1/topics/payroll/ack".to_owned(),
            &format!(r#"{{"receipt_handles":["{handle}"]}}"#),
        ),
    ];
    for who in [&alice, &bob] {
        for (m, path, body) in &forbidden {
            let (s, v) = who.call(m.clone(), path, body).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (StatusCode::FORBIDDEN, Some("forbidden")),
                "{} {m} {path}",
                who.user
            );
        }
    }
    let (_, t) = root.call(Method::GET, "/v1/topics/payroll", "").await;
    assert_eq!(t["partitions"][0]["next_offset"], 1, "nothing produced");
    assert_eq!(
        t["partitions"][0]["in_flight"], 1,
        "the lease was not settled"
    );

    // Produce and consume where granted; admin only where granted.
    assert_eq!(
        alice
            .call(Method::POST, "/v1/topics/orders/produce", "o1")
            .await
            .0,
        StatusCode::CREATED
    );
    let (s, m) = alice
        .call(Method::GET, "/v1/topics/orders/consume", "")
        .await;
    assert_eq!(s, StatusCode::OK);
    let h = m["receipt_handle"].as_str().unwrap();
    assert_eq!(
        alice
            .call(Method::POST, &format!("/v1/topics/orders/ack?{}", q(h)), "")
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        alice.call(Method::GET, "/v1/topics/orders", "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        alice.call(Method::DELETE, "/v1/topics/orders", "").await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        alice
            .call(Method::PUT, "/v1/topics/audit-dlq", "{}")
            .await
            .0,
        StatusCode::CREATED
    );
    // A dead-letter topic must be within the caller's admin grants too.
    let (s, _) = alice
        .call(
            Method::PUT,
            "/v1/topics/audit-1",
            r#"{"max_deliveries":3,"dead_letter_topic":"payroll"}"#,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = alice
        .call(
            Method::PUT,
            "/v1/topics/audit-1",
            r#"{"max_deliveries":3,"dead_letter_topic":"audit-dlq"}"#,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = alice
        .call(
            Method::PATCH,
            "/v1/topics/audit-1",
            r#"{"dead_letter_topic":"orders"}"#,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Listing shows only topics with some grant.
    let names = |v: &Value| -> Vec<String> {
        v["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&alice.call(Method::GET, "/v1/topics", "").await.1),
        vec!["audit-1", "audit-dlq", "orders"]
    );
    assert!(names(&bob.call(Method::GET, "/v1/topics", "").await.1).is_empty());
    assert_eq!(
        names(&root.call(Method::GET, "/v1/topics", "").await.1).len(),
        4
    );

    // A wrong password is 401 everywhere, for a known user and for nobody (half the
    // routes each: twenty failures from one address would be throttled).
    for (i, who) in [client("alice", "bob-pw"), client("nobody", "x")]
        .iter()
        .enumerate()
    {
        for (m, path, body) in forbidden.iter().skip(i).step_by(2) {
            assert_eq!(
                who.call(m.clone(), path, body).await.0,
                StatusCode::UNAUTHORIZED,
                "{m} {path}"
            );
        }
    }
    p.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_bad_passwords_from_one_address_get_429() {
    if narad_tests::skip_in_external_mode("a narad serve process with a users file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = server(&dir).await;
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let r = http
            .get(format!("{}/v1/topics", p.base))
            .basic_auth("alice", Some("guess"))
            .send()
            .await
            .unwrap();
        statuses.push(r.status());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            let wait: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=60).contains(&wait));
        }
    }
    assert!(
        statuses[..19]
            .iter()
            .all(|s| *s == StatusCode::UNAUTHORIZED),
        "{statuses:?}"
    );
    assert_eq!(statuses[19], StatusCode::TOO_MANY_REQUESTS);
    // Throttled: even the right password waits, and /health is unaffected.
    let r = http
        .get(format!("{}/v1/topics", p.base))
        .basic_auth("alice", Some("alice-pw"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = http.get(format!("{}/health", p.base)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Another address is not throttled.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let r = other
        .get(format!("{}/v1/topics", p.base))
        .basic_auth("alice", Some("alice-pw"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "another address");
    p.kill().await;
}

/// `/metrics` shows per-topic backlog only for the topics the caller holds a grant on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_topic_metrics_show_only_the_callers_topics() {
    if narad_tests::skip_in_external_mode("a narad serve process with a users file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = server(&dir).await;
    let http = reqwest::Client::new();
    let metrics = |user: &'static str, pass: &'static str| {
        let (http, base) = (http.clone(), p.base.clone());
        async move {
            let r = http
                .get(format!("{base}/metrics"))
                .basic_auth(user, Some(pass))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            r.text().await.unwrap()
        }
    };
    let root = Client {
        http: http.clone(),
        base: p.base.clone(),
        user: USER,
        pass: PASS,
    };
    for t in ["orders-eu", "payroll"] {
        root.call(Method::PUT, &format!("/v1/topics/{t}"), "{}")
            .await;
        for i in 0..3 {
            root.call(
                Method::POST,
                &format!("/v1/topics/{t}/produce"),
                &format!("m{i}"),
            )
            .await;
        }
    }
    let (s, _) = root
        .call(Method::GET, "/v1/topics/orders-eu/consume", "")
        .await;
    assert_eq!(s, StatusCode::OK);
    let all = metrics(USER, PASS).await;
    assert!(
        all.contains("narad_topic_backlog_messages{topic=\"orders-eu\"} 2"),
        "{all}"
    );
    assert!(
        all.contains("narad_topic_in_flight_messages{topic=\"orders-eu\"} 1"),
        "{all}"
    );
    assert!(
        all.contains("narad_topic_backlog_messages{topic=\"payroll\"} 3"),
        "{all}"
    );
    assert!(
        all.contains("narad_topic_oldest_unsettled_age_seconds{topic=\"payroll\"}"),
        "{all}"
    );
    let alices = metrics("alice", "alice-pw").await;
    assert!(alices.contains("topic=\"orders-eu\""), "{alices}");
    assert!(
        !alices.contains("payroll"),
        "alice holds no grant on payroll: {alices}"
    );
    let bobs = metrics("bob", "bob-pw").await;
    assert!(
        !bobs.contains("topic=\""),
        "bob holds no grant at all: {bobs}"
    );
    p.kill().await;
}
