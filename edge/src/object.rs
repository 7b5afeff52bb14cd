//! The Durable Object that runs a broker: one per topic (and one for requests that name
//! no topic), each with its own broker, caches and commit queues, R2 its only durable
//! state (docs/edge.md, "Why a Durable Object per topic").
//!
//! A Worker may not use, in one request, I/O that another request started (workerd: "Cannot
//! perform I/O on behalf of a different request"), and Narad's group commit is exactly
//! that: one request's drain writes the commit that answers many. Inside one Durable
//! Object every request shares the object's I/O, so the broker runs there as it runs in
//! `narad serve`. Which object serves a request is only a matter of speed: any number of
//! brokers may share the bucket (they combine, docs/design.md §6), so a request that lands
//! on another object, or on two objects during a move, is still served correctly.

use std::sync::Arc;
use std::time::Duration;

use narad_shared::access::Users;
use narad_shared::broker::Broker;
use narad_shared::clock::RandomIds;
use narad_shared::config::Config;
use narad_shared::http::{self, ClientAddr};
use narad_shared::store::local::Local;
use narad_shared::store::DynStore;
use tokio::sync::OnceCell;
use tower_service::Service;
use worker::{durable_object, DurableObject, Env, HttpRequest, Request, Response, State};

use crate::r2::R2Store;

/// The binding of the R2 bucket the broker keeps its state in (wrangler.toml's
/// `[[r2_buckets]] binding`).
pub const BUCKET_BINDING: &str = "NARAD_BUCKET";

/// The variable naming the key prefix below which the broker's keys live (unset or empty:
/// the whole bucket).
pub const PREFIX_VAR: &str = "NARAD_R2_PREFIX";

/// The variable that spaces writes of one key by other than R2's second: only for a local
/// R2 under `wrangler dev`, which does not enforce the limit (the test run sets 100).
pub const WRITE_INTERVAL_VAR: &str = "NARAD_R2_WRITE_INTERVAL_MS";

/// The header in which Cloudflare passes the client's address.
const CLIENT_IP_HEADER: &str = "cf-connecting-ip";

/// A broker in a Durable Object (wrangler.toml's `class_name = "Narad"`).
#[durable_object]
pub struct Narad {
    env: Env,
    /// The time a test set (`test-hooks` only).
    #[cfg(feature = "test-hooks")]
    clock: narad_shared::clock::ManualClock,
    /// The router over this object's broker, built by its first request that succeeds.
    app: OnceCell<Served>,
}

/// What an object serves with, once started.
struct Served {
    app: axum::Router,
    /// The largest body read whole before the router sees the request (the server's
    /// `max_body_buffer`, docs/configuration.md).
    max_body: usize,
}

impl std::fmt::Debug for Narad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Narad")
            .field("started", &self.app.initialized())
            .finish_non_exhaustive()
    }
}

impl DurableObject for Narad {
    fn new(_state: State, env: Env) -> Self {
        Self {
            env,
            #[cfg(feature = "test-hooks")]
            clock: crate::hooks::clock(),
            app: OnceCell::new(),
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        #[cfg(feature = "test-hooks")]
        crate::hooks::set_time(&self.clock, &req);
        #[cfg(feature = "test-hooks")]
        let clock: Arc<dyn narad_shared::clock::Clock> = Arc::new(self.clock.clone());
        #[cfg(not(feature = "test-hooks"))]
        let clock: Arc<dyn narad_shared::clock::Clock> = Arc::new(narad_shared::clock::SystemClock);
        let served = self
            .app
            .get_or_try_init(|| start(&self.env, clock))
            .await
            .map_err(worker::Error::RustError)?;
        let req = HttpRequest::try_from(req)?;
        let (mut parts, body) = req.into_parts();
        // The failed-login throttle counts per client: the address Cloudflare saw.
        if let Some(ip) = client_ip(&parts.headers) {
            parts.extensions.insert(ClientAddr(ip));
        }
        // A body of a stated length is read whole first: the router may answer before it
        // reads the body (a 400 for a bad query), and an answer sent while the client is
        // still sending breaks the request on its way in (under wrangler dev, a 503 "Your
        // worker restarted mid-request"). Bodies of no stated length, or longer than the
        // server reads, go through as a stream, for the router to refuse.
        let stated = parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let body = match stated {
            Some(n) if n <= served.max_body => {
                let bytes = axum::body::to_bytes(axum::body::Body::new(body), n)
                    .await
                    .map_err(|e| worker::Error::RustError(format!("reading the body: {e}")))?;
                axum::body::Body::from(bytes)
            }
            _ => axum::body::Body::new(body),
        };
        let req = axum::http::Request::from_parts(parts, body);
        let res = served.app.clone().call(req).await?;
        Response::try_from(res)
    }
}

/// Builds the router over a new broker on the bucket bound in `env`, configured by the
/// Worker's variables and secrets (the names `narad serve` reads from its environment,
/// `narad_shared::config`).
///
/// Errors: a message naming what is missing or wrong (a variable, the binding, the store).
async fn start(env: &Env, clock: Arc<dyn narad_shared::clock::Clock>) -> Result<Served, String> {
    let var = |name: &str| env.var(name).ok().map(|v| v.to_string());
    let cfg = Config::from_lookup(var).map_err(|e| e.to_string())?;
    let users = Users::from_config(&cfg)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            "NARAD_USERS or NARAD_AUTH must be set (the Worker never generates credentials)"
                .to_owned()
        })?;
    let bucket = env
        .bucket(BUCKET_BINDING)
        .map_err(|e| format!("no R2 bucket bound as {BUCKET_BINDING}: {e}"))?;
    let prefix = var(PREFIX_VAR).unwrap_or_default();
    let interval = match var(WRITE_INTERVAL_VAR) {
        Some(ms) => Duration::from_millis(
            ms.trim()
                .parse()
                .map_err(|_| format!("{WRITE_INTERVAL_VAR}: expected milliseconds, got {ms:?}"))?,
        ),
        None => crate::r2::R2_WRITE_INTERVAL,
    };
    let r2 = R2Store::new(bucket, &prefix).with_write_interval(interval);
    let store: DynStore = Arc::new(Local::new(r2));
    let described = store.describe();
    // What `Broker::from_config` passes, with the store it cannot open from a URL.
    let broker = Broker::new(
        store,
        clock,
        Arc::new(RandomIds),
        cfg.receipt_keys.clone(),
        cfg.broker.clone(),
    )
    .await
    .map_err(|e| format!("cannot start on {described}: {e}"))?;
    Ok(Served {
        app: http::router(Arc::new(broker), users, &cfg.http),
        max_body: cfg.http.max_body_buffer,
    })
}

/// The client's address, from Cloudflare's `CF-Connecting-IP` header.
fn client_ip(headers: &axum::http::HeaderMap) -> Option<std::net::IpAddr> {
    let value = headers.get(CLIENT_IP_HEADER)?.to_str().ok()?;
    value.trim().parse().ok()
}
