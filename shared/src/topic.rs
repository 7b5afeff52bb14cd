//! A topic as the broker uses it ([`Topic`]), its stored form `topics/{t}/topic.json`
//! ([`TopicRecord`], a [`crate::cas`] record created with put-if-absent and changed by
//! conditional writes, docs/design.md §2), and the [`Group`] of competing consumers an
//! operation is for.
//!
//! Each creation of a topic name gets a new `incarnation` id (time-sortable), so objects
//! left behind by a deleted topic of the same name are told apart from the new topic's.

use serde::{Deserialize, Serialize};

use crate::cas::JsonRecord;
use std::sync::Arc;

use crate::error::{BrokerError, BrokerResult};
use crate::settings::TopicSettings;
use crate::store::ETag;
use crate::subscription::{SubscriptionRecord, Subscriptions};

/// The stored form of `topic.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    /// The topic's settings.
    pub settings: TopicSettings,
    /// Changes each time a topic of this name is created; sorts by creation time.
    pub incarnation: String,
    /// Creation time, wall-clock ms.
    pub created_at_ms: u64,
    /// Where the partitions' manifests are ([`crate::keys::manifest`]): 1 (records
    /// without the field) or [`crate::keys::LAYOUT_FLAT`], which new topics get.
    #[serde(default = "layout_1")]
    pub layout: u32,
    /// Its subscriptions besides the default one, by name (written only at fleet level
    /// 5, [`crate::formats::Level::has_subscriptions`]).
    #[serde(default, skip_serializing_if = "Subscriptions::is_empty")]
    pub subscriptions: Subscriptions,
    /// Fields a newer build stored that this one does not know, kept as they are.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

fn layout_1() -> u32 {
    1
}

impl JsonRecord for TopicRecord {
    /// A layout above [`crate::keys::LAYOUT_FLAT`] puts manifests where this build does not
    /// look.
    fn newer(&self) -> Option<crate::cas::Newer> {
        (self.layout > crate::keys::LAYOUT_FLAT).then(|| crate::cas::Newer {
            what: "topic layout",
            found: self.layout.into(),
            known: crate::keys::LAYOUT_FLAT.into(),
        })
    }
}

/// A topic as loaded for one request.
#[derive(Debug, Clone)]
pub struct Topic {
    /// The topic name.
    pub name: String,
    /// Its settings.
    pub settings: TopicSettings,
    /// Changes each time a topic of this name is created; sorts by creation time.
    pub incarnation: String,
    /// Creation time, wall-clock ms.
    pub created_at_ms: u64,
    /// Where its manifests are (see [`TopicRecord::layout`]).
    pub layout: u32,
    /// Its subscriptions besides the default one.
    pub subscriptions: Arc<Subscriptions>,
    /// ETag of the settings object this was read from.
    pub etag: ETag,
    /// Served from this process's cache (possibly up to `topic_cache` old): a request
    /// that the cached settings refuse is retried against freshly read ones.
    pub from_cache: bool,
}

impl Topic {
    /// The key of partition `p`'s manifest.
    pub fn manifest_key(&self, p: u32) -> String {
        crate::keys::manifest(&self.name, self.layout, p)
    }

    /// The subscription `name`, if the topic has it.
    pub fn subscription(&self, name: &str) -> Option<&SubscriptionRecord> {
        self.subscriptions.get(name)
    }

    /// The topic `name` as stored in `rec` with ETag `etag`, freshly read.
    pub fn from_record(name: &str, rec: TopicRecord, etag: ETag) -> Self {
        Self {
            name: name.to_owned(),
            settings: rec.settings,
            incarnation: rec.incarnation,
            created_at_ms: rec.created_at_ms,
            layout: rec.layout,
            subscriptions: Arc::new(rec.subscriptions),
            etag,
            from_cache: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_a_newer_build_added_survive_a_change_made_here() {
        let stored = r#"{"settings":{"partitions":2,"visibility_timeout_ms":30000,
            "max_in_flight_per_partition":10,"max_acked_ahead_per_partition":10,
            "retention_ms":60000,"max_message_bytes":512,"routing":{"kind":"hash"}},
            "incarnation":"i1","created_at_ms":5,"layout":2,"owner":"team-a"}"#;
        let mut rec: TopicRecord = serde_json::from_str(stored).unwrap();
        assert!(
            rec.newer().is_none(),
            "an unknown field alone is not a newer layout"
        );
        rec.settings.visibility_timeout_ms = 1000;
        let back: serde_json::Value = serde_json::to_value(&rec).unwrap();
        assert_eq!(back["settings"]["max_message_bytes"], 512);
        assert_eq!(back["settings"]["routing"]["kind"], "hash");
        assert_eq!(back["settings"]["visibility_timeout_ms"], 1000);
        assert_eq!(back["owner"], "team-a");
    }
}

/// Which set of competing consumers an operation is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Group<'a> {
    /// The topic's default subscription (its ledger is in the manifest).
    Default,
    /// A named subscription.
    Named(&'a str, &'a SubscriptionRecord),
}

impl<'a> Group<'a> {
    /// The group `name` names on `topic` (`None`: the default one).
    ///
    /// Errors: [`BrokerError::InvalidSetting`] for an invalid name,
    /// [`BrokerError::SubscriptionNotFound`]; [`BrokerError::StaleTopic`] when a topic
    /// from this process's cache does not have it (another process may have just created
    /// it: the caller reads the topic again).
    pub(crate) fn of(topic: &'a Topic, name: Option<&'a str>) -> BrokerResult<Self> {
        let Some(name) = name else {
            return Ok(Group::Default);
        };
        validate_name(name)?;
        match topic.subscriptions.get_key_value(name) {
            Some((n, rec)) => Ok(Group::Named(n, rec)),
            None if topic.from_cache => Err(BrokerError::StaleTopic),
            None => Err(BrokerError::SubscriptionNotFound),
        }
    }

    /// Its name (`None`: the default one).
    pub(crate) fn name(&self) -> Option<&'a str> {
        match *self {
            Group::Default => None,
            Group::Named(name, _) => Some(name),
        }
    }

    /// The settings its leases and settles obey.
    pub(crate) fn settings(&self, topic: &Topic) -> TopicSettings {
        match self {
            Group::Default => topic.settings.clone(),
            Group::Named(_, rec) => rec.settings.effective(&topic.settings),
        }
    }
}

/// Checks a subscription name: the rules of topic names.
///
/// Errors: [`BrokerError::InvalidSetting`].
pub(crate) fn validate_name(name: &str) -> BrokerResult<()> {
    crate::keys::validate_topic(name).map_err(|e| {
        BrokerError::InvalidSetting(crate::settings::InvalidSetting(format!(
            "invalid subscription name: {}",
            e.0
        )))
    })
}
