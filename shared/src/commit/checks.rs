//! What this process's commits last learnt of each topic record: a segment write's topic
//! re-check ([`super::Committer::write_segment`]) that the store answered 304 proves the
//! record was still the one with that ETag when the check was sent. The broker renews its
//! cached copy from it ([`TopicChecks::since`]), so a process that produces keeps its topic
//! cache fresh without reading the record a second time (docs/design.md §6).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::store::ETag;

/// Topics remembered at most; past this the map starts again (a topic not produced to
/// since simply reads its record when its cache expires, as it would without this).
const MAX_TOPICS: usize = 4096;

/// The latest unchanged topic re-check per topic name.
#[derive(Debug, Default)]
pub struct TopicChecks(Mutex<HashMap<String, (ETag, Instant)>>);

impl TopicChecks {
    /// Records that `topic`'s record still had `etag` at `sent` (when the check was sent,
    /// so never later than the moment the store looked).
    pub(super) fn unchanged(&self, topic: &str, etag: &ETag, sent: Instant) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((e, at)) = map.get_mut(topic) {
            if *at <= sent {
                *e = etag.clone();
                *at = sent;
            }
            return;
        }
        if map.len() >= MAX_TOPICS {
            map.clear();
        }
        map.insert(topic.to_owned(), (etag.clone(), sent));
    }

    /// When a check last found `topic`'s record to have `etag`, if one did.
    pub fn since(&self, topic: &str, etag: &ETag) -> Option<Instant> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(topic).filter(|(e, _)| e == etag).map(|&(_, at)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn answers_the_latest_check_of_the_etag_asked_about() {
        let checks = TopicChecks::default();
        let (a, b) = (ETag::new("a"), ETag::new("b"));
        assert_eq!(checks.since("t", &a), None);
        let t0 = Instant::now();
        checks.unchanged("t", &a, t0);
        assert_eq!(checks.since("t", &a), Some(t0));
        assert_eq!(checks.since("t", &b), None, "another ETag proves nothing");
        assert_eq!(checks.since("u", &a), None, "another topic proves nothing");
        // A check sent earlier that answers later does not move the time back.
        checks.unchanged("t", &a, t0 + Duration::from_millis(5));
        checks.unchanged("t", &a, t0 + Duration::from_millis(2));
        assert_eq!(checks.since("t", &a), Some(t0 + Duration::from_millis(5)));
        // Only the latest check counts, whatever record it found.
        checks.unchanged("t", &b, t0 + Duration::from_millis(1));
        assert_eq!(checks.since("t", &a), Some(t0 + Duration::from_millis(5)));
        checks.unchanged("t", &b, t0 + Duration::from_millis(6));
        assert_eq!(checks.since("t", &a), None);
        assert_eq!(checks.since("t", &b), Some(t0 + Duration::from_millis(6)));
    }

    #[tokio::test(start_paused = true)]
    async fn stays_bounded() {
        let checks = TopicChecks::default();
        let e = ETag::new("e");
        for i in 0..(MAX_TOPICS + 10) {
            checks.unchanged(&format!("t{i}"), &e, Instant::now());
        }
        assert!(checks.0.lock().unwrap().len() <= MAX_TOPICS);
        assert!(checks.since(&format!("t{}", MAX_TOPICS + 9), &e).is_some());
    }
}
