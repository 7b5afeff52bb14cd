//! One tracing span per request (docs/design.md §9, "Logs"), so that every log line a
//! request causes (a storage warning, a corrupt object, a refused login) names the request,
//! its route and topic, and the commit that carried its operation.
//!
//! * The span is `request{id, method, route, topic, commit}`. `route` is the
//!   router's pattern (`/v1/topics/{topic}/ack`), never the raw path; `topic` is the path's
//!   topic segment as sent (bounded, percent-encoding kept), `commit` is filled in by the
//!   committer when a batch takes the request's operation (the same id its `commit` span
//!   carries).
//! * `id` is the client's `X-Request-Id` when it is 1 to [`MAX_ID_LEN`] characters of
//!   `[A-Za-z0-9._-]` (so a caller can correlate with its own logs), otherwise a fresh
//!   one ([`crate::clock::process_unique_hex`]). Every response carries it back as `X-Request-Id`, so a client
//!   that reports a 503 can name the log lines behind it.
//! * The span is at ERROR level although it is no error: a span is context, and at that
//!   level it is there whatever `NARAD_LOG` lets through (a WARN line of a `warn` filter
//!   still names its request).
//! * The finished request is a DEBUG event with its status and duration
//!   (`NARAD_LOG=narad_shared::http::trace=debug` is an access log); failures are already
//!   logged where they are decided.

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::field::Empty;
use tracing::Instrument;

/// The request id header, read and answered.
pub(crate) static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-chosen request id kept.
pub(crate) const MAX_ID_LEN: usize = 64;

/// Longest topic segment put in a span (topic names are shorter; longer input is cut).
const MAX_TOPIC_LEN: usize = 128;

/// Wraps the request in its span and answers its id.
pub(super) async fn request(req: Request, next: Next) -> Response {
    let id = request_id(req.headers());
    // The span's fields are formatted once, here (borrowing the request, copying nothing).
    let span = tracing::error_span!(
        "request",
        %id,
        method = %req.method(),
        route = %req.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str),
        topic = topic_segment(req.uri().path()).map(tracing::field::display),
        commit = Empty,
    );
    let started = crate::runtime::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let (status, ms) = (resp.status().as_u16(), started.elapsed().as_millis() as u64);
    span.in_scope(|| tracing::debug!(status, ms, "request done"));
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID.clone(), v);
    }
    resp
}

/// The client's request id if it is well-formed, else a fresh one.
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            (1..=MAX_ID_LEN).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
        .map_or_else(crate::clock::process_unique_hex, str::to_owned)
}

/// The `{topic}` segment of a `/v1/topics/{topic}…` path, cut to [`MAX_TOPIC_LEN`].
fn topic_segment(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/topics/")?;
    let seg = rest.split('/').next().filter(|s| !s.is_empty())?;
    let mut end = seg.len().min(MAX_TOPIC_LEN);
    while !seg.is_char_boundary(end) {
        end -= 1;
    }
    Some(&seg[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_client_id_is_kept_and_anything_else_replaced() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID.clone(), HeaderValue::from_str(v).unwrap());
            request_id(&h)
        };
        assert_eq!(with("abc-123_x.y"), "abc-123_x.y");
        for bad in ["", "has space", "semi;colon", &"a".repeat(MAX_ID_LEN + 1)] {
            let id = with(bad);
            assert_eq!(id.len(), 32, "{bad:?} replaced by a fresh id");
            assert_ne!(id, bad);
        }
        assert_eq!(request_id(&HeaderMap::new()).len(), 32);
    }

    #[test]
    fn the_topic_is_the_segment_after_topics() {
        assert_eq!(topic_segment("/v1/topics/orders/ack"), Some("orders"));
        assert_eq!(topic_segment("/v1/topics/orders"), Some("orders"));
        assert_eq!(topic_segment("/v1/topics/"), None);
        assert_eq!(topic_segment("/v1/topics"), None);
        assert_eq!(topic_segment("/health"), None);
        let long = "x".repeat(500);
        assert_eq!(
            topic_segment(&format!("/v1/topics/{long}")).map(str::len),
            Some(MAX_TOPIC_LEN)
        );
    }
}
