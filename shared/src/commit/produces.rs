//! The produces of one batch across its commit attempts: the plan made against each
//! attempt's state (which messages are new, which are retries of remembered idempotency
//! keys), the one segment written for it, and why none could be.
//!
//! A later attempt reuses the segment unless its plan differs (another writer committed
//! one of the keys meanwhile), in which case a fresh one is written and the old one is
//! left to garbage collection. A segment older than [`MAX_SEGMENT_AGE_AT_COMMIT_MS`] is
//! never committed.

use std::collections::HashMap;

use super::write::{BesideWrite, TopicCheck};
use super::{Committer, Op, Pending, Queue, TopicSeen, MAX_SEGMENT_AGE_AT_COMMIT_MS};
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::batch::Batch;
use crate::partition::combine::{self, Combinable, Status};
use crate::partition::intent::Decides;
use crate::partition::produce::{NewStored, Plan};
use crate::partition::{Manifest, SegmentRef};

/// One batch's produces (see the module documentation).
#[derive(Default)]
pub(super) struct Produces {
    /// The plan of the current attempt.
    plan: Option<Plan>,
    /// The plan the current segment (or refusal) was made for.
    written_for: Option<Plan>,
    segment: Option<SegmentRef>,
    /// Why the produces cannot be committed (the segment write failed, say).
    refused: Option<BrokerError>,
    /// Offsets of the batch's idempotency keys found in chunk objects.
    spilled: HashMap<String, u64>,
    /// Where this batch's combinable segment landed, found in an index object.
    found_at: Option<u64>,
    /// Whether the current segment's write confirmed the topic record
    /// ([`super::write::TopicCheck::confirms`]).
    confirmed: bool,
    /// The current segment's PUT, when it runs beside the manifest write (fleet level 7).
    beside: Option<BesideWrite>,
}

/// A segment written for a batch taken ahead, before the state it commits to was known
/// (`commit/queue.rs`): for a plan that holds against any state ([`Plan::stateless`]), or
/// why the write failed (the batch's produces are then refused, as when the segment write
/// of a batch's own attempt fails: it may have landed all the same).
pub(super) struct EarlySegment {
    plan: Plan,
    written: BrokerResult<SegmentRef>,
}

/// Whether `ops` (a batch) have produces and none carries an idempotency key or a delay:
/// their segment can be written before the state it commits to is known
/// ([`Committer::write_early`]).
pub(super) fn writes_early(ops: &[Pending]) -> bool {
    let mut produces = ops
        .iter()
        .filter_map(|p| match &p.op {
            Op::Produce(msgs, _) => Some(msgs),
            _ => None,
        })
        .flatten()
        .peekable();
    produces.peek().is_some() && produces.all(NewStored::stateless)
}

impl Committer {
    /// Writes the segment of `ops` (a batch taken ahead, its produces all
    /// [`writes_early`]) for the plan that holds against any state; `None` when no plan
    /// does or no message needs one. An ordinary segment, which only this batch's commit
    /// lands; the commit confirms the topic record if it is the one to create the
    /// manifest ([`super::write`]).
    pub(super) async fn write_early(&self, q: &Queue, ops: &[Pending]) -> Option<EarlySegment> {
        let produces = || {
            ops.iter().filter_map(|p| match &p.op {
                Op::Produce(msgs, _) => Some(msgs.as_slice()),
                _ => None,
            })
        };
        let plan = Plan::stateless(produces())?;
        if !plan.needs_segment() {
            return None;
        }
        let messages = produces().flatten().map(|m| m.message.clone()).collect();
        let topic = &ops.first()?.topic;
        let written = self
            .write_segment(q, topic, messages, None, TopicCheck::NotNeeded)
            .await;
        Some(EarlySegment { plan, written })
    }
}

/// Whether a segment is written beside the manifest write that names it: at fleet level
/// 7, for an ordinary segment (not `combinable`) whose topic record needs no check before
/// the manifest write: one going to a manifest that exists, or one whose request read the
/// record itself (a commit creating the manifest otherwise confirms the record first, and
/// the segment rides along that check). The caller asks it only of produces without
/// idempotency keys or delays: a key is remembered at its offset the moment the manifest
/// lands, and a retry of its produce would be answered from an offset whose segment may
/// turn out void.
fn writes_beside(c: &Committer, combinable: bool, check: TopicCheck) -> bool {
    c.writes_beside() && !combinable && matches!(check, TopicCheck::Read | TopicCheck::NotNeeded)
}

/// Whether `batch` has produces and none carries an idempotency key or a delay: its
/// segment can be committed by any process ([`crate::partition::combine`]), which knows
/// nothing but the segment.
pub(super) fn combinable(batch: &Batch) -> bool {
    !batch.produces.is_empty() && batch.produces.iter().flatten().all(NewStored::stateless)
}

impl Produces {
    /// Produces whose segment a combining head wrote already, for `plan`.
    pub(super) fn written(segment: Option<(SegmentRef, Plan)>) -> Self {
        let (segment, written_for) = segment.map_or((None, None), |(s, p)| (Some(s), Some(p)));
        Self {
            segment,
            written_for,
            ..Self::default()
        }
    }

    /// Produces whose segment was written (or failed) while the batch waited for its
    /// turn ([`EarlySegment`]); none: nothing written yet.
    pub(super) fn early(early: Option<EarlySegment>) -> Self {
        let Some(EarlySegment { plan, written }) = early else {
            return Self::default();
        };
        let (segment, refused) = match written {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(e)),
        };
        Self {
            segment,
            refused,
            written_for: Some(plan),
            ..Self::default()
        }
    }

    /// The segment written and the plan it was written for, taken away: a batch that
    /// turns to combining ([`super::batch::Stop::Switch`]) waits for a combinable segment to
    /// land rather than write its messages again (any process's combining commit may land
    /// it already).
    pub(super) fn take_written(&mut self) -> Option<(SegmentRef, Plan)> {
        let segment = self.segment.take()?;
        let plan = self.written_for.take()?;
        Some((segment, plan))
    }

    /// The segment this attempt commits, if any.
    pub(super) fn segment(&self) -> Option<&SegmentRef> {
        self.segment.as_ref()
    }

    /// Whether the segment this attempt commits is being written beside its manifest
    /// write: named undecided ([`crate::partition::beside`]).
    pub(super) fn writes_beside(&self) -> bool {
        self.segment.is_some() && self.beside.is_some()
    }

    /// The PUT of the segment written beside the manifest write, taken away: the caller
    /// waits for it before anyone is answered, or before it deletes the segment.
    pub(super) fn take_beside(&mut self) -> Option<BesideWrite> {
        self.beside.take()
    }

    /// Refuses the produces after their commit landed: their segment was never stored (a
    /// void marker is at its key) or its fate could not be told.
    pub(super) fn refuse(&mut self, why: BrokerError) {
        self.refused = Some(why);
    }

    /// Whether the current segment's write confirmed the topic record: a commit that
    /// creates the manifest need not confirm it again ([`super::write`]).
    pub(super) fn confirmed_topic(&self) -> bool {
        self.segment.is_some() && self.confirmed
    }

    /// Where the segment landed, when only an index object could tell.
    pub(super) fn found_at(&self) -> Option<u64> {
        self.found_at
    }

    /// Why the produces could not be committed, if they could not.
    pub(super) fn refused(&self) -> Option<&BrokerError> {
        self.refused.as_ref()
    }

    /// Plans `batch`'s produces against `state` and writes the segment the plan needs
    /// (unless the last attempt wrote it for the same plan; combinable only when
    /// `combining` and the batch is combinable), confirming the topic record
    /// beside it when `state` is no stored manifest of this incarnation yet. Returns
    /// whether the batch's combinable segment has landed already (in a commit of another
    /// process).
    pub(super) async fn prepare(
        &mut self,
        c: &Committer,
        q: &Queue,
        (batch, topic): (&Batch, &TopicSeen),
        state: &Manifest,
        now: u64,
        combining: bool,
    ) -> bool {
        let landed = self.check_own_segment(c, q, state).await;
        let spilled = match c.spilled_keys(q, state, now, &batch.produces).await {
            Ok(found) => found,
            Err(e) => {
                // Without the spilled keys no produce can be planned safely: none is made.
                (self.segment, self.refused, self.written_for) = (None, Some(e), None);
                self.spilled = HashMap::new();
                self.plan = Some(Plan::refused(&batch.produces));
                return landed;
            }
        };
        let plan = Plan::new(&batch.produces, state, now, &|k| spilled.get(k).copied());
        self.spilled = spilled;
        if self.written_for.as_ref() != Some(&plan) {
            // A segment written beside an earlier attempt is left to garbage collection:
            // no manifest names it.
            (self.segment, self.refused, self.beside) = (None, None, None);
            if plan.needs_segment() {
                let messages = plan.new_messages(&batch.produces);
                // Combinable only when combining: an ordinary commit lands its own
                // segment alone, and a combinable one would pass over every combinable
                // segment still waiting below its id (their writers would write them
                // again), so it gets an ordinary id.
                let after = (combining && combinable(batch)).then_some(state.ids_above());
                let check = c.segment_check(topic, after.is_some(), !state.stored());
                self.confirmed = check.confirms();
                let beside = combinable(batch) && writes_beside(c, after.is_some(), check);
                let written = match beside {
                    true => c.write_beside(q, messages).await.map(|(seg, w)| {
                        self.beside = Some(w);
                        seg
                    }),
                    false => c.write_segment(q, topic, messages, after, check).await,
                };
                match written {
                    Ok(seg) => self.segment = Some(seg),
                    Err(e) => self.refused = Some(e),
                }
            }
            self.written_for = Some(plan.clone());
        }
        // A segment must never be committed after garbage collection could have taken
        // it for an orphan: if this process stalled since writing it, give up on it.
        if let Some(seg) = &self.segment {
            let written = keys::segment_time(&seg.id).unwrap_or(0);
            let age = c.clock.now_ms().saturating_sub(written);
            if age > MAX_SEGMENT_AGE_AT_COMMIT_MS {
                (self.segment, self.refused) = (None, Some(BrokerError::Contention));
            }
        }
        self.plan = Some(plan);
        landed
    }

    /// The plan for applying to `m`: the one `prepare` made against it, or (had it not
    /// run) one made now.
    pub(super) fn take_plan(&mut self, batch: &Batch, m: &Manifest, now: u64) -> Plan {
        self.plan.take().unwrap_or_else(|| {
            let spilled = &self.spilled;
            Plan::new(&batch.produces, m, now, &|k| spilled.get(k).copied())
        })
    }

    /// Puts back the plan `take_plan` gave.
    pub(super) fn keep_plan(&mut self, plan: Plan) {
        self.plan = Some(plan);
    }

    /// The plan of the current attempt, once made.
    pub(super) fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// If this batch's combinable segment is dead in `state` (it can never land), forgets
    /// it so that `prepare` writes the messages again under a new id; if its fate can no
    /// longer be told, refuses the batch (503: the outcome is unknown). Returns whether
    /// the segment has landed already.
    async fn check_own_segment(&mut self, c: &Committer, q: &Queue, state: &Manifest) -> bool {
        let Some(seg) = &self.segment else {
            return false;
        };
        if Combinable::parse(&seg.id).is_none() {
            return false;
        }
        self.found_at = None;
        match c.segment_status(q, state, seg).await {
            Status::Dead => (self.segment, self.written_for) = (None, None),
            // Landed, and no longer in the manifest's own memory: apply cannot tell.
            Status::Landed(base) if combine::status(state, &seg.id) == Status::Unknown => {
                self.found_at = Some(base);
                return true;
            }
            Status::Landed(_) => return true,
            Status::Unknown => {
                tracing::warn!(segment = %seg.id, version = state.version, "the fate of this batch's combinable segment can no longer be told: answered 503");
                let why = format!(
                    "the fate of combinable segment {} can no longer be told",
                    seg.id
                );
                self.segment = None;
                self.refused = Some(BrokerError::OutcomeUnknown(why));
            }
            Status::Pending => {}
        }
        false
    }
}
