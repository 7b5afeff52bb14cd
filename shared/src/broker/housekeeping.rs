//! [`Housekeeping`]: the narrow handle gc and compaction ([`crate::maintenance`]) work
//! through, built from the broker's parts. [`Broker`] itself keeps the consumer contract
//! (topics, produce, consume, settle, replay, redrive); what maintenance needs beside it
//! (the raw store, the clock and ids, reads of stored objects through the caches, and the
//! two commits it makes) is here and nowhere else. Every manifest change still goes
//! through the committer.

use std::sync::Arc;

use super::{Broker, Topic};
use crate::clock::{Clock, IdSource};
use crate::error::BrokerResult;
use crate::formats::Level;
use crate::gate::Gate;
use crate::partition::index::Index;
use crate::partition::Manifest;
use crate::segment::Segment;
use crate::store::DynStore;
use crate::topic::Group;

/// What gc and compaction may do ([`Broker::housekeeping`]).
#[derive(Debug, Clone, Copy)]
pub struct Housekeeping<'a> {
    broker: &'a Broker,
}

impl Broker {
    /// The handle maintenance works through.
    pub fn housekeeping(&self) -> Housekeeping<'_> {
        Housekeeping { broker: self }
    }
}

impl Housekeeping<'_> {
    /// The store (counting requests, as every request of the broker does).
    pub(crate) fn store(&self) -> &DynStore {
        &self.broker.store
    }

    pub(crate) fn clock(&self) -> &dyn Clock {
        &*self.broker.clock
    }

    pub(crate) fn ids(&self) -> &dyn IdSource {
        &*self.broker.ids
    }

    /// This process's place in the fleet: a pass runs only at a level it may write.
    pub(crate) fn gate(&self) -> &Gate {
        &self.broker.gate
    }

    /// The longest a commit may name an object after it was written (a segment, or a
    /// fold's index object written ahead of its commit): nothing younger is an orphan.
    pub(crate) fn named_within(&self) -> std::time::Duration {
        std::time::Duration::from_millis(crate::commit::MAX_SEGMENT_AGE_AT_COMMIT_MS)
    }

    /// The level objects are written at now.
    pub(crate) fn fleet_level(&self) -> Level {
        self.broker.fleet_level()
    }

    /// A topic read from the store (not the cache).
    ///
    /// Errors: as [`Broker::load_topic`].
    pub(crate) async fn load_topic(&self, name: &str) -> BrokerResult<Topic> {
        self.broker.load_topic(name).await
    }

    /// A partition's manifest as stored now.
    ///
    /// Errors: store failures, `Corrupt`, `StaleTopic`.
    pub(crate) async fn read_manifest(&self, topic: &Topic, p: u32) -> BrokerResult<Manifest> {
        self.broker.read_manifest(topic, p).await
    }

    /// A whole segment, from the cache or the store; `None` if it is gone.
    ///
    /// Errors: store failures, `Corrupt`.
    pub(crate) async fn load_segment(
        &self,
        topic: &str,
        p: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Segment>>> {
        self.broker.reader().segment(topic, p, id).await
    }

    /// An index object, from the cache or the store; `None` if it is gone.
    ///
    /// Errors: store failures, `Corrupt`.
    pub(crate) async fn load_index(
        &self,
        topic: &str,
        p: u32,
        id: &str,
    ) -> BrokerResult<Option<Arc<Index>>> {
        self.broker.reader().index(topic, p, id).await
    }

    /// Commits retention alone on one partition (a commit that leases nothing), as a
    /// pass does for idle partitions.
    ///
    /// Errors: the commit's failure.
    pub(crate) async fn apply_retention(&self, topic: &Topic, p: u32) -> BrokerResult<()> {
        self.broker
            .committer
            .lease((topic, Group::Default), p, (0, 0))
            .await?;
        Ok(())
    }

    /// Commits compaction swaps on one partition; returns how many segments were
    /// replaced.
    ///
    /// Errors: the commit's failure.
    pub(crate) async fn swap_segments(
        &self,
        topic: &Topic,
        p: u32,
        swaps: Vec<crate::partition::compact::Swap>,
    ) -> BrokerResult<u64> {
        self.broker.committer.compact(topic, p, swaps).await
    }
}
