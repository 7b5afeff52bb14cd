//! Long polling: try, and while nothing turns up, wait for a wake-up from this
//! process's committer ([`crate::commit::Wakers`]) or the next poll interval (work
//! committed by other processes), until the request's `wait` (capped by the server's
//! `max_wait`) runs out.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

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
        let deadline = Instant::now() + wait.min(self.opts.max_wait);
        let waker = self.committer.wakers().get(topic);
        let mut counted = false;
        let result = loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match attempt().await {
                Ok(None) => {}
                other => break other,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Ok(None);
            }
            if !counted && gauge == Gauge::Counted {
                counted = true;
                self.waiting.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tokio::time::timeout(left.min(self.opts.poll_interval), notified).await;
        };
        if counted {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }
}
