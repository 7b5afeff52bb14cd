//! Narad's HTTP API as a Cloudflare Worker, its state in an R2 bucket (docs/edge.md).
//!
//! Two parts: this Worker's `fetch`, which sends each request to the Durable Object of its
//! topic ([`route::object_for`]), and that object ([`object::Narad`]), which serves it with
//! the very router `narad serve` and the Lambda function serve
//! (`narad_shared::http::router`) over the very broker (`narad_shared::broker::Broker`),
//! whose store is the bucket bound as [`object::BUCKET_BINDING`] ([`R2Store`], made a
//! `Store` by `narad_shared::store::local::Local`). The core's timers, tasks and clocks come
//! from the host (narad-shared's runtime seam on `wasm32`). R2 is the only durable state:
//! the objects' own storage is not used.
//!
//! Each object builds its broker, configured by the Worker's variables and secrets (the
//! names `narad serve` reads from its environment, `narad_shared::config`), on its first
//! request; a start that fails is not kept, and the next request tries again. Like the
//! Lambda function, the Worker never generates credentials: `NARAD_AUTH` or `NARAD_USERS`
//! must be set. `NARAD_R2_PREFIX` puts every key below a prefix of the bucket.
//!
//! Only `wasm32` builds have the Worker: a native build compiles the routing alone, with
//! its tests.

pub mod route;

#[cfg(all(target_arch = "wasm32", feature = "test-hooks"))]
mod hooks;
#[cfg(target_arch = "wasm32")]
mod object;
#[cfg(target_arch = "wasm32")]
mod r2;

#[cfg(target_arch = "wasm32")]
pub use object::{Narad, BUCKET_BINDING, PREFIX_VAR, WRITE_INTERVAL_VAR};
#[cfg(target_arch = "wasm32")]
pub use r2::{R2Store, R2_WRITE_INTERVAL};

/// The binding of the Durable Object namespace (wrangler.toml's
/// `[[durable_objects.bindings]] name`).
pub const OBJECTS_BINDING: &str = "NARAD";

/// One request: to the Durable Object of its topic, answered as that object answers.
#[cfg(target_arch = "wasm32")]
#[worker::event(fetch)]
async fn fetch(
    req: worker::HttpRequest,
    env: worker::Env,
    _ctx: worker::Context,
) -> worker::Result<axum::response::Response> {
    #[allow(unused_mut)]
    let mut name = route::object_for(req.uri().path());
    #[allow(unused_mut)]
    let mut req = worker::Request::try_from(req)?;
    #[cfg(feature = "test-hooks")]
    {
        if let Some(answer) = hooks::store(&mut req, &env).await {
            return Ok(answer?.into());
        }
        hooks::choose_object(&mut name, &req);
    }
    let stub = env.durable_object(OBJECTS_BINDING)?.get_by_name(&name)?;
    Ok(stub.fetch_with_request(req).await?.into())
}
