//! The bench's HTTP client: one per worker, over one server or rotating over several
//! processes, speaking the API as curl would (produce, consume, ack, piggybacked acks).

use std::sync::Arc;

use serde_json::{json, Value};

/// The processes a rotating client sends its requests to in turn.
#[derive(Clone)]
pub(super) struct Rotation {
    pub(super) bases: Arc<Vec<String>>,
    pub(super) next: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Clone)]
pub(super) struct Client {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
    /// `--rotate`: every request goes to the next process instead of `base`.
    pub(super) rotation: Option<Rotation>,
    pub(super) topic: String,
    /// The subscription consumes lease for (`None`: the topic's default one).
    pub(super) subscription: Option<String>,
    pub(super) batch: usize,
    /// Keys to give messages, round-robin (0: none), counted over all clients by `sent`.
    pub(super) keys: usize,
    pub(super) sent: Arc<std::sync::atomic::AtomicUsize>,
}

impl Client {
    /// Where the next request goes.
    pub(super) fn base(&self) -> &str {
        match &self.rotation {
            None => &self.base,
            Some(r) => {
                let n = r.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                &r.bases[n % r.bases.len()]
            }
        }
    }

    /// The key of the next message, if messages get keys.
    pub(super) fn next_key(&self) -> Option<String> {
        let n = self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (self.keys > 0).then(|| format!("k{}", n % self.keys))
    }

    pub(super) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: String,
    ) -> Result<reqwest::Response, String> {
        self.http
            .request(method, format!("{}{path}", self.base()))
            .basic_auth("bench", Some("bench"))
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())
    }

    /// Produces `n` messages (one request); returns how many were accepted.
    pub(super) async fn produce(&self, payload: &str, n: usize) -> Result<usize, String> {
        if self.batch == 1 {
            let query = self
                .next_key()
                .map_or_else(String::new, |k| format!("?key={k}"));
            let r = self
                .send(
                    reqwest::Method::POST,
                    &format!("/v1/topics/{}/produce{query}", self.topic),
                    payload.to_owned(),
                )
                .await?;
            let status = r.status();
            return if status.as_u16() == 201 {
                Ok(1)
            } else {
                Err(format!(
                    "produce: {status} {}",
                    r.text().await.unwrap_or_default()
                ))
            };
        }
        let msgs: Vec<String> = (0..n)
            .map(|_| match self.next_key() {
                Some(k) => format!("{{\"payload\":{payload},\"key\":\"{k}\"}}"),
                None => format!("{{\"payload\":{payload}}}"),
            })
            .collect();
        let body = format!("{{\"messages\":[{}]}}", msgs.join(","));
        let r = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/topics/{}/produce-batch", self.topic),
                body,
            )
            .await?;
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        let ok = v["results"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|x| x["status"] == 201).count());
        if ok == 0 {
            return Err(format!("produce-batch: {v}"));
        }
        Ok(ok)
    }

    /// Consumes up to `n` messages (one request); returns their receipt handles.
    pub(super) async fn consume(&self, n: usize) -> Result<Vec<String>, String> {
        let mut q = if self.batch == 1 {
            String::new()
        } else {
            format!("?max={n}")
        };
        if let Some(sub) = &self.subscription {
            q.push(if q.is_empty() { '?' } else { '&' });
            q.push_str(&format!("subscription={sub}"));
        }
        let r = self
            .send(
                reqwest::Method::GET,
                &format!("/v1/topics/{}/consume{q}", self.topic),
                String::new(),
            )
            .await?;
        match r.status().as_u16() {
            200 => {
                let v: Value = r.json().await.map_err(|e| e.to_string())?;
                let handles = match v.get("messages").and_then(Value::as_array) {
                    Some(list) => list
                        .iter()
                        .filter_map(|m| m["receipt_handle"].as_str().map(str::to_owned))
                        .collect(),
                    None => v["receipt_handle"]
                        .as_str()
                        .map(str::to_owned)
                        .into_iter()
                        .collect(),
                };
                Ok(handles)
            }
            204 | 503 => Ok(Vec::new()),
            s => Err(format!("consume: {s}")),
        }
    }

    /// Acks `acks` and leases up to `n` messages in one request; returns the new
    /// messages' handles and the acks whose outcome is unknown (503: ack them again).
    pub(super) async fn consume_acking(
        &self,
        n: usize,
        acks: &[String],
    ) -> Result<(Vec<String>, Vec<String>), String> {
        let q = if self.batch == 1 {
            String::new()
        } else {
            format!("?max={n}")
        };
        let r = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/topics/{}/consume{q}", self.topic),
                json!({ "ack": acks }).to_string(),
            )
            .await?;
        match r.status().as_u16() {
            200 => {}
            // Nothing acked for sure: ack them again, on their own.
            503 => return Ok((Vec::new(), acks.to_vec())),
            s => return Err(format!("consume: {s}")),
        }
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        let leased = v["messages"]
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|m| m["receipt_handle"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let answers = v["acks"].as_array().cloned().unwrap_or_default();
        let unsettled = acks
            .iter()
            .enumerate()
            .filter(|(i, _)| answers.get(*i).is_none_or(|a| a["status"] == 503))
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
            let r = if self.batch == 1 && handles.len() == 1 {
                self.http
                    .post(format!("{}/v1/topics/{}/ack", self.base(), self.topic))
                    .query(&[("receipt_handle", handles[0].as_str())])
                    .basic_auth("bench", Some("bench"))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?
            } else {
                let body = json!({ "receipt_handles": handles }).to_string();
                self.send(
                    reqwest::Method::POST,
                    &format!("/v1/topics/{}/ack", self.topic),
                    body,
                )
                .await?
            };
            match r.status().as_u16() {
                204 => return Ok(1),
                200 => {
                    let v: Value = r.json().await.map_err(|e| e.to_string())?;
                    let all = v["results"].as_array().cloned().unwrap_or_default();
                    if all.iter().any(|x| x["status"] == 503) {
                        continue;
                    }
                    return Ok(all.iter().filter(|x| x["status"] == 204).count());
                }
                503 => continue,
                s => return Err(format!("ack: {s}")),
            }
        }
        Err("ack: still 503 after 100 tries".into())
    }
}
