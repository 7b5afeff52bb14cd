//! The runtime seam: the one place the core starts tasks, sleeps, bounds a wait and reads
//! a monotonic clock (docs/design.md §9, "The runtime seam").
//!
//! `narad serve`, the Lambda functions and the tests (tokio's paused clock among them) all
//! run the core on tokio, and so do the items here. A build for another runtime (a Worker
//! on `wasm32`) supplies the same items, and nothing else in the core changes: no file of
//! `shared/src` outside this one, the clock ([`crate::clock`]), the HTTP server
//! (`http/serve.rs`) and the stores calls `tokio::spawn` or `tokio::time`, or reads
//! `SystemTime::now` or `Instant::now` (`tests/tests/structure.rs` checks it).
//!
//! Background work a broker starts goes through its [`crate::dispatch::Dispatcher`],
//! which registers each task so that stopping the broker stops them all; [`spawn`] is
//! what the dispatcher calls. A request's own concurrent reads are futures joined in the
//! request's task (`futures::future::join_all`), not tasks: dropping the request drops
//! them.
//!
//! Wall-clock time (lease deadlines, ids, retention) is [`crate::clock::Clock`]'s, which
//! tests replace; the monotonic [`Instant`] here measures waits and intervals.

use std::future::Future;
use std::time::Duration;

/// A point on the monotonic clock (tokio's: a paused test clock moves it).
pub(crate) use tokio::time::Instant;

/// The monotonic clock's reading now.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// What [`timeout`] answers when the wait ran out first.
pub(crate) use tokio::time::error::Elapsed;

/// A handle to a started task: awaiting it gives the task's output, or an error when it
/// panicked or was aborted.
pub(crate) use tokio::task::JoinHandle;

/// Aborts a started task without waiting for it.
pub(crate) use tokio::task::AbortHandle;

/// A sleep as a value (kept in a struct and polled, as admission's queue does).
pub(crate) type Sleep = tokio::time::Sleep;

/// Sleeps for `d`.
pub(crate) fn sleep(d: Duration) -> Sleep {
    tokio::time::sleep(d)
}

/// Sleeps until `t`.
pub(crate) fn sleep_until(t: Instant) -> Sleep {
    tokio::time::sleep_until(t)
}

/// Runs `f` for at most `d`.
///
/// Errors: [`Elapsed`] when `d` passed first (`f` is dropped).
pub(crate) async fn timeout<F: Future>(d: Duration, f: F) -> Result<F::Output, Elapsed> {
    tokio::time::timeout(d, f).await
}

/// Starts `f` as a task of its own. Only [`crate::dispatch`] calls it: background work
/// is registered there so that it stops with the broker.
pub(crate) fn spawn<F>(f: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(f)
}

/// Runs the CPU-bound `f` (a password hash) off the tasks that serve requests; `None`
/// when it panicked.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn timeout_and_sleep_follow_the_paused_clock() {
        let start = now();
        sleep(Duration::from_millis(250)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        let never = std::future::pending::<()>();
        assert!(timeout(Duration::from_secs(3), never).await.is_err());
        assert_eq!(start.elapsed(), Duration::from_millis(3250));
        assert_eq!(
            timeout(Duration::from_secs(1), async { 7 }).await.ok(),
            Some(7)
        );
        sleep_until(start + Duration::from_secs(4)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        assert_eq!(blocking(|| 6 * 7).await, Some(42));
        assert_eq!(spawn(async { 5 }).await.ok(), Some(5));
    }
}
