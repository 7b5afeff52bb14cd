//! The HTTP API (docs/design.md §1): one axum [`Router`] used by `narad serve` and by the
//! Lambda function alike.
//!
//! Every route under `/v1` and `/metrics` needs HTTP Basic auth ([`auth`]); `/health`
//! `/openapi.json` (the contract, [`OPENAPI`], listed route by route in [`ROUTES`]) and
//! the web console's files under `/console` do not. One file per group of routes under [`handlers`]; request parsing in [`extract`],
//! limits in [`limits`], the span every request runs in in [`trace`], the request-body budget and deadline in [`admission`], response
//! shapes in [`views`], and [`error`] the one place where broker errors become statuses
//! and JSON error codes. Handlers parse, call one broker operation, and render: they hold
//! no logic of their own.

mod admission;
mod auth;
pub(crate) mod batch_body;
pub(crate) mod error;
mod extract;
mod handlers;
pub mod limits;
#[cfg(feature = "server")]
mod serve;
#[cfg(feature = "server")]
pub mod tls;
pub(crate) mod trace;
mod views;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use axum::Router;

pub use crate::payload::{render, RenderedPayload};
pub use batch_body::{parse_ack_batch, parse_produce_batch};
pub use error::ApiError;
pub use extract::parse_wait;
#[cfg(feature = "server")]
pub use serve::{connection_limit, serve};
pub use views::rfc3339_ms;

use crate::access::Users;
use crate::broker::Broker;
use crate::config::HttpOptions;

pub use auth::{basic_credentials, ClientAddr};

pub use handlers::ops::OPENAPI;

/// Every route [`router`] serves, as (method, path), in the OpenAPI document's path syntax.
/// `tests/tests/openapi.rs` checks that the router answers each of them and 405 to every
/// other method on those paths, and that the OpenAPI document names exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/openapi.json"),
    ("GET", "/console"),
    ("GET", "/console/app.js"),
    ("GET", "/console/style.css"),
    ("GET", "/metrics"),
    ("GET", "/v1/whoami"),
    ("GET", "/v1/topics"),
    ("PUT", "/v1/topics/{topic}"),
    ("GET", "/v1/topics/{topic}"),
    ("PATCH", "/v1/topics/{topic}"),
    ("DELETE", "/v1/topics/{topic}"),
    ("GET", "/v1/topics/{topic}/subscriptions"),
    ("PUT", "/v1/topics/{topic}/subscriptions/{subscription}"),
    ("GET", "/v1/topics/{topic}/subscriptions/{subscription}"),
    ("PATCH", "/v1/topics/{topic}/subscriptions/{subscription}"),
    ("DELETE", "/v1/topics/{topic}/subscriptions/{subscription}"),
    ("POST", "/v1/topics/{topic}/produce"),
    ("POST", "/v1/topics/{topic}/produce-batch"),
    ("GET", "/v1/topics/{topic}/consume"),
    ("POST", "/v1/topics/{topic}/consume"),
    ("POST", "/v1/topics/{topic}/ack"),
    ("DELETE", "/v1/topics/{topic}/messages/{partition}/{offset}"),
    ("POST", "/v1/topics/{topic}/purge"),
    ("POST", "/v1/topics/{topic}/redrive"),
];

#[derive(Clone)]
struct AppState {
    broker: Arc<Broker>,
    /// Who may call, and with which grants.
    users: Arc<Users>,
    /// Failed logins per client address.
    throttle: Arc<auth::Throttle>,
    /// The request-body budget and deadline.
    admission: admission::Admission,
}

/// Middleware of every route that needs a caller: authenticate ([`auth`]), then admit the
/// request's body ([`admission`]). One layer rather than one each, since every layer costs
/// a boxed service clone and a state clone per request (docs/benchmarks.md, "CPU per
/// request"). An unauthenticated request reserves nothing.
async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    match auth::authenticate(&s, req).await {
        Ok(req) => admission::admit(&s.admission, req, next).await,
        Err(refusal) => refusal,
    }
}

/// Builds the router over `broker`, admitting `users`, within the edge limits `http`.
pub fn router(broker: Arc<Broker>, users: Users, http: &HttpOptions) -> Router {
    let largest = broker.options().max_message_bytes;
    let state = AppState {
        broker,
        users: Arc::new(users),
        throttle: Arc::new(auth::Throttle::new()),
        admission: admission::Admission::new(http.max_body_buffer, http.body_timeout, largest),
    };
    let v1 = Router::new()
        .route("/v1/whoami", get(handlers::ops::whoami))
        .route("/v1/topics", get(handlers::topics::list))
        .route(
            "/v1/topics/{topic}",
            put(handlers::topics::create)
                .get(handlers::topics::get)
                .patch(handlers::topics::patch)
                .delete(handlers::topics::delete),
        )
        .route(
            "/v1/topics/{topic}/subscriptions",
            get(handlers::subscriptions::list),
        )
        .route(
            "/v1/topics/{topic}/subscriptions/{subscription}",
            put(handlers::subscriptions::create)
                .get(handlers::subscriptions::get)
                .patch(handlers::subscriptions::patch)
                .delete(handlers::subscriptions::delete),
        )
        .route("/v1/topics/{topic}/produce", post(handlers::produce::one))
        .route(
            "/v1/topics/{topic}/produce-batch",
            post(handlers::produce::batch),
        )
        .route(
            "/v1/topics/{topic}/consume",
            get(handlers::consume::consume).post(handlers::consume::consume_acking),
        )
        .route("/v1/topics/{topic}/ack", post(handlers::ack::ack))
        .route(
            "/v1/topics/{topic}/messages/{partition}/{offset}",
            delete(handlers::ack::cancel),
        )
        .route("/v1/topics/{topic}/purge", post(handlers::topics::purge))
        .route(
            "/v1/topics/{topic}/redrive",
            post(handlers::topics::redrive),
        )
        .route("/metrics", get(handlers::ops::metrics))
        // Auth, then the body budget: an unauthenticated request reserves nothing.
        .route_layer(middleware::from_fn_with_state(state.clone(), guard));
    Router::new()
        .route("/health", get(handlers::ops::health))
        .route("/openapi.json", get(handlers::ops::openapi))
        .route("/console", get(handlers::ops::console))
        .route("/console/app.js", get(handlers::ops::console))
        .route("/console/style.css", get(handlers::ops::console))
        .merge(v1)
        .fallback(handlers::ops::not_found)
        .method_not_allowed_fallback(handlers::ops::method_not_allowed)
        // Outermost: every log line of a request, auth's included, carries its span.
        .layer(middleware::from_fn(trace::request))
        .with_state(state)
}
