//! The runtime seam: the one place the core starts tasks, sleeps, bounds a wait and reads
//! a monotonic clock (docs/design.md §9, "The runtime seam").
//!
//! `narad serve`, the Lambda functions and the tests (tokio's paused clock among them) all
//! run the core on tokio, and so do the items here. A build for `wasm32` (a Worker) gets
//! the same items from the host instead ([`wasm`]: its timers, its event loop, its
//! clock), and nothing else in the core changes: no file of
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

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use native::*;
#[cfg(target_arch = "wasm32")]
pub(crate) use wasm::*;

/// The items on tokio.
#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::future::Future;
    use std::time::Duration;

    /// A point on the monotonic clock (tokio's: a paused test clock moves it).
    pub(crate) use tokio::time::Instant;

    /// The monotonic clock's reading now.
    pub(crate) fn now() -> Instant {
        Instant::now()
    }

    /// This process's id, for its process record.
    pub(crate) fn process_id() -> u32 {
        std::process::id()
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
}

/// The items on a `wasm32` host (a Worker): one thread and the host's event loop, its
/// timers (`setTimeout`) and its clock (`performance.now`). Futures there need not be
/// `Send`; the items that must be (a sleep kept in a `Send` struct) wrap theirs in a
/// [`SendWrapper`], sound where there is one thread.
#[cfg(target_arch = "wasm32")]
pub(crate) mod wasm {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use futures::future::{AbortHandle as Abort, Abortable, Aborted};
    use send_wrapper::SendWrapper;
    use tokio::sync::oneshot;
    use wasm_bindgen::{JsCast, JsValue};
    use wasm_bindgen_futures::JsFuture;

    /// A point on the host's monotonic clock.
    pub(crate) use web_time::Instant;

    /// The monotonic clock's reading now.
    pub(crate) fn now() -> Instant {
        Instant::now()
    }

    /// A Worker has no process id (std's panics on this target): its record says 0.
    pub(crate) fn process_id() -> u32 {
        0
    }

    /// What [`timeout`] answers when the wait ran out first.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Elapsed;

    impl std::fmt::Display for Elapsed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("deadline has elapsed")
        }
    }

    impl std::error::Error for Elapsed {}

    /// A sleep as a value: a host timer's promise.
    pub(crate) struct Sleep(SendWrapper<JsFuture>);

    impl Future for Sleep {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            // A timer that could not be set resolves at once (as a zero wait would).
            Pin::new(&mut *self.0).poll(cx).map(|_| ())
        }
    }

    /// Sleeps for `d` (the host's `setTimeout`; a wait past `i32::MAX` ms is cut to it).
    pub(crate) fn sleep(d: Duration) -> Sleep {
        let ms = i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
        let promise = js_sys::Promise::new(&mut |resolve, reject| {
            let global = js_sys::global();
            let set = js_sys::Reflect::get(&global, &JsValue::from_str("setTimeout"))
                .ok()
                .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
            let started = set.map(|set| set.call2(&global, &resolve, &JsValue::from(ms)));
            if !matches!(started, Some(Ok(_))) {
                drop(reject.call0(&JsValue::UNDEFINED));
            }
        });
        Sleep(SendWrapper::new(JsFuture::from(promise)))
    }

    /// Sleeps until `t`.
    pub(crate) fn sleep_until(t: Instant) -> Sleep {
        sleep(t.saturating_duration_since(now()))
    }

    /// Runs `f` for at most `d`.
    ///
    /// Errors: [`Elapsed`] when `d` passed first (`f` is dropped).
    pub(crate) async fn timeout<F: Future>(d: Duration, f: F) -> Result<F::Output, Elapsed> {
        let f = std::pin::pin!(f);
        match futures::future::select(f, sleep(d)).await {
            futures::future::Either::Left((out, _)) => Ok(out),
            futures::future::Either::Right(_) => Err(Elapsed),
        }
    }

    /// Aborts a started task without waiting for it.
    #[derive(Debug, Clone)]
    pub(crate) struct AbortHandle(Abort);

    impl AbortHandle {
        /// Ends the task at its next await.
        pub(crate) fn abort(&self) {
            self.0.abort();
        }
    }

    /// Why a task gave no output: it was aborted, or it panicked (its sender dropped).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct JoinError;

    /// A handle to a started task: awaiting it gives the task's output, or [`JoinError`]
    /// when it was aborted.
    pub(crate) struct JoinHandle<T> {
        output: oneshot::Receiver<Result<T, Aborted>>,
        abort: AbortHandle,
    }

    impl<T> std::fmt::Debug for JoinHandle<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JoinHandle")
        }
    }

    impl<T> JoinHandle<T> {
        /// Ends the task at its next await.
        pub(crate) fn abort(&self) {
            self.abort.abort();
        }

        /// A handle that aborts the task.
        pub(crate) fn abort_handle(&self) -> AbortHandle {
            self.abort.clone()
        }
    }

    impl<T> Future for JoinHandle<T> {
        type Output = Result<T, JoinError>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            Pin::new(&mut self.output)
                .poll(cx)
                .map(|r| r.ok().and_then(Result::ok).ok_or(JoinError))
        }
    }

    /// Starts `f` on the host's event loop. Only [`crate::dispatch`] calls it.
    pub(crate) fn spawn<F>(f: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (abort, registration) = Abort::new_pair();
        let (tx, output) = oneshot::channel();
        wasm_bindgen_futures::spawn_local(async move {
            drop(tx.send(Abortable::new(f, registration).await));
        });
        JoinHandle {
            output,
            abort: AbortHandle(abort),
        }
    }

    /// Runs `f` where it is: a Worker has one thread, and nothing to move it off to.
    pub(crate) async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        Some(f())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
