//! A typed client for Narad's HTTP API (the contract: docs/design.md §1, and the OpenAPI
//! document every server serves at `/openapi.json`).
//!
//! One [`Client`] per server; it is cheap to clone and safe to share. Every call that the
//! server refuses with 503 (or 429) is retried after the `Retry-After` it names (capped at
//! [`MAX_RETRY_AFTER`]; exponential backoff with jitter when it names none), at most
//! [`Client::with_retries`] times, as the consumer contract asks ("retry 503 acks, this is
//! not optional"). A produce is retried only when it carries an idempotency key: without
//! one, a 503 `storage_unavailable` may hide a write that landed, and a blind retry could
//! append the message twice. Other errors are returned as [`Error::Api`] with the server's
//! status, code and message.
//!
//! ```no_run
//! # async fn demo() -> Result<(), narad_client::Error> {
//! let client = narad_client::Client::new("http://127.0.0.1:8080", Some(("me", "secret")))?;
//! client.produce("orders", b"hello".to_vec(), &Default::default()).await?;
//! for m in client.consume("orders", &narad_client::ConsumeOptions::default()).await? {
//!     println!("{:?}", m.payload_bytes()?);
//!     client.ack("orders", m.receipt_handle.as_deref().unwrap_or_default()).await?;
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use rand::Rng;
use reqwest::{RequestBuilder, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

mod operation;
pub use operation::Operation;

/// The longest `Retry-After` the client waits for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error (after any retries).
    #[error("{status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The error code (`topic_not_found`, `lease_gone`, …).
        code: String,
        /// The server's explanation.
        message: String,
    },
    /// No answer: connection refused, timed out, TLS failure.
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// An answer that is not what the API documents.
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// A bad argument (URL, payload encoding).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// The HTTP status, for [`Error::Api`].
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// True for a 410 Gone: the lease lapsed or was settled (the work may run twice), or a
    /// replayed offset expired.
    pub fn is_gone(&self) -> bool {
        self.status() == Some(StatusCode::GONE)
    }
}

/// A client's result.
pub type Result<T> = std::result::Result<T, Error>;

/// A topic as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Topic {
    /// Name.
    pub name: String,
    /// Its settings.
    pub settings: Settings,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Per-partition state (on `get_topic` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<PartitionState>>,
}

impl Topic {
    /// The visibility timeout, when the settings carry it.
    pub fn visibility_timeout(&self) -> Option<Duration> {
        self.settings.visibility_timeout()
    }

    /// Partition `p`'s state, from `get_topic`.
    pub fn partition(&self, p: u32) -> Option<&PartitionState> {
        self.partitions.as_ref()?.iter().find(|s| s.partition == p)
    }
}

/// Settings as the server shows them: a topic's (every field), a subscription's own
/// (those it sets) or the ones it obeys (`effective`). Each field is optional, and
/// fields a newer server sends that this client does not know are kept in `other`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Partitions (a topic's, fixed at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// How long a consumed message stays invisible to others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    /// Leases in flight per partition before consume answers 204.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_partition: Option<u32>,
    /// Out-of-order acks held above the frontier before acks answer 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_acked_ahead_per_partition: Option<u32>,
    /// Messages older than this are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// How long a produce's `Idempotency-Key` is remembered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<u64>,
    /// Deliveries before a message moves to the dead-letter topic; 0: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<u32>,
    /// Where messages go after `max_deliveries` deliveries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// While true, consume delivers nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Delivery order within a partition: `none` or `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<String>,
    /// Fields this client does not know, as the server sent them.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

impl Settings {
    /// The visibility timeout, when these settings carry it.
    pub fn visibility_timeout(&self) -> Option<Duration> {
        self.visibility_timeout_ms.map(Duration::from_millis)
    }
}

/// One partition's state, as `get_topic` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PartitionState {
    /// Partition.
    pub partition: u32,
    /// Lowest retained offset.
    pub start_offset: u64,
    /// Lowest unsettled offset.
    pub frontier: u64,
    /// Offset the next message gets.
    pub next_offset: u64,
    /// Unsettled messages with no live lease and no delay (the backlog).
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Offsets acked above the frontier.
    pub acked_ahead: u64,
    /// Unsettled messages whose delay is not over.
    pub delayed: u64,
    /// Segments the manifest names.
    pub segments: u64,
    /// Payload bytes retained.
    pub bytes: u64,
    /// The manifest's version.
    pub version: u64,
    /// The manifest's size.
    pub manifest_bytes: u64,
    /// Index objects the manifest names.
    pub indexes: u64,
    /// Age of the oldest unsettled message, ms.
    pub oldest_unsettled_age_ms: Option<u64>,
    /// Age of the oldest available message, ms.
    pub oldest_available_age_ms: Option<u64>,
    /// Fields this client does not know, as the server sent them.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// A subscription as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Subscription {
    /// Name.
    pub name: String,
    /// Its topic.
    pub topic: String,
    /// `latest` or `earliest`.
    pub start: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// The settings it sets itself.
    pub settings: Settings,
    /// The settings it obeys: the topic's, overlaid with its own.
    pub effective: Settings,
    /// Per-partition figures (`get_subscription` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<SubscriptionPartition>>,
}

/// One partition's figures for a subscription, as `get_subscription` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SubscriptionPartition {
    /// Partition.
    pub partition: u32,
    /// The subscription's lowest unsettled offset.
    pub frontier: u64,
    /// Offset the next message gets.
    pub next_offset: u64,
    /// Unsettled messages with no live lease and no delay (the backlog).
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Offsets acked above the frontier.
    pub acked_ahead: u64,
    /// Unsettled messages whose delay is not over.
    pub delayed: u64,
    /// Messages retention removed before this subscription settled them.
    pub lost: u64,
    /// Age of the oldest unsettled message, ms.
    pub oldest_unsettled_age_ms: Option<u64>,
    /// Age of the oldest available message, ms.
    pub oldest_available_age_ms: Option<u64>,
    /// Fields this client does not know, as the server sent them.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// What `create_topic` and `create_subscription` found.
#[derive(Debug, Clone)]
pub struct Created<T> {
    /// True when this call created it (201); false when it existed with the same
    /// settings (200).
    pub created: bool,
    /// The topic or subscription.
    pub value: T,
}

/// One page of `list_topics`.
#[derive(Debug, Clone, Deserialize)]
pub struct TopicPage {
    /// The topics.
    pub topics: Vec<Topic>,
    /// Pass as `after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// Where a produced message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Produced {
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
}

/// Options of a single produce.
#[derive(Debug, Clone, Default)]
pub struct ProduceOptions {
    /// Routes by hash, and comes back on consume.
    pub key: Option<String>,
    /// An explicit partition.
    pub partition: Option<u32>,
    /// Makes retries safe: a retry within the topic's dedup window appends nothing.
    pub idempotency_key: Option<String>,
    /// Headers (name → value), sent as `Narad-Header-<name>`.
    pub headers: Headers,
    /// Deliver no sooner than this long from now (`30s`, `5m`; up to 12 h).
    pub delay: Option<String>,
}

/// A message's headers.
pub type Headers = std::collections::BTreeMap<String, String>;

/// One message of a produce batch.
#[derive(Debug, Clone, Serialize)]
pub struct BatchMessage {
    /// The payload: any JSON value (stored as its exact text), or with
    /// `payload_encoding` `"base64"` a base64 string of the bytes.
    pub payload: Box<RawValue>,
    /// `Some("base64")` for binary payloads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_encoding: Option<&'static str>,
    /// Key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// Idempotency key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Headers.
    #[serde(skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// Deliver no sooner than this many ms from now (0: at once; up to 12 h).
    #[serde(skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl BatchMessage {
    /// A message of these bytes, sent in the form that stores exactly them: as the JSON
    /// text itself when they are one JSON value, else base64.
    ///
    /// Errors: none in practice ([`Error::Invalid`] if base64 text would not serialise).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let as_json = std::str::from_utf8(bytes)
            .ok()
            .filter(|t| !t.is_empty() && t.trim() == *t)
            .and_then(|t| RawValue::from_string(t.to_owned()).ok());
        match as_json {
            Some(raw) => Ok(Self::new(raw, None)),
            None => {
                let text = base64::engine::general_purpose::STANDARD.encode(bytes);
                let raw = serde_json::value::to_raw_value(&text)
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                Ok(Self::new(raw, Some("base64")))
            }
        }
    }

    fn new(payload: Box<RawValue>, payload_encoding: Option<&'static str>) -> Self {
        Self {
            payload,
            payload_encoding,
            key: None,
            partition: None,
            idempotency_key: None,
            headers: Headers::new(),
            delay_ms: 0,
        }
    }
}

/// One result of a batch call, in the order of the request.
#[derive(Debug, Clone, Deserialize)]
pub struct EntryResult {
    /// The status the single call would have got.
    pub status: u16,
    /// Where it landed (produce).
    pub partition: Option<u32>,
    /// Where it landed (produce).
    pub offset: Option<u64>,
    /// Why it failed.
    pub error: Option<Value>,
}

/// A delivered (or replayed) message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// The payload as the API renders it (JSON verbatim, text as a string, binary base64).
    pub payload: Box<RawValue>,
    /// `"base64"` when `payload` is base64 of binary bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_encoding: Option<String>,
    /// Proof of the lease (absent on replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_handle: Option<String>,
    /// Deliveries so far, this one included.
    pub delivery_count: u32,
    /// When the broker accepted it, RFC 3339.
    pub produced_at: String,
    /// Headers (empty when it has none).
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
}

impl Message {
    /// The payload's bytes as produced: base64 decoded when flagged, a JSON string's
    /// text, or any other JSON value's exact text. (A produced JSON string and the same
    /// text produced plainly come back alike; both give the text.)
    ///
    /// Errors: [`Error::Decode`] for a flagged payload that is not base64.
    pub fn payload_bytes(&self) -> Result<Vec<u8>> {
        let raw = self.payload.get();
        if self.payload_encoding.as_deref() == Some("base64") {
            let text: String =
                serde_json::from_str(raw).map_err(|e| Error::Decode(e.to_string()))?;
            return base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Error::Decode(format!("base64 payload: {e}")));
        }
        match serde_json::from_str::<String>(raw) {
            Ok(text) if raw.starts_with('"') => Ok(text.into_bytes()),
            _ => Ok(raw.as_bytes().to_vec()),
        }
    }
}

/// Options of a consume.
#[derive(Debug, Clone, Default)]
pub struct ConsumeOptions {
    /// Long-poll up to this long (capped by the server).
    pub wait: Option<Duration>,
    /// Only this partition.
    pub partition: Option<u32>,
    /// Up to this many messages (1–100); `None`: one.
    pub max: Option<u32>,
    /// Lease for this subscription (`None`: the topic's default one).
    pub subscription: Option<String>,
}

impl ConsumeOptions {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(w) = self.wait {
            q.push(("wait", format!("{}ms", w.as_millis())));
        }
        if let Some(p) = self.partition {
            q.push(("partition", p.to_string()));
        }
        if let Some(m) = self.max {
            q.push(("max", m.to_string()));
        }
        if let Some(s) = &self.subscription {
            q.push(("subscription", s.clone()));
        }
        q
    }
}

/// What [`Client::redrive`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redriven {
    /// Messages moved back to where they came from.
    pub moved: u64,
    /// Messages that could not be moved (their origin is gone or refused them).
    pub failed: u64,
}

/// What [`Client::whoami`] answers: the caller and its grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whoami {
    /// The user name.
    pub user: String,
    /// Its grants; a full-rights user holds the one grant `*` with every action.
    pub grants: Vec<Grant>,
}

/// One grant: a topic pattern and what it allows there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// A topic name, or a prefix ending in `*`.
    pub topics: String,
    /// What it allows.
    pub actions: Vec<GrantAction>,
}

/// What a grant allows on its topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantAction {
    /// Produce and produce-batch.
    Produce,
    /// Consume, replay, ack, extend, nack.
    Consume,
    /// Create, change, delete, purge, redrive.
    Admin,
    /// An action a newer server knows and this client does not (written back as `other`).
    #[serde(other)]
    Other,
}

/// What [`Client::consume_acking`] answers.
#[derive(Debug, Clone, Deserialize)]
pub struct Consumed {
    /// The messages leased (empty when none turned up within `wait`).
    pub messages: Vec<Message>,
    /// One result per ack, in order: `status` 204, 410 or 503 (outcome unknown).
    pub acks: Vec<EntryResult>,
}

/// What to do with a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done: settled forever.
    Ack,
    /// Still working: the visibility window restarts now.
    Extend,
    /// Give it back: available again at once.
    Nack,
    /// Retry later: the lease ends this long from now (at most 12 h), then the message
    /// comes back.
    ExtendFor(Duration),
}

impl Settle {
    fn query(self) -> Option<String> {
        match self {
            Settle::Ack => None,
            Settle::Extend => Some("true".into()),
            Settle::Nack => Some("0".into()),
            Settle::ExtendFor(d) => Some(format!("{}ms", d.as_millis())),
        }
    }
}

/// The client. Clone it freely: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    auth: Option<(String, String)>,
    retries: u32,
}

/// How a call treats 503s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Retry after `Retry-After`.
    Yes,
    /// Return the 503: a retry might apply the call twice.
    No,
}

impl Client {
    /// A client of the server at `base` (`http://host:port`, or an API Gateway URL with
    /// its stage), with HTTP Basic credentials.
    ///
    /// Errors: [`Error::Invalid`] for a URL that is not http(s).
    pub fn new(base: &str, auth: Option<(&str, &str)>) -> Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::Invalid(format!(
                "the server URL must start with http:// or https://, got {base:?}"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // Above the server's longest long poll (25 s) and API Gateway's 30 s.
            .timeout(Duration::from_secs(60))
            .build()?;
        Ok(Self {
            http,
            base,
            auth: auth.map(|(u, p)| (u.to_owned(), p.to_owned())),
            retries: 8,
        })
    }

    /// The same client, retrying a refused call at most `n` times.
    pub fn with_retries(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request for `op`, its path filled with `params` in the template's order.
    fn request(&self, op: Operation, params: &[&str]) -> RequestBuilder {
        let (_, method, _) = op.spec();
        let r = self
            .http
            .request(method, format!("{}{}", self.base, op.path(params)));
        match &self.auth {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        }
    }

    /// Sends what `build` makes, retrying 503s and 429s as the module documentation says.
    async fn send(&self, retry: Retry, build: impl Fn() -> RequestBuilder) -> Result<Response> {
        let mut attempt = 0u32;
        loop {
            let r = build().send().await?;
            let status = r.status();
            let refused = status == StatusCode::SERVICE_UNAVAILABLE
                || status == StatusCode::TOO_MANY_REQUESTS;
            if status.is_success() || !refused || retry == Retry::No || attempt >= self.retries {
                return if status.is_success() {
                    Ok(r)
                } else {
                    Err(api_error(r).await)
                };
            }
            let named = r
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let backoff = Duration::from_millis(100 << attempt.min(6));
            let jitter = rand::thread_rng().gen_range(0..=backoff.as_millis() as u64 / 2);
            let wait = named
                .unwrap_or(backoff + Duration::from_millis(jitter))
                .min(MAX_RETRY_AFTER);
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// A page of topics (`limit` 1–1000) after `after`.
    pub async fn list_topics(&self, after: Option<&str>, limit: u32) -> Result<TopicPage> {
        let r = self
            .send(Retry::Yes, || {
                let mut q = vec![("limit", limit.to_string())];
                if let Some(a) = after {
                    q.push(("after", a.to_owned()));
                }
                self.request(Operation::ListTopics, &[]).query(&q)
            })
            .await?;
        json(r).await
    }

    /// Every topic, following the pages.
    pub async fn all_topics(&self) -> Result<Vec<Topic>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.list_topics(after.as_deref(), 1000).await?;
            out.extend(page.topics);
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(out),
            }
        }
    }

    /// A topic's settings and per-partition state.
    pub async fn get_topic(&self, name: &str) -> Result<Topic> {
        let r = self
            .send(Retry::Yes, || self.request(Operation::GetTopic, &[name]))
            .await?;
        json(r).await
    }

    /// Creates a topic with `settings` (a JSON object, every field optional). Returns
    /// whether it was created (false: it existed with the same settings) and the topic.
    pub async fn create_topic(&self, name: &str, settings: &Value) -> Result<Created<Topic>> {
        let body = settings.to_string();
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::CreateTopic, &[name])
                    .body(body.clone())
            })
            .await?;
        let created = r.status() == StatusCode::CREATED;
        Ok(Created {
            created,
            value: json(r).await?,
        })
    }

    /// Changes the settings that can change.
    pub async fn patch_topic(&self, name: &str, settings: &Value) -> Result<Topic> {
        let body = settings.to_string();
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::ChangeTopic, &[name])
                    .body(body.clone())
            })
            .await?;
        json(r).await
    }

    /// Deletes a topic and all its messages.
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        self.send(Retry::Yes, || self.request(Operation::DeleteTopic, &[name]))
            .await?;
        Ok(())
    }

    /// Removes every retained message (available and in flight); answers how many.
    pub async fn purge_topic(&self, name: &str) -> Result<u64> {
        #[derive(Deserialize)]
        struct Purged {
            purged: u64,
        }
        let r = self
            .send(Retry::Yes, || self.request(Operation::PurgeTopic, &[name]))
            .await?;
        Ok(json::<Purged>(r).await?.purged)
    }

    /// Moves up to `max` (1–1000, the server's default 1000 when `None`) messages of the
    /// dead-letter topic `name` back where their `narad-source-*` headers say they came
    /// from, idempotently.
    pub async fn redrive(&self, name: &str, max: Option<u32>) -> Result<Redriven> {
        let r = self
            .send(Retry::Yes, || {
                let q: Vec<(&str, String)> =
                    max.map(|m| ("max", m.to_string())).into_iter().collect();
                self.request(Operation::Redrive, &[name]).query(&q)
            })
            .await?;
        json(r).await
    }

    /// The caller's user name and grants.
    pub async fn whoami(&self) -> Result<Whoami> {
        let r = self
            .send(Retry::Yes, || self.request(Operation::Whoami, &[]))
            .await?;
        json(r).await
    }

    /// Appends one message (its raw bytes). Retried on 503 only with an idempotency key.
    pub async fn produce(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        opts: &ProduceOptions,
    ) -> Result<Produced> {
        let payload: Bytes = payload.into();
        let retry = if opts.idempotency_key.is_some() {
            Retry::Yes
        } else {
            Retry::No
        };
        let r = self
            .send(retry, || {
                let mut q: Vec<(&str, String)> = Vec::new();
                if let Some(k) = &opts.key {
                    q.push(("key", k.clone()));
                }
                if let Some(p) = opts.partition {
                    q.push(("partition", p.to_string()));
                }
                if let Some(d) = &opts.delay {
                    q.push(("delay", d.clone()));
                }
                let mut req = self
                    .request(Operation::Produce, &[topic])
                    .query(&q)
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(payload.clone());
                if let Some(k) = &opts.idempotency_key {
                    req = req.header("Idempotency-Key", k);
                }
                for (name, value) in &opts.headers {
                    req = req.header(format!("Narad-Header-{name}"), value);
                }
                req
            })
            .await?;
        json(r).await
    }

    /// Appends up to 1000 messages in one request; one result per message, in order.
    /// Retried on 503 only when every message carries an idempotency key.
    pub async fn produce_batch(
        &self,
        topic: &str,
        messages: &[BatchMessage],
    ) -> Result<Vec<EntryResult>> {
        #[derive(Serialize)]
        struct Body<'a> {
            messages: &'a [BatchMessage],
        }
        #[derive(Deserialize)]
        struct Results {
            results: Vec<EntryResult>,
        }
        let body =
            serde_json::to_string(&Body { messages }).map_err(|e| Error::Invalid(e.to_string()))?;
        let retry = if messages.iter().all(|m| m.idempotency_key.is_some()) {
            Retry::Yes
        } else {
            Retry::No
        };
        let r = self
            .send(retry, || {
                self.request(Operation::ProduceBatch, &[topic])
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        Ok(json::<Results>(r).await?.results)
    }

    /// Leases a message (or up to `max`); empty when nothing turned up within `wait`.
    pub async fn consume(&self, topic: &str, opts: &ConsumeOptions) -> Result<Vec<Message>> {
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::Consume, &[topic])
                    .query(&opts.query())
            })
            .await?;
        if r.status() == StatusCode::NO_CONTENT {
            return Ok(Vec::new());
        }
        if opts.max.is_some() {
            #[derive(Deserialize)]
            struct List {
                messages: Vec<Message>,
            }
            Ok(json::<List>(r).await?.messages)
        } else {
            Ok(vec![json(r).await?])
        }
    }

    /// Acks `acks` and leases up to `opts.max` messages in one request (`POST
    /// /v1/topics/{t}/consume`): the acks on the partition leased from land in the same
    /// commit as the new lease. Each ack is answered in [`Consumed::acks`] as
    /// [`Client::ack`] would be: 204 acked, 410 gone, 503 outcome unknown (ack it again).
    /// With no acks this is [`Client::consume`].
    pub async fn consume_acking(
        &self,
        topic: &str,
        opts: &ConsumeOptions,
        acks: &[String],
    ) -> Result<Consumed> {
        let body = serde_json::json!({ "ack": acks }).to_string();
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::ConsumeAcking, &[topic])
                    .query(&opts.query())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        json(r).await
    }

    /// Reads the message at `offset` of `partition` without leasing it; `None` when
    /// nothing is there (yet) after `wait`. An expired offset is [`Error::is_gone`].
    pub async fn replay(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        wait: Option<Duration>,
    ) -> Result<Option<Message>> {
        let r = self
            .send(Retry::Yes, || {
                let mut q = vec![
                    ("partition", partition.to_string()),
                    ("offset", offset.to_string()),
                ];
                if let Some(w) = wait {
                    q.push(("wait", format!("{}ms", w.as_millis())));
                }
                self.request(Operation::Consume, &[topic]).query(&q)
            })
            .await?;
        if r.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        Ok(Some(json(r).await?))
    }

    /// Acks, extends or nacks one lease. 503s are retried (an ack dropped on the floor
    /// becomes a redelivery); a 410 means the lease is gone (the work may run twice).
    pub async fn settle(&self, topic: &str, receipt_handle: &str, action: Settle) -> Result<()> {
        self.send(Retry::Yes, || {
            let mut q = vec![("receipt_handle", receipt_handle.to_owned())];
            if let Some(e) = action.query() {
                q.push(("extend", e));
            }
            self.request(Operation::Ack, &[topic]).query(&q)
        })
        .await?;
        Ok(())
    }

    /// Settles many handles of `topic` the same way in one request (`POST
    /// /v1/topics/{t}/ack` with `receipt_handles`): one result per handle, in order, each
    /// as [`Client::settle`] would answer it: 204 done, 410 gone, 503 outcome unknown
    /// (settle it again). Handles on one partition share a commit.
    ///
    /// Errors: a refusal of the whole request (400 for 0 or more than 100 handles).
    pub async fn settle_batch(
        &self,
        topic: &str,
        receipt_handles: &[String],
        action: Settle,
    ) -> Result<Vec<EntryResult>> {
        #[derive(Serialize)]
        struct Body<'a> {
            receipt_handles: &'a [String],
            #[serde(skip_serializing_if = "Option::is_none")]
            extend: Option<String>,
        }
        #[derive(Deserialize)]
        struct Results {
            results: Vec<EntryResult>,
        }
        let body = serde_json::to_string(&Body {
            receipt_handles,
            extend: action.query(),
        })
        .map_err(|e| Error::Invalid(e.to_string()))?;
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::Ack, &[topic])
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        Ok(json::<Results>(r).await?.results)
    }

    /// [`Client::settle`] with [`Settle::Ack`].
    pub async fn ack(&self, topic: &str, receipt_handle: &str) -> Result<()> {
        self.settle(topic, receipt_handle, Settle::Ack).await
    }

    /// [`Client::settle`] with [`Settle::Extend`].
    pub async fn extend(&self, topic: &str, receipt_handle: &str) -> Result<()> {
        self.settle(topic, receipt_handle, Settle::Extend).await
    }

    /// [`Client::settle`] with [`Settle::Nack`].
    pub async fn nack(&self, topic: &str, receipt_handle: &str) -> Result<()> {
        self.settle(topic, receipt_handle, Settle::Nack).await
    }

    /// Creates subscription `name` on `topic` with `settings` (a JSON object, every field
    /// optional: `start`, `visibility_timeout_ms`, …). Returns whether it was created
    /// (false: it existed the same) and the subscription.
    pub async fn create_subscription(
        &self,
        topic: &str,
        name: &str,
        settings: &Value,
    ) -> Result<Created<Subscription>> {
        let body = settings.to_string();
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::CreateSubscription, &[topic, name])
                    .body(body.clone())
            })
            .await?;
        let created = r.status() == StatusCode::CREATED;
        Ok(Created {
            created,
            value: json(r).await?,
        })
    }

    /// A topic's subscriptions (without per-partition figures).
    pub async fn list_subscriptions(&self, topic: &str) -> Result<Vec<Subscription>> {
        #[derive(Deserialize)]
        struct List {
            subscriptions: Vec<Subscription>,
        }
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::ListSubscriptions, &[topic])
            })
            .await?;
        Ok(json::<List>(r).await?.subscriptions)
    }

    /// One subscription, with its per-partition figures.
    pub async fn get_subscription(&self, topic: &str, name: &str) -> Result<Subscription> {
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::GetSubscription, &[topic, name])
            })
            .await?;
        json(r).await
    }

    /// Changes a subscription's settings.
    pub async fn patch_subscription(
        &self,
        topic: &str,
        name: &str,
        settings: &Value,
    ) -> Result<Subscription> {
        let body = settings.to_string();
        let r = self
            .send(Retry::Yes, || {
                self.request(Operation::PatchSubscription, &[topic, name])
                    .body(body.clone())
            })
            .await?;
        json(r).await
    }

    /// Deletes a subscription and its state.
    pub async fn delete_subscription(&self, topic: &str, name: &str) -> Result<()> {
        self.send(Retry::Yes, || {
            self.request(Operation::DeleteSubscription, &[topic, name])
        })
        .await?;
        Ok(())
    }

    /// Cancels the retained message at `offset` of `partition`: for every subscription,
    /// or for `subscription` only. A cancelled delayed message is never delivered.
    pub async fn cancel(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        subscription: Option<&str>,
    ) -> Result<()> {
        let (partition, offset) = (partition.to_string(), offset.to_string());
        self.send(Retry::Yes, || {
            let q: Vec<(&str, &str)> = subscription
                .map(|s| ("subscription", s))
                .into_iter()
                .collect();
            self.request(Operation::CancelMessage, &[topic, &partition, &offset])
                .query(&q)
        })
        .await?;
        Ok(())
    }
}

async fn json<T: serde::de::DeserializeOwned>(r: Response) -> Result<T> {
    let bytes = r.bytes().await?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Decode(e.to_string()))
}

async fn api_error(r: Response) -> Error {
    let status = r.status();
    let body = r.bytes().await.unwrap_or_default();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let field = |f: &str| v["error"][f].as_str().map(str::to_owned);
    Error::Api {
        status,
        code: field("code").unwrap_or_else(|| "unknown".into()),
        message: field("message")
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_and_subscriptions_read_typed_and_keep_what_they_do_not_know() {
        let t: Topic = serde_json::from_value(serde_json::json!({
            "name": "orders",
            "settings": {"partitions": 2, "visibility_timeout_ms": 30000,
                         "dead_letter_topic": null, "ordering": "key", "newer": 7},
            "created_at": "2026-12-05T00:00:00.000Z",
            "partitions": [{"partition": 1, "start_offset": 4, "frontier": 5,
                            "next_offset": 9, "oldest_unsettled_age_ms": null, "newer": true}]
        }))
        .unwrap();
        assert_eq!(t.settings.partitions, Some(2));
        assert_eq!(t.visibility_timeout(), Some(Duration::from_secs(30)));
        assert_eq!(t.settings.dead_letter_topic, None);
        assert_eq!(t.settings.other["newer"], 7);
        let p = t.partition(1).unwrap();
        assert_eq!((p.start_offset, p.frontier, p.next_offset), (4, 5, 9));
        assert_eq!(p.other["newer"], true);
        assert!(t.partition(0).is_none());
        let s: Subscription = serde_json::from_value(serde_json::json!({
            "name": "audit", "topic": "orders", "start": "earliest",
            "created_at": "2026-12-05T00:00:00.000Z",
            "settings": {"max_deliveries": 3},
            "effective": {"visibility_timeout_ms": 1000, "max_deliveries": 3}
        }))
        .unwrap();
        assert_eq!(s.settings.max_deliveries, Some(3));
        assert_eq!(s.settings.visibility_timeout(), None);
        assert_eq!(
            s.effective.visibility_timeout(),
            Some(Duration::from_secs(1))
        );
    }

    fn message(payload: &str, encoding: Option<&str>) -> Message {
        Message {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: RawValue::from_string(payload.to_owned()).unwrap(),
            payload_encoding: encoding.map(str::to_owned),
            receipt_handle: None,
            delivery_count: 1,
            produced_at: String::new(),
            headers: Headers::new(),
        }
    }

    #[test]
    fn payload_bytes_are_what_was_produced() {
        assert_eq!(
            message(r#"{"a":1.0}"#, None).payload_bytes().unwrap(),
            br#"{"a":1.0}"#
        );
        assert_eq!(
            message(r#""hello world""#, None).payload_bytes().unwrap(),
            b"hello world"
        );
        assert_eq!(
            message(r#""AAH/""#, Some("base64"))
                .payload_bytes()
                .unwrap(),
            [0, 1, 255]
        );
        assert!(message("42", Some("base64")).payload_bytes().is_err());
    }

    #[test]
    fn batch_messages_store_exactly_the_bytes() {
        let m = BatchMessage::from_bytes(br#"{"a":[1,2]}"#).unwrap();
        assert_eq!(
            (m.payload.get(), m.payload_encoding),
            (r#"{"a":[1,2]}"#, None)
        );
        let m = BatchMessage::from_bytes(b"plain text").unwrap();
        assert_eq!(m.payload_encoding, Some("base64"));
        let m = BatchMessage::from_bytes(b" 1").unwrap();
        assert_eq!(
            m.payload_encoding,
            Some("base64"),
            "whitespace would be lost"
        );
    }
}
