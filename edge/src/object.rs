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
    app: OnceCell<axum::Router>,
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
        let app = self
            .app
            .get_or_try_init(|| start(&self.env, clock))
            .await
            .map_err(worker::Error::RustError)?;
        let mut req = HttpRequest::try_from(req)?;
        // The failed-login throttle counts per client: the address Cloudflare saw.
        if let Some(ip) = client_ip(&req) {
            req.extensions_mut().insert(ClientAddr(ip));
        }
        let res = app.clone().call(req).await?;
        Response::try_from(res)
    }
}

/// Builds the router over a new broker on the bucket bound in `env`, configured by the
/// Worker's variables and secrets (the names `narad serve` reads from its environment,
/// `narad_shared::config`).
///
/// Errors: a message naming what is missing or wrong (a variable, the binding, the store).
async fn start(
    env: &Env,
    clock: Arc<dyn narad_shared::clock::Clock>,
) -> Result<axum::Router, String> {
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
    Ok(http::router(Arc::new(broker), users, &cfg.http))
}

/// The client's address, from Cloudflare's `CF-Connecting-IP` header.
fn client_ip(req: &HttpRequest) -> Option<std::net::IpAddr> {
    let value = req.headers().get(CLIENT_IP_HEADER)?.to_str().ok()?;
    value.trim().parse().ok()
}
