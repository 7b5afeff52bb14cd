//! Narad's HTTP API as a Cloudflare Worker, its state in an R2 bucket.
//!
//! The Worker serves the very router `narad serve` and the Lambda function serve
//! (`narad_shared::http::router`), over the very broker (`narad_shared::broker::Broker`),
//! whose store is the bucket bound as [`BUCKET_BINDING`] ([`R2Store`], made a `Store` by
//! `narad_shared::store::local::Local`). The core's timers, tasks and clocks come from the
//! host (narad-shared's runtime seam on `wasm32`).
//!
//! Everything that can be built once is built once per isolate, by its first request: the
//! configuration (from the Worker's variables and secrets, the same names as the
//! environment of `narad serve`, see `narad_shared::config`), the store and the broker with
//! its caches. A start that fails is not kept: the next request tries again.
//!
//! Like the Lambda function, the Worker never generates credentials: `NARAD_AUTH`,
//! `NARAD_USERS` (or `NARAD_USERS_FILE`, which a Worker cannot read) must be set.
//! `NARAD_R2_PREFIX` puts every key below a prefix of the bucket.
//!
//! Only `wasm32` builds have a body: a native build of the workspace compiles an empty
//! library here.
#![cfg(target_arch = "wasm32")]

mod r2;

pub use r2::R2Store;

use std::net::IpAddr;
use std::sync::Arc;

use narad_shared::access::Users;
use narad_shared::broker::Broker;
use narad_shared::clock::RandomIds;
use narad_shared::config::Config;
use narad_shared::http::{self, ClientAddr};
use narad_shared::store::local::Local;
use narad_shared::store::DynStore;
use tokio::sync::OnceCell;
use tower_service::Service;
use worker::{event, Context, Env, HttpRequest};

/// The binding of the R2 bucket the broker keeps its state in (wrangler.toml's
/// `[[r2_buckets]] binding`).
pub const BUCKET_BINDING: &str = "NARAD_BUCKET";

/// The variable naming the key prefix below which the broker's keys live (unset or empty:
/// the whole bucket).
pub const PREFIX_VAR: &str = "NARAD_R2_PREFIX";

/// The header in which Cloudflare passes the client's address.
const CLIENT_IP_HEADER: &str = "cf-connecting-ip";

/// The router over this isolate's broker, built by the first request that succeeds.
static APP: OnceCell<axum::Router> = OnceCell::const_new();

/// One request: through the router, once the broker is built.
#[event(fetch)]
async fn fetch(
    mut req: HttpRequest,
    env: Env,
    _ctx: Context,
) -> worker::Result<axum::response::Response> {
    let app = APP
        .get_or_try_init(|| start(&env))
        .await
        .map_err(worker::Error::RustError)?;
    // The failed-login throttle counts per client: the address Cloudflare saw.
    if let Some(ip) = client_ip(&req) {
        req.extensions_mut().insert(ClientAddr(ip));
    }
    Ok(app.clone().call(req).await?)
}

/// Builds the router over a new broker on the bucket bound in `env`, configured by the
/// Worker's variables and secrets.
///
/// Errors: a message naming what is missing or wrong (a variable, the binding, the store).
pub async fn start(env: &Env) -> Result<axum::Router, String> {
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
    let store: DynStore = Arc::new(Local::new(R2Store::new(bucket, &prefix)));
    let described = store.describe();
    // What `Broker::from_config` passes, with the store it cannot open from a URL.
    let broker = Broker::new(
        store,
        cfg.clock(),
        Arc::new(RandomIds),
        cfg.receipt_keys.clone(),
        cfg.broker.clone(),
    )
    .await
    .map_err(|e| format!("cannot start on {described}: {e}"))?;
    Ok(http::router(Arc::new(broker), users, &cfg.http))
}

/// The client's address, from Cloudflare's `CF-Connecting-IP` header.
fn client_ip(req: &HttpRequest) -> Option<IpAddr> {
    let value = req.headers().get(CLIENT_IP_HEADER)?.to_str().ok()?;
    value.trim().parse().ok()
}
