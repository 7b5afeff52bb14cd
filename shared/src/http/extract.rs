//! Request parsing shared by the handlers: the topic in the path, strict query strings
//! (an unknown or repeated parameter is a 400, so a typo never silently changes
//! behaviour), `wait` durations, bounded bodies, and the checks every produced message
//! gets whichever route it came by.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;

use super::limits::{
    HEADER_PREFIX, MAX_HEADERS, MAX_HEADER_BYTES, MAX_HEADER_NAME, MAX_IDEMPOTENCY_KEY,
    MAX_KEY_BYTES,
};
use super::ApiError;

/// The topic name in the path.
pub(super) fn topic_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(t)| t).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_topic_name",
            "invalid topic name in path",
        )
    })
}

/// A parsed query string.
pub(super) struct Query(HashMap<String, String>);

impl Query {
    /// Parses `raw`, refusing parameters not in `allowed` and repeated ones.
    pub(super) fn parse(raw: Option<String>, allowed: &[&str]) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
            .map_err(|_| ApiError::bad_request("malformed query string"))?;
        let mut out = HashMap::new();
        for (k, v) in pairs {
            if !allowed.contains(&k.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {k:?}; allowed: {}",
                    allowed.join(", ")
                )));
            }
            if out.insert(k.clone(), v).is_some() {
                return Err(ApiError::bad_request(format!(
                    "query parameter {k:?} given twice"
                )));
            }
        }
        Ok(Self(out))
    }

    /// The raw value of `name`.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// `name` as a non-negative integer.
    pub(super) fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::bad_request(format!("{name} must be a non-negative integer"))
                })
            })
            .transpose()
    }
}

/// `wait`: `0`, `500ms`, `10s`, `1m`; a bare number is seconds (as SQS's WaitTimeSeconds).
pub fn parse_wait(v: &str) -> Result<Duration, ApiError> {
    let d = parse_wait_uncapped(v).map_err(|_| {
        ApiError::bad_request(format!("wait must look like 0, 500ms or 10s, got {v:?}"))
    })?;
    Ok(d.min(Duration::from_secs(3600)))
}

/// The longest delay a produce may ask for (Cloudflare Queues' limit too).
pub(super) const MAX_DELAY_MS: u64 = 12 * 3600 * 1000;

/// `delay` of a produce, in `wait`'s syntax, in ms: at most [`MAX_DELAY_MS`].
///
/// Errors: 400 for anything else.
pub(super) fn parse_delay(v: &str) -> Result<u64, ApiError> {
    let ms = parse_wait_uncapped(v)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .filter(|&ms| ms <= MAX_DELAY_MS);
    ms.ok_or_else(|| {
        ApiError::bad_request(format!(
            "delay must be a duration up to 12h like 30s, 500ms or 5m, got {v:?}"
        ))
    })
}

/// A duration in `wait`'s syntax, not capped (the caller bounds it).
///
/// Errors: the text is not such a duration.
pub(super) fn parse_wait_uncapped(v: &str) -> Result<Duration, humantime::DurationError> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Ok(Duration::from_secs(secs.min(u64::MAX / 1000)));
    }
    humantime::parse_duration(v)
}

/// Checks a message's headers: at most [`MAX_HEADERS`], names of 1–[`MAX_HEADER_NAME`]
/// characters from `[a-z0-9._-]` not starting with the reserved `narad-`, values without
/// control characters, at most [`MAX_HEADER_BYTES`] of names and values together.
///
/// Errors: 400 naming the first problem (with `at`, the batch position, if any).
pub(super) fn check_headers(at: &str, headers: &crate::segment::Headers) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(format!("{at}{m}")));
    if headers.len() > MAX_HEADERS {
        return bad(format!("at most {MAX_HEADERS} headers per message"));
    }
    let mut bytes = 0;
    for (name, value) in headers {
        let name_ok = !name.is_empty()
            && name.len() <= MAX_HEADER_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !name_ok {
            return bad(format!(
                "header name {name:?}: 1 to {MAX_HEADER_NAME} characters of a-z, 0-9, '.', '_', '-'"
            ));
        }
        if name.starts_with("narad-") {
            return bad(format!(
                "header name {name:?}: the narad- prefix is reserved"
            ));
        }
        if value.chars().any(char::is_control) {
            return bad(format!(
                "header {name:?}: control characters are not allowed"
            ));
        }
        bytes += name.len() + value.len();
    }
    if bytes > MAX_HEADER_BYTES {
        return bad(format!("headers exceed {MAX_HEADER_BYTES} bytes"));
    }
    Ok(())
}

/// The message headers of a single produce: every `Narad-Header-<name>` HTTP header
/// (names lowercase, as HTTP header names are case-insensitive), checked. A repeated
/// header is one value, its values joined by commas (RFC 9110 §5.3; API Gateway joins
/// them so before Lambda sees the request).
///
/// Errors: 400 for a value that is not visible ASCII, or [`check_headers`].
pub(super) fn message_headers(http: &HeaderMap) -> Result<crate::segment::Headers, ApiError> {
    let mut out = crate::segment::Headers::new();
    for (name, value) in http {
        let Some(short) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        let value = value.to_str().map_err(|_| {
            ApiError::bad_request(format!("header {}: not visible ASCII", name.as_str()))
        })?;
        out.entry(short.to_owned())
            .and_modify(|v: &mut String| {
                v.push(',');
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    check_headers("", &out)?;
    Ok(out)
}

/// Reads a body of at most `limit` bytes; 413 beyond it, before buffering it all.
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("body exceeds {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) if super::admission::is_body_timeout(&*e) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the request body did not arrive in time",
        )),
        Err(_) => Err(ApiError::bad_request("could not read the request body")),
    }
}

/// Checks a produced message's key, payload and idempotency key. `index` is the
/// message's place in a batch (`None` for a single produce), named in errors.
pub(super) fn check_message(
    index: Option<usize>,
    key: Option<&str>,
    payload: &[u8],
    idempotency_key: Option<&str>,
) -> Result<(), ApiError> {
    let at = index.map_or(String::new(), |i| format!("messages[{i}]: "));
    if key.is_some_and(|k| k.len() > MAX_KEY_BYTES) {
        return Err(ApiError::bad_request(format!(
            "{at}key exceeds {MAX_KEY_BYTES} bytes"
        )));
    }
    if payload.is_empty() {
        let message = match index {
            None => "the request body (the message) is empty".to_owned(),
            Some(i) => format!("messages[{i}] is empty"),
        };
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "empty_payload",
            message,
        ));
    }
    let valid_idempotency_key = |k: &str| {
        !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY && k.bytes().all(|b| b.is_ascii_graphic())
    };
    if idempotency_key.is_some_and(|k| !valid_idempotency_key(k)) {
        let name = if index.is_none() {
            "Idempotency-Key"
        } else {
            "idempotency_key"
        };
        return Err(ApiError::bad_request(format!(
            "{at}{name} must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
        )));
    }
    Ok(())
}
