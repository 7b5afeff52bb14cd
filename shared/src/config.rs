//! Configuration, read from the environment in one place.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `NARAD_STORE` | `file://./narad-data` | store URL: `file://PATH`, `memory://`, `s3://BUCKET[/PREFIX]` |
//! | `NARAD_LISTEN` | `127.0.0.1:8080` | address `narad serve` listens on |
//! | `NARAD_AUTH` | (unset) | `user:pass[,user:pass…]`, every right on every topic; unset (and no users file): `serve` generates a password |
//! | `NARAD_USERS_FILE` | (unset) | a users file with password hashes and per-topic grants ([`crate::access`]); `serve --users FILE` |
//! | `NARAD_USERS` | (unset) | the users file's JSON itself (for Lambda, from Secrets Manager) |
//! | `NARAD_RECEIPT_KEY` | (unset) | `key[,older-key…]`; the first signs, all verify; unset: generated once and kept in the store |
//! | `NARAD_MAX_MESSAGE_BYTES` | 1048576 | largest payload; larger produces get 413 |
//! | `NARAD_MAX_WAIT_MS` | 10000 | cap on a consume's `wait` |
//! | `NARAD_POLL_INTERVAL_MS` | 500 | how often a long poll re-reads the store at first (and always on topics of layout 1) |
//! | `NARAD_WATCH_ACTIVE_MS` | 100 | how often consumers waiting on a topic of up to 12 partitions read its manifests while other processes commit to it (one conditional GET each; docs/design.md §5) |
//! | `NARAD_WATCH_IDLE_MS` | 1500 | the interval those reads grow to while the topic is idle, for a topic of 4 partitions (`N/4` times this for N partitions): the most a message produced through another process waits for an idle waiter |
//! | `NARAD_IDLE_POLL_MAX_MS` | 4000 | the same for a topic of more than 12 partitions, which waiters list instead (from `NARAD_POLL_INTERVAL_MS` up to this) |
//! | `NARAD_TOPIC_CACHE_MS` | 1000 | how long topic settings are cached per process |
//! | `NARAD_SEGMENT_CACHE_BYTES` | 67108864 | decoded segments kept in memory per process (index objects get a quarter of this more) |
//! | `NARAD_MAX_TOPICS` | 10000 | topics a store may hold; creating one more gets 409 `too_many_topics` |
//! | `NARAD_COMMIT_LINGER_MS` | 2 | how long a group commit waits for more operations to join |
//! | `NARAD_PROCESS_RECORD_TTL_MS` | 900000 | how long a process's record in the store (`system/processes/`, read by `narad upgrade`) counts unless renewed; renewed every third of this |
//! | `NARAD_HEADER_TIMEOUT_MS` | 10000 | `narad serve`: a connection that takes longer to send a request's headers, or sits idle between requests longer, is closed |
//! | `NARAD_BODY_TIMEOUT_MS` | 30000 | a request body not received within this long gets 408 |
//! | `NARAD_MAX_CONNECTIONS` | 4096 | `narad serve`: open connections at most (lowered to fit the file-descriptor limit); beyond it, 503 and close |
//! | `NARAD_TLS_CERT`, `NARAD_TLS_KEY` | (unset) | `narad serve`: PEM certificate chain and private key; both set: HTTPS only |
//! | `NARAD_MAX_BODY_BUFFER_BYTES` | 268435456 | request body bytes held by the process at once; a request over it gets 503 with `Retry-After` |
//! | `NARAD_STORE_LATENCY_MS` | 0 | **benchmarks only**: adds this many milliseconds to every storage request, to measure a local store with a remote store's round-trip time |
//! | `NARAD_STORE_KEY_WRITE_INTERVAL_MS` | 0 | **benchmarks and tests only**: refuses (as R2's 429) a second write of one key within this many milliseconds, to measure a store with Cloudflare R2's one write per second per key (1000) |
//! | `NARAD_TEST_CLOCK_FILE` | (unset) | **tests only**: read "now" (ms since the epoch) from this file on every clock read, so a test can move an external server's time |
//!
//! Errors name the variable at fault.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, FileClock, SystemClock};

/// Process-level limits of the broker (read from the `NARAD_*` variables above).
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// Largest payload accepted, in bytes.
    pub max_message_bytes: usize,
    /// Cap on a consume's `wait`.
    pub max_wait: Duration,
    /// How often a long poll re-reads the store for work from other processes, at first.
    pub poll_interval: Duration,
    /// The longest interval between an idle topic's listings while consumers wait, for
    /// a topic of more than 12 partitions (`broker/watch.rs`); never below
    /// `poll_interval`.
    pub idle_poll_max: Duration,
    /// How often consumers waiting on a topic of up to 12 partitions read its manifests
    /// while other processes commit to it (`broker/watch.rs`).
    pub watch_active: Duration,
    /// The interval those reads grow to while the topic is idle, for 4 partitions
    /// (`N/4` times this for N); never below `watch_active`.
    pub watch_idle: Duration,
    /// Bytes of decoded segments kept in memory (index objects get a quarter more).
    pub segment_cache_bytes: usize,
    /// How long topic settings are cached in this process. Settings changed by another
    /// process take up to this long to apply here.
    pub topic_cache: Duration,
    /// How long a group commit waits for more operations to join it.
    pub commit_linger: Duration,
    /// Topics the store may hold.
    pub max_topics: usize,
    /// Subscriptions one topic may hold besides its default one (`NARAD_MAX_SUBSCRIPTIONS`).
    pub max_subscriptions: usize,
    /// How long this process's record in the store counts without being renewed (it is
    /// renewed every third of this; [`crate::gate`]).
    pub process_ttl: Duration,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        Self {
            max_message_bytes: 1 << 20,
            max_wait: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            idle_poll_max: Duration::from_secs(4),
            watch_active: Duration::from_millis(100),
            watch_idle: Duration::from_millis(1500),
            segment_cache_bytes: 64 << 20,
            topic_cache: Duration::from_secs(1),
            commit_linger: Duration::from_millis(2),
            max_topics: 10_000,
            max_subscriptions: crate::subscription::DEFAULT_MAX_SUBSCRIPTIONS,
            process_ttl: Duration::from_secs(15 * 60),
        }
    }
}

/// Limits of the HTTP edge (read from the `NARAD_*` variables above).
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `narad serve`: longest wait for a request's headers, and longest idle time
    /// between requests on a kept-alive connection.
    pub header_timeout: Duration,
    /// Longest time to receive a request body (408 after it).
    pub body_timeout: Duration,
    /// `narad serve`: open connections at most, before the file-descriptor limit lowers it.
    pub max_connections: usize,
    /// Request body bytes held by the process at once (503 beyond it).
    pub max_body_buffer: usize,
    /// `narad serve`: PEM certificate chain and private key files for TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            max_body_buffer: 256 << 20,
            tls: None,
        }
    }
}

/// A user allowed to call the API.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// User name.
    pub user: String,
    /// Password.
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// A bad configuration value.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {message}")]
pub struct ConfigError {
    /// The environment variable (or flag) at fault.
    pub var: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// Everything a Narad process is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Store URL.
    pub store: String,
    /// Listen address for `narad serve`.
    pub listen: String,
    /// Allowed users; `None` when `NARAD_AUTH` is unset.
    pub auth: Option<Vec<Credential>>,
    /// Path of a users file (`NARAD_USERS_FILE`).
    pub users_file: Option<PathBuf>,
    /// A users file's JSON (`NARAD_USERS`).
    pub users_json: Option<String>,
    /// Receipt-signing keys, first signs; empty when `NARAD_RECEIPT_KEY` is unset.
    pub receipt_keys: Vec<Vec<u8>>,
    /// Broker limits.
    pub broker: BrokerOptions,
    /// HTTP edge limits.
    pub http: HttpOptions,
    /// Benchmark and test emulation only: latency added to every storage request
    /// (`NARAD_STORE_LATENCY_MS`, 0 to 5000; default 0, none), and R2's limit of one
    /// write per key per interval (`NARAD_STORE_KEY_WRITE_INTERVAL_MS`, 0 to 10000;
    /// default 0, none).
    pub emulation: crate::store::Emulation,
    /// Test only: the file [`Config::clock`] reads the time from (`NARAD_TEST_CLOCK_FILE`).
    /// Never set it in production.
    pub test_clock_file: Option<PathBuf>,
}

impl Config {
    /// The clock to run the broker on: [`SystemClock`], or a [`FileClock`] when
    /// `NARAD_TEST_CLOCK_FILE` is set (tests only).
    pub fn clock(&self) -> Arc<dyn Clock> {
        match &self.test_clock_file {
            Some(path) => Arc::new(FileClock::new(path)),
            None => Arc::new(SystemClock),
        }
    }

    /// Reads the process environment.
    ///
    /// Errors: [`ConfigError`] naming the first bad variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads configuration through `get` (the environment, or a map in tests).
    ///
    /// Errors: [`ConfigError`] naming the first bad variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let auth = match get("NARAD_AUTH") {
            None => None,
            Some(v) => Some(parse_auth(&v)?),
        };
        let receipt_keys = match get("NARAD_RECEIPT_KEY") {
            None => Vec::new(),
            Some(v) => {
                let keys: Vec<Vec<u8>> =
                    v.split(',').map(|k| k.trim().as_bytes().to_vec()).collect();
                if keys.iter().any(|k| k.len() < 16) {
                    return Err(ConfigError {
                        var: "NARAD_RECEIPT_KEY",
                        message: "each key must be at least 16 characters".into(),
                    });
                }
                keys
            }
        };
        Ok(Self {
            store: get("NARAD_STORE").unwrap_or_else(|| "file://./narad-data".into()),
            listen: get("NARAD_LISTEN").unwrap_or_else(|| "127.0.0.1:8080".into()),
            auth,
            users_file: get("NARAD_USERS_FILE")
                .filter(|p| !p.trim().is_empty())
                .map(PathBuf::from),
            users_json: get("NARAD_USERS").filter(|j| !j.trim().is_empty()),
            receipt_keys,
            broker: broker_options(&get)?,
            http: http_options(&get)?,
            emulation: crate::store::Emulation {
                latency: Duration::from_millis(bounded(
                    &get,
                    "NARAD_STORE_LATENCY_MS",
                    0,
                    0,
                    5000,
                )?),
                key_write_interval: Duration::from_millis(bounded(
                    &get,
                    "NARAD_STORE_KEY_WRITE_INTERVAL_MS",
                    0,
                    0,
                    10_000,
                )?),
            },
            test_clock_file: get("NARAD_TEST_CLOCK_FILE")
                .filter(|p| !p.trim().is_empty())
                .map(PathBuf::from),
        })
    }
}

/// The whole number in `var`, or `default` when unset; refused outside `lo..=hi`.
fn bounded(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: u64,
    lo: u64,
    hi: u64,
) -> Result<u64, ConfigError> {
    let Some(v) = get(var) else {
        return Ok(default);
    };
    let n: u64 = v.trim().parse().map_err(|_| ConfigError {
        var,
        message: format!("expected a whole number, got {v:?}"),
    })?;
    if n < lo || n > hi {
        return Err(ConfigError {
            var,
            message: format!("must be between {lo} and {hi}, got {n}"),
        });
    }
    Ok(n)
}

/// The duration in milliseconds in `var`, as [`bounded`].
fn bounded_ms(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: Duration,
    lo: u64,
    hi: u64,
) -> Result<Duration, ConfigError> {
    bounded(get, var, default.as_millis() as u64, lo, hi).map(Duration::from_millis)
}

/// The broker limits from the `NARAD_*` variables, each within its range.
fn broker_options(get: &impl Fn(&str) -> Option<String>) -> Result<BrokerOptions, ConfigError> {
    let defaults = BrokerOptions::default();
    let num = |var, default, lo, hi| bounded(get, var, default, lo, hi);
    let ms = |var, default, lo, hi| bounded_ms(get, var, default, lo, hi);
    Ok(BrokerOptions {
        max_message_bytes: num(
            "NARAD_MAX_MESSAGE_BYTES",
            defaults.max_message_bytes as u64,
            1,
            64 << 20,
        )? as usize,
        max_wait: ms("NARAD_MAX_WAIT_MS", defaults.max_wait, 0, 25_000)?,
        poll_interval: ms("NARAD_POLL_INTERVAL_MS", defaults.poll_interval, 10, 60_000)?,
        idle_poll_max: ms(
            "NARAD_IDLE_POLL_MAX_MS",
            defaults.idle_poll_max,
            10,
            600_000,
        )?,
        watch_active: ms("NARAD_WATCH_ACTIVE_MS", defaults.watch_active, 10, 60_000)?,
        watch_idle: ms("NARAD_WATCH_IDLE_MS", defaults.watch_idle, 10, 600_000)?,
        segment_cache_bytes: num(
            "NARAD_SEGMENT_CACHE_BYTES",
            defaults.segment_cache_bytes as u64,
            0,
            16 << 30,
        )? as usize,
        commit_linger: ms("NARAD_COMMIT_LINGER_MS", defaults.commit_linger, 0, 1000)?,
        topic_cache: ms("NARAD_TOPIC_CACHE_MS", defaults.topic_cache, 0, 60_000)?,
        max_topics: num("NARAD_MAX_TOPICS", defaults.max_topics as u64, 1, 1_000_000)? as usize,
        max_subscriptions: num(
            "NARAD_MAX_SUBSCRIPTIONS",
            defaults.max_subscriptions as u64,
            1,
            10_000,
        )? as usize,
        process_ttl: ms(
            "NARAD_PROCESS_RECORD_TTL_MS",
            defaults.process_ttl,
            1000,
            86_400_000,
        )?,
    })
}

/// The HTTP edge limits from the `NARAD_*` variables, each within its range.
fn http_options(get: &impl Fn(&str) -> Option<String>) -> Result<HttpOptions, ConfigError> {
    let d = HttpOptions::default();
    let num = |var, default, lo, hi| bounded(get, var, default, lo, hi);
    let ms = |var, default, lo, hi| bounded_ms(get, var, default, lo, hi);
    Ok(HttpOptions {
        header_timeout: ms("NARAD_HEADER_TIMEOUT_MS", d.header_timeout, 100, 600_000)?,
        body_timeout: ms("NARAD_BODY_TIMEOUT_MS", d.body_timeout, 100, 600_000)?,
        max_connections: num(
            "NARAD_MAX_CONNECTIONS",
            d.max_connections as u64,
            1,
            1 << 20,
        )? as usize,
        max_body_buffer: num(
            "NARAD_MAX_BODY_BUFFER_BYTES",
            d.max_body_buffer as u64,
            1 << 20,
            64 << 30,
        )? as usize,
        tls: match (get("NARAD_TLS_CERT"), get("NARAD_TLS_KEY")) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(ConfigError {
                    var: "NARAD_TLS_CERT",
                    message: "NARAD_TLS_CERT and NARAD_TLS_KEY go together".into(),
                })
            }
        },
    })
}

/// A random 24-character password (letters and digits) for `serve` without `NARAD_AUTH`.
pub fn generate_password() -> String {
    use rand::distributions::{Alphanumeric, DistString};
    Alphanumeric.sample_string(&mut rand::thread_rng(), 24)
}

/// Parses `user:pass[,user:pass…]`.
///
/// Errors: [`ConfigError`] for `NARAD_AUTH` when an entry has no `:` or an empty part.
pub fn parse_auth(v: &str) -> Result<Vec<Credential>, ConfigError> {
    let mut out = Vec::new();
    for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once(':') {
            Some((u, p)) if !u.is_empty() && !p.is_empty() => out.push(Credential {
                user: u.to_owned(),
                password: p.to_owned(),
            }),
            _ => {
                return Err(ConfigError {
                    var: "NARAD_AUTH",
                    message: "expected user:password[,user:password…] with non-empty parts".into(),
                })
            }
        }
    }
    if out.is_empty() {
        return Err(ConfigError {
            var: "NARAD_AUTH",
            message: "no credentials given".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.store, "file://./narad-data");
        assert!(c.auth.is_none());
        assert_eq!(c.broker.max_message_bytes, 1 << 20);
        assert_eq!(c.broker.max_wait, Duration::from_secs(10));
        assert!(c.test_clock_file.is_none());
    }

    #[test]
    fn test_clock_file_selects_the_file_clock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("now");
        std::fs::write(&path, "1234").unwrap();
        let c = cfg(&[("NARAD_TEST_CLOCK_FILE", path.to_str().unwrap())]).unwrap();
        assert_eq!(c.test_clock_file.as_deref(), Some(path.as_path()));
        assert_eq!(c.clock().now_ms(), 1234);
        assert!(cfg(&[]).unwrap().clock().now_ms() > 1234);
    }

    #[test]
    fn errors_name_the_variable() {
        assert_eq!(
            cfg(&[("NARAD_MAX_WAIT_MS", "x")]).unwrap_err().var,
            "NARAD_MAX_WAIT_MS"
        );
        assert_eq!(
            cfg(&[("NARAD_MAX_WAIT_MS", "60000")]).unwrap_err().var,
            "NARAD_MAX_WAIT_MS"
        );
        assert_eq!(
            cfg(&[("NARAD_AUTH", "nocolon")]).unwrap_err().var,
            "NARAD_AUTH"
        );
        assert_eq!(
            cfg(&[("NARAD_RECEIPT_KEY", "short")]).unwrap_err().var,
            "NARAD_RECEIPT_KEY"
        );
        let c = cfg(&[("NARAD_AUTH", "a:b, c:d:e")]).unwrap();
        let auth = c.auth.unwrap();
        assert_eq!(
            auth[1],
            Credential {
                user: "c".into(),
                password: "d:e".into()
            }
        );
    }
}
