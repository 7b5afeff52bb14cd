//! Topic settings: their defaults, their limits, and how they are created and changed.
//!
//! | setting | default | range | changeable |
//! |---|---|---|---|
//! | `partitions` | 1 | 1–256 | no |
//! | `visibility_timeout_ms` | 30000 | 100 ms – 12 h | yes |
//! | `max_in_flight_per_partition` | 1000 | 1–10000 | yes |
//! | `max_acked_ahead_per_partition` | 1000 | 1–10000 | yes |
//! | `retention_ms` | 7 days | 1 s – 365 days | yes |
//! | `dedup_window_ms` | 5 min | 1 s – 1 day | yes |
//! | `max_deliveries` | 0 (no limit) | 0–1000 | yes |
//! | `dead_letter_topic` | none | a topic name; `""` clears it | yes |
//! | `paused` | false | true, false | yes |
//! | `ordering` | `"none"` | `"none"`, `"key"` | yes |
//!
//! `max_deliveries` needs a `dead_letter_topic`: a message is never dropped silently.
//!
//! Unknown settings are refused, so a typo never silently falls back to a default.

use serde::{Deserialize, Serialize};

/// Upper bound on partitions per topic.
pub const MAX_PARTITIONS: u32 = 256;

/// A topic's effective settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSettings {
    /// Number of partitions (fixed at creation).
    pub partitions: u32,
    /// How long a consumed message stays invisible to others.
    pub visibility_timeout_ms: u64,
    /// Leases in flight per partition before consume answers 204.
    pub max_in_flight_per_partition: u32,
    /// Out-of-order acks held above the frontier before acks answer 503.
    pub max_acked_ahead_per_partition: u32,
    /// Messages older than this are deleted.
    pub retention_ms: u64,
    /// How long a produce's `Idempotency-Key` is remembered.
    #[serde(default = "default_dedup_window")]
    pub dedup_window_ms: u64,
    /// Deliveries without an ack before a message moves to the dead-letter topic; 0: no limit.
    #[serde(default)]
    pub max_deliveries: u32,
    /// Where messages go after `max_deliveries` deliveries.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// While true, consume delivers nothing (204 with `Narad-Paused: true` after its
    /// wait); produce, ack, extend, nack and replay work as usual.
    #[serde(default)]
    pub paused: bool,
    /// `"key"`: within a partition, a message is not delivered while an earlier message
    /// with the same key is unsettled (docs/design.md §5).
    #[serde(default)]
    pub ordering: Ordering,
    /// Settings a newer build stored that this one does not know: kept as they are, so a
    /// change made through this build does not drop them (docs/upgrades.md), and not
    /// obeyed.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// Delivery order within a partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ordering {
    /// Lowest available offset first, whatever the keys.
    #[default]
    None,
    /// Per key: a message waits while an earlier one with its key is unsettled.
    Key,
}

fn default_dedup_window() -> u64 {
    5 * 60 * 1000
}

impl Default for TopicSettings {
    fn default() -> Self {
        Self {
            partitions: 1,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1000,
            max_acked_ahead_per_partition: 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            dedup_window_ms: default_dedup_window(),
            max_deliveries: 0,
            dead_letter_topic: None,
            paused: false,
            ordering: Ordering::None,
            unknown: serde_json::Map::new(),
        }
    }
}

/// A non-negative whole number, or null. `3.0` counts: JSON Schema calls it an integer,
/// and Python's `json` writes a float that holds a whole number that way.
pub(crate) fn integral<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    use serde::de::Error;
    use serde::Deserialize;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    // Up to 2^53 a float holds every whole number exactly.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let whole = n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=EXACT).contains(f))
            // Whole and within range: the cast is exact.
            .map(|f| f as u64)
    });
    whole
        .and_then(|w| T::try_from(w).ok())
        .map(Some)
        .ok_or_else(|| {
            D::Error::custom(format!("expected a non-negative integer in range, got {n}"))
        })
}

/// The JSON body of a create (`PUT`) or change (`PATCH`): every field optional; a
/// number may be a whole-number float (`3.0`), as JSON Schema's integers may be.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsInput {
    /// See [`TopicSettings::partitions`].
    #[serde(default, deserialize_with = "integral")]
    pub partitions: Option<u32>,
    /// See [`TopicSettings::visibility_timeout_ms`].
    #[serde(default, deserialize_with = "integral")]
    pub visibility_timeout_ms: Option<u64>,
    /// See [`TopicSettings::max_in_flight_per_partition`].
    #[serde(default, deserialize_with = "integral")]
    pub max_in_flight_per_partition: Option<u32>,
    /// See [`TopicSettings::max_acked_ahead_per_partition`].
    #[serde(default, deserialize_with = "integral")]
    pub max_acked_ahead_per_partition: Option<u32>,
    /// See [`TopicSettings::retention_ms`].
    #[serde(default, deserialize_with = "integral")]
    pub retention_ms: Option<u64>,
    /// See [`TopicSettings::dedup_window_ms`].
    #[serde(default, deserialize_with = "integral")]
    pub dedup_window_ms: Option<u64>,
    /// See [`TopicSettings::max_deliveries`].
    #[serde(default, deserialize_with = "integral")]
    pub max_deliveries: Option<u32>,
    /// See [`TopicSettings::dead_letter_topic`]; `""` clears it.
    pub dead_letter_topic: Option<String>,
    /// See [`TopicSettings::paused`].
    pub paused: Option<bool>,
    /// See [`TopicSettings::ordering`].
    pub ordering: Option<Ordering>,
}

/// Parses the JSON body of a create or change of `what`; an empty body means "all
/// defaults".
///
/// Errors: [`InvalidSetting`] for malformed JSON, unknown fields or wrong types.
pub(crate) fn parse_input<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
    what: &str,
) -> Result<T, InvalidSetting> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| InvalidSetting(format!("invalid {what}: {e}")))
}

/// A setting out of range, or an attempt to change a fixed one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSetting(pub String);

impl SettingsInput {
    /// Parses a request body; an empty body means "all defaults".
    ///
    /// Errors: [`InvalidSetting`] for malformed JSON, unknown fields or wrong types.
    pub fn parse(body: &[u8]) -> Result<Self, InvalidSetting> {
        parse_input(body, "settings")
    }

    /// The settings of a new topic: defaults overlaid with this input, validated.
    pub fn to_new(&self) -> Result<TopicSettings, InvalidSetting> {
        let mut s = TopicSettings::default();
        if let Some(p) = self.partitions {
            s.partitions = p;
        }
        self.overlay(&mut s);
        validate(&s)?;
        Ok(s)
    }

    /// `current` changed by this input, validated. `partitions` cannot change.
    pub fn apply_to(&self, current: &TopicSettings) -> Result<TopicSettings, InvalidSetting> {
        if let Some(p) = self.partitions {
            if p != current.partitions {
                return Err(InvalidSetting(
                    "partitions cannot be changed after creation".into(),
                ));
            }
        }
        let mut s = current.clone();
        self.overlay(&mut s);
        validate(&s)?;
        Ok(s)
    }

    fn overlay(&self, s: &mut TopicSettings) {
        if let Some(v) = self.visibility_timeout_ms {
            s.visibility_timeout_ms = v;
        }
        if let Some(v) = self.max_in_flight_per_partition {
            s.max_in_flight_per_partition = v;
        }
        if let Some(v) = self.max_acked_ahead_per_partition {
            s.max_acked_ahead_per_partition = v;
        }
        if let Some(v) = self.retention_ms {
            s.retention_ms = v;
        }
        if let Some(v) = self.dedup_window_ms {
            s.dedup_window_ms = v;
        }
        if let Some(v) = self.max_deliveries {
            s.max_deliveries = v;
        }
        if let Some(v) = &self.dead_letter_topic {
            s.dead_letter_topic = (!v.is_empty()).then(|| v.clone());
        }
        if let Some(v) = self.paused {
            s.paused = v;
        }
        if let Some(v) = self.ordering {
            s.ordering = v;
        }
    }
}

fn check(name: &str, v: u64, lo: u64, hi: u64) -> Result<(), InvalidSetting> {
    if v < lo || v > hi {
        return Err(InvalidSetting(format!(
            "{name} must be between {lo} and {hi}, got {v}"
        )));
    }
    Ok(())
}

/// Checks every setting against its range.
pub fn validate(s: &TopicSettings) -> Result<(), InvalidSetting> {
    check("partitions", s.partitions.into(), 1, MAX_PARTITIONS.into())?;
    check(
        "visibility_timeout_ms",
        s.visibility_timeout_ms,
        100,
        12 * 3600 * 1000,
    )?;
    check(
        "max_in_flight_per_partition",
        s.max_in_flight_per_partition.into(),
        1,
        10_000,
    )?;
    check(
        "max_acked_ahead_per_partition",
        s.max_acked_ahead_per_partition.into(),
        1,
        10_000,
    )?;
    check("retention_ms", s.retention_ms, 1000, 365 * 24 * 3600 * 1000)?;
    check("dedup_window_ms", s.dedup_window_ms, 1000, 24 * 3600 * 1000)?;
    check("max_deliveries", s.max_deliveries.into(), 0, 1000)?;
    if let Some(t) = &s.dead_letter_topic {
        crate::keys::validate_topic(t)
            .map_err(|e| InvalidSetting(format!("dead_letter_topic: {e}")))?;
    }
    if s.max_deliveries > 0 && s.dead_letter_topic.is_none() {
        return Err(InvalidSetting(
            "max_deliveries needs a dead_letter_topic: messages are never dropped silently".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overlay() {
        let s = SettingsInput::parse(b"").unwrap().to_new().unwrap();
        assert_eq!(s, TopicSettings::default());
        let s = SettingsInput::parse(br#"{"partitions":4,"visibility_timeout_ms":500}"#)
            .unwrap()
            .to_new()
            .unwrap();
        assert_eq!((s.partitions, s.visibility_timeout_ms), (4, 500));
    }

    #[test]
    fn refuses_unknown_and_out_of_range() {
        assert!(SettingsInput::parse(br#"{"partitionz":4}"#).is_err());
        // A whole-number float is an integer, as JSON Schema says; a fraction is not.
        let s = SettingsInput::parse(br#"{"partitions":4.0,"retention_ms":60000.0}"#).unwrap();
        assert_eq!((s.partitions, s.retention_ms), (Some(4), Some(60_000)));
        assert!(SettingsInput::parse(br#"{"partitions":4.5}"#).is_err());
        assert!(SettingsInput::parse(br#"{"partitions":-1.0}"#).is_err());
        assert!(SettingsInput::parse(br#"{"partitions":4294967296.0}"#).is_err());
        assert!(SettingsInput::parse(br#"{"partitions":-1}"#).is_err());
        assert!(SettingsInput::parse(br#"{"visibility_timeout_ms":99}"#)
            .unwrap()
            .to_new()
            .is_err());
        assert!(SettingsInput::parse(br#"{"partitions":0}"#)
            .unwrap()
            .to_new()
            .is_err());
        let cur = TopicSettings::default();
        assert!(SettingsInput::parse(br#"{"partitions":2}"#)
            .unwrap()
            .apply_to(&cur)
            .is_err());
        assert!(SettingsInput::parse(br#"{"partitions":1}"#)
            .unwrap()
            .apply_to(&cur)
            .is_ok());
    }
}
