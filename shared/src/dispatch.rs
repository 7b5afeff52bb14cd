//! The dispatcher: every background task a broker starts, registered so that stopping the
//! broker stops them all (docs/design.md §6, "Background work and stopping").
//!
//! A task is started through [`Dispatcher::spawn`] with its [`Kind`], which says what a
//! stop does to it. [`Dispatcher::stop`] refuses new tasks, aborts the ones whose work
//! another process or garbage collection takes over (gate renewals, topic refreshes,
//! index deletes), and gives the rest (a commit queue's drain, a commit's chore) a grace
//! period to finish what they hold: a drain answers every operation already queued and
//! then ends instead of sweeping. What is still running after the grace is aborted, and
//! `stop` returns only when every task has ended.
//!
//! Aborting a commit mid-write loses nothing acknowledged: its callers are answered only
//! after the write landed, and a caller whose drain ended without answering gets 503,
//! the outcome unknown (`commit::answer`). SlateDB's dispatcher is the model: one owner of
//! the background tasks, cancelled together.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::runtime::{self, AbortHandle, JoinHandle};

/// What a background task is, and so what stopping the broker does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A commit queue's drain loop: finishes the operations queued, then ends.
    Drain,
    /// The writes a commit leaves behind once its callers are answered (checkpoint,
    /// deletes): finished within the grace.
    Chore,
    /// Deleting what retention dropped beneath an index: aborted (garbage collection
    /// takes what is left).
    Cleanup,
    /// Renewing this process's record in the fleet: aborted.
    Renewal,
    /// Reading a topic again for the cache: aborted.
    Refresh,
}

impl Kind {
    /// Whether a stop lets it finish (within the grace) rather than aborting it at once.
    fn finishes(self) -> bool {
        matches!(self, Kind::Drain | Kind::Chore)
    }
}

#[derive(Debug, Default)]
struct Tasks {
    stopping: bool,
    next: u64,
    /// Every task not ended, with its abort handle once it is started.
    live: HashMap<u64, (Kind, Option<AbortHandle>)>,
}

/// The background tasks of one broker. Shared behind an `Arc`.
#[derive(Debug, Default)]
pub(crate) struct Dispatcher {
    tasks: Mutex<Tasks>,
    /// Told whenever a task ends.
    ended: Notify,
}

/// Removes its task from the register when the task ends, returns or is aborted.
struct Registered {
    dispatcher: Weak<Dispatcher>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(d) = self.dispatcher.upgrade() {
            d.lock().live.remove(&self.id);
            d.ended.notify_waiters();
        }
    }
}

impl Dispatcher {
    fn lock(&self) -> MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `f` as a registered task of kind `kind`.
    ///
    /// Errors: `f` itself, not started, once the broker is stopping (the caller does the
    /// work in its own task or answers that it cannot).
    pub(crate) fn spawn<F>(self: &Arc<Self>, kind: Kind, f: F) -> Result<JoinHandle<F::Output>, F>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let id = {
            let mut t = self.lock();
            if t.stopping {
                return Err(f);
            }
            t.next += 1;
            let id = t.next;
            t.live.insert(id, (kind, None));
            id
        };
        let guard = Registered {
            dispatcher: Arc::downgrade(self),
            id,
        };
        // Started outside the lock: a runtime that is shutting down drops `f` (and the
        // guard, which takes the lock) at once.
        let handle = runtime::spawn(async move {
            let _registered = guard;
            f.await
        });
        let abort_now = {
            let mut t = self.lock();
            let stopping = t.stopping;
            match t.live.get_mut(&id) {
                Some(entry) => {
                    entry.1 = Some(handle.abort_handle());
                    // Stopped while starting: a task that does not finish on stop ends now.
                    stopping && !kind.finishes()
                }
                None => false, // ended already
            }
        };
        if abort_now {
            handle.abort();
        }
        Ok(handle)
    }

    /// Whether [`Dispatcher::stop`] has begun: drains end once their queue is empty.
    pub(crate) fn stopping(&self) -> bool {
        self.lock().stopping
    }

    /// How many registered tasks have not ended, by kind.
    pub(crate) fn running(&self) -> HashMap<Kind, usize> {
        let mut out = HashMap::new();
        for (kind, _) in self.lock().live.values() {
            *out.entry(*kind).or_insert(0) += 1;
        }
        out
    }

    /// Stops every task: refuses new ones, aborts those that do not finish on stop, gives
    /// the rest `grace` to finish, aborts what is left, and returns once all have ended.
    pub(crate) async fn stop(&self, grace: Duration) {
        self.abort(|k| !k.finishes(), true);
        let deadline = runtime::now() + grace;
        loop {
            let ended = self.ended.notified();
            if self.lock().live.is_empty() {
                return;
            }
            if runtime::now() >= deadline {
                self.abort(|_| true, true);
            }
            // Woken by the next task to end; a short bound covers a wake-up sent between
            // the check and the wait, and a task aborted before it first ran.
            let _ = runtime::timeout(Duration::from_millis(20), ended).await;
        }
    }

    /// Aborts every started task whose kind `which` picks (and marks the broker stopping
    /// when `stop`).
    fn abort(&self, which: impl Fn(Kind) -> bool, stop: bool) {
        let picked: Vec<AbortHandle> = {
            let mut t = self.lock();
            t.stopping |= stop;
            t.live
                .values()
                .filter(|(kind, _)| which(*kind))
                .filter_map(|(_, h)| h.clone())
                .collect()
        };
        // Outside the lock: an aborted task's register entry is removed as it ends.
        for h in picked {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_aborts_some_lets_others_finish_and_refuses_new_tasks() {
        let d = Arc::new(Dispatcher::default());
        let finished = Arc::new(AtomicU32::new(0));
        let f = finished.clone();
        let drain = d
            .spawn(Kind::Drain, async move {
                runtime::sleep(Duration::from_millis(300)).await;
                f.fetch_add(1, Ordering::SeqCst);
            })
            .ok()
            .unwrap();
        let f = finished.clone();
        d.spawn(Kind::Renewal, async move {
            loop {
                runtime::sleep(Duration::from_millis(10)).await;
                f.fetch_add(100, Ordering::SeqCst);
            }
        })
        .ok()
        .unwrap();
        let stuck = d
            .spawn(Kind::Chore, std::future::pending::<()>())
            .ok()
            .unwrap();
        runtime::sleep(Duration::from_millis(25)).await;
        assert_eq!(d.running().values().sum::<usize>(), 3);
        let renewed = finished.load(Ordering::SeqCst);
        assert_eq!(renewed, 200);
        let start = runtime::now();
        d.stop(Duration::from_secs(1)).await;
        // The drain finished its work; the renewal stopped at once; the stuck chore was
        // aborted when the grace ran out.
        assert!(drain.await.is_ok());
        assert!(stuck.await.unwrap_err().is_cancelled());
        assert_eq!(finished.load(Ordering::SeqCst), renewed + 1);
        assert!(start.elapsed() >= Duration::from_secs(1));
        assert!(start.elapsed() < Duration::from_millis(1100));
        assert!(d.running().is_empty());
        assert!(d.stopping());
        assert!(d.spawn(Kind::Drain, async {}).is_err());
    }

    #[tokio::test]
    async fn a_task_that_ends_at_once_leaves_the_register() {
        let d = Arc::new(Dispatcher::default());
        for _ in 0..50 {
            d.spawn(Kind::Refresh, async {})
                .ok()
                .unwrap()
                .await
                .unwrap();
        }
        assert!(d.running().is_empty());
        d.stop(Duration::ZERO).await;
    }
}
