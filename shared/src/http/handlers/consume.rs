//! `GET /v1/topics/{topic}/consume`: lease messages (with receipt handles), or with
//! `partition` and `offset` replay one read-only.

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::access::Action;
use crate::http::auth::{allow, Caller};
use crate::http::batch_body::parse_consume_acks;
use crate::http::extract::{parse_wait, read_body, topic_name, Query};
use crate::http::limits::{MAX_BATCH_BODY, MAX_CONSUME_BATCH};
use crate::http::views::{AckedMessages, EntryResult, MessageList, MessageView};
use crate::http::{ApiError, AppState};

/// Set to `true` on a 204 from a paused topic.
pub(crate) const PAUSED_HEADER: &str = "narad-paused";

/// `GET /v1/topics/{topic}/consume[?wait=10s][&partition=N[&offset=M]][&max=N]
/// [&subscription=S]`: 200 with one message and its receipt handle, or 204; with
/// `offset`, a read-only replay; with `max`, up to that many messages as
/// `{"messages":[...]}`; with `subscription`, leased for that subscription (else the
/// topic's default one).
pub(in crate::http) async fn consume(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Consume, &name)?;
    let q = Query::parse(raw, &["wait", "partition", "offset", "max", "subscription"])?;
    let (wait, partition, max) = consume_query(&q)?;
    let offset: Option<u64> = q.number("offset")?;
    let sub = q.get("subscription");
    if sub.is_some() && offset.is_some() {
        return Err(ApiError::bad_request(
            "a replay reads the topic's messages: subscription does not apply",
        ));
    }
    let deliveries = match (partition, offset) {
        (p, None) => {
            let max = max.unwrap_or(1) as usize;
            s.broker.consume_from(&name, sub, p, wait, max).await?
        }
        (Some(p), Some(o)) => {
            if max.is_some() {
                return Err(ApiError::bad_request("max does not apply to a replay"));
            }
            let found = s.broker.replay(&name, p, o, wait).await?;
            found.into_iter().collect()
        }
        (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "offset needs partition (replay is by partition and offset)",
            ))
        }
    };
    if deliveries.is_empty() {
        // A consumer told why nothing came: the topic is paused (its settings as this
        // process has them, at most the topic cache's age old).
        let paused = offset.is_none()
            && s.broker.topic(&name).await.is_ok_and(|t| {
                crate::broker::subscriptions::Group::of(&t, sub)
                    .is_ok_and(|g| g.settings(&t).paused)
            });
        if paused {
            return Ok((StatusCode::NO_CONTENT, [(PAUSED_HEADER, "true")]).into_response());
        }
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let mut views: Vec<MessageView> = deliveries.into_iter().map(MessageView::from).collect();
    Ok(match max {
        Some(_) => Json(MessageList { messages: views }).into_response(),
        None => Json(views.swap_remove(0)).into_response(),
    })
}

/// A consume's `wait`, `partition` and `max`.
///
/// Errors: 400 for a malformed value or a `max` outside 1 to [`MAX_CONSUME_BATCH`].
fn consume_query(q: &Query) -> Result<(Duration, Option<u32>, Option<u32>), ApiError> {
    let wait = q
        .get("wait")
        .map(parse_wait)
        .transpose()?
        .unwrap_or(Duration::ZERO);
    let partition: Option<u32> = q.number("partition")?;
    let max: Option<u32> = q.number("max")?;
    if max.is_some_and(|m| m == 0 || m as usize > MAX_CONSUME_BATCH) {
        return Err(ApiError::bad_request(format!(
            "max must be between 1 and {MAX_CONSUME_BATCH}"
        )));
    }
    Ok((wait, partition, max))
}

/// `POST /v1/topics/{topic}/consume[?wait=10s][&partition=N][&max=N][&subscription=S]`
/// with an optional body `{"ack":["h1","h2"]}`: acks those handles and leases up to `max`
/// (default 1) messages, the acks on one partition in the same commit as its lease (for a
/// subscription: its acks first, then its lease). Always 200 with
/// `{"messages":[...],"acks":[{"status":204},{"status":410,"error":{...}}]}` (messages
/// may be empty; `acks` answers each handle as `POST /ack` would, in order).
pub(in crate::http) async fn consume_acking(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Consume, &name)?;
    let q = Query::parse(raw, &["wait", "partition", "max", "subscription"])?;
    let (wait, partition, max) = consume_query(&q)?;
    let sub = q.get("subscription");
    let body = read_body(&headers, body, MAX_BATCH_BODY).await?;
    let handles = if body.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        parse_consume_acks(&body)?
    };
    let max = max.unwrap_or(1) as usize;
    let done = s
        .broker
        .consume_acking_from(&name, sub, (partition, wait, max), &handles)
        .await?;
    let paused = done.deliveries.is_empty()
        && s.broker.topic(&name).await.is_ok_and(|t| {
            crate::broker::subscriptions::Group::of(&t, sub).is_ok_and(|g| g.settings(&t).paused)
        });
    let view = AckedMessages {
        messages: done.deliveries.into_iter().map(MessageView::from).collect(),
        acks: done.acks.into_iter().map(EntryResult::settled).collect(),
    };
    Ok(if paused {
        ([(PAUSED_HEADER, "true")], Json(view)).into_response()
    } else {
        Json(view).into_response()
    })
}
