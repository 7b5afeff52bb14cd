//! Consume: lease up to `max` messages, long-polling for them (docs/design.md §4, §5).
//!
//! One pass tries the partitions in order from the process's sticky cursor
//! ([`super::sticky`]: consumes arriving while a partition commits lease there together),
//! or only the one asked for, asking each partition's committer for the leases still wanted. A
//! lease's message is read (from the segment cache when this process wrote or read it)
//! and its receipt handle signed over (topic, partition, offset, lease id). Messages
//! parked for dead-lettering go to [`Broker::dead_letter`] instead of the consumer.
//!
//! A response carries at most [`MAX_CONSUME_RESPONSE_BYTES`] (its first message always,
//! whatever its size): each partition is asked for no more payload than the room left
//! (by its segments' average message size), and a message that still does not fit once
//! read is released ([`Settle::Release`]: available again, its delivery not counted).

use std::time::Duration;

use bytes::Bytes;

use super::long_poll::{Gauge, Waiting};
use super::read::AtOffset;
use super::sticky::Kind;
use super::subscriptions::Group;
use super::watch::{Seen, View, Watch};
use super::{check_partition, Broker};
use crate::commit::{LeaseAnswer, Peek};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::{Grant, Layout, Settle};
use crate::receipt::{Claims, SubscriptionClaim};
use crate::segment::Headers;
use crate::topic::Topic;

/// Most messages one consume may return.
pub const MAX_CONSUME_BATCH: usize = 100;

/// Most bytes of JSON one consume response carries, its first message excepted (below
/// Lambda's 6 MB response limit, with room for API Gateway's envelope).
pub const MAX_CONSUME_RESPONSE_BYTES: usize = 4 << 20;

/// Leases one consume takes of a partition at most while each meets only void offsets
/// (never a message: settled instead, [`Broker::deliver`]).
const LEASES_PAST_VOID: usize = 4;

/// An upper bound of the JSON one delivery adds to a response: the payload grows by half
/// at most (`payload.rs`), a key by six times (escaping), and the handle and fields take
/// a few hundred bytes plus the topic name.
fn rendered_bound(d: &Delivery) -> usize {
    d.payload.len() * 3 / 2
        + d.key.as_ref().map_or(0, |k| k.len() * 6)
        + d.headers
            .iter()
            .map(|(k, v)| k.len() + v.len() * 6 + 8)
            .sum::<usize>()
        + 512
        + d.topic.len() * 3
}

/// A message handed to a consumer (or read by replay, without a handle).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Topic name.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// Raw payload bytes.
    pub payload: Bytes,
    /// Proof of the lease; `None` for replays.
    pub receipt_handle: Option<String>,
    /// Deliveries so far, this one included (for a replay: of the unsettled message, else 0).
    pub delivery_count: u32,
    /// When the broker accepted it.
    pub produced_at_ms: u64,
    /// Headers.
    pub headers: Headers,
}

impl Broker {
    /// Leases up to `max` messages, long-polling up to `wait` (capped by the server).
    /// Empty when nothing turned up in time. With `partition`, only that partition is tried.
    ///
    /// Errors: [`crate::error::BrokerError::TopicNotFound`],
    /// [`crate::error::BrokerError::NoSuchPartition`],
    /// [`crate::error::BrokerError::Contention`], store failures.
    pub async fn consume(
        &self,
        name: &str,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
    ) -> BrokerResult<Vec<Delivery>> {
        self.consume_from(name, None, partition, wait, max).await
    }

    /// As [`Broker::consume`], for the subscription `sub` (`None`: the default one).
    ///
    /// Errors: as [`Broker::consume`], and
    /// [`crate::error::BrokerError::SubscriptionNotFound`].
    pub async fn consume_from(
        &self,
        name: &str,
        sub: Option<&str>,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
    ) -> BrokerResult<Vec<Delivery>> {
        let max = max.clamp(1, MAX_CONSUME_BATCH);
        if !wait.is_zero() {
            let watch = self.watches.get(name);
            let topic = self.topic_seen(name, watch.view().as_ref()).await?;
            if topic.layout >= keys::LAYOUT_FLAT {
                return self
                    .consume_watched(name, sub, partition, wait, max, &watch)
                    .await;
            }
        }
        let found = self
            .long_poll(name, wait, Gauge::Counted, || async move {
                let (got, _) = self
                    .with_topic(name, |topic| async move {
                        self.lease_once(&topic, sub, partition, max, None).await
                    })
                    .await?;
                Ok((!got.is_empty()).then_some(got))
            })
            .await?;
        Ok(found.unwrap_or_default())
    }

    /// A long-polling consume on a topic the idle watch covers ([`super::watch`]): the
    /// topic is listed at most once per interval for every waiter of this process, and a
    /// partition whose listed manifest is the cached one with nothing to lease is skipped.
    async fn consume_watched(
        &self,
        name: &str,
        sub: Option<&str>,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
        watch: &Watch,
    ) -> BrokerResult<Vec<Delivery>> {
        let deadline = crate::runtime::now() + wait.min(self.opts.max_wait);
        let waker = self.committer.wakers().get(name);
        let mut counted = None;
        loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let changed = watch.changed().notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (due, tried) = watch.due();
            if crate::runtime::now() >= due {
                self.watch_round(watch, tried).await;
            }
            let view = watch.view();
            let topic = self.topic_seen(name, view.as_ref()).await?;
            let view = view.as_ref();
            let (got, lapse) = self
                .with_loaded_topic(name, topic, |topic| async move {
                    self.lease_once(&topic, sub, partition, max, view).await
                })
                .await?;
            if !got.is_empty() {
                return Ok(got);
            }
            let now = crate::runtime::now();
            if now >= deadline {
                return Ok(got);
            }
            if counted.is_none() {
                counted = Some(Waiting::new(&self.waiting));
            }
            let mut wake = deadline.min(watch.due().0);
            if let Some(at) = lapse {
                let in_ms = at.saturating_sub(self.clock.now_ms());
                wake = wake.min(now + Duration::from_millis(in_ms));
            }
            tokio::select! {
                _ = notified => {}
                _ = changed => {}
                _ = crate::runtime::sleep_until(wake) => {}
            }
        }
    }

    /// The topic, from this process's cache whatever its age when `view` shows the ETag
    /// it was read with; gone when `view` shows no `topic.json`.
    ///
    /// Errors: [`BrokerError::TopicNotFound`], and as [`Broker::topic`].
    async fn topic_seen(&self, name: &str, view: Option<&View>) -> BrokerResult<Topic> {
        if let Some(v) = view {
            let Some(etag) = &v.topic_etag else {
                self.topics.forget(name);
                return Err(BrokerError::TopicNotFound);
            };
            if let Some(t) = self.topics.confirmed(name, etag) {
                return Ok(t);
            }
        }
        self.topic(name).await
    }

    /// Whether a waiting consume may skip `p` without a storage request, per `view`: the
    /// broker time until which it may (`None`: it may not).
    fn quiet(&self, (topic, group): (&Topic, Group<'_>), p: u32, view: &View) -> Option<u64> {
        let peek = self.committer.peek((topic, group), p);
        let until = match (view.seen(p), peek) {
            (Seen::Missing, Peek::Unknown) => Some(u64::MAX),
            (
                Seen::Missing,
                Peek::Known {
                    etag: None,
                    quiet_until,
                },
            ) => quiet_until,
            (
                Seen::Etag(listed),
                Peek::Known {
                    etag: Some(cached),
                    quiet_until,
                },
            ) if *listed == cached => quiet_until,
            _ => None,
        };
        until.filter(|&t| t > self.clock.now_ms())
    }

    /// One pass over the partitions, leasing up to `max` messages for the subscription
    /// `sub`; with a `view`, partitions it shows quiet are skipped ([`Broker::quiet`]), and
    /// the earliest time one of them could have a message again (a lease lapsing, or a
    /// named subscription's ledger as known here growing too old) is answered beside the
    /// deliveries.
    async fn lease_once(
        &self,
        topic: &Topic,
        sub: Option<&str>,
        partition: Option<u32>,
        max: usize,
        view: Option<&View>,
    ) -> BrokerResult<(Vec<Delivery>, Option<u64>)> {
        let group = Group::of(topic, sub)?;
        if group.settings(topic).paused {
            // Delivers nothing until resumed; the long poll waits out its time meanwhile.
            return Ok((Vec::new(), None));
        }
        let n = topic.settings.partitions;
        let order: Vec<u32> = match partition {
            Some(p) => {
                check_partition(topic, p)?;
                vec![p]
            }
            None => {
                let take = u32::try_from(max).unwrap_or(u32::MAX);
                let start = self.sticky_partition(Kind::Consume, (topic, group), take);
                (0..n).map(|i| (start + i) % n).collect()
            }
        };
        let first = order.first().copied();
        let mut out = Vec::new();
        let mut used = 0;
        let mut lapse: Option<u64> = None;
        for p in order {
            if out.len() >= max || used >= MAX_CONSUME_RESPONSE_BYTES {
                break;
            }
            if let Some(until) = view.and_then(|v| self.quiet((topic, group), p, v)) {
                if until != u64::MAX {
                    lapse = Some(lapse.map_or(until, |l| l.min(until)));
                }
                continue;
            }
            let before = out.len();
            // A lease that met only void offsets (settled meanwhile) leases again, a few
            // times: a consume does not come back empty while messages wait behind them.
            for _ in 0..LEASES_PAST_VOID {
                // Payload bytes by estimate: the rendered bound is about 1.5 times that.
                let room = (MAX_CONSUME_RESPONSE_BYTES - used) as u64 * 2 / 3;
                let want = (max - out.len(), room);
                let answer = match group {
                    Group::Default => {
                        let likely = self.committer.likely_segment(topic, p);
                        let lease = self.committer.lease((topic, group), p, want);
                        let (answer, ()) =
                            futures::join!(lease, self.read_beside(&topic.name, p, likely));
                        answer?
                    }
                    Group::Named(..) => self.committer.lease((topic, group), p, want).await?,
                };
                let void = self
                    .take_leased(topic, group, p, answer, &mut out, &mut used)
                    .await?;
                if void == 0 || out.len() > before {
                    break;
                }
            }
            if out.len() > before {
                let offsets: Vec<u64> = out[before..].iter().map(|d| d.offset).collect();
                tracing::debug!(partition = p, ?offsets, "delivered");
            }
            if partition.is_none() && before == 0 && !out.is_empty() && Some(p) != first {
                // The cursor's partition had nothing: the next consumes start here.
                self.sticky
                    .served(Kind::Consume, (&topic.name, group.name()), p);
            }
        }
        Ok((out, lapse))
    }

    /// Hands a lease answer's messages to the consumer: dead-letters those parked for it,
    /// reads and signs the rest into `out`, and releases any that would take the response
    /// past [`MAX_CONSUME_RESPONSE_BYTES`] (`used` counts its bytes so far). Returns how
    /// many of its offsets were void and settled instead ([`Broker::deliver`]).
    pub(super) async fn take_leased(
        &self,
        topic: &Topic,
        group: Group<'_>,
        p: u32,
        answer: LeaseAnswer,
        out: &mut Vec<Delivery>,
        used: &mut usize,
    ) -> BrokerResult<usize> {
        for g in answer.leased.dead {
            self.dead_letter(topic, group, p, &answer.layout, g).await;
        }
        let grants = answer.leased.grants;
        let (delivered, void) = self
            .deliver(topic, group, p, &answer.layout, &grants, !answer.shared)
            .await?;
        for (d, g) in delivered {
            let bound = rendered_bound(&d);
            if out.is_empty() || *used + bound <= MAX_CONSUME_RESPONSE_BYTES {
                *used += bound;
                out.push(d);
            } else {
                // No room: give it back as if never leased (it lapses if this fails).
                let release = [(g.offset, g.lease_id, Settle::Release)];
                let _ = self.settle_in(topic, group, p, &release).await;
            }
        }
        Ok(void)
    }

    /// Reads the leased messages (and, with `read_ahead`, the segments after them) and
    /// signs their handles. A message retention removed meanwhile is left out (its lease
    /// then lapses harmlessly); an offset of a void segment, which never held a message
    /// ([`crate::partition::beside`]), is left out and acked.
    async fn deliver<'g>(
        &self,
        topic: &Topic,
        group: Group<'_>,
        partition: u32,
        layout: &Layout,
        grants: &'g [Grant],
        read_ahead: bool,
    ) -> BrokerResult<(Vec<(Delivery, &'g Grant)>, usize)> {
        let offsets: Vec<u64> = grants.iter().map(|g| g.offset).collect();
        let follows = self.followed.lease(&topic.name, partition, &offsets);
        let messages = self
            .messages(
                &topic.name,
                partition,
                layout,
                &offsets,
                read_ahead && follows,
            )
            .await?;
        let mut out = Vec::with_capacity(grants.len());
        let mut void = Vec::new();
        for (g, at) in grants.iter().zip(messages) {
            let msg = match at {
                AtOffset::Message(msg) => msg,
                AtOffset::Void => {
                    void.push((g.offset, g.lease_id, Settle::Ack));
                    continue;
                }
                AtOffset::Gone | AtOffset::NotYet => continue,
            };
            let claims = Claims {
                topic: topic.name.clone(),
                incarnation: crate::receipt::incarnation_tag(&topic.incarnation),
                partition,
                offset: g.offset,
                lease_id: g.lease_id,
                subscription: match group {
                    Group::Default => None,
                    Group::Named(name, rec) => Some(SubscriptionClaim {
                        name: name.to_owned(),
                        tag: crate::receipt::incarnation_tag(&rec.id),
                    }),
                },
            };
            let d = Delivery {
                topic: topic.name.clone(),
                partition,
                offset: g.offset,
                key: msg.key,
                payload: Bytes::from(msg.payload),
                receipt_handle: Some(self.receipts.sign(&claims)),
                delivery_count: g.delivery_count,
                produced_at_ms: msg.produced_at_ms,
                headers: crate::segment::shown(msg.headers),
            };
            out.push((d, g));
        }
        if !void.is_empty() {
            // Offsets that never held a message: settled, so that nobody leases them
            // again (one failing here lapses and is settled by the next delivery).
            tracing::debug!(partition, offsets = ?void.iter().map(|v| v.0).collect::<Vec<_>>(), "settled void offsets");
            let _ = self.settle_in(topic, group, partition, &void).await;
        }
        Ok((out, void.len()))
    }
}
