//! A queue's chore: the storage writes a commit leaves behind once its callers are
//! answered (its checkpoint, the deletes of what retention dropped), run in the
//! background beside the queue's next commit instead of in series before it. The delete
//! of the checkpoint before the previous one is not part of it: it follows the new
//! checkpoint as a task of its own (`commit/repair.rs`), so that a commit of one round
//! trip never waits for two.
//!
//! One chore per queue at a time: starting one first waits for the last. The next batch
//! waits for it before it answers ([`Chore::done`]), so a write answered after another
//! also follows that other write's chore, as when the chore ran in series, and a repair
//! waits for it before it looks for checkpoints.

use std::future::Future;
use std::sync::{Arc, Mutex};

use super::lock;
use crate::dispatch::{Dispatcher, Kind};
use crate::runtime::JoinHandle;

/// The running chore of one queue, if any.
#[derive(Debug, Default)]
pub(super) struct Chore(Mutex<Option<JoinHandle<()>>>);

impl Chore {
    /// Waits until the running chore, if any, has ended.
    pub(super) async fn done(&self) {
        let running = lock(&self.0).take();
        if let Some(h) = running {
            // A chore that panicked left nothing to wait for.
            let _ = h.await;
        }
    }

    /// Runs `work` in the background (a task of `tasks`) once the running chore has
    /// ended; in the caller's task when the broker is stopping.
    pub(super) async fn start(
        &self,
        tasks: &Arc<Dispatcher>,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        self.done().await;
        match tasks.spawn(Kind::Chore, work) {
            Ok(h) => *lock(&self.0) = Some(h),
            Err(work) => work.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn chores_run_one_at_a_time_and_done_waits_for_the_last() {
        let c = Chore::default();
        let tasks = Arc::new(Dispatcher::default());
        let (log, n) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicU32::new(0)),
        );
        for i in 0..3u32 {
            let (log, n) = (log.clone(), n.clone());
            c.start(&tasks, async move {
                assert_eq!(n.fetch_add(1, Ordering::SeqCst), 0, "one at a time");
                crate::runtime::sleep(Duration::from_millis(10)).await;
                lock(&log).push(i);
                n.fetch_sub(1, Ordering::SeqCst);
            })
            .await;
        }
        c.done().await;
        assert_eq!(*lock(&log), vec![0, 1, 2]);
        c.done().await;
    }
}
