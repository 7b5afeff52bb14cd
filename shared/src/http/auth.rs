//! HTTP Basic auth for every `/v1` route and `/metrics`, per-topic authorization, and the
//! failed-login throttle (docs/security.md).
//!
//! * The middleware authenticates the caller ([`crate::access::Users`]) and puts it in the
//!   request as a [`Caller`]; handlers check it with [`allow`] before any storage call
//!   (403 `forbidden`).
//! * A client address with [`THROTTLE_AFTER`] failed logins within [`THROTTLE_WINDOW`] is
//!   answered 429 with `Retry-After` for [`THROTTLE_FOR`], whatever it sends; other
//!   addresses are unaffected. Every failure is logged with the user name and address,
//!   never the password. The address is the TCP peer for `narad serve` and API Gateway's
//!   source IP on Lambda ([`ClientAddr`]); the count is per process.

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::runtime::Instant;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::{ApiError, AppState};
use crate::access::{Action, User};

/// Failed logins from one address before it is throttled.
pub(super) const THROTTLE_AFTER: u32 = 20;
/// The window those failures are counted in.
pub(super) const THROTTLE_WINDOW: Duration = Duration::from_secs(60);
/// How long a throttled address gets 429.
pub(super) const THROTTLE_FOR: Duration = Duration::from_secs(60);
/// Addresses tracked at once (the least recently failing are forgotten first).
const TRACKED: usize = 10_000;

/// The client's address, put in each request by the server loop or the Lambda adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub(super) struct Caller(pub Arc<User>);

/// 403 unless `caller` may do `action` on `topic`.
pub(super) fn allow(caller: &Caller, action: Action, topic: &str) -> Result<(), ApiError> {
    if caller.0.may(action, topic) {
        Ok(())
    } else {
        Err(forbidden(action, topic))
    }
}

/// 403 unless `caller` holds some grant on `topic`.
pub(super) fn allow_seeing(caller: &Caller, topic: &str) -> Result<(), ApiError> {
    if caller.0.sees(topic) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("no grant on topic {topic:?}"),
        ))
    }
}

fn forbidden(action: Action, topic: &str) -> ApiError {
    let what = match action {
        Action::Produce => "produce",
        Action::Consume => "consume",
        Action::Admin => "admin",
    };
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("no {what} grant on topic {topic:?}"),
    )
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    since: Instant,
    blocked_until: Option<Instant>,
}

/// Failed logins per client address.
pub(super) struct Throttle(Mutex<lru::LruCache<IpAddr, Failures>>);

impl Throttle {
    pub(super) fn new() -> Self {
        let cap = NonZeroUsize::new(TRACKED).unwrap_or(NonZeroUsize::MIN);
        Self(Mutex::new(lru::LruCache::new(cap)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<IpAddr, Failures>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long `addr` is still throttled, if it is.
    fn blocked(&self, addr: IpAddr) -> Option<Duration> {
        let f = *self.lock().peek(&addr)?;
        f.blocked_until
            .map(|t| t.saturating_duration_since(crate::runtime::now()))
            .filter(|d| !d.is_zero())
    }

    /// Counts a failure; returns how long `addr` is throttled if this one tips it over.
    fn failed(&self, addr: IpAddr) -> Option<Duration> {
        let now = crate::runtime::now();
        let mut c = self.lock();
        let f = c.get_or_insert_mut(addr, || Failures {
            count: 0,
            since: now,
            blocked_until: None,
        });
        if now.duration_since(f.since) > THROTTLE_WINDOW {
            *f = Failures {
                count: 0,
                since: now,
                blocked_until: None,
            };
        }
        f.count += 1;
        (f.count >= THROTTLE_AFTER).then(|| {
            f.blocked_until = Some(now + THROTTLE_FOR);
            THROTTLE_FOR
        })
    }
}

fn too_many(wait: Duration) -> Response {
    ApiError {
        retry_after: Some(wait.as_secs().max(1) as u32),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_failed_logins",
            "too many failed logins from this address; retry later",
        )
    }
    .into_response()
}

/// The user name and password of a Basic `Authorization` header.
pub fn basic_credentials(value: &str) -> Option<(String, String)> {
    let b = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

/// The request with its caller put in as a [`Caller`], or the answer: 401 with
/// `WWW-Authenticate` unless it carries valid credentials, 429 for a throttled address.
pub(super) async fn authenticate(state: &AppState, mut req: Request) -> Result<Request, Response> {
    let addr = req.extensions().get::<ClientAddr>().map(|a| a.0);
    let creds = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(basic_credentials);
    // A blocked address gets no verdict on any password; a request without credentials
    // guesses nothing, so it gets its plain 401.
    if creds.is_some() {
        if let Some(wait) = addr.and_then(|a| state.throttle.blocked(a)) {
            return Err(too_many(wait));
        }
    }
    let user = match &creds {
        Some((u, p)) => state.users.authenticate(u, p).await,
        None => None,
    };
    // A success does not clear the count: one valid account must not buy unlimited
    // guesses at another's password.
    if let Some(user) = user {
        req.extensions_mut().insert(Caller(user));
        return Ok(req);
    }
    if let Some((name, _)) = &creds {
        let shown = addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        tracing::warn!(user = %name.escape_debug(), addr = %shown, "failed login");
        if let Some(wait) = addr.and_then(|a| state.throttle.failed(a)) {
            tracing::warn!(addr = %shown, "throttling failed logins");
            return Err(too_many(wait));
        }
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "missing or invalid credentials",
    )
    .into_response())
}
