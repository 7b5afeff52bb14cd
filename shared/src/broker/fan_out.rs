//! The fan-out of a request with many entries (a produce batch, a settle batch): its
//! entries grouped by where they go, one submit per group, every group at once, and each
//! entry's result put back in its place. Entries that fail before they are grouped (a
//! payload too large, a forged handle) get their result first ([`Slots::set`]).

use std::collections::BTreeMap;
use std::future::Future;

use crate::error::{BrokerError, BrokerResult};

/// One result per entry of a request, in the request's order.
#[derive(Debug)]
pub(super) struct Slots<T> {
    slots: Vec<Option<BrokerResult<T>>>,
}

impl<T: Clone> Slots<T> {
    /// `n` entries, none answered yet.
    pub(super) fn new(n: usize) -> Self {
        Self {
            slots: vec![None; n],
        }
    }

    /// Answers entry `i`.
    pub(super) fn set(&mut self, i: usize, result: BrokerResult<T>) {
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = Some(result);
        }
    }

    /// Whether any entry got `Ok`.
    pub(super) fn any_ok(&self) -> bool {
        self.slots.iter().any(|r| matches!(r, Some(Ok(_))))
    }

    /// Whether any entry got an error `is` picks.
    pub(super) fn any_err(&self, is: impl Fn(&BrokerError) -> bool) -> bool {
        self.slots
            .iter()
            .any(|r| matches!(r, Some(Err(e)) if is(e)))
    }

    /// Every entry's result, in order; one that none was given is an internal error
    /// naming `what` ("a message").
    pub(super) fn finish(self, what: &str) -> Vec<BrokerResult<T>> {
        self.slots
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(BrokerError::Internal(format!("{what} got no result"))))
            })
            .collect()
    }

    /// Runs `submit` for every group at once (each with its entries' indices, in order)
    /// and puts each of its results, one per index, in its slot.
    pub(super) async fn fan_out<K, F, Fut>(&mut self, groups: BTreeMap<K, Vec<usize>>, submit: F)
    where
        F: Fn(K, &[usize]) -> Fut,
        Fut: Future<Output = Vec<BrokerResult<T>>>,
    {
        let submits = groups.into_iter().map(|(key, entries)| {
            let done = submit(key, &entries);
            async move { (entries, done.await) }
        });
        for (entries, results) in futures::future::join_all(submits).await {
            for (i, r) in entries.into_iter().zip(results) {
                self.set(i, r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_entry_gets_its_groups_result_in_its_place() {
        let mut slots = Slots::<u64>::new(5);
        slots.set(2, Err(BrokerError::PayloadTooLarge(1)));
        let groups = BTreeMap::from([("a", vec![0, 3]), ("b", vec![1])]);
        slots
            .fan_out(groups, |key, entries| {
                let n = entries.len();
                async move {
                    match key {
                        "a" => (0..n as u64).map(|k| Ok(10 + k)).collect(),
                        _ => vec![Err(BrokerError::LeaseGone); n],
                    }
                }
            })
            .await;
        assert!(slots.any_ok());
        assert!(slots.any_err(|e| matches!(e, BrokerError::LeaseGone)));
        let r = slots.finish("an entry");
        assert!(matches!(r[0], Ok(10)) && matches!(r[3], Ok(11)));
        assert!(matches!(r[1], Err(BrokerError::LeaseGone)));
        assert!(matches!(r[2], Err(BrokerError::PayloadTooLarge(1))));
        assert!(matches!(&r[4], Err(BrokerError::Internal(m)) if m == "an entry got no result"));
    }
}
