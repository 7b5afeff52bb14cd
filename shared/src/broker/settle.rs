//! Ack, extend and nack by receipt handle (docs/design.md §4).
//!
//! Every handle's signature is verified before any storage call, so a forged or foreign
//! handle costs nothing; then each valid handle becomes one settle operation on its
//! partition's committer, where the pure transition [`crate::partition::settle`] decides.
//! Handles on one partition are queued together, so they share a commit.
//!
//! A settle takes the topic from this process's cache for up to [`SETTLE_TOPIC_MAX_AGE`],
//! past the ordinary cache period: its handle names the incarnation it was granted in, so
//! a topic deleted or created again since is found out anyway (a handle of another
//! incarnation reloads the topic, and a manifest that is gone or another incarnation's
//! settles nothing), and a client whose requests rotate over many processes then pays no
//! topic read on its acks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::fan_out::Slots;
use super::subscriptions::Group;
use super::{Broker, Settle};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::receipt::{incarnation_tag, Claims};
use crate::topic::Topic;

/// How old a cached topic a settle may use (see the module documentation): a change of
/// `max_acked_ahead_per_partition`, `visibility_timeout_ms` or `max_deliveries` reaches
/// settles within this.
pub(super) const SETTLE_TOPIC_MAX_AGE: Duration = Duration::from_secs(10);

/// One settle on a partition: (offset, lease id, action).
type SettleAt = (u64, u64, Settle);

impl Broker {
    /// Acks, extends or nacks the lease a receipt handle names.
    ///
    /// Errors: [`BrokerError::Receipt`] (malformed: 400; not ours: 410),
    /// [`BrokerError::LeaseGone`] (410), [`BrokerError::AckedAheadFull`] (503),
    /// [`BrokerError::TopicNotFound`].
    pub async fn settle(&self, name: &str, handle: &str, action: Settle) -> BrokerResult<()> {
        let mut r = self
            .settle_batch(name, &[(handle.to_owned(), action)])
            .await?;
        r.pop()
            .unwrap_or_else(|| Err(BrokerError::Internal("a settle got no result".into())))
    }

    /// Settles many handles at once; one result per handle, in order.
    ///
    /// Errors (whole batch): [`BrokerError::InvalidTopic`], [`BrokerError::TopicNotFound`].
    pub async fn settle_batch(
        &self,
        name: &str,
        entries: &[(String, Settle)],
    ) -> BrokerResult<Vec<BrokerResult<()>>> {
        keys::validate_topic(name)?;
        // A process stopped by a newer build checks no signature (its key may be a stand-in).
        self.gate().check()?;
        // Signatures first: a forged handle costs no storage call.
        let claims: Vec<(BrokerResult<Claims>, Settle)> = entries
            .iter()
            .map(|(h, action)| {
                let c = self.receipts.verify(h, name).map_err(BrokerError::from);
                (c, *action)
            })
            .collect();
        if claims.iter().all(|(c, _)| c.is_err()) {
            return Ok(claims.into_iter().map(|(c, _)| c.map(|_| ())).collect());
        }
        let claims = Arc::new(claims);
        let topic = match self.topics.recent(name, SETTLE_TOPIC_MAX_AGE) {
            Some(t) => t,
            None => self.topic(name).await?,
        };
        self.with_loaded_topic(name, topic, |topic| {
            let claims = claims.clone();
            async move { self.settle_on(&topic, &claims).await }
        })
        .await
    }

    /// Applies each verified handle's settle on its partition's committer (handles on
    /// one partition share a commit); one result per entry, in order.
    ///
    /// Errors: [`BrokerError::StaleTopic`] when a handle names another incarnation or a
    /// partition beyond a cached `topic` (reload and try again).
    pub(super) async fn settle_on(
        &self,
        topic: &Topic,
        claims: &[(BrokerResult<Claims>, Settle)],
    ) -> BrokerResult<Vec<BrokerResult<()>>> {
        let mut results = Slots::new(claims.len());
        let tag = incarnation_tag(&topic.incarnation);
        // Per subscription (`None`: the default one) and partition, the entries settled
        // there, and what each settles.
        type Place = (Option<String>, u32);
        let mut per: BTreeMap<Place, Vec<usize>> = BTreeMap::new();
        let mut settle_at: Vec<SettleAt> = vec![(0, 0, Settle::Ack); claims.len()];
        for (i, (c, action)) in claims.iter().enumerate() {
            let known_sub = c
                .as_ref()
                .ok()
                .and_then(|c| c.subscription.as_ref())
                .map(|s| {
                    topic
                        .subscription(&s.name)
                        .is_some_and(|rec| incarnation_tag(&rec.id) == s.tag)
                });
            match c {
                Err(e) => results.set(i, Err(e.clone())),
                // Granted in another incarnation of the topic (deleted and created again),
                // or of a subscription.
                Ok(c)
                    if c.partition >= topic.settings.partitions
                        || (!c.incarnation.is_empty() && c.incarnation != tag)
                        || known_sub == Some(false) =>
                {
                    if topic.from_cache {
                        return Err(BrokerError::StaleTopic);
                    }
                    results.set(i, Err(BrokerError::LeaseGone));
                }
                Ok(c) => {
                    settle_at[i] = (c.offset, c.lease_id, *action);
                    per.entry((c.subscription.as_ref().map(|s| s.name.clone()), c.partition))
                        .or_default()
                        .push(i);
                }
            }
        }
        let submit = |(sub, p): Place, entries: &[usize]| {
            let settles: Vec<SettleAt> = entries.iter().map(|&i| settle_at[i]).collect();
            async move {
                match Group::of(topic, sub.as_deref()) {
                    Ok(group) => self.settle_in(topic, group, p, &settles).await,
                    Err(_) => vec![Err(BrokerError::LeaseGone); settles.len()],
                }
            }
        };
        results.fan_out(per, submit).await;
        if results.any_err(|e| matches!(e, BrokerError::StaleTopic)) {
            return Err(BrokerError::StaleTopic);
        }
        Ok(results.finish("a handle"))
    }

    /// Cancels the retained message at `offset` of `partition`: settles it for the
    /// subscription `sub`, or for every subscription (the default one included) when
    /// `None`. A live lease's handle then gets 410; a delayed message is never delivered.
    /// Settled already: nothing changes (204 again).
    ///
    /// Errors: [`BrokerError::MessageNotFound`] when the offset is not retained or the
    /// partition does not exist, [`BrokerError::SubscriptionNotFound`],
    /// [`BrokerError::AckedAheadFull`] (the acked-ahead window is full: retry later).
    pub async fn cancel(
        &self,
        name: &str,
        partition: u32,
        offset: u64,
        sub: Option<&str>,
    ) -> BrokerResult<()> {
        keys::validate_topic(name)?;
        self.gate().check()?;
        self.with_topic(name, |topic| async move {
            // A partition the topic does not have holds no message either.
            super::check_partition(&topic, partition).map_err(|e| match e {
                BrokerError::NoSuchPartition(_) => BrokerError::MessageNotFound,
                other => other,
            })?;
            let group = Group::of(&topic, sub)?;
            let m = self.read_manifest(&topic, partition).await?;
            if offset < m.start_offset || offset >= m.next_offset {
                return Err(BrokerError::MessageNotFound);
            }
            let groups: Vec<Group<'_>> = match (sub, group) {
                (Some(_), g) => vec![g],
                (None, _) => std::iter::once(Group::Default)
                    .chain(topic.subscriptions.iter().map(|(n, r)| Group::Named(n, r)))
                    .collect(),
            };
            let cancel = [(offset, 0, Settle::Cancel)];
            let done = futures::future::join_all(
                groups
                    .iter()
                    .map(|&g| self.settle_in(&topic, g, partition, &cancel)),
            )
            .await;
            done.into_iter()
                .flatten()
                .collect::<BrokerResult<Vec<()>>>()?;
            Ok(())
        })
        .await
    }

    /// Settles `settles` (offset, lease id, action) of `group` on partition `p`, queued
    /// together; each one's result, in order.
    pub(super) async fn settle_in(
        &self,
        topic: &Topic,
        group: Group<'_>,
        p: u32,
        settles: &[SettleAt],
    ) -> Vec<BrokerResult<()>> {
        self.committer.settle_many((topic, group), p, settles).await
    }
}
