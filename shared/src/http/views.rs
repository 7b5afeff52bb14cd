//! The JSON shapes of responses (docs/design.md §1). Typed structs, not `json!`: a
//! payload is embedded as raw JSON text, byte for byte ([`crate::payload`]).

use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;

use super::ApiError;
use crate::broker::{Delivery, PartitionStats, Produced, Topic};
use crate::error::BrokerResult;
use crate::payload;
use crate::segment::Headers;
use crate::settings::TopicSettings;

/// A topic, with per-partition stats on `GET /v1/topics/{topic}`.
#[derive(Serialize)]
pub(super) struct TopicView {
    name: String,
    settings: TopicSettings,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<Vec<PartitionStats>>,
}

impl TopicView {
    pub(super) fn new(t: Topic, partitions: Option<Vec<PartitionStats>>) -> Self {
        Self {
            name: t.name,
            settings: t.settings,
            created_at: rfc3339_ms(t.created_at_ms),
            partitions,
        }
    }
}

/// A subscription: its start, its own settings and the settings it obeys.
#[derive(Serialize)]
pub(super) struct SubscriptionView {
    name: String,
    topic: String,
    start: crate::subscription::Start,
    created_at: String,
    /// Its own settings (what a `PUT` or `PATCH` set).
    settings: crate::subscription::SubscriptionSettings,
    /// The settings its leases obey: the topic's, overlaid with its own.
    effective: EffectiveSettings,
    /// Per-partition figures (`GET` of one subscription only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) partitions: Option<Vec<crate::broker::subscriptions::SubscriptionPartition>>,
}

/// The delivery settings a subscription obeys.
#[derive(Serialize)]
struct EffectiveSettings {
    visibility_timeout_ms: u64,
    max_in_flight_per_partition: u32,
    max_acked_ahead_per_partition: u32,
    max_deliveries: u32,
    dead_letter_topic: Option<String>,
    paused: bool,
}

impl SubscriptionView {
    pub(super) fn of(t: &Topic, name: &str) -> Option<Self> {
        let rec = t.subscription(name)?;
        let e = rec.settings.effective(&t.settings);
        Some(Self {
            name: name.to_owned(),
            topic: t.name.clone(),
            start: rec.start,
            created_at: rfc3339_ms(rec.created_at_ms),
            settings: rec.settings.clone(),
            effective: EffectiveSettings {
                visibility_timeout_ms: e.visibility_timeout_ms,
                max_in_flight_per_partition: e.max_in_flight_per_partition,
                max_acked_ahead_per_partition: e.max_acked_ahead_per_partition,
                max_deliveries: e.max_deliveries,
                dead_letter_topic: e.dead_letter_topic,
                paused: e.paused,
            },
            partitions: None,
        })
    }
}

/// `GET /v1/topics/{topic}/subscriptions`.
#[derive(Serialize)]
pub(super) struct SubscriptionList {
    pub(super) subscriptions: Vec<SubscriptionView>,
}

/// `GET /v1/topics`.
#[derive(Serialize)]
pub(super) struct TopicList {
    pub(super) topics: Vec<TopicView>,
    /// The `after` of the next page; null after the last.
    pub(super) next: Option<String>,
}

/// One consumed or replayed message.
#[derive(Serialize)]
pub(super) struct MessageView {
    topic: String,
    partition: u32,
    offset: u64,
    key: Option<String>,
    payload: Box<RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_encoding: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt_handle: Option<String>,
    delivery_count: u32,
    produced_at: String,
    #[serde(skip_serializing_if = "Headers::is_empty")]
    headers: Headers,
}

impl From<Delivery> for MessageView {
    fn from(d: Delivery) -> Self {
        let p = payload::render(&d.payload);
        Self {
            topic: d.topic,
            partition: d.partition,
            offset: d.offset,
            key: d.key,
            payload: p.json,
            payload_encoding: p.encoding,
            receipt_handle: d.receipt_handle,
            delivery_count: d.delivery_count,
            produced_at: rfc3339_ms(d.produced_at_ms),
            headers: d.headers,
        }
    }
}

/// A consume with `max`: `{"messages":[...]}`.
#[derive(Serialize)]
pub(super) struct MessageList {
    pub(super) messages: Vec<MessageView>,
}

/// A consume with piggybacked acks: `{"messages":[...],"acks":[...]}`.
#[derive(Serialize)]
pub(super) struct AckedMessages {
    pub(super) messages: Vec<MessageView>,
    pub(super) acks: Vec<EntryResult>,
}

/// An entry's error inside a batch result.
#[derive(Serialize)]
pub(super) struct EntryError {
    code: &'static str,
    message: String,
}

/// One entry of a batch answer: the status a single request would have got, and its
/// body's fields.
#[derive(Serialize)]
pub(super) struct EntryResult {
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<EntryError>,
}

impl EntryResult {
    fn failed(e: crate::error::BrokerError) -> Self {
        let e = ApiError::from(e);
        Self {
            status: e.status.as_u16(),
            partition: None,
            offset: None,
            error: Some(EntryError {
                code: e.code,
                message: e.message,
            }),
        }
    }

    /// A produce-batch entry: 201 with its partition and offset, or its error.
    pub(super) fn produced(r: BrokerResult<Produced>) -> Self {
        match r {
            Ok(p) => Self {
                status: 201,
                partition: Some(p.partition),
                offset: Some(p.offset),
                error: None,
            },
            Err(e) => Self::failed(e),
        }
    }

    /// An ack-batch entry: 204, or its error.
    pub(super) fn settled(r: BrokerResult<()>) -> Self {
        match r {
            Ok(()) => Self {
                status: 204,
                partition: None,
                offset: None,
                error: None,
            },
            Err(e) => Self::failed(e),
        }
    }
}

/// A batch answer: `{"results":[...]}`, one per entry, in order.
#[derive(Serialize)]
pub(super) struct BatchResults {
    pub(super) results: Vec<EntryResult>,
}

/// `2026-11-29T12:00:00.000Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}
