//! Subscriptions: several independent sets of competing consumers on one topic
//! (docs/design.md §5). Their records live in the topic record ([`SubscriptionRecord`]
//! under `subscriptions` in `topic.json`); each one's ledger per partition in its own
//! object ([`crate::partition::subscription`]).
//!
//! | setting | default | range | changeable |
//! |---|---|---|---|
//! | `start` | `"latest"` | `"latest"`: messages produced after creation; `"earliest"`: every retained message | no |
//! | `visibility_timeout_ms` | the topic's | as the topic's | yes |
//! | `max_in_flight_per_partition` | the topic's | as the topic's | yes |
//! | `max_acked_ahead_per_partition` | the topic's | as the topic's | yes |
//! | `max_deliveries` | the topic's | as the topic's | yes |
//! | `dead_letter_topic` | the topic's | a topic name; `""` clears it | yes |
//! | `paused` | the topic's | true, false | yes |
//!
//! A setting not given follows the topic's, also when the topic's changes later.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::settings::{InvalidSetting, TopicSettings};

/// Subscriptions one topic holds at most unless `NARAD_MAX_SUBSCRIPTIONS` says otherwise.
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 100;

/// Where a new subscription starts in each partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// With the messages produced after its creation.
    #[default]
    Latest,
    /// With every message retained at its creation.
    Earliest,
}

/// A subscription's own settings; a field left out follows the topic's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionSettings {
    /// See [`TopicSettings::visibility_timeout_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    /// See [`TopicSettings::max_in_flight_per_partition`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_partition: Option<u32>,
    /// See [`TopicSettings::max_acked_ahead_per_partition`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_acked_ahead_per_partition: Option<u32>,
    /// See [`TopicSettings::max_deliveries`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<u32>,
    /// See [`TopicSettings::dead_letter_topic`]; `Some("")`: none, whatever the topic's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// See [`TopicSettings::paused`]: while true, a consume of this subscription
    /// delivers nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

impl SubscriptionSettings {
    /// The settings this subscription's leases and settles obey: the topic's, overlaid
    /// with this subscription's own.
    pub fn effective(&self, topic: &TopicSettings) -> TopicSettings {
        let mut s = topic.clone();
        if let Some(v) = self.visibility_timeout_ms {
            s.visibility_timeout_ms = v;
        }
        if let Some(v) = self.max_in_flight_per_partition {
            s.max_in_flight_per_partition = v;
        }
        if let Some(v) = self.max_acked_ahead_per_partition {
            s.max_acked_ahead_per_partition = v;
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
        s
    }
}

/// One subscription as the topic record stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionRecord {
    /// Changes each time a subscription of this name is created; sorts by creation time
    /// (its ledgers belong to it: [`crate::partition::subscription::Origin`]).
    pub id: String,
    /// Creation time, wall-clock ms.
    pub created_at_ms: u64,
    /// Where it started.
    pub start: Start,
    /// Each partition's first offset for it, read at creation (a partition not listed:
    /// 0).
    pub start_offsets: Vec<u64>,
    /// Its own settings.
    pub settings: SubscriptionSettings,
    /// Fields a newer build stored that this one does not know, kept as they are.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl SubscriptionRecord {
    /// Partition `p`'s first offset for this subscription.
    pub fn start_offset(&self, p: u32) -> u64 {
        self.start_offsets.get(p as usize).copied().unwrap_or(0)
    }
}

/// A topic's subscriptions by name.
pub type Subscriptions = BTreeMap<String, SubscriptionRecord>;

/// The JSON body of a subscription's create (`PUT`) or change (`PATCH`): every field
/// optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionInput {
    /// See [`Start`]; only at creation.
    pub start: Option<Start>,
    /// See [`TopicSettings::visibility_timeout_ms`].
    #[serde(default, deserialize_with = "crate::settings::integral")]
    pub visibility_timeout_ms: Option<u64>,
    /// See [`TopicSettings::max_in_flight_per_partition`].
    #[serde(default, deserialize_with = "crate::settings::integral")]
    pub max_in_flight_per_partition: Option<u32>,
    /// See [`TopicSettings::max_acked_ahead_per_partition`].
    #[serde(default, deserialize_with = "crate::settings::integral")]
    pub max_acked_ahead_per_partition: Option<u32>,
    /// See [`TopicSettings::max_deliveries`].
    #[serde(default, deserialize_with = "crate::settings::integral")]
    pub max_deliveries: Option<u32>,
    /// See [`TopicSettings::dead_letter_topic`]; `""`: none.
    pub dead_letter_topic: Option<String>,
    /// See [`TopicSettings::paused`].
    pub paused: Option<bool>,
}

impl SubscriptionInput {
    /// Parses a request body; an empty body means "all defaults".
    ///
    /// Errors: [`InvalidSetting`] for malformed JSON, unknown fields or wrong types.
    pub fn parse(body: &[u8]) -> Result<Self, InvalidSetting> {
        crate::settings::parse_input(body, "subscription settings")
    }

    /// The start and settings of a new subscription on a topic with settings `topic`.
    ///
    /// Errors: [`InvalidSetting`] for a value out of its range.
    pub fn to_new(
        &self,
        topic: &TopicSettings,
    ) -> Result<(Start, SubscriptionSettings), InvalidSetting> {
        let s = self.overlay(SubscriptionSettings::default());
        crate::settings::validate(&s.effective(topic))?;
        Ok((self.start.unwrap_or_default(), s))
    }

    /// `current` changed by this input, validated. `start` cannot change.
    ///
    /// Errors: [`InvalidSetting`].
    pub fn apply_to(
        &self,
        current: &SubscriptionRecord,
        topic: &TopicSettings,
    ) -> Result<SubscriptionSettings, InvalidSetting> {
        if self.start.is_some_and(|s| s != current.start) {
            return Err(InvalidSetting(
                "start cannot be changed after creation".into(),
            ));
        }
        let s = self.overlay(current.settings.clone());
        crate::settings::validate(&s.effective(topic))?;
        Ok(s)
    }

    fn overlay(&self, mut s: SubscriptionSettings) -> SubscriptionSettings {
        if let Some(v) = self.visibility_timeout_ms {
            s.visibility_timeout_ms = Some(v);
        }
        if let Some(v) = self.max_in_flight_per_partition {
            s.max_in_flight_per_partition = Some(v);
        }
        if let Some(v) = self.max_acked_ahead_per_partition {
            s.max_acked_ahead_per_partition = Some(v);
        }
        if let Some(v) = self.max_deliveries {
            s.max_deliveries = Some(v);
        }
        if let Some(v) = &self.dead_letter_topic {
            s.dead_letter_topic = Some(v.clone());
        }
        if let Some(v) = self.paused {
            s.paused = Some(v);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic() -> TopicSettings {
        TopicSettings {
            visibility_timeout_ms: 5000,
            ..TopicSettings::default()
        }
    }

    #[test]
    fn a_setting_left_out_follows_the_topics() {
        let input = SubscriptionInput::parse(br#"{"max_in_flight_per_partition":7}"#).unwrap();
        let (start, s) = input.to_new(&topic()).unwrap();
        assert_eq!(start, Start::Latest);
        let e = s.effective(&topic());
        assert_eq!(
            (e.visibility_timeout_ms, e.max_in_flight_per_partition),
            (5000, 7)
        );
        let later = TopicSettings {
            visibility_timeout_ms: 9000,
            ..topic()
        };
        assert_eq!(s.effective(&later).visibility_timeout_ms, 9000);
        let stored = serde_json::to_string(&s).unwrap();
        assert_eq!(stored, r#"{"max_in_flight_per_partition":7}"#);
    }

    #[test]
    fn bad_input_is_refused() {
        assert!(SubscriptionInput::parse(br#"{"strat":"earliest"}"#).is_err());
        assert!(SubscriptionInput::parse(br#"{"start":"middle"}"#).is_err());
        let too_short = SubscriptionInput::parse(br#"{"visibility_timeout_ms":5}"#).unwrap();
        assert!(too_short.to_new(&topic()).is_err());
        let no_dlq = SubscriptionInput::parse(br#"{"max_deliveries":3}"#).unwrap();
        assert!(no_dlq.to_new(&topic()).is_err());
        let bad_dlq = SubscriptionInput::parse(br#"{"dead_letter_topic":"a b"}"#).unwrap();
        assert!(bad_dlq.to_new(&topic()).is_err());
    }

    #[test]
    fn a_dead_letter_topic_of_its_own_or_none() {
        let with_dlq = TopicSettings {
            max_deliveries: 3,
            dead_letter_topic: Some("dlq".into()),
            ..topic()
        };
        let own = SubscriptionInput::parse(br#"{"dead_letter_topic":"mine"}"#).unwrap();
        let (_, s) = own.to_new(&with_dlq).unwrap();
        assert_eq!(
            s.effective(&with_dlq).dead_letter_topic.as_deref(),
            Some("mine")
        );
        // No dead-letter topic while the topic's max_deliveries applies: refused.
        let none = SubscriptionInput::parse(br#"{"dead_letter_topic":""}"#).unwrap();
        assert!(none.to_new(&with_dlq).is_err());
        let none =
            SubscriptionInput::parse(br#"{"dead_letter_topic":"","max_deliveries":0}"#).unwrap();
        let (_, s) = none.to_new(&with_dlq).unwrap();
        assert_eq!(s.effective(&with_dlq).dead_letter_topic, None);
    }

    #[test]
    fn start_is_fixed_at_creation() {
        let rec = SubscriptionRecord {
            id: "1".into(),
            created_at_ms: 0,
            start: Start::Earliest,
            start_offsets: vec![3],
            settings: SubscriptionSettings::default(),
            unknown: serde_json::Map::new(),
        };
        let same = SubscriptionInput::parse(br#"{"start":"earliest","paused":true}"#).unwrap();
        assert_eq!(same.apply_to(&rec, &topic()).unwrap().paused, Some(true));
        let other = SubscriptionInput::parse(br#"{"start":"latest"}"#).unwrap();
        assert!(other.apply_to(&rec, &topic()).is_err());
        assert_eq!((rec.start_offset(0), rec.start_offset(5)), (3, 0));
    }
}
