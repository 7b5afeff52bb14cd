//! Subscriptions (docs/design.md §5): creating, listing, changing and deleting them (the
//! [`Group`] a consume, settle or dead-letter move works on is `topic.rs`'s).
//!
//! A subscription's record is part of the topic record, changed by the same conditional
//! writes as the topic's settings; its ledgers are objects of their own
//! ([`crate::partition::subscription`]). Creating one reads every partition's manifest
//! once, for where it starts.

use serde::Serialize;

use crate::cas::{Cell, Decision, Pure};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::subscription::{Origin, SubscriptionState};
use crate::partition::Ledger;
use crate::subscription::{Start, SubscriptionInput, SubscriptionRecord};
use crate::topic::{Topic, TopicRecord};

use super::{Broker, Created};
pub(crate) use crate::topic::{validate_name, Group};

/// One partition of a subscription, as `GET /v1/topics/{t}/subscriptions/{s}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SubscriptionPartition {
    /// Partition.
    pub partition: u32,
    /// The subscription's lowest unsettled offset.
    pub frontier: u64,
    /// Offset the next message gets.
    pub next_offset: u64,
    /// Unsettled messages with no live lease and no delay (the backlog).
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Offsets acked above the frontier.
    pub acked_ahead: u64,
    /// Unsettled messages whose delay is not over.
    pub delayed: u64,
    /// Messages retention removed before this subscription settled them.
    pub lost: u64,
    /// Age of the oldest unsettled message, ms.
    pub oldest_unsettled_age_ms: Option<u64>,
    /// Age of the oldest available message, ms.
    pub oldest_available_age_ms: Option<u64>,
}

impl Broker {
    /// Subscription `sub`'s figures per partition: two reads per partition (the manifest
    /// and the subscription's ledger), plus the segments of its oldest messages.
    ///
    /// Errors: [`BrokerError::SubscriptionNotFound`], store failures.
    pub async fn subscription_stats(
        &self,
        topic: &Topic,
        sub: &str,
    ) -> BrokerResult<Vec<SubscriptionPartition>> {
        let Group::Named(name, rec) = Group::of(topic, Some(sub))? else {
            return Err(BrokerError::SubscriptionNotFound);
        };
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        for p in 0..topic.settings.partitions {
            let log = self.read_manifest(topic, p).await?;
            let origin = Origin {
                id: rec.id.clone(),
                start: rec.start_offset(p),
            };
            let key = keys::subscription_ledger(&topic.name, name, &rec.id, p);
            let cell = Cell::<SubscriptionState>::new(&*self.store, &*self.ids, &key, &origin);
            let mut state = cell.read::<BrokerError>().await?.value;
            // As the next commit will see it: what retention removed since is lost.
            state.catch_up(&log);
            let lost = state.lost;
            let view = state.over(&log);
            let (oldest_unsettled_age_ms, oldest_available_age_ms) = self
                .backlog_ages(topic, p, &view, &log.layout(), now)
                .await?;
            out.push(SubscriptionPartition {
                partition: p,
                frontier: view.frontier(),
                next_offset: log.next_offset,
                available: view.available_count(now),
                in_flight: view.in_flight(now) as u64,
                acked_ahead: view.acked_ahead().len() as u64,
                delayed: view.delayed_count(now),
                lost,
                oldest_unsettled_age_ms,
                oldest_available_age_ms,
            });
        }
        Ok(out)
    }

    /// Creates the subscription `sub` on topic `name`: [`Created::New`], or
    /// [`Created::Existing`] when it existed with the same start and settings.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::SubscriptionConflict`],
    /// [`BrokerError::TooManySubscriptions`], [`BrokerError::InvalidSetting`],
    /// [`BrokerError::FleetBelow`].
    pub async fn create_subscription(
        &self,
        name: &str,
        sub: &str,
        input: &SubscriptionInput,
    ) -> BrokerResult<(Created, Topic)> {
        keys::validate_topic(name)?;
        validate_name(sub)?;
        self.gate.check()?;
        let level = self.fleet_level();
        if !level.has_subscriptions() {
            return Err(BrokerError::FleetBelow {
                needed: 5,
                level: level.0,
            });
        }
        let topic = self.load_topic(name).await?;
        let (start, settings) = input.to_new(&topic.settings)?;
        if let Some(existing) = topic.subscription(sub) {
            // Known already: no manifest reads.
            return if existing.start == start && existing.settings == settings {
                Ok((Created::Existing, topic))
            } else {
                Err(BrokerError::SubscriptionConflict)
            };
        }
        let mut start_offsets = Vec::with_capacity(topic.settings.partitions as usize);
        for p in 0..topic.settings.partitions {
            let m = self.read_manifest(&topic, p).await?;
            start_offsets.push(match start {
                Start::Latest => m.next_offset,
                Start::Earliest => m.start_offset,
            });
        }
        let new = SubscriptionRecord {
            id: self.ids.new_id(),
            created_at_ms: self.clock.now_ms(),
            start,
            start_offsets,
            settings,
            unknown: serde_json::Map::new(),
        };
        let max = self.opts.max_subscriptions;
        let key = keys::topic_settings(name);
        let incarnation = topic.incarnation.clone();
        let (created, snap) = self
            .record_cell(&key)
            .update(Pure(|cur: &mut Option<TopicRecord>| {
                let Some(rec) = cur.as_mut().filter(|r| r.incarnation == incarnation) else {
                    // Deleted, or created again since its manifests were read.
                    return Err(BrokerError::StaleTopic);
                };
                if let Some(old) = rec.subscriptions.get(sub) {
                    return if old.start == new.start && old.settings == new.settings {
                        Ok(Decision::Keep(Created::Existing))
                    } else {
                        Err(BrokerError::SubscriptionConflict)
                    };
                }
                if rec.subscriptions.len() >= max {
                    return Err(BrokerError::TooManySubscriptions(max));
                }
                rec.subscriptions.insert(sub.to_owned(), new.clone());
                Ok(Decision::Commit(Created::New))
            }))
            .await?;
        let topic = self.remember(name, snap)?;
        Ok((created, topic))
    }

    /// Changes the settings of subscription `sub` that can change.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::SubscriptionNotFound`],
    /// [`BrokerError::InvalidSetting`].
    pub async fn patch_subscription(
        &self,
        name: &str,
        sub: &str,
        input: &SubscriptionInput,
    ) -> BrokerResult<Topic> {
        keys::validate_topic(name)?;
        validate_name(sub)?;
        self.gate.check()?;
        let key = keys::topic_settings(name);
        let (_, snap) = self
            .record_cell(&key)
            .update(Pure(|cur: &mut Option<TopicRecord>| {
                let Some(rec) = cur else {
                    return Err(BrokerError::TopicNotFound);
                };
                let Some(old) = rec.subscriptions.get(sub) else {
                    return Err(BrokerError::SubscriptionNotFound);
                };
                let settings = input.apply_to(old, &rec.settings)?;
                if settings == old.settings {
                    return Ok(Decision::Keep(()));
                }
                if let Some(s) = rec.subscriptions.get_mut(sub) {
                    s.settings = settings;
                }
                Ok(Decision::Commit(()))
            }))
            .await?;
        let topic = self.remember(name, snap)?;
        self.committer.wakers().wake(name);
        Ok(topic)
    }

    /// Deletes subscription `sub` and its ledgers: its outstanding handles get 410.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::SubscriptionNotFound`].
    pub async fn delete_subscription(&self, name: &str, sub: &str) -> BrokerResult<()> {
        keys::validate_topic(name)?;
        validate_name(sub)?;
        self.gate.check()?;
        let key = keys::topic_settings(name);
        let (id, snap) = self
            .record_cell(&key)
            .update(Pure(|cur: &mut Option<TopicRecord>| {
                let Some(rec) = cur else {
                    return Err(BrokerError::TopicNotFound);
                };
                match rec.subscriptions.remove(sub) {
                    Some(removed) => Ok(Decision::Commit(removed.id)),
                    None => Err(BrokerError::SubscriptionNotFound),
                }
            }))
            .await?;
        self.remember(name, snap)?;
        // The record went first; the ledgers are under the removed creation's id, which
        // nothing writes again (gc deletes what an interrupted delete leaves).
        let prefix = keys::subscription_prefix(name, sub, &id);
        let deleted = self.store.list(&prefix).await?;
        for k in &deleted {
            self.store.delete(k).await?;
        }
        self.store.delete_folders(&prefix, &deleted).await?;
        Ok(())
    }
}
