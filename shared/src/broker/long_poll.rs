//! Long polling: try, and while nothing turns up, wait for a wake-up from this
//! process's committer ([`crate::commit::Wakers`]) or the next poll interval (work
//! committed by other processes), until the request's `wait` (capped by the server's
//! `max_wait`) runs out.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use super::Broker;
use crate::error::BrokerResult;

/// Whether a waiting request shows in the `narad_long_poll_waiters` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gauge {
    /// Counted (consumes).
    Counted,
    /// Not counted (replays).
    Uncounted,
}

impl Broker {
    /// Calls `attempt` until it answers `Some`, an error, or the wait is over (`None`).
    pub(super) async fn long_poll<T, F, Fut>(
        &self,
        topic: &str,
        wait: Duration,
        gauge: Gauge,
        attempt: F,
    ) -> BrokerResult<Option<T>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = BrokerResult<Option<T>>>,
    {
        let deadline = crate::runtime::now() + wait.min(self.opts.max_wait);
        let waker = self.committer.wakers().get(topic);
        let mut counted = None;
        loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match attempt().await {
                Ok(None) => {}
                other => return other,
            }
            let left = deadline.saturating_duration_since(crate::runtime::now());
            if left.is_zero() {
                return Ok(None);
            }
            if counted.is_none() && gauge == Gauge::Counted {
                counted = Some(Waiting::new(&self.waiting));
            }
            let _ = crate::runtime::timeout(left.min(self.opts.poll_interval), notified).await;
        }
    }
}

/// One request counted in the `narad_long_poll_waiters` gauge while this lives.
pub(super) struct Waiting<'a>(&'a AtomicI64);

impl<'a> Waiting<'a> {
    /// Counts one more waiter.
    pub(super) fn new(gauge: &'a AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
