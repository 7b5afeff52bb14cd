//! The HTTP error contract: every failure is a status plus
//! `{"error": {"code": "snake_case", "message": "human text"}}`.
//!
//! [`ApiError::from`] is the one place where broker errors become HTTP statuses. Store
//! and corruption details are logged, never sent: clients see no bucket names, keys or
//! stack traces.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::{BrokerError, CORRUPT_SEEN, NEWER_SEEN};
use crate::receipt::ReceiptError;
use crate::store::StoreError;

/// Objects (and versions) already logged as newer, at most [`MAX_LOGGED_NEWER`].
static LOGGED_NEWER: std::sync::Mutex<std::collections::BTreeSet<(String, u64)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());
/// Objects remembered as logged; beyond this many, each sighting is logged again.
const MAX_LOGGED_NEWER: usize = 1024;

/// True the first time this process meets `object` at version `found` (and always once
/// [`MAX_LOGGED_NEWER`] objects are remembered).
fn first_sighting(object: &str, found: u64) -> bool {
    let Ok(mut seen) = LOGGED_NEWER.lock() else {
        return true;
    };
    if seen.len() >= MAX_LOGGED_NEWER {
        return true;
    }
    seen.insert((object.to_owned(), found))
}

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
    /// Seconds for `Retry-After` (503s).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with no `Retry-After`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 `invalid_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
        }
    }

    /// 503 `partition_corrupt`: the detail (naming the object) goes to the log and the
    /// `narad_corrupt_objects_total` counter, never to the client.
    fn corrupt(object: &str) -> Self {
        CORRUPT_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            %object,
            "corrupt stored object: this partition cannot be served until it is repaired; \
             a corrupt manifest is rebuilt by the next commit that confirms it, or run \
             `narad repair [--dry-run] --store URL TOPIC [PARTITION]` (docs/design.md §7)"
        );
        Self {
            retry_after: Some(30),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "partition_corrupt",
                "a stored object of this partition is corrupt; the server log names it",
            )
        }
    }

    /// 503 `upgrade_required`: a newer version of Narad wrote an object this request needs.
    /// Logged once per object (and version) in this process, counted every time in
    /// `narad_upgrade_required_total`.
    fn upgrade_required(object: &str, newer: &crate::cas::Newer) -> Self {
        NEWER_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if first_sighting(object, newer.found) {
            tracing::error!(
                %object,
                what = newer.what,
                found = newer.found,
                known = newer.known,
                "a newer version of Narad wrote this object; this process leaves it alone and \
                 answers upgrade_required until it is upgraded (docs/upgrades.md)"
            );
        }
        Self {
            retry_after: Some(30),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "upgrade_required",
                "a newer version of Narad wrote data this request needs; this server must be \
                 upgraded",
            )
        }
    }

    fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error; see the server log",
        )
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        use StatusCode as S;
        let msg = e.to_string();
        match e {
            BrokerError::InvalidTopic(_) => Self::new(S::BAD_REQUEST, "invalid_topic_name", msg),
            BrokerError::TopicNotFound => Self::new(S::NOT_FOUND, "topic_not_found", msg),
            BrokerError::TopicConflict => Self::new(S::CONFLICT, "topic_exists", msg),
            BrokerError::TooManyTopics(_) => Self::new(S::CONFLICT, "too_many_topics", msg),
            BrokerError::SubscriptionNotFound => {
                Self::new(S::NOT_FOUND, "subscription_not_found", msg)
            }
            BrokerError::SubscriptionConflict => Self::new(S::CONFLICT, "subscription_exists", msg),
            BrokerError::TooManySubscriptions(_) => {
                Self::new(S::CONFLICT, "too_many_subscriptions", msg)
            }
            BrokerError::FleetBelow { .. } => Self::new(S::CONFLICT, "fleet_level_too_low", msg),
            BrokerError::InvalidSetting(_) => Self::new(S::BAD_REQUEST, "invalid_setting", msg),
            BrokerError::NoSuchPartition(_) => Self::new(S::BAD_REQUEST, "invalid_partition", msg),
            BrokerError::PayloadTooLarge(_) => {
                Self::new(S::PAYLOAD_TOO_LARGE, "payload_too_large", msg)
            }
            BrokerError::Receipt(ReceiptError::Malformed) => {
                Self::new(S::BAD_REQUEST, "invalid_receipt_handle", msg)
            }
            BrokerError::Receipt(ReceiptError::Invalid) => {
                Self::new(S::GONE, "receipt_handle_invalid", msg)
            }
            BrokerError::Receipt(ReceiptError::Newer(version)) => Self::upgrade_required(
                "a receipt handle",
                &crate::formats::Newer {
                    what: "receipt handle version",
                    found: version.into(),
                    known: 2,
                },
            ),
            BrokerError::LeaseGone => Self::new(S::GONE, "lease_gone", msg),
            BrokerError::MessageNotFound => Self::new(S::NOT_FOUND, "message_not_found", msg),
            BrokerError::OffsetExpired(_) => Self::new(S::GONE, "offset_expired", msg),
            BrokerError::AckedAheadFull => Self::unavailable("acked_ahead_full", msg),
            BrokerError::DelayedFull => Self {
                retry_after: Some(5),
                ..Self::new(S::TOO_MANY_REQUESTS, "too_many_delayed", msg)
            },
            BrokerError::Contention | BrokerError::StaleTopic => Self::unavailable("busy", msg),
            BrokerError::Store(StoreError::Unavailable(failure)) => {
                let source = std::error::Error::source(&failure).map(ToString::to_string);
                tracing::warn!(detail = %failure, ?source, "storage unavailable");
                Self::unavailable(
                    "storage_unavailable",
                    "storage is temporarily unavailable; retry later",
                )
            }
            BrokerError::OutcomeUnknown(detail) => {
                tracing::warn!(%detail, "outcome unknown");
                Self::unavailable(
                    "storage_unavailable",
                    "storage lost the answer to this request's write, and whether it was applied is unknown; retry it (a produce with its Idempotency-Key, to store it once)",
                )
            }
            BrokerError::Store(StoreError::Corrupt(failure)) => Self::corrupt(&failure.to_string()),
            BrokerError::Store(err) => {
                tracing::error!(error = %err, "storage error");
                Self::internal()
            }
            BrokerError::Corrupt(detail) => Self::corrupt(&detail),
            BrokerError::UpgradeRequired { object, newer } => {
                Self::upgrade_required(&object, &newer)
            }
            BrokerError::Internal(detail) => {
                tracing::error!(%detail, "internal error (a bug)");
                Self::internal()
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"narad\""),
            );
        }
        resp
    }
}
