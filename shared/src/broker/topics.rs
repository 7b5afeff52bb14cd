//! Topic administration: create, list, get, change, delete, and per-partition stats.
//!
//! The topic record is a [`crate::cas`] record (docs/design.md §2): create is a
//! put-if-absent that answers the existing topic when it has the same settings; change
//! is a conditional replace of the settings that may change. Settings are cached in this
//! process for `topic_cache` ([`super::topic_cache`]; a request the cached settings refuse is checked again
//! against fresh ones, see [`super::check_partition`]).

use serde::Serialize;

use super::read::AtOffset;
use super::topic_cache::{Load, Lookup, Refresh};
use super::Broker;
use crate::cas::{Cell, Decision, Pure, Snapshot, Stored};
use crate::dispatch::Kind;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::{Layout, Ledger, Manifest};
use crate::settings::{InvalidSetting, SettingsInput, TopicSettings};
use crate::topic::{Group, Topic, TopicRecord};

/// One partition's state, for `GET /v1/topics/{topic}`.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionStats {
    /// Partition.
    pub partition: u32,
    /// Oldest retained offset.
    pub start_offset: u64,
    /// Lowest unsettled offset.
    pub frontier: u64,
    /// Offset the next message gets.
    pub next_offset: u64,
    /// Unsettled messages not in flight.
    pub available: u64,
    /// Live leases.
    pub in_flight: u64,
    /// Offsets acked above the frontier.
    pub acked_ahead: u64,
    /// Messages produced with a delay that is not over yet (unsettled, not available).
    pub delayed: u64,
    /// Retained segment objects (hot and indexed).
    pub segments: u64,
    /// Retained payload bytes.
    pub bytes: u64,
    /// Manifest version.
    pub version: u64,
    /// Size of the manifest object in bytes (what every commit writes).
    pub manifest_bytes: u64,
    /// Index objects the manifest names (each may name more below it).
    pub indexes: u64,
    /// Age of the oldest unsettled message (the one at the frontier), ms; `None` when
    /// every message is settled.
    pub oldest_unsettled_age_ms: Option<u64>,
    /// Age of the oldest available message (unsettled, no live lease), ms; `None` when
    /// none is available.
    pub oldest_available_age_ms: Option<u64>,
}

/// What a create (`PUT`) of a topic or a subscription did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// Made now (201).
    New,
    /// There already, the same (200).
    Existing,
}

impl Broker {
    pub(super) fn record_cell<'a>(&'a self, key: &'a str) -> Cell<'a, Option<TopicRecord>> {
        Cell::new(&*self.store, &*self.ids, key, &())
    }

    /// Keeps a topic just read or written in the cache, as a [`Topic`].
    pub(super) fn remember(
        &self,
        name: &str,
        snap: Snapshot<Option<TopicRecord>>,
    ) -> BrokerResult<Topic> {
        self.topics.remember(name, snap)
    }

    /// Loads a topic's settings, from this process's short-lived cache when fresh.
    ///
    /// Errors: [`BrokerError::InvalidTopic`], [`BrokerError::TopicNotFound`].
    pub async fn topic(&self, name: &str) -> BrokerResult<Topic> {
        keys::validate_topic(name)?;
        self.gate.check()?;
        if let Some(t) = self.cached_topic(name) {
            return Ok(t);
        }
        match self.topics.join_load(name) {
            Load::Lead(_turn) => self.load_topic(name).await,
            follow => {
                follow.wait().await;
                match self.cached_topic(name) {
                    Some(t) => Ok(t),
                    None => self.load_topic(name).await,
                }
            }
        }
    }

    /// The cached topic, if fresh; one past half its period is also read again in the
    /// background.
    fn cached_topic(&self, name: &str) -> Option<Topic> {
        match self.topics.lookup(name) {
            Lookup::Fresh(t) => Some(t),
            Lookup::Aging(t, refresh) => {
                self.refresh_topic(name, refresh);
                Some(t)
            }
            Lookup::Missing => None,
        }
    }

    /// Reads a topic again in the background (the cached copy is half its period old and
    /// still served meanwhile); what it reads replaces the cached copy, and a topic found
    /// deleted leaves the cache.
    fn refresh_topic(&self, name: &str, refresh: Refresh) {
        let (store, ids, topics) = (self.store.clone(), self.ids.clone(), self.topics.clone());
        let name = name.to_owned();
        let work = async move {
            let key = keys::topic_settings(&name);
            let cell = Cell::new(&*store, &*ids, &key, &());
            let read = match cell.read::<BrokerError>().await {
                Ok(snap) => Some(snap),
                Err(e) => {
                    tracing::debug!(topic = %name, error = %e, "background topic refresh failed");
                    None
                }
            };
            topics.refreshed(&name, refresh, read);
        };
        // Not started once the broker stopped: nothing will ask for the topic again.
        let _ = self.tasks.spawn(Kind::Refresh, work);
    }

    /// Reads a topic's settings from the store, refreshing the cache.
    ///
    /// Errors: [`BrokerError::InvalidTopic`], [`BrokerError::TopicNotFound`].
    pub async fn load_topic(&self, name: &str) -> BrokerResult<Topic> {
        keys::validate_topic(name)?;
        self.gate.check()?;
        let key = keys::topic_settings(name);
        let snap = self.record_cell(&key).read::<BrokerError>().await?;
        self.remember(name, snap)
    }

    /// Creates a topic: [`Created::New`], or [`Created::Existing`] when it already existed
    /// with the same settings; with the topic.
    ///
    /// Errors: [`BrokerError::InvalidTopic`], [`BrokerError::InvalidSetting`],
    /// [`BrokerError::TopicConflict`] when it exists with other settings.
    pub async fn create_topic(
        &self,
        name: &str,
        input: &SettingsInput,
    ) -> BrokerResult<(Created, Topic)> {
        keys::validate_topic(name)?;
        self.gate.check()?;
        let settings = input.to_new()?;
        not_own_dead_letter_topic(name, &settings)?;
        let new = TopicRecord {
            settings,
            incarnation: self.ids.new_id(),
            created_at_ms: self.clock.now_ms(),
            layout: keys::LAYOUT_FLAT,
            subscriptions: Default::default(),
            unknown: serde_json::Map::new(),
        };
        let key = keys::topic_settings(name);
        let cell = self.record_cell(&key);
        // The quota, checked before a new topic only (soft: two creates at once may both
        // pass it). The record read for it is the one the write starts from.
        let snap = cell.read::<BrokerError>().await?;
        if snap.value.is_none() {
            let max = self.opts.max_topics;
            if self.count_topics().await? >= max {
                return Err(BrokerError::TooManyTopics(max));
            }
        }
        let (created, snap) = cell
            .update_cached(
                &mut Some(snap),
                &mut Pure(|cur: &mut Option<TopicRecord>| match cur {
                    Some(old) if same_configuration(&old.settings, &new.settings) => {
                        Ok(Decision::Keep(Created::Existing))
                    }
                    Some(_) => Err(BrokerError::TopicConflict),
                    None => {
                        *cur = Some(new.clone());
                        Ok(Decision::Commit(Created::New))
                    }
                }),
            )
            .await?;
        let topic = self.remember(name, snap)?;
        if created == Created::New {
            self.committer.created(&topic);
        }
        Ok((created, topic))
    }

    /// Up to `limit` topics that `visible` admits, after the name `after` (empty: from the
    /// first), in key order (a name compares as if followed by `/`), and the name to
    /// continue after when there may be more. Delimited listings of up to 1000 names each,
    /// until `limit` visible ones are found, plus one read per topic returned, whatever
    /// the topics hold.
    ///
    /// Errors: store failures.
    pub async fn list_topics(
        &self,
        after: &str,
        limit: usize,
        visible: impl Fn(&str) -> bool,
    ) -> BrokerResult<(Vec<Topic>, Option<String>)> {
        self.gate.check()?;
        const PAGE: usize = 1000;
        let mut names: Vec<String> = Vec::new();
        let mut cursor = after.to_owned();
        let next = loop {
            let page = self
                .store
                .list_dirs(keys::TOPICS_PREFIX, &cursor, PAGE)
                .await?;
            let full = page.len() == PAGE;
            if let Some(last) = page.last() {
                cursor = last.clone();
            }
            for n in page {
                if keys::validate_topic(&n).is_ok() && visible(&n) {
                    names.push(n);
                    if names.len() == limit {
                        break;
                    }
                }
            }
            if names.len() == limit {
                break names.last().cloned();
            }
            if !full {
                break None;
            }
        };
        let loaded = futures::future::join_all(names.iter().map(|n| self.load_topic(n))).await;
        let mut out = Vec::new();
        for t in loaded {
            match t {
                Ok(t) => out.push(t),
                // Leftovers of a topic being deleted.
                Err(BrokerError::TopicNotFound) => {}
                // A topic a newer build created: listed by that build, not this one (its
                // own routes answer upgrade_required).
                Err(BrokerError::UpgradeRequired { object, newer }) => {
                    tracing::warn!(%object, %newer, "topic left out of the listing");
                }
                Err(e) => return Err(e),
            }
        }
        Ok((out, next))
    }

    /// How many topics the store holds (their directories: one listing per 1000).
    async fn count_topics(&self) -> BrokerResult<usize> {
        let mut n = 0;
        let mut after = String::new();
        loop {
            let page = self
                .store
                .list_dirs(keys::TOPICS_PREFIX, &after, 1000)
                .await?;
            n += page.len();
            match page.last() {
                Some(last) if page.len() == 1000 => after = last.clone(),
                _ => return Ok(n),
            }
        }
    }

    /// Changes the settings that can change.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::InvalidSetting`].
    pub async fn patch_topic(&self, name: &str, input: &SettingsInput) -> BrokerResult<Topic> {
        keys::validate_topic(name)?;
        self.gate.check()?;
        let key = keys::topic_settings(name);
        let (_, snap) = self
            .record_cell(&key)
            .update(Pure(|cur: &mut Option<TopicRecord>| {
                let Some(rec) = cur else {
                    return Err(BrokerError::TopicNotFound);
                };
                let settings = input.apply_to(&rec.settings)?;
                not_own_dead_letter_topic(name, &settings)?;
                if settings == rec.settings {
                    return Ok(Decision::Keep(()));
                }
                rec.settings = settings;
                Ok(Decision::Commit(()))
            }))
            .await?;
        let topic = self.remember(name, snap)?;
        self.committer.wakers().wake(name);
        Ok(topic)
    }

    /// Deletes a topic and every object under it. The settings object goes first, so
    /// the topic disappears at once; leftovers of an interrupted delete belong to a dead
    /// incarnation and are ignored by a new topic of the same name.
    ///
    /// Errors: [`BrokerError::TopicNotFound`].
    pub async fn delete_topic(&self, name: &str) -> BrokerResult<()> {
        self.load_topic(name).await?;
        self.topics.forget(name);
        self.store.delete(&keys::topic_settings(name)).await?;
        let prefix = keys::topic_prefix(name);
        let mut deleted = self.store.list(&prefix).await?;
        for key in &deleted {
            self.store.delete(key).await?;
        }
        // The folders too, so the topic stops being listed and counted at once (SeaweedFS).
        deleted.push(keys::topic_settings(name));
        self.store.delete_folders(&prefix, &deleted).await?;
        self.committer.wakers().wake(name);
        Ok(())
    }

    /// Inspects the partitions of a topic (all, or `partition`) and rebuilds each one whose
    /// manifest is corrupt ([`crate::commit::Committer::repair`]); with `dry_run`, only
    /// says what a rebuild would restore and retire.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::NoSuchPartition`], store
    /// failures, [`BrokerError::Contention`] (the manifest changed meanwhile: run again).
    pub async fn repair(
        &self,
        name: &str,
        partition: Option<u32>,
        dry_run: bool,
    ) -> BrokerResult<Vec<crate::repair::Repair>> {
        let topic = self.load_topic(name).await?;
        let parts: Vec<u32> = match partition {
            Some(p) => {
                super::check_partition(&topic, p)?;
                vec![p]
            }
            None => (0..topic.settings.partitions).collect(),
        };
        let mut out = Vec::new();
        for p in parts {
            out.push(self.committer.repair(&topic, p, dry_run).await?);
            // A repair writes the manifest beside the partition's queue, which announces
            // only what its own commits answer: forget what replays keep of it here.
            self.views.forget(&topic.manifest_key(p));
        }
        Ok(out)
    }

    /// Removes every retained message of every partition (available and in flight; see
    /// [`crate::commit::Committer::purge`]); answers how many. The topic, its settings and
    /// its offsets stay: new produces continue from where the partitions were.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], store failures.
    pub async fn purge_topic(&self, name: &str) -> BrokerResult<u64> {
        self.purge_from(name, None).await
    }

    /// As [`Broker::purge_topic`] with `sub: None`; with a subscription, settles every
    /// message the topic holds now for that subscription alone (its outstanding handles
    /// get 410; the messages stay for the others). Answers how many were unsettled.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], [`BrokerError::SubscriptionNotFound`],
    /// store failures.
    pub async fn purge_from(&self, name: &str, sub: Option<&str>) -> BrokerResult<u64> {
        if let Some(sub) = sub {
            return self
                .with_topic(name, |topic| async move {
                    let group = Group::of(&topic, Some(sub))?;
                    let mut removed = 0;
                    for p in 0..topic.settings.partitions {
                        removed += self.committer.purge((&topic, group), p).await?;
                    }
                    Ok(removed)
                })
                .await;
        }
        self.with_topic(name, |topic| async move {
            let mut removed = 0;
            for p in 0..topic.settings.partitions {
                removed += self.committer.purge((&topic, Group::Default), p).await?;
            }
            Ok(removed)
        })
        .await
    }

    /// Per-partition state of a topic.
    ///
    /// Errors: store failures, [`BrokerError::StaleTopic`].
    pub async fn partition_stats(&self, topic: &Topic) -> BrokerResult<Vec<PartitionStats>> {
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        for p in 0..topic.settings.partitions {
            let m = self.read_manifest(topic, p).await?;
            let (oldest_unsettled_age_ms, oldest_available_age_ms) =
                self.backlog_ages(topic, p, &m, &m.layout(), now).await?;
            out.push(PartitionStats {
                partition: p,
                start_offset: m.start_offset,
                frontier: m.frontier,
                next_offset: m.next_offset,
                available: m.available_count(now),
                in_flight: m.in_flight(now) as u64,
                acked_ahead: m.acked_ahead.len() as u64,
                delayed: m.delayed_count(now),
                segments: m.retained_segments(),
                bytes: m.retained_bytes(),
                version: m.version,
                manifest_bytes: m.encode().map_or(0, |b| b.len() as u64),
                indexes: m.indexes.len() as u64,
                oldest_unsettled_age_ms,
                oldest_available_age_ms,
            });
        }
        Ok(out)
    }

    /// The ages of the oldest unsettled and the oldest available (or undecided) message of
    /// `m` at `now`: their produce times, read from their segments (at most two reads).
    pub(super) async fn backlog_ages(
        &self,
        topic: &Topic,
        p: u32,
        m: &impl Ledger,
        layout: &Layout,
        now: u64,
    ) -> BrokerResult<(Option<u64>, Option<u64>)> {
        let (frontier, next) = (m.frontier(), m.next_offset());
        let unsettled = (frontier < next).then_some(frontier);
        // Every offset skipped on the way is leased, acked ahead or delayed: bounded by
        // the limits, and a delayed run is skipped whole.
        let mut available = None;
        let mut o = frontier;
        while o < next {
            if m.is_available(o, now) || m.undecided_run(o).is_some() {
                available = Some(o);
                break;
            }
            o = match m.delayed_run(o, now) {
                Some(d) => d.to,
                None => o + 1,
            };
        }
        let offsets: Vec<u64> = unsettled.into_iter().chain(available).collect();
        if offsets.is_empty() {
            return Ok((None, None));
        }
        let found = self
            .messages(&topic.name, p, layout, &offsets, false)
            .await?;
        let age = |o: Option<u64>| {
            let i = offsets.iter().position(|x| Some(*x) == o)?;
            let AtOffset::Message(msg) = found.get(i)? else {
                return None;
            };
            Some(now.saturating_sub(msg.produced_at_ms))
        };
        Ok((age(unsettled), age(available)))
    }

    /// A partition's manifest as stored now.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`], [`BrokerError::StaleTopic`].
    pub(super) async fn read_manifest(
        &self,
        topic: &Topic,
        partition: u32,
    ) -> BrokerResult<Manifest> {
        let key = topic.manifest_key(partition);
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &key, &topic.incarnation);
        Ok(cell.read::<BrokerError>().await?.value)
    }
}

/// Whether a create with `new` finds the topic as it asked for it: every setting equal,
/// but `paused`, which is a state an operator toggles rather than configuration (an app
/// that creates its topics at start-up must not fail while one is paused).
fn same_configuration(old: &TopicSettings, new: &TopicSettings) -> bool {
    TopicSettings {
        paused: old.paused,
        unknown: old.unknown.clone(),
        ..new.clone()
    } == *old
}

fn not_own_dead_letter_topic(name: &str, s: &TopicSettings) -> BrokerResult<()> {
    if s.dead_letter_topic.as_deref() == Some(name) {
        return Err(InvalidSetting("dead_letter_topic must be another topic".into()).into());
    }
    Ok(())
}
