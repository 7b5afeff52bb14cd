//! Test harness: a real Narad HTTP server on 127.0.0.1 and a small client for it.
//! (The pure partition transitions have their own unit tests in `shared/src/partition/`.)
//!
//! [`Server::start`] runs the same router `narad serve` runs, in-process on a real
//! socket, with an injected [`ManualClock`] so lease timing is tested without sleeping.
//! The store comes from `NARAD_TEST_STORE`: unset or `file` for a fresh temporary
//! directory, `memory://`, or `s3://BUCKET[/PREFIX]` (a random sub-prefix per server, so
//! tests never see each other's objects). [`narad_binary`] finds the real `narad`
//! executable for tests that run it as a process.
//!
//! **External mode.** When `NARAD_TEST_URL` is set (e.g.
//! `http://127.0.0.1:9000/lambda-url/narad-api`, the `narad-api` function under
//! `cargo lambda watch`), [`Server::start`] starts nothing and targets that URL instead:
//! - `NARAD_TEST_STORE` is then the exact store URL the external server uses (for tests
//!   that inspect objects), not a base for random sub-prefixes;
//! - `NARAD_TEST_CLOCK_FILE` is the file the external server reads its time from (its
//!   `NARAD_TEST_CLOCK_FILE`); the server's [`TestClock`] writes it;
//! - `NARAD_TEST_SERVER_ENV` (optional) is a `KEY=VALUE` file with the external server's
//!   configuration, so [`Server::start_with_or_skip`] knows which options it has.
//!
//! Every test then shares one server and one store, so run them with `--test-threads=1`:
//! [`Server::start`] deletes every topic and resets the clock to [`T0`] first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod worker_store;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_shared::broker::Broker;
use narad_shared::clock::{Clock, ManualClock, RandomIds};
use narad_shared::config::BrokerOptions;
use narad_shared::config::{Config, Credential};
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

/// `NARAD_TEST_STORE`, unless it is unset, `file`, or a Worker's store (which only the
/// Worker's own server can use: a test's own servers then get a file store).
fn own_store_url() -> Option<String> {
    std::env::var("NARAD_TEST_STORE")
        .ok()
        .filter(|s| !s.is_empty() && s != "file" && !s.starts_with(worker_store::SCHEME))
}

/// The wall clock, in ms since the epoch: for servers that a `narad` command (which reads
/// the wall clock) also works on, whose time a fixed start would leave behind retention.
pub fn now_ms() -> u64 {
    narad_shared::clock::Clock::now_ms(&narad_shared::clock::SystemClock)
}

/// The store URL tests should use, with a fresh directory or prefix.
pub async fn test_store() -> (DynStore, Option<tempfile::TempDir>) {
    match own_store_url() {
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
    match own_store_url() {
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

/// The external server's base URL (`NARAD_TEST_URL`), when tests run in external mode.
pub fn external_url() -> Option<String> {
    std::env::var("NARAD_TEST_URL")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().trim_end_matches('/').to_owned())
}

/// In external mode, prints `skipped in external mode: needs X` and returns true: the
/// caller returns at once. Outside external mode, returns false.
pub fn skip_in_external_mode(needs: &str) -> bool {
    if external_url().is_some() {
        skipped(needs);
        true
    } else {
        false
    }
}

/// In a repeat of the suite against another store or server (`NARAD_TEST_REPEAT`, which
/// test.sh sets in every step after the file store's), prints `skipped in a repeat: …`
/// and returns true: the caller, a test that makes its own stores and servers (`uses`)
/// and so tests the same thing whatever the run's store, ran in the first step and returns
/// at once. Not counted with the external-mode skips (`NARAD_TEST_SKIPS`). Outside a
/// repeat, returns false.
pub fn skip_in_repeat(uses: &str) -> bool {
    let repeat = std::env::var_os("NARAD_TEST_REPEAT").is_some_and(|v| !v.is_empty());
    if repeat {
        println!("skipped in a repeat: uses {uses}, not the run's store");
    }
    repeat
}

/// The Worker's base URL, when tests run in external mode against a Worker with its test
/// hooks (`NARAD_TEST_STORE=worker+…`, edge/src/hooks.rs).
pub fn worker_url() -> Option<String> {
    let store = std::env::var("NARAD_TEST_STORE").ok()?;
    store.starts_with(worker_store::SCHEME).then_some(())?;
    external_url()
}

/// Says that the running test skipped itself, needing `needs`; with `NARAD_TEST_SKIPS`
/// set, also appends a line to that file, so that a run against an external server can
/// count its skips (test.sh prints the count for each).
fn skipped(needs: &str) {
    println!("skipped in external mode: needs {needs}");
    if let Some(path) = std::env::var_os("NARAD_TEST_SKIPS").filter(|p| !p.is_empty()) {
        use std::io::Write;
        let line = format!("{needs}\n");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        if let Ok(mut f) = file {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// A test's clock: a [`ManualClock`] shared with an in-process server, or the file an
/// external server reads its time from (`NARAD_TEST_CLOCK_FILE`). Clones share the time.
#[derive(Debug, Clone)]
pub enum TestClock {
    /// In-process time.
    Manual(ManualClock),
    /// Time written to a file on every change (see `narad_shared::clock::FileClock`).
    File {
        /// The file.
        path: PathBuf,
        /// The time last written.
        now: Arc<AtomicU64>,
    },
}

impl TestClock {
    /// A manual clock at `start_ms`.
    pub fn manual(start_ms: u64) -> Self {
        Self::Manual(ManualClock::new(start_ms))
    }

    /// A clock kept in `path`, set to `start_ms` now.
    pub fn file(path: impl Into<PathBuf>, start_ms: u64) -> Self {
        let c = Self::File {
            path: path.into(),
            now: Arc::new(AtomicU64::new(start_ms)),
        };
        c.set(start_ms);
        c
    }

    /// Moves time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        match self {
            Self::Manual(c) => c.advance(ms),
            Self::File { now, .. } => self.set(now.load(Ordering::SeqCst) + ms),
        }
    }

    /// Sets the time.
    pub fn set(&self, ms: u64) {
        match self {
            Self::Manual(c) => c.set(ms),
            Self::File { path, now } => {
                now.store(ms, Ordering::SeqCst);
                // Write then rename, so a reader never sees a half-written number.
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, ms.to_string()).unwrap();
                std::fs::rename(&tmp, path).unwrap();
            }
        }
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        match self {
            Self::Manual(c) => c.now_ms(),
            Self::File { now, .. } => now.load(Ordering::SeqCst),
        }
    }
}

/// A running test server.
pub struct Server {
    /// `http://127.0.0.1:PORT`, or the external server's URL (which may have a path).
    pub base: String,
    /// The server's clock; advance it to expire leases.
    pub clock: TestClock,
    /// The store under the server.
    pub store: DynStore,
    /// HTTP client with no auth preset.
    pub http: reqwest::Client,
    _dir: Option<tempfile::TempDir>,
    /// The in-process server; `None` in external mode.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
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

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("broker", &self.broker)
            .field("receipt_keys", &self.receipt_keys.len())
            .finish()
    }
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
    /// A server on a fresh store with default options; in external mode, the external
    /// server, with every topic deleted and the clock at [`T0`].
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// A server on a fresh store.
    ///
    /// In external mode `opts` must be what the external server is configured with (it
    /// panics otherwise); use [`Server::start_with_or_skip`] for options it may lack.
    pub async fn start_with(opts: Options) -> Self {
        if let Some(url) = external_url() {
            if let Err(diff) = external_options_match(&opts) {
                panic!("the external server is not configured with {diff}: use start_with_or_skip");
            }
            return Self::external(url).await;
        }
        let (store, dir) = test_store().await;
        Self::start_on(store, dir, opts, TestClock::manual(T0)).await
    }

    /// Like [`Server::start_with`], but in external mode, when the external server is not
    /// configured with `opts`, prints `skipped in external mode: needs server option …`
    /// and returns `None`.
    pub async fn start_with_or_skip(opts: Options) -> Option<Self> {
        if external_url().is_some() {
            if let Err(diff) = external_options_match(&opts) {
                skipped(&format!("server option {diff}"));
                return None;
            }
        }
        Some(Self::start_with(opts).await)
    }

    /// An in-process server on a fresh store of its own, even in external mode (e.g. a
    /// foreign server whose handles the server under test must refuse).
    pub async fn start_local_with(opts: Options) -> Self {
        let (store, dir) = if external_url().is_some() {
            local_store_beside_external().await
        } else {
            test_store().await
        };
        Self::start_on(store, dir, opts, TestClock::manual(T0)).await
    }

    /// The external server at `url`, cleaned for a new test.
    async fn external(url: String) -> Self {
        let store_url = std::env::var("NARAD_TEST_STORE")
            .expect("external mode needs NARAD_TEST_STORE: the store URL the server uses");
        let store = worker_store::open(&store_url).await;
        let clock_file = std::env::var("NARAD_TEST_CLOCK_FILE").expect(
            "external mode needs NARAD_TEST_CLOCK_FILE: the file the server reads time from",
        );
        let s = Self {
            base: url,
            clock: TestClock::file(clock_file, T0),
            store,
            http: http_client(),
            _dir: None,
            task: None,
        };
        s.delete_every_topic().await;
        s
    }

    /// Deletes every topic through the API, then any object left under `topics/`.
    async fn delete_every_topic(&self) {
        let r = self
            .req(reqwest::Method::GET, "/v1/topics?limit=1000")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "list topics on the external server"
        );
        let v: Value = r.json().await.unwrap();
        for t in v["topics"].as_array().cloned().unwrap_or_default() {
            let name = t["name"].as_str().unwrap();
            let r = self
                .req(reqwest::Method::DELETE, &format!("/v1/topics/{name}"))
                .send()
                .await
                .unwrap();
            assert!(
                r.status().is_success() || r.status() == StatusCode::NOT_FOUND,
                "delete {name}: {}",
                r.status()
            );
        }
        for key in self.store.list("topics/").await.unwrap() {
            self.store.delete(&key).await.unwrap();
        }
    }

    /// An in-process server on `store` (e.g. another server's, to act as a second
    /// process), on `clock`. In external mode this runs beside the external server, on
    /// its store and its clock file.
    pub async fn start_on(
        store: DynStore,
        dir: Option<tempfile::TempDir>,
        opts: Options,
        clock: TestClock,
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
        let http = narad_shared::config::HttpOptions::default();
        let users = narad_shared::access::Users::full_rights(&users);
        let app = narad_shared::http::router(Arc::new(broker), users, &http);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            narad_shared::http::serve(listener, app, &http, None, std::future::pending()).await;
        });
        Self {
            base: format!("http://{addr}"),
            clock,
            store,
            http: http_client(),
            _dir: dir,
            task: Some(task),
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// An authenticated request builder. In external mode it carries the test's time
    /// (`x-narad-test-now`) for a server that reads no clock file (a Worker's test hooks).
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, self.url(path))
            .basic_auth(USER, Some(PASS));
        match self.task {
            None => r.header("x-narad-test-now", self.clock.now_ms()),
            Some(_) => r,
        }
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

    /// Produces with an `Idempotency-Key`; answers (partition, offset), a retry's too.
    pub async fn produce_idem(&self, topic: &str, key: &str, body: &str) -> (u32, u64) {
        let r = self
            .req(
                reqwest::Method::POST,
                &format!("/v1/topics/{topic}/produce"),
            )
            .header("Idempotency-Key", key)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        (
            v["partition"].as_u64().unwrap() as u32,
            v["offset"].as_u64().unwrap(),
        )
    }

    /// Produces with a query string (`partition=1`, `key=k`).
    pub async fn produce_q(
        &self,
        topic: &str,
        query: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u32, u64) {
        let body: reqwest::Body = body.into();
        let mut req = self.req(
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/produce?{query}"),
        );
        // The Lambda emulator answers 500 to a body that is not UTF-8 and has no
        // Content-Type (it cannot tell it is binary), so say so in external mode.
        if external_url().is_some()
            && body
                .as_bytes()
                .is_some_and(|b| std::str::from_utf8(b).is_err())
        {
            req = req.header("content-type", "application/octet-stream");
        }
        let r = req.body(body).send().await.unwrap();
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

    /// `GET /metrics` (with the admin credentials) as text.
    pub async fn metrics(&self) -> String {
        self.req(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .unwrap()
            .text()
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

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The external server's configuration: `NARAD_TEST_SERVER_ENV` (`KEY=VALUE` lines, as
/// given to `cargo lambda watch --env-file`), or the defaults when unset.
fn external_config() -> Config {
    let vars: std::collections::HashMap<String, String> =
        match std::env::var("NARAD_TEST_SERVER_ENV") {
            Ok(path) if !path.is_empty() => std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("NARAD_TEST_SERVER_ENV {path}: {e}"))
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
            _ => Default::default(),
        };
    Config::from_lookup(|k| vars.get(k).cloned()).unwrap()
}

/// Ok when the external server runs with `opts`; otherwise the first option that differs.
fn external_options_match(opts: &Options) -> Result<(), String> {
    let cfg = external_config();
    let (want, have) = (&opts.broker, &cfg.broker);
    if want.max_message_bytes != have.max_message_bytes {
        return Err(format!("max_message_bytes={}", want.max_message_bytes));
    }
    if want.max_wait != have.max_wait {
        return Err(format!("max_wait={:?}", want.max_wait));
    }
    if want.poll_interval != have.poll_interval {
        return Err(format!("poll_interval={:?}", want.poll_interval));
    }
    if want.max_topics != have.max_topics {
        return Err(format!("max_topics={}", want.max_topics));
    }
    if opts.receipt_keys != cfg.receipt_keys {
        return Err("receipt_keys (another receipt key)".into());
    }
    Ok(())
}

/// A fresh store for an in-process server in external mode: a random prefix beside the
/// external server's (never under its `topics/`).
async fn local_store_beside_external() -> (DynStore, Option<tempfile::TempDir>) {
    match std::env::var("NARAD_TEST_STORE") {
        Ok(url) if url.starts_with("s3://") => {
            let url = format!("{}-local/t-{}", url.trim_end_matches('/'), uuid_like());
            (store::open(&url).await.unwrap(), None)
        }
        _ => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}", dir.path().display());
            (store::open(&url).await.unwrap(), Some(dir))
        }
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

/// Sends a raw HTTP/1.1 request with test credentials; returns the status code. `path`
/// goes after `base`'s own path, if it has one (`http://HOST:PORT/lambda-url/fn`).
pub async fn raw_status(base: &str, method: &str, path: &str) -> u16 {
    use base64::Engine;
    let rest = base.trim_start_matches("http://");
    let (addr, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let path = format!("{prefix}{path}");
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
#[derive(Debug)]
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
        let child = Self::command(store_url, port, extra_env).spawn().unwrap();
        Self::healthy(child, port).await
    }

    /// As [`Process::start`], with the process's log (stderr) piped to the caller.
    pub async fn start_logged(
        store_url: &str,
        port: u16,
        extra_env: &[(&str, &str)],
    ) -> (Self, tokio::process::ChildStderr) {
        let mut cmd = Self::command(store_url, port, extra_env);
        let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
        let log = child.stderr.take().unwrap();
        (Self::healthy(child, port).await, log)
    }

    /// As [`Process::start_logged`], running the `narad` executable at `binary` (an
    /// earlier build: [`previous_build`]).
    pub async fn start_binary(
        binary: &Path,
        store_url: &str,
        port: u16,
        extra_env: &[(&str, &str)],
    ) -> (Self, tokio::process::ChildStderr) {
        let mut cmd = Self::command_of(binary, store_url, port, extra_env);
        let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
        let log = child.stderr.take().unwrap();
        (Self::healthy(child, port).await, log)
    }

    fn command(store_url: &str, port: u16, extra_env: &[(&str, &str)]) -> tokio::process::Command {
        Self::command_of(&narad_binary(), store_url, port, extra_env)
    }

    fn command_of(
        binary: &Path,
        store_url: &str,
        port: u16,
        extra_env: &[(&str, &str)],
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(binary);
        cmd.args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            store_url,
        ])
        .env("NARAD_AUTH", format!("{USER}:{PASS}"))
        .env("NARAD_LOG", "warn")
        .env_remove("NARAD_TEST_CLOCK_FILE")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Waits until `child`, serving on `port`, answers `/health`.
    async fn healthy(child: tokio::process::Child, port: u16) -> Self {
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

/// Runs this build's `narad ARGS` (with `NARAD_LOG=warn`) to the end; answers (success,
/// stdout, stderr).
pub async fn run_narad(args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(narad_binary())
        .args(args)
        .env("NARAD_LOG", "warn")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Main at commit c3661c8 (2026-12-01): the last build before the format gate.
pub const PREVIOUS_COMMIT: &str = "c3661c8b5c3fbc164d5ac1d54440f5f7ca7e0d6c";

/// The `narad` executable of `commit` (built once by `tests/previous-build.sh` and kept
/// under the target directory; the first call on a fresh machine builds it, minutes).
pub fn previous_build(commit: &str) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("previous-build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(commit)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{} {commit} failed", script.display());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Collects the lines `log` prints, in the background, into the returned vector.
pub fn collect_log(
    log: tokio::process::ChildStderr,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use tokio::io::AsyncBufReadExt;
    let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let into = lines.clone();
    tokio::spawn(async move {
        let mut r = tokio::io::BufReader::new(log).lines();
        while let Ok(Some(l)) = r.next_line().await {
            into.lock().unwrap().push(l);
        }
    });
    lines
}

/// The value of the unlabelled metric `name` in a `/metrics` text, if it is there.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
