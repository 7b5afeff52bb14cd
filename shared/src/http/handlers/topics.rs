//! Topic administration routes: `GET /v1/topics`, and `PUT`, `GET`, `PATCH`, `DELETE`
//! `/v1/topics/{topic}`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::BrokerError;
use crate::http::extract::{read_body, topic_name};
use crate::http::limits::MAX_SETTINGS_BODY;
use crate::http::views::{TopicList, TopicView};
use crate::http::{ApiError, AppState};
use crate::settings::SettingsInput;

type TopicPath = Result<Path<String>, PathRejection>;

/// `GET /v1/topics`: every topic with its settings.
pub(in crate::http) async fn list(State(s): State<AppState>) -> Result<Response, ApiError> {
    let topics = s.broker.list_topics().await?;
    let topics = topics
        .into_iter()
        .map(|t| TopicView::new(t, None))
        .collect();
    Ok(Json(TopicList { topics }).into_response())
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
    path: TopicPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let input = read_settings(&headers, body).await?;
    let (created, topic) = s.broker.create_topic(&name, &input).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(TopicView::new(topic, None))).into_response())
}

/// `GET /v1/topics/{topic}`: settings and per-partition stats. Read from the store, not
/// the per-process cache: an admin read sees every change another process made before it.
pub(in crate::http) async fn get(
    State(s): State<AppState>,
    path: TopicPath,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let topic = s.broker.load_topic(&name).await?;
    let stats = s.broker.partition_stats(&topic).await?;
    Ok(Json(TopicView::new(topic, Some(stats))).into_response())
}

/// `PATCH /v1/topics/{topic}`: change the settings that can change.
pub(in crate::http) async fn patch(
    State(s): State<AppState>,
    path: TopicPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let input = read_settings(&headers, body).await?;
    let topic = s.broker.patch_topic(&name, &input).await?;
    Ok(Json(TopicView::new(topic, None)).into_response())
}

/// `DELETE /v1/topics/{topic}`: 204.
pub(in crate::http) async fn delete(
    State(s): State<AppState>,
    path: TopicPath,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    s.broker.delete_topic(&name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
