//! What the bench measures besides its phases: the store's serial CAS rate and
//! concurrent PUT rate, manifest sizes (read beneath the meter), and what a replay costs a
//! fresh process.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use narad_shared::clock::{IdSource, RandomIds};
use narad_shared::config::Config;
use narad_shared::store::metered::MeteredStore;
use narad_shared::store::{DynStore, StoreError};
use serde_json::Value;

use super::broker_on;

/// Commits per second one writer gets from the store: read + conditional PUT, serially.
pub(super) async fn serial_cas_rate(store: &DynStore, ops: usize) -> Result<f64, String> {
    let key = format!("bench/cas-{}", RandomIds.new_id());
    let mut etag = store
        .put_if_absent(&key, Bytes::from_static(b"0"))
        .await
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    for i in 0..ops {
        let _ = store.get(&key).await.map_err(|e| e.to_string())?;
        match store
            .put_if_match(&key, Bytes::from((i + 1).to_string()), &etag)
            .await
        {
            Ok(e) => etag = e,
            Err(StoreError::Conflict) => {
                return Err("unexpected conflict measuring the CAS rate".into())
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let rate = ops as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let _ = store.delete(&key).await;
    Ok(rate)
}

/// PUTs per second the store absorbs from `writers` concurrent writers of small new
/// objects: the ceiling on requests per second every server together can spend.
pub(super) async fn concurrent_put_rate(
    store: &DynStore,
    writers: usize,
    period: Duration,
) -> Result<f64, String> {
    let prefix = format!("bench/capacity-{}", RandomIds.new_id());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (store, prefix) = (store.clone(), prefix.clone());
        tasks.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            while start.elapsed() < period {
                let key = format!("{prefix}/{w}-{}", keys.len());
                if store
                    .put_if_absent(&key, Bytes::from_static(&[b'x'; 100]))
                    .await
                    .is_err()
                {
                    break;
                }
                keys.push(key);
            }
            keys
        }));
    }
    let mut keys = Vec::new();
    for t in tasks {
        keys.extend(t.await.map_err(|e| e.to_string())?);
    }
    let rate = keys.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    for k in keys {
        let _ = store.delete(&k).await;
    }
    Ok(rate)
}

/// The largest manifest of the benchmark's topic, sampled during the run and recorded
/// after each phase, with the number of index objects it named.
#[derive(Clone)]
pub(super) struct ManifestSizes {
    store: DynStore,
    keys: Vec<String>,
    /// (bytes, indexes) after each recorded phase.
    after: Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
    /// Largest size seen while sampling.
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

impl ManifestSizes {
    pub(super) fn new(store: DynStore, topic: &str, partitions: u32) -> Self {
        Self {
            store,
            keys: (0..partitions)
                .map(|p| {
                    narad_shared::stored::keys::manifest(
                        topic,
                        narad_shared::stored::keys::LAYOUT_FLAT,
                        p,
                    )
                })
                .collect(),
            after: Arc::default(),
            peak: Arc::default(),
        }
    }

    /// The largest manifest now, in bytes, and its number of index refs.
    pub(super) async fn largest(&self) -> (usize, usize) {
        let mut out = (0, 0);
        for k in &self.keys {
            if let Ok(Some(o)) = self.store.get(k).await {
                let json = narad_shared::stored::open_json(&o.data).unwrap_or(&o.data);
                let indexes = serde_json::from_slice::<Value>(json)
                    .ok()
                    .and_then(|v| v["indexes"].as_array().map(Vec::len))
                    .unwrap_or(0);
                out = out.max((o.data.len(), indexes));
            }
        }
        self.peak
            .fetch_max(out.0, std::sync::atomic::Ordering::Relaxed);
        out
    }

    pub(super) async fn record(&self) {
        let now = self.largest().await;
        self.after
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(now);
    }

    pub(super) fn sample_every(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                me.largest().await;
            }
        })
    }

    pub(super) fn report(&self) -> String {
        let after = self.after.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let parts: Vec<String> = after
            .iter()
            .map(|(b, i)| format!("{b} bytes ({i} index refs)"))
            .collect();
        format!(
            "largest manifest: {} after each phase; peak {} bytes",
            parts.join(", then "),
            self.peak.load(std::sync::atomic::Ordering::Relaxed)
        )
    }
}

/// Storage GETs a fresh process spends to replay partition 0, offset 0 of `topic`: for
/// loading the topic record, then for the replay cold, then for the same replay again.
pub(super) async fn replay_cost(
    inner: &DynStore,
    cfg: &Config,
    topic: &str,
) -> Result<(u64, u64, u64), String> {
    let metered = MeteredStore::new(inner.clone());
    let broker = broker_on(metered.clone(), cfg).await?;
    let gets = || metered.counts().gets();
    let start = gets();
    broker.topic(topic).await.map_err(|e| e.to_string())?;
    let loaded = gets();
    let replay = || broker.replay(topic, 0, 0, Duration::ZERO);
    let first = replay().await.map_err(|e| e.to_string())?;
    let cold = gets();
    replay().await.map_err(|e| e.to_string())?;
    let warm = gets();
    if first.is_none() {
        return Err("offset 0 was not found".into());
    }
    Ok((loaded - start, cold - loaded, warm - cold))
}
