//! Topic administration routes: `GET /v1/topics`, and `PUT`, `GET`, `PATCH`, `DELETE`
//! `/v1/topics/{topic}`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::access::Action;
use crate::broker::Created;
use crate::error::BrokerError;
use crate::http::auth::{allow, allow_seeing, Caller};
use crate::http::extract::{read_body, topic_name, Query};
use crate::http::limits::{DEFAULT_TOPIC_PAGE, MAX_SETTINGS_BODY, MAX_TOPIC_PAGE};
use crate::http::views::{TopicList, TopicView};
use crate::http::{ApiError, AppState};
use crate::settings::SettingsInput;

type TopicPath = Result<Path<String>, PathRejection>;

/// `GET /v1/topics[?limit=N][&after=NAME]`: up to `limit` topics (default
/// [`DEFAULT_TOPIC_PAGE`], at most [`MAX_TOPIC_PAGE`]) with their settings, and `next`:
/// the `after` for the next page, or null after the last.
pub(in crate::http) async fn list(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw, &["limit", "after"])?;
    let limit = q.number::<usize>("limit")?.unwrap_or(DEFAULT_TOPIC_PAGE);
    if !(1..=MAX_TOPIC_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_TOPIC_PAGE}"
        )));
    }
    let after = q.get("after").unwrap_or("");
    // Only the topics the caller holds a grant on.
    let (topics, next) = s
        .broker
        .list_topics(after, limit, |t| caller.0.sees(t))
        .await?;
    let topics = topics
        .into_iter()
        .map(|t| TopicView::new(t, None))
        .collect();
    Ok(Json(TopicList { topics, next }).into_response())
}

/// A dead-letter topic must be within the caller's admin grants too: otherwise a user
/// could send their messages into another user's topic.
/// Used by subscriptions' too.
pub(super) fn allow_dead_letter(
    caller: &Caller,
    dead_letter_topic: Option<&str>,
) -> Result<(), ApiError> {
    match dead_letter_topic {
        Some(dlq) if !dlq.is_empty() => allow(caller, Action::Admin, dlq),
        _ => Ok(()),
    }
}

/// The status of a create (`PUT`): 201 for a new topic or subscription, 200 for the same
/// one already there.
pub(super) fn created_status(created: Created) -> StatusCode {
    match created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    }
}

/// The JSON settings body of a create or change.
async fn read_settings(headers: &HeaderMap, body: Body) -> Result<SettingsInput, ApiError> {
    let body = read_body(headers, body, MAX_SETTINGS_BODY).await?;
    Ok(SettingsInput::parse(&body).map_err(BrokerError::from)?)
}

/// `PUT /v1/topics/{topic}`: 201 created, 200 when it exists with the same settings,
/// 409 when it exists with other settings.
pub(in crate::http) async fn create(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: TopicPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Admin, &name)?;
    let input = read_settings(&headers, body).await?;
    allow_dead_letter(&caller, input.dead_letter_topic.as_deref())?;
    let (created, topic) = s.broker.create_topic(&name, &input).await?;
    let status = super::topics::created_status(created);
    Ok((status, Json(TopicView::new(topic, None))).into_response())
}

/// `GET /v1/topics/{topic}`: settings and per-partition stats. Read from the store, not
/// the per-process cache: an admin read sees every change another process made before it.
pub(in crate::http) async fn get(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: TopicPath,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow_seeing(&caller, &name)?;
    let topic = s.broker.load_topic(&name).await?;
    let stats = s.broker.partition_stats(&topic).await?;
    Ok(Json(TopicView::new(topic, Some(stats))).into_response())
}

/// `PATCH /v1/topics/{topic}`: change the settings that can change.
pub(in crate::http) async fn patch(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: TopicPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Admin, &name)?;
    let input = read_settings(&headers, body).await?;
    allow_dead_letter(&caller, input.dead_letter_topic.as_deref())?;
    let topic = s.broker.patch_topic(&name, &input).await?;
    Ok(Json(TopicView::new(topic, None)).into_response())
}

/// `DELETE /v1/topics/{topic}`: 204.
pub(in crate::http) async fn delete(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: TopicPath,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Admin, &name)?;
    s.broker.delete_topic(&name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/topics/{topic}/purge[?subscription=S]`: remove every retained message
/// (available and in flight); outstanding receipt handles then get 410. With
/// `subscription`, settle them for that subscription alone. Answers `{"purged": N}`.
pub(in crate::http) async fn purge(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: TopicPath,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Admin, &name)?;
    let q = Query::parse(raw, &["subscription"])?;
    let purged = s.broker.purge_from(&name, q.get("subscription")).await?;
    Ok(Json(serde_json::json!({ "purged": purged })).into_response())
}

/// `POST /v1/topics/{dlq}/redrive[?max=N]`: move up to N (1000 at most and by default)
/// dead letters back to the topics they came from. Answers `{"moved": M, "failed": F}`.
pub(in crate::http) async fn redrive(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: TopicPath,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Admin, &name)?;
    let q = Query::parse(raw, &["max"])?;
    let max = q
        .number::<usize>("max")?
        .unwrap_or(crate::broker::MAX_REDRIVE);
    if max == 0 || max > crate::broker::MAX_REDRIVE {
        return Err(ApiError::bad_request(format!(
            "max must be between 1 and {}",
            crate::broker::MAX_REDRIVE
        )));
    }
    let done = s.broker.redrive(&name, max).await?;
    Ok(Json(done).into_response())
}
