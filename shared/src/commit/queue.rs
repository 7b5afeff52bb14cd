//! One queue of operations per object a process commits, and the one drain loop that
//! empties it (docs/design.md §6): the partition's queue ([`super::Queue`], the manifest)
//! and a subscription's ([`super::ledgers`], its ledger) differ in what they queue, how a
//! batch runs and what it leaves for the next, and share the rest, here.
//!
//! Operations queued while a batch is in flight wait for it; the drain then takes what
//! [`Drained::take`] says (at least one), after lingering when the last batch had
//! company, and runs it. A queue may pipeline ([`Drained::takes_ahead`]): once the batch
//! in flight is past the writes it makes before its commit ([`Onward`]), the drain takes
//! what queued meanwhile as the next batch and makes its writes ([`Drained::early`]) while
//! that commit is in flight, so the next commit starts the moment this one lands. Commits
//! still go one at a time and in order. With nothing queued, the process's [`Role`] says whether to sweep
//! (it is the object's committer: land what other processes wrote) or to stop; a stopping
//! broker never sweeps. The drain is a task of the broker's dispatcher; if it ends without
//! returning (a stop cut it short, or it panicked), what it still held queued is dropped,
//! and each of those callers is answered 503 with the outcome unknown
//! ([`super::answer`]) instead of waiting for a drain that will not come.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use futures::future::{select, Either};
use tokio::sync::{oneshot, Notify};

use super::role::{Idle, Role};
use super::{lock, Committer};
use crate::dispatch::Kind;

/// A queue the drain loop runs: what it queues, how a batch runs, what a batch leaves.
pub(super) trait Drained: Send + Sync + Sized + 'static {
    /// One queued operation with the channel its caller waits on.
    /// The object it commits.
    const OBJECT: super::Object;
    type Op: Send + 'static;
    /// What sweeps commit under: the last batch's rules (and, for the manifest, the
    /// topic record's ETag).
    type With: Clone + Send + 'static;
    /// What a batch leaves for the next: the manifest's cached snapshot, a ledger's
    /// `Known`.
    type Held: Default + Send + 'static;
    /// What the committer listed beside its last commit (`listing::Ahead`, for both).
    type Ahead: Send + 'static;
    /// The rest of the queue's state.
    type More: Default + Send + 'static;

    /// The queue's state.
    fn state(&self) -> &Mutex<QueueState<Self>>;

    /// The key of the object its batches write.
    fn key(&self) -> &str;

    /// Where the object's combining writes are listed.
    fn listing(&self) -> Place<'_>;

    /// How many of `pending` (never empty) the next batch takes (at least one), and what
    /// sweeps after it commit under.
    fn take(pending: &[Self::Op]) -> (usize, Self::With);

    /// What a batch taken ahead did before its turn (the partition's queue: its segment,
    /// written).
    type Early: Send + 'static;

    /// Runs `ops` as one batch (none: a sweep under `with`), starting from `held`, with
    /// what it did while taken ahead (`early`); answers every caller, and returns what
    /// the next batch starts from. It fires the [`Onward`] once past the writes it makes
    /// before its commit (dropped unfired: the next batch is not taken ahead of it).
    fn run(
        c: &Arc<Committer>,
        q: &Arc<Self>,
        ops: Vec<Self::Op>,
        from: (Self::With, Self::Held),
        early: (Option<Self::Early>, Onward),
    ) -> impl Future<Output = Self::Held> + Send;

    /// Whether the drain takes the first `n` of `st.pending` (the next batch, never
    /// empty) while the batch before it commits, and does [`Drained::early`] for them
    /// meanwhile.
    fn takes_ahead(c: &Committer, st: &QueueState<Self>, n: usize) -> bool;

    /// What a batch taken ahead does before its turn.
    fn early(
        c: &Arc<Committer>,
        q: &Arc<Self>,
        ops: &[Self::Op],
    ) -> impl Future<Output = Self::Early> + Send;

    /// Keeps what a batch left in `st` (and the copies read while the next one runs).
    fn keep(st: &mut QueueState<Self>, held: Self::Held) {
        st.held = held;
    }
}

/// Where a queue's object has its combining writes listed (`listing::Committer::list_after`).
pub(super) struct Place<'a> {
    /// The prefix its combinable segments and intents are written under.
    pub prefix: &'a str,
    /// The incarnation tag its combinable segments must carry; `None`: it has none (a
    /// ledger's prefix holds intents only).
    pub tag: Option<&'a str>,
    /// When its topic was created: writes older than that are an earlier topic's.
    pub created_at_ms: u64,
}

/// A queue's state, behind its mutex.
pub(super) struct QueueState<Q: Drained> {
    /// Operations waiting for the next batch, in order.
    pub(super) pending: Vec<Q::Op>,
    /// Whether a drain runs.
    pub(super) running: bool,
    /// Operations in the previous batch: lingering pays only when there is company.
    pub(super) last_batch: usize,
    /// This process's part on the object when other processes write it too.
    pub(super) role: Role<Q::With>,
    /// What the last batch left (taken out while a batch runs).
    pub(super) held: Q::Held,
    /// What the committer listed beside its last commit.
    pub(super) ahead: Option<Q::Ahead>,
    /// What only this kind of queue keeps.
    pub(super) more: Q::More,
    /// Told when operations queue while a drain runs (for taking the next batch ahead).
    arrived: Arc<Notify>,
}

/// A batch's word to its drain that it is past the writes it makes before its commit
/// ([`Drained::run`]).
pub(super) struct Onward(Option<oneshot::Sender<()>>);

impl Onward {
    /// Tells the drain (once; later calls do nothing).
    pub(super) fn fire(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

impl Default for Onward {
    /// A word nobody waits for.
    fn default() -> Self {
        Self(None)
    }
}

/// A batch taken ahead, and what it did before its turn.
struct Taken<Q: Drained> {
    ops: Vec<Q::Op>,
    with: Q::With,
    early: Q::Early,
}

impl<Q: Drained> Default for QueueState<Q> {
    fn default() -> Self {
        Self {
            pending: Vec::new(),
            running: false,
            last_batch: 0,
            role: Role::default(),
            held: Q::Held::default(),
            ahead: None,
            more: Q::More::default(),
            arrived: Arc::new(Notify::new()),
        }
    }
}

impl<Q: Drained> QueueState<Q> {
    /// Operations queued, or a batch running.
    pub(super) fn busy(&self) -> bool {
        self.running || !self.pending.is_empty()
    }
}

/// A drain loop's hold on its queue, for when the loop ends without returning: `release`
/// marks the queue drained by nobody and drops what is still queued. A loop that returns
/// released the queue itself and disarms it.
struct Cut<F: FnMut()>(Option<F>);

impl<F: FnMut()> Cut<F> {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl<F: FnMut()> Drop for Cut<F> {
    fn drop(&mut self) {
        if let Some(release) = self.0.as_mut() {
            release();
        }
    }
}

/// Marks `q` drained by nobody and drops what it holds queued (its callers get 503).
fn release<Q: Drained>(q: &Q) {
    let mut st = lock(q.state());
    st.running = false;
    st.pending.clear();
}

impl Committer {
    /// Queues `ops` on `q`, one after another with nothing between them, and starts its
    /// drain if none runs. Once the broker stopped no drain starts: the operations are
    /// dropped and their callers answered 503, the outcome unknown.
    pub(super) fn enqueue_on<Q: Drained>(
        self: &Arc<Self>,
        q: &Arc<Q>,
        ops: impl IntoIterator<Item = Q::Op>,
    ) {
        let start = {
            let mut st = lock(q.state());
            st.pending.extend(ops);
            let start = !std::mem::replace(&mut st.running, true);
            if !start {
                st.arrived.notify_one();
            }
            start
        };
        if start {
            let (me, queue) = (self.clone(), q.clone());
            if self
                .tasks
                .spawn(Kind::Drain, async move { me.drain(queue).await })
                .is_err()
            {
                release(&**q);
            }
        }
    }

    /// Commits batches until `q` is empty, then sweeps while this process is the
    /// object's committer. While the object is busy (the previous batch held more than
    /// one operation) each batch first waits the committer's `linger`, so that the clients
    /// the last commit answered come back in time to share the next one. A batch taken
    /// ahead ([`Committer::run_taking_ahead`]) runs next, at once.
    async fn drain<Q: Drained>(self: Arc<Self>, q: Arc<Q>) {
        let held = q.clone();
        let mut cut = Cut(Some(move || release(&*held)));
        let mut ahead: Option<Taken<Q>> = None;
        loop {
            let (ops, with, held, early) = match ahead.take() {
                Some(t) => {
                    let held = std::mem::take(&mut lock(q.state()).held);
                    (t.ops, t.with, held, Some(t.early))
                }
                None => {
                    let Some((ops, with, held)) = self.take_next(&*q).await else {
                        cut.disarm();
                        return;
                    };
                    (ops, with, held, None)
                }
            };
            let sweep = ops.is_empty();
            let (tx, rx) = oneshot::channel();
            let run = Q::run(&self, &q, ops, (with, held), (early, Onward(Some(tx))));
            let held = match sweep {
                true => run.await,
                false => {
                    let (held, next) = self.run_taking_ahead(&q, run, rx).await;
                    ahead = next;
                    held
                }
            };
            Q::keep(&mut lock(q.state()), held);
        }
    }

    /// The next batch to run (no operations: a sweep), with what it starts from; `None`
    /// when the queue is empty and this process does not sweep it (the drain ends, and the
    /// queue is marked drained by nobody).
    async fn take_next<Q: Drained>(&self, q: &Q) -> Option<(Vec<Q::Op>, Q::With, Q::Held)> {
        let busy = lock(q.state()).last_batch > 1;
        if busy && !self.linger.is_zero() {
            crate::runtime::sleep(self.linger).await;
        }
        // On a store that paces writes of a key (R2's one a second), the batch is
        // taken when its write may go, so that what arrives until then rides in it
        // (taken earlier, the batch would wait in the store while the rest queued for
        // the write after it). With nothing queued the loop ends at once instead: a
        // queue that waits for its slot with nothing to write would look busy, and
        // sticky cursors would stay on it (broker/sticky.rs).
        let wait = self.store.write_wait(q.key());
        if !wait.is_zero() && !lock(q.state()).pending.is_empty() {
            crate::runtime::sleep(wait).await;
        }
        let mut st = lock(q.state());
        if st.pending.is_empty() {
            return match (st.role.idle(), st.role.sweep_with()) {
                (Idle::Sweep, Some(with)) if !self.tasks.stopping() => {
                    st.last_batch = 0;
                    Some((Vec::new(), with, std::mem::take(&mut st.held)))
                }
                _ => {
                    st.running = false;
                    None
                }
            };
        }
        let (ops, with) = take_batch(&mut st);
        Some((ops, with, std::mem::take(&mut st.held)))
    }

    /// Runs `run` (a batch) and, once it fires its [`Onward`] (`readied`), takes what
    /// queues meanwhile as the next batch, if [`Drained::takes_ahead`] says so, and does
    /// its [`Drained::early`] work beside the commit in flight. Returns what `run` left and
    /// the batch taken ahead, if one was.
    async fn run_taking_ahead<Q: Drained>(
        self: &Arc<Self>,
        q: &Arc<Q>,
        run: impl Future<Output = Q::Held>,
        readied: oneshot::Receiver<()>,
    ) -> (Q::Held, Option<Taken<Q>>) {
        let mut run = pin!(run);
        let taking = pin!(self.take_early(&**q, readied));
        // `take_early` takes its operations and returns in one step: dropped unfinished
        // (the batch ended first), it took none.
        match select(run.as_mut(), taking).await {
            Either::Left((held, _)) => (held, None),
            Either::Right(((ops, with), _)) => {
                let (held, early) = futures::join!(run, Q::early(self, q, &ops));
                (held, Some(Taken { ops, with, early }))
            }
        }
    }

    /// Waits for `readied`, then for operations [`Drained::takes_ahead`] takes, and takes
    /// them; pending for good when the batch in flight will not fire, the broker stops,
    /// or what is queued is not worth taking ahead.
    async fn take_early<Q: Drained>(
        &self,
        q: &Q,
        readied: oneshot::Receiver<()>,
    ) -> (Vec<Q::Op>, Q::With) {
        if readied.await.is_err() {
            return std::future::pending().await;
        }
        let arrived = lock(q.state()).arrived.clone();
        loop {
            let notified = arrived.notified();
            // Queued but not worth taking ahead: it waits for the batch in flight to end.
            let queued = {
                let mut st = lock(q.state());
                if !st.pending.is_empty() {
                    let (n, _) = Q::take(&st.pending);
                    let n = n.clamp(1, st.pending.len());
                    if !self.tasks.stopping() && Q::takes_ahead(self, &st, n) {
                        return take_batch(&mut st);
                    }
                }
                !st.pending.is_empty()
            };
            match queued {
                true => return std::future::pending().await,
                false => notified.await,
            }
        }
    }
}

/// Takes the next batch out of `st.pending` (never empty) as [`Drained::take`] says, and
/// what sweeps after it commit under.
fn take_batch<Q: Drained>(st: &mut QueueState<Q>) -> (Vec<Q::Op>, Q::With) {
    let (n, with) = Q::take(&st.pending);
    let ops: Vec<Q::Op> = st.pending.drain(..n.max(1)).collect();
    st.last_batch = ops.len();
    st.role.took_batch(with.clone());
    (ops, with)
}
