//! The bench's client: one per worker, over one server or rotating over several
//! processes, on [`narad_client`] (produce, consume, ack, piggybacked acks), with its
//! retries off: the bench counts and handles every 503 itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use narad_client::{BatchMessage, ConsumeOptions, ProduceOptions, Settle};
use serde_json::value::RawValue;

/// The API clients of every server, one per process.
pub(super) fn api_clients(
    bases: &[String],
    auth: &str,
) -> Result<Vec<narad_client::Client>, String> {
    let (user, password) = auth.split_once(':').unwrap_or((auth, ""));
    bases
        .iter()
        .map(|b| {
            narad_client::Client::new(b, Some((user, password)))
                .map(|c| c.with_retries(0))
                .map_err(|e| e.to_string())
        })
        .collect()
}

#[derive(Clone)]
pub(super) struct Client {
    /// Every server's API client (clones share one connection pool each).
    pub(super) servers: Arc<Vec<narad_client::Client>>,
    /// The server this worker talks to when it does not rotate.
    pub(super) home: usize,
    /// `--rotate`: every request goes to the next process instead of `home`.
    pub(super) rotation: Option<Arc<AtomicUsize>>,
    pub(super) topic: String,
    /// The subscription consumes lease for (`None`: the topic's default one).
    pub(super) subscription: Option<String>,
    pub(super) batch: usize,
    /// Keys to give messages, round-robin (0: none), counted over all clients by `sent`.
    pub(super) keys: usize,
    pub(super) sent: Arc<AtomicUsize>,
}

/// Whether `e` is a 503 (or 429): refused, nothing done for sure.
fn refused(e: &narad_client::Error) -> bool {
    matches!(e.status().map(|s| s.as_u16()), Some(503 | 429))
}

impl Client {
    /// The server the next request goes to.
    pub(super) fn api(&self) -> &narad_client::Client {
        let i = match &self.rotation {
            None => self.home,
            Some(next) => next.fetch_add(1, Ordering::Relaxed),
        };
        &self.servers[i % self.servers.len()]
    }

    /// The key of the next message, if messages get keys.
    fn next_key(&self) -> Option<String> {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        (self.keys > 0).then(|| format!("k{}", n % self.keys))
    }

    fn consume_options(&self, n: usize) -> ConsumeOptions {
        ConsumeOptions {
            wait: None,
            partition: None,
            max: (self.batch > 1).then(|| u32::try_from(n).unwrap_or(u32::MAX)),
            subscription: self.subscription.clone(),
        }
    }

    /// Produces `n` messages of the JSON `payload` (one request); returns how many were
    /// accepted.
    pub(super) async fn produce(&self, payload: &str, n: usize) -> Result<usize, String> {
        if self.batch == 1 {
            let opts = ProduceOptions {
                key: self.next_key(),
                ..ProduceOptions::default()
            };
            return match self
                .api()
                .produce(&self.topic, payload.to_owned(), &opts)
                .await
            {
                Ok(_) => Ok(1),
                Err(e) => Err(format!("produce: {e}")),
            };
        }
        let raw = RawValue::from_string(payload.to_owned()).map_err(|e| e.to_string())?;
        let msgs: Vec<BatchMessage> = (0..n)
            .map(|_| BatchMessage {
                payload: raw.clone(),
                payload_encoding: None,
                key: self.next_key(),
                partition: None,
                idempotency_key: None,
                headers: Default::default(),
                delay_ms: 0,
            })
            .collect();
        let results = self
            .api()
            .produce_batch(&self.topic, &msgs)
            .await
            .map_err(|e| format!("produce-batch: {e}"))?;
        let ok = results.iter().filter(|r| r.status == 201).count();
        if ok == 0 {
            return Err(format!("produce-batch: {results:?}"));
        }
        Ok(ok)
    }

    /// Consumes up to `n` messages (one request); returns their receipt handles.
    pub(super) async fn consume(&self, n: usize) -> Result<Vec<String>, String> {
        match self
            .api()
            .consume(&self.topic, &self.consume_options(n))
            .await
        {
            Ok(messages) => Ok(messages
                .into_iter()
                .filter_map(|m| m.receipt_handle)
                .collect()),
            Err(e) if refused(&e) => Ok(Vec::new()),
            Err(e) => Err(format!("consume: {e}")),
        }
    }

    /// Acks `acks` and leases up to `n` messages in one request; returns the new
    /// messages' handles and the acks whose outcome is unknown (503: ack them again).
    pub(super) async fn consume_acking(
        &self,
        n: usize,
        acks: &[String],
    ) -> Result<(Vec<String>, Vec<String>), String> {
        let got = match self
            .api()
            .consume_acking(&self.topic, &self.consume_options(n), acks)
            .await
        {
            Ok(got) => got,
            // Nothing acked for sure: ack them again, on their own.
            Err(e) if refused(&e) => return Ok((Vec::new(), acks.to_vec())),
            Err(e) => return Err(format!("consume: {e}")),
        };
        let leased = got
            .messages
            .into_iter()
            .filter_map(|m| m.receipt_handle)
            .collect();
        let unsettled = acks
            .iter()
            .enumerate()
            .filter(|(i, _)| got.acks.get(*i).is_none_or(|a| a.status == 503))
            .map(|(_, h)| h.clone())
            .collect();
        Ok((leased, unsettled))
    }

    /// Acks `handles`, retrying 503s; returns how many were acked.
    pub(super) async fn ack(&self, handles: &[String]) -> Result<usize, String> {
        if handles.is_empty() {
            return Ok(0);
        }
        for _ in 0..100 {
            if self.batch == 1 && handles.len() == 1 {
                match self.api().ack(&self.topic, &handles[0]).await {
                    Ok(()) => return Ok(1),
                    Err(e) if refused(&e) => continue,
                    Err(e) => return Err(format!("ack: {e}")),
                }
            }
            match self
                .api()
                .settle_batch(&self.topic, handles, Settle::Ack)
                .await
            {
                Ok(all) if all.iter().any(|r| r.status == 503) => continue,
                Ok(all) => return Ok(all.iter().filter(|r| r.status == 204).count()),
                Err(e) if refused(&e) => continue,
                Err(e) => return Err(format!("ack: {e}")),
            }
        }
        Err("ack: still 503 after 100 tries".into())
    }
}
