//! Wake-ups for long polls in this process: the committer calls [`Wakers::wake`] after a
//! commit that makes messages available (a produce, an ack, a nack), and a waiting
//! consume or replay looks again at once instead of at its next poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Per-topic wake-ups for long polls in this process.
#[derive(Debug, Default)]
pub(crate) struct Wakers(Mutex<HashMap<String, Arc<Notify>>>);

impl Wakers {
    /// The notifier of `topic`.
    pub(crate) fn get(&self, topic: &str) -> Arc<Notify> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(topic.to_owned()).or_default().clone()
    }

    /// Wakes every long poll on `topic` in this process.
    pub(crate) fn wake(&self, topic: &str) {
        self.get(topic).notify_waiters();
    }
}
