//! Every limit the HTTP edge enforces on a request, in one place. The payload limit is
//! the broker's (`NARAD_MAX_MESSAGE_BYTES`, [`crate::config::BrokerOptions`]); a consume
//! returns at most [`MAX_CONSUME_BATCH`] messages in at most [`MAX_CONSUME_RESPONSE_BYTES`]
//! of JSON (its first message whatever its size).

pub use crate::broker::{MAX_CONSUME_BATCH, MAX_CONSUME_RESPONSE_BYTES};

/// Largest settings body accepted (create and change).
pub const MAX_SETTINGS_BODY: usize = 64 * 1024;
/// Largest `key` accepted on produce.
pub const MAX_KEY_BYTES: usize = 1024;
/// Headers per message at most.
pub const MAX_HEADERS: usize = 32;
/// Bytes of header names and values per message at most.
pub const MAX_HEADER_BYTES: usize = 8192;
/// Longest header name.
pub const MAX_HEADER_NAME: usize = 64;
/// Prefix of the HTTP headers that carry a single produce's message headers.
pub const HEADER_PREFIX: &str = "narad-header-";
/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;
/// Largest batch body (API Gateway's own limit is 10 MB).
pub const MAX_BATCH_BODY: usize = 10 << 20;
/// Topics one `GET /v1/topics` page returns unless `limit` says otherwise.
pub const DEFAULT_TOPIC_PAGE: usize = 100;
/// Most topics one `GET /v1/topics` page returns.
pub const MAX_TOPIC_PAGE: usize = 1000;
/// Most entries in one batch request.
pub const MAX_BATCH_ENTRIES: usize = 1000;
