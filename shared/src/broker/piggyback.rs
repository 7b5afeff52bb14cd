//! Consume with acks piggybacked (docs/design.md §4): a consume that also acks the
//! handles its caller is done with, the way Kafka's share groups carry acknowledgements
//! on ShareFetch.
//!
//! The acks on one partition (the one asked for, else the one most of them name) go into
//! the same commit as the new lease, applied before it, so a consumer that processes one
//! message at a time pays one conditional write per message instead of two, and the
//! places its acks free are leased at once. Acks on other partitions go to their own
//! committers meanwhile. Each handle is answered as `POST /ack` would answer it.
//!
//! Once any ack has been answered 204, the request answers 200 whatever happens to the
//! lease (its messages then lapse, redelivered after the visibility timeout): an ack
//! answered 204 is final and must reach the caller, so a failed lease must not turn the
//! whole request into an error. Before any ack landed, an error is the request's.

use std::collections::BTreeMap;
use std::time::Duration;

use super::consume::{Delivery, MAX_CONSUME_BATCH, MAX_CONSUME_RESPONSE_BYTES};
use super::fan_out::Slots;
use super::subscriptions::Group;
use super::{check_partition, Broker, Settle};
use crate::commit::LeaseAnswer;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::receipt::{incarnation_tag, Claims};
use crate::topic::Topic;

/// What a consume with piggybacked acks answers.
#[derive(Debug, Default)]
pub struct AckedConsume {
    /// The messages leased (empty when none turned up in time).
    pub deliveries: Vec<Delivery>,
    /// One result per handle, in order: `Ok` is 204.
    pub acks: Vec<BrokerResult<()>>,
}

/// The handles sorted for one attempt: those that ride with the lease on `with_lease`,
/// and the rest (including every invalid one), settled on their own committers.
#[derive(Debug, Default, PartialEq)]
struct Split {
    /// The partition whose acks share the lease's commit.
    with_lease: Option<u32>,
    /// Indices into the handles of the acks sharing the lease's commit.
    leased: Vec<usize>,
    /// Indices of every other handle.
    rest: Vec<usize>,
}

/// Where each ack of a consume of `topic` goes (only from `partition` if given, else from
/// the topic's only partition if it has one): that partition, and the split of the acks
/// between its lease's commit and the other partitions ([`split`]).
///
/// Errors: [`BrokerError::NoSuchPartition`]; [`BrokerError::StaleTopic`] when a handle
/// names another incarnation of a cached topic, found out before anything is applied so
/// that the retry on a reloaded topic applies nothing twice.
fn plan(
    topic: &Topic,
    partition: Option<u32>,
    claims: &[(BrokerResult<Claims>, Settle)],
) -> BrokerResult<(Option<u32>, Split)> {
    if let Some(p) = partition {
        check_partition(topic, p)?;
    }
    let partition = partition.or((topic.settings.partitions == 1).then_some(0));
    let tag = incarnation_tag(&topic.incarnation);
    let fits = |c: &Claims| {
        c.partition < topic.settings.partitions
            && (c.incarnation.is_empty() || c.incarnation == tag)
    };
    if topic.from_cache
        && claims
            .iter()
            .any(|(c, _)| c.as_ref().is_ok_and(|c| !fits(c)))
    {
        return Err(BrokerError::StaleTopic);
    }
    // A subscription's handle is settled on its own ledger, never in this lease's commit
    // (the default subscription's).
    let valid = |i: usize| match &claims[i].0 {
        Ok(c) if fits(c) && c.subscription.is_none() => Some(c.partition),
        _ => None,
    };
    Ok((
        partition,
        split(claims.len(), partition, topic.settings.paused, valid),
    ))
}

/// How one attempt's handles are split (see [`Split`]): with a `partition` asked for, its
/// valid acks ride with its lease; without, the partition most valid acks name (the
/// lowest on a tie); none when `paused` (nothing is leased then). `valid(i)` is the
/// partition handle `i` names when it may be settled at all.
fn split(
    n: usize,
    partition: Option<u32>,
    paused: bool,
    valid: impl Fn(usize) -> Option<u32>,
) -> Split {
    let mut per: BTreeMap<u32, usize> = BTreeMap::new();
    for i in 0..n {
        if let Some(p) = valid(i) {
            *per.entry(p).or_default() += 1;
        }
    }
    let with_lease = match (paused, partition) {
        (true, _) => None,
        (false, Some(p)) => Some(p),
        (false, None) => per
            .iter()
            .max_by(|(pa, a), (pb, b)| a.cmp(b).then(pb.cmp(pa)))
            .map(|(p, _)| *p),
    };
    let (leased, rest) = (0..n).partition(|&i| with_lease.is_some() && valid(i) == with_lease);
    Split {
        with_lease,
        leased,
        rest,
    }
}

impl Broker {
    /// As [`Broker::consume_acking`], for the subscription `sub` (`None`: the default
    /// one). A subscription's acks are settled on its ledger first, then its lease is
    /// taken: one request, two commits.
    ///
    /// Errors (before any ack was answered 204): as [`Broker::consume_from`].
    pub async fn consume_acking_from(
        &self,
        name: &str,
        sub: Option<&str>,
        (partition, wait, max): (Option<u32>, Duration, usize),
        handles: &[String],
    ) -> BrokerResult<AckedConsume> {
        let Some(sub) = sub else {
            return self
                .consume_acking(name, partition, wait, max, handles)
                .await;
        };
        let entries: Vec<(String, Settle)> =
            handles.iter().map(|h| (h.clone(), Settle::Ack)).collect();
        let acks = if entries.is_empty() {
            Vec::new()
        } else {
            self.settle_batch(name, &entries).await?
        };
        let acked = acks.iter().any(Result::is_ok);
        let deliveries = match self
            .consume_from(name, Some(sub), partition, wait, max)
            .await
        {
            Ok(d) => d,
            // An ack answered 204 must reach its caller: the consume's error does not.
            Err(e) if acked => {
                tracing::warn!(topic = name, error = %e, "consume after acks failed");
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        Ok(AckedConsume { deliveries, acks })
    }

    /// Acks `handles`, then leases up to `max` messages as [`Broker::consume`] does (with
    /// `partition`, only from it; long-polling up to `wait`); see the module
    /// documentation for how the two combine.
    ///
    /// Errors (before any ack was answered 204): as [`Broker::consume`].
    pub async fn consume_acking(
        &self,
        name: &str,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
        handles: &[String],
    ) -> BrokerResult<AckedConsume> {
        if handles.is_empty() {
            let deliveries = self.consume(name, partition, wait, max).await?;
            return Ok(AckedConsume {
                deliveries,
                acks: Vec::new(),
            });
        }
        let started = crate::runtime::now();
        let max = max.clamp(1, MAX_CONSUME_BATCH);
        keys::validate_topic(name)?;
        // A process stopped by a newer build checks no signature (its key may be a stand-in).
        self.gate().check()?;
        // Signatures first: a forged handle costs no storage call.
        let claims: Vec<(BrokerResult<Claims>, Settle)> = handles
            .iter()
            .map(|h| {
                let c = self.receipts.verify(h, name).map_err(BrokerError::from);
                (c, Settle::Ack)
            })
            .collect();
        // The lease needs settings within the cache period (a pause, a new flow-control
        // limit reach every process within it), not the settles' longer one.
        let topic = self.topic(name).await?;
        let claims = &claims;
        let (mut done, covered) = self
            .with_loaded_topic(name, topic, |topic| async move {
                self.lease_acking(&topic, partition, max, claims).await
            })
            .await?;
        let acked = done.acks.iter().any(Result::is_ok);
        if !done.deliveries.is_empty() || (wait.is_zero() && covered) {
            return Ok(done);
        }
        // Nothing leased with the acks: consume as a GET would, for the time left.
        let left = wait.saturating_sub(started.elapsed());
        match self.consume(name, partition, left, max).await {
            Ok(d) => done.deliveries = d,
            // An ack answered 204 must reach its caller: the consume's error does not.
            Err(e) if acked => {
                tracing::warn!(topic = name, error = %e, "consume after piggybacked acks failed");
            }
            Err(e) => return Err(e),
        }
        Ok(done)
    }

    /// One attempt on a loaded topic: the acks on one partition committed with its lease,
    /// the others beside it; beside the answer, whether that lease covered every partition
    /// the consume may lease from (one asked for, or the topic's only one).
    ///
    /// Errors: [`BrokerError::StaleTopic`] before anything was applied (reload, try again),
    /// and the lease's error when no ack was answered 204.
    async fn lease_acking(
        &self,
        topic: &Topic,
        partition: Option<u32>,
        max: usize,
        claims: &[(BrokerResult<Claims>, Settle)],
    ) -> BrokerResult<(AckedConsume, bool)> {
        let (partition, plan) = plan(topic, partition, claims)?;
        let rest: Vec<(BrokerResult<Claims>, Settle)> =
            plan.rest.iter().map(|&i| claims[i].clone()).collect();
        let settles: Vec<(u64, u64, Settle)> = plan
            .leased
            .iter()
            .filter_map(|&i| claims[i].0.as_ref().ok())
            .map(|c| (c.offset, c.lease_id, Settle::Ack))
            .collect();
        let with_lease = async {
            let p = plan.with_lease?;
            // Payload bytes by estimate: the rendered bound is about 1.5 times that.
            let room = MAX_CONSUME_RESPONSE_BYTES as u64 * 2 / 3;
            Some(
                self.committer
                    .lease_settling(topic, p, (max, room), &settles)
                    .await,
            )
        };
        let (leased, others) = tokio::join!(with_lease, self.settle_on(topic, &rest));
        let mut acks = Slots::new(claims.len());
        let mut lease = None;
        if let Some((answer, results)) = leased {
            for (&i, r) in plan.leased.iter().zip(results) {
                acks.set(i, r);
            }
            lease = Some(answer);
        }
        match others {
            Ok(results) => {
                for (&i, r) in plan.rest.iter().zip(results) {
                    acks.set(i, r);
                }
            }
            Err(e) if !acks.any_ok() => return Err(e),
            // Those handles' outcome is unknown (503): some may have landed.
            Err(e) => {
                tracing::warn!(topic = %topic.name, error = %e, "acks beside a lease failed");
                for &i in &plan.rest {
                    acks.set(i, Err(BrokerError::Contention));
                }
            }
        }
        let acks = acks.finish("an ack");
        let acked = acks.iter().any(Result::is_ok);
        let covered = plan.with_lease.is_some() && partition.is_some();
        let deliveries = match (plan.with_lease, lease) {
            (Some(p), Some(answer)) => self.delivered_beside(topic, p, answer, acked).await?,
            _ => Vec::new(),
        };
        Ok((AckedConsume { deliveries, acks }, covered))
    }

    /// The deliveries of the lease committed with piggybacked acks on partition `p`.
    ///
    /// Errors: the lease's, when no ack was answered 204 (`acked`); once one was, a failed
    /// lease delivers nothing (its leases lapse) so that the acks reach the caller.
    async fn delivered_beside(
        &self,
        topic: &Topic,
        p: u32,
        answer: BrokerResult<LeaseAnswer>,
        acked: bool,
    ) -> BrokerResult<Vec<Delivery>> {
        let mut deliveries = Vec::new();
        let taken = match answer {
            Ok(answer) => {
                let mut used = 0;
                self.take_leased(topic, Group::Default, p, answer, &mut deliveries, &mut used)
                    .await
            }
            Err(e) => Err(e),
        };
        match taken {
            Ok(_) => Ok(deliveries),
            Err(e) if !acked => Err(e),
            Err(e) => {
                tracing::warn!(topic = %topic.name, partition = p, error = %e,
                    "lease beside piggybacked acks failed");
                Ok(Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(ps: &[Option<u32>]) -> impl Fn(usize) -> Option<u32> + '_ {
        move |i| ps[i]
    }

    #[test]
    fn acks_ride_with_the_partition_most_of_them_name() {
        let ps = [Some(2), None, Some(1), Some(2), Some(1), Some(2)];
        let s = split(ps.len(), None, false, valid(&ps));
        assert_eq!(s.with_lease, Some(2));
        assert_eq!(s.leased, vec![0, 3, 5]);
        assert_eq!(s.rest, vec![1, 2, 4]);
    }

    #[test]
    fn a_tie_goes_to_the_lowest_partition() {
        let ps = [Some(3), Some(1)];
        let s = split(ps.len(), None, false, valid(&ps));
        assert_eq!(s.with_lease, Some(1));
        assert_eq!((s.leased, s.rest), (vec![1], vec![0]));
    }

    #[test]
    fn a_partition_asked_for_takes_the_lease_even_without_acks_on_it() {
        let ps = [Some(0), Some(0)];
        let s = split(ps.len(), Some(4), false, valid(&ps));
        assert_eq!(s.with_lease, Some(4));
        assert!(s.leased.is_empty());
        assert_eq!(s.rest, vec![0, 1]);
    }

    #[test]
    fn a_paused_topic_leases_nothing_and_settles_every_ack_on_its_own() {
        let ps = [Some(0), Some(0)];
        let s = split(ps.len(), Some(0), true, valid(&ps));
        assert_eq!(s.with_lease, None);
        assert_eq!(s.rest, vec![0, 1]);
    }

    #[test]
    fn no_valid_ack_and_no_partition_asked_for_leases_nothing_here() {
        let ps = [None, None];
        let s = split(ps.len(), None, false, valid(&ps));
        assert_eq!(
            s,
            Split {
                with_lease: None,
                leased: vec![],
                rest: vec![0, 1],
            }
        );
    }
}
