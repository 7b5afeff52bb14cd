//! Subscription routes: `GET /v1/topics/{topic}/subscriptions`, and `PUT`, `GET`,
//! `PATCH`, `DELETE` `/v1/topics/{topic}/subscriptions/{subscription}`. Creating,
//! changing and deleting need `admin` on the topic; reading needs any grant on it.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::access::Action;
use crate::error::BrokerError;
use crate::http::auth::{allow, allow_seeing, Caller};
use crate::http::extract::read_body;
use crate::http::limits::MAX_SETTINGS_BODY;
use crate::http::views::{SubscriptionList, SubscriptionView};
use crate::http::{ApiError, AppState};
use crate::subscription::SubscriptionInput;

type SubPath = Result<Path<(String, String)>, PathRejection>;

fn names(path: SubPath) -> Result<(String, String), ApiError> {
    path.map(|Path(p)| p).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_topic_name",
            "invalid topic or subscription name in path",
        )
    })
}

async fn read_input(headers: &HeaderMap, body: Body) -> Result<SubscriptionInput, ApiError> {
    let body = read_body(headers, body, MAX_SETTINGS_BODY).await?;
    Ok(SubscriptionInput::parse(&body).map_err(BrokerError::from)?)
}

/// `PUT /v1/topics/{topic}/subscriptions/{subscription}`: 201 created, 200 when it exists
/// with the same start and settings, 409 when it exists otherwise.
pub(in crate::http) async fn create(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: SubPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (name, sub) = names(path)?;
    allow(&caller, Action::Admin, &name)?;
    let input = read_input(&headers, body).await?;
    super::topics::allow_dead_letter(&caller, input.dead_letter_topic.as_deref())?;
    let (created, topic) = s.broker.create_subscription(&name, &sub, &input).await?;
    let view = SubscriptionView::of(&topic, &sub).ok_or(BrokerError::SubscriptionNotFound)?;
    let status = super::topics::created_status(created);
    Ok((status, Json(view)).into_response())
}

/// `GET /v1/topics/{topic}/subscriptions`: every subscription of the topic.
pub(in crate::http) async fn list(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = crate::http::extract::topic_name(path)?;
    allow_seeing(&caller, &name)?;
    let topic = s.broker.load_topic(&name).await?;
    let subscriptions = topic
        .subscriptions
        .keys()
        .filter_map(|n| SubscriptionView::of(&topic, n))
        .collect();
    Ok(Json(SubscriptionList { subscriptions }).into_response())
}

/// `GET /v1/topics/{topic}/subscriptions/{subscription}`: with per-partition figures
/// (backlog, in flight, delayed, lost, oldest ages).
pub(in crate::http) async fn get(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: SubPath,
) -> Result<Response, ApiError> {
    let (name, sub) = names(path)?;
    allow_seeing(&caller, &name)?;
    crate::broker::subscriptions::validate_name(&sub)?;
    let topic = s.broker.load_topic(&name).await?;
    let mut view = SubscriptionView::of(&topic, &sub).ok_or(BrokerError::SubscriptionNotFound)?;
    view.partitions = Some(s.broker.subscription_stats(&topic, &sub).await?);
    Ok(Json(view).into_response())
}

/// `PATCH /v1/topics/{topic}/subscriptions/{subscription}`: change its settings.
pub(in crate::http) async fn patch(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: SubPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (name, sub) = names(path)?;
    allow(&caller, Action::Admin, &name)?;
    let input = read_input(&headers, body).await?;
    super::topics::allow_dead_letter(&caller, input.dead_letter_topic.as_deref())?;
    let topic = s.broker.patch_subscription(&name, &sub, &input).await?;
    let view = SubscriptionView::of(&topic, &sub).ok_or(BrokerError::SubscriptionNotFound)?;
    Ok(Json(view).into_response())
}

/// `DELETE /v1/topics/{topic}/subscriptions/{subscription}`: 204.
pub(in crate::http) async fn delete(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: SubPath,
) -> Result<Response, ApiError> {
    let (name, sub) = names(path)?;
    allow(&caller, Action::Admin, &name)?;
    s.broker.delete_subscription(&name, &sub).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
