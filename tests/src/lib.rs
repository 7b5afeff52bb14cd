//! Test harness: a real Narad HTTP server on 127.0.0.1 and a small client for it.
//!
//! [`Server::start`] runs the same router `narad serve` runs, in-process on a real
//! socket, with an injected [`ManualClock`] so lease timing is tested without sleeping.
//! The store comes from `NARAD_TEST_STORE`: unset or `file` for a fresh temporary
//! directory, `memory://`, or `s3://BUCKET[/PREFIX]` (a random sub-prefix per server, so
//! tests never see each other's objects). [`narad_binary`] finds the real `narad`
//! executable for tests that run it as a process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use narad_shared::clock::{Clock, ManualClock, RandomIds};
use narad_shared::config::Credential;
use narad_shared::engine::{Broker, BrokerOptions};
use narad_shared::store::{self, DynStore};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Basic-auth user of test servers.
pub const USER: &str = "tester";
/// Basic-auth password of test servers.
pub const PASS: &str = "s3cret-pass";
/// Start of the manual clock: 2026-11-29T12:00:00Z.
pub const T0: u64 = 1_795_953_600_000;

/// The store URL tests should use, with a fresh directory or prefix.
pub async fn test_store() -> (DynStore, Option<tempfile::TempDir>) {
    match std::env::var("NARAD_TEST_STORE")
        .ok()
        .filter(|s| !s.is_empty() && s != "file")
    {
        None => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}", dir.path().display());
            (store::open(&url).await.unwrap(), Some(dir))
        }
        Some(url) if url.starts_with("s3://") => {
            let url = format!("{}/t-{}", url.trim_end_matches('/'), uuid_like());
            (store::open(&url).await.unwrap(), None)
        }
        Some(url) => (store::open(&url).await.unwrap(), None),
    }
}

/// The store URL for a process-level test (`narad serve --store ...`), plus the
/// directory to keep alive for a file store.
pub fn test_store_url() -> (String, Option<tempfile::TempDir>) {
    match std::env::var("NARAD_TEST_STORE")
        .ok()
        .filter(|s| !s.is_empty() && s != "file")
    {
        None => {
            let dir = tempfile::tempdir().unwrap();
            (format!("file://{}", dir.path().display()), Some(dir))
        }
        Some(url) if url.starts_with("s3://") => (
            format!("{}/t-{}", url.trim_end_matches('/'), uuid_like()),
            None,
        ),
        Some(url) => (url, None),
    }
}

fn uuid_like() -> String {
    use narad_shared::clock::IdSource;
    RandomIds.new_id()
}

/// A running test server.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The server's clock; advance it to expire leases.
    pub clock: ManualClock,
    /// The store under the server.
    pub store: DynStore,
    /// HTTP client with no auth preset.
    pub http: reqwest::Client,
    _dir: Option<tempfile::TempDir>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Options for [`Server::start_with`].
#[derive(Clone)]
pub struct Options {
    /// Broker limits.
    pub broker: BrokerOptions,
    /// Receipt keys (empty: generated and kept in the store).
    pub receipt_keys: Vec<Vec<u8>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            broker: BrokerOptions {
                poll_interval: Duration::from_millis(50),
                ..BrokerOptions::default()
            },
            receipt_keys: vec![b"test-receipt-key-0123456789".to_vec()],
        }
    }
}

impl Server {
    /// A server on a fresh store with default options.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// A server on a fresh store.
    pub async fn start_with(opts: Options) -> Self {
        let (store, dir) = test_store().await;
        Self::start_on(store, dir, opts, ManualClock::new(T0)).await
    }

    /// A server on `store` (e.g. another server's, to act as a second process).
    pub async fn start_on(
        store: DynStore,
        dir: Option<tempfile::TempDir>,
        opts: Options,
        clock: ManualClock,
    ) -> Self {
        let broker = Broker::new(
            store.clone(),
            Arc::new(clock.clone()) as Arc<dyn Clock>,
            Arc::new(RandomIds),
            opts.receipt_keys,
            opts.broker,
        )
        .await
        .unwrap();
        let users = vec![Credential {
            user: USER.into(),
            password: PASS.into(),
        }];
        let app = narad_shared::api::router(Arc::new(broker), &users);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base: format!("http://{addr}"),
            clock,
            store,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            _dir: dir,
            task,
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// An authenticated request builder.
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, self.url(path))
            .basic_auth(USER, Some(PASS))
    }

    /// Creates a topic with `settings` (a JSON object), asserting 201.
    pub async fn create_topic(&self, name: &str, settings: Value) -> Value {
        let r = self
            .req(reqwest::Method::PUT, &format!("/v1/topics/{name}"))
            .body(settings.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "create {name}");
        r.json().await.unwrap()
    }

    /// Produces raw bytes; returns (partition, offset), asserting 201.
    pub async fn produce(&self, topic: &str, body: impl Into<reqwest::Body>) -> (u32, u64) {
        self.produce_q(topic, "", body).await
    }

    /// Produces with a query string (`partition=1`, `key=k`).
    pub async fn produce_q(
        &self,
        topic: &str,
        query: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u32, u64) {
        let r = self
            .req(
                reqwest::Method::POST,
                &format!("/v1/topics/{topic}/produce?{query}"),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "produce: {v}");
        (
            v["partition"].as_u64().unwrap() as u32,
            v["offset"].as_u64().unwrap(),
        )
    }

    /// Consumes with a query string; `None` on 204, panics on anything but 200/204.
    pub async fn consume(&self, topic: &str, query: &str) -> Option<Value> {
        let r = self.consume_raw(topic, query).await;
        match r.status() {
            StatusCode::OK => Some(r.json().await.unwrap()),
            StatusCode::NO_CONTENT => None,
            s => panic!(
                "consume answered {s}: {}",
                r.text().await.unwrap_or_default()
            ),
        }
    }

    /// Consumes, returning the raw response.
    pub async fn consume_raw(&self, topic: &str, query: &str) -> reqwest::Response {
        self.req(
            reqwest::Method::GET,
            &format!("/v1/topics/{topic}/consume?{query}"),
        )
        .send()
        .await
        .unwrap()
    }

    /// Acks (`extra` = "" ), extends (`&extend=true`) or nacks (`&extend=0`); the status.
    pub async fn ack(&self, topic: &str, handle: &str, extra: &str) -> StatusCode {
        self.ack_raw(topic, handle, extra).await.status()
    }

    /// Like [`Server::ack`], returning the whole response.
    pub async fn ack_raw(&self, topic: &str, handle: &str, extra: &str) -> reqwest::Response {
        let q = serde_urlencoded_pair("receipt_handle", handle);
        self.req(
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/ack?{q}{extra}"),
        )
        .send()
        .await
        .unwrap()
    }

    /// `GET /v1/topics/{topic}` as JSON.
    pub async fn topic(&self, topic: &str) -> Value {
        let r = self
            .req(reqwest::Method::GET, &format!("/v1/topics/{topic}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// Sends `request_line` + headers verbatim over TCP (for paths a URL library would
    /// normalise, like `/v1/topics/..`); returns the status code.
    pub async fn raw_status(&self, method: &str, path: &str) -> u16 {
        raw_status(&self.base, method, path).await
    }
}

/// `name=value`, percent-encoded.
pub fn serde_urlencoded_pair(name: &str, value: &str) -> String {
    let mut s = String::from(name);
    s.push('=');
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// Sends a raw HTTP/1.1 request with test credentials; returns the status code.
pub async fn raw_status(base: &str, method: &str, path: &str) -> u16 {
    use base64::Engine;
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASS}"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {auth}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The `narad` executable built beside this test binary (`cargo build` builds it).
pub fn narad_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join(format!("narad{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} not found: run `cargo build -p narad` first",
        bin.display()
    );
    bin
}

/// A `narad serve` child process.
pub struct Process {
    /// The child.
    pub child: tokio::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Process {
    /// Starts `narad serve --listen 127.0.0.1:PORT --store URL` with test credentials and
    /// waits until `/health` answers.
    pub async fn start(store_url: &str, port: u16, extra_env: &[(&str, &str)]) -> Self {
        let mut cmd = tokio::process::Command::new(narad_binary());
        cmd.args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            store_url,
        ])
        .env("NARAD_AUTH", format!("{USER}:{PASS}"))
        .env("NARAD_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        for _ in 0..300 {
            if http
                .get(format!("{base}/health"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Self { child, base };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("narad serve did not become healthy on port {port}");
    }

    /// Kills the process and waits for it.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
