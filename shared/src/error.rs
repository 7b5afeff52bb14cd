//! [`BrokerError`]: everything a broker operation can refuse or fail with.
//!
//! The HTTP edge maps each case to a status and error code in one place
//! (`http::error`). Refusals of the consumer contract come from the pure partition
//! transitions ([`Refused`]); storage failures keep their source error
//! ([`StoreError`]); stored data that does not decode is [`BrokerError::Corrupt`], and a
//! state the code believes impossible is [`BrokerError::Internal`] (a bug, 500).

use std::convert::Infallible;

use crate::cache::ReadError;
use crate::cas::CasError;
use crate::keys::InvalidTopic;
use crate::partition::Refused;
use crate::receipt::ReceiptError;
use crate::segment::UnencodableSegment;
use crate::settings::InvalidSetting;
use crate::store::StoreError;

/// Everything the broker can refuse or fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The topic name is not allowed.
    #[error(transparent)]
    InvalidTopic(#[from] InvalidTopic),
    /// No topic by that name.
    #[error("topic not found")]
    TopicNotFound,
    /// The topic exists with other settings.
    #[error("topic already exists with different settings")]
    TopicConflict,
    /// Creating the topic would exceed `NARAD_MAX_TOPICS`.
    #[error("the store holds its limit of {0} topics (NARAD_MAX_TOPICS); delete one first")]
    TooManyTopics(usize),
    /// No subscription by that name on the topic.
    #[error("subscription not found")]
    SubscriptionNotFound,
    /// The subscription exists with other settings.
    #[error("subscription already exists with different settings")]
    SubscriptionConflict,
    /// Creating the subscription would exceed `NARAD_MAX_SUBSCRIPTIONS`.
    #[error(
        "the topic holds its limit of {0} subscriptions (NARAD_MAX_SUBSCRIPTIONS); delete one first"
    )]
    TooManySubscriptions(usize),
    /// Subscriptions need every process on the store to serve them: fleet level 5
    /// (`narad upgrade finalize`, docs/upgrades.md).
    #[error("subscriptions need fleet level {needed}, and the store is at level {level}: run `narad upgrade finalize` once every process runs this build")]
    FleetBelow {
        /// The level the feature needs.
        needed: u32,
        /// The store's level.
        level: u32,
    },
    /// A setting is unknown or out of range.
    #[error(transparent)]
    InvalidSetting(#[from] InvalidSetting),
    /// The partition does not exist in this topic.
    #[error("partition {0} does not exist in this topic")]
    NoSuchPartition(u32),
    /// The payload exceeds the configured maximum.
    #[error("payload exceeds the maximum of {0} bytes")]
    PayloadTooLarge(usize),
    /// The receipt handle is malformed or not valid for this topic.
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    /// The lease the handle names is no longer held (acked, expired, nacked, redelivered).
    #[error("the lease for this receipt handle is no longer held")]
    LeaseGone,
    /// The partition's acked-ahead window is full; ack the frontier message first.
    #[error("too many out-of-order acks are outstanding on this partition; retry later")]
    AckedAheadFull,
    /// The partition holds as many runs of delayed messages as it may
    /// ([`crate::partition::MAX_DELAYED_RUNS`]); retry when some are due.
    #[error(
        "this partition holds too many delayed messages; retry later or produce without a delay"
    )]
    DelayedFull,
    /// No retained message at that offset.
    #[error("no retained message at that offset")]
    MessageNotFound,
    /// The replayed offset was deleted by retention.
    #[error("offset {0} has been deleted by retention")]
    OffsetExpired(u64),
    /// Too many concurrent writers on one object; retry later.
    #[error("the partition is busy; retry later")]
    Contention,
    /// Storage lost the answer to a write, and whether it was applied can no longer be
    /// told (docs/design.md §3): it is not applied again.
    #[error("{0}")]
    OutcomeUnknown(String),
    /// The topic was deleted and created again while this request used it; retried once
    /// internally, then reported as busy.
    #[error("the topic changed while the request ran; retry")]
    StaleTopic,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stored data does not decode.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// A stored object was written by a newer version of Narad; this build leaves it alone.
    #[error("{object} was written by a newer version of Narad: {newer}")]
    UpgradeRequired {
        /// Its key.
        object: String,
        /// Which version, and the newest this build knows.
        newer: crate::cas::Newer,
    },
    /// A state the code holds impossible was reached (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result of a broker call.
pub type BrokerResult<T> = Result<T, BrokerError>;

/// Requests that met a corrupt stored object in this process (`/metrics`:
/// `narad_corrupt_objects_total`), counted where errors become responses.
pub static CORRUPT_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Requests that met an object written by a newer version of Narad in this process
/// (`/metrics`: `narad_upgrade_required_total`), counted where errors become responses.
pub static NEWER_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl From<Refused> for BrokerError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::LeaseGone => BrokerError::LeaseGone,
            Refused::AckedAheadFull => BrokerError::AckedAheadFull,
        }
    }
}

impl From<ReadError> for BrokerError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Store(e) => BrokerError::Store(e),
            e @ ReadError::Corrupt { .. } => BrokerError::Corrupt(e.to_string()),
            ReadError::Newer { key, newer } => BrokerError::UpgradeRequired { object: key, newer },
        }
    }
}

impl From<UnencodableSegment> for BrokerError {
    fn from(e: UnencodableSegment) -> Self {
        BrokerError::Internal(e.to_string())
    }
}

impl From<Infallible> for BrokerError {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

impl<E: Into<BrokerError>> From<CasError<E>> for BrokerError {
    fn from(e: CasError<E>) -> Self {
        match e {
            CasError::Rejected(e) => e.into(),
            CasError::Contention => BrokerError::Contention,
            CasError::Superseded => BrokerError::StaleTopic,
            CasError::Store(e) => BrokerError::Store(e),
            CasError::Corrupt { key, detail } => BrokerError::Corrupt(format!("{key}: {detail}")),
            CasError::Newer { key, newer } => BrokerError::UpgradeRequired { object: key, newer },
            CasError::OutcomeUnknown { key, why } => BrokerError::OutcomeUnknown(format!(
                "the outcome of a write to {key} is unknown: its answer was lost and {why}"
            )),
            CasError::Encode { key, source } => {
                BrokerError::Internal(format!("cannot encode {key}: {source}"))
            }
        }
    }
}
