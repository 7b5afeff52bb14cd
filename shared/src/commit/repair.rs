//! What the committer does about a corrupt manifest ([`crate::repair`], docs/design.md
//! §7): repair it by itself when a commit finds it corrupt, or on demand for
//! `narad repair`; and the checkpoints its commits leave.

use std::future::Future;

use crate::cas::{Cell, Snapshot, Stored};
use crate::dispatch::Kind;
use crate::error::{BrokerError, BrokerResult};
use crate::keys;
use crate::partition::{Manifest, Rules};
use crate::repair::{Repair, Repairer, Target};
use crate::topic::Topic;

use super::{Committer, Queue};

impl Committer {
    /// Inspects partition `partition` of `topic` and, unless `dry_run`, rebuilds its
    /// manifest if it is corrupt ([`Repairer::repair`]).
    ///
    /// Errors: as [`Repairer::repair`].
    pub(crate) async fn repair(
        &self,
        topic: &Topic,
        partition: u32,
        dry_run: bool,
    ) -> BrokerResult<Repair> {
        let key = topic.manifest_key(partition);
        let t = Target {
            topic: &topic.name,
            incarnation: &topic.incarnation,
            partition,
            key: &key,
            created_at_ms: topic.created_at_ms,
            dedup_window_ms: topic.settings.dedup_window_ms,
        };
        Repairer::new(&self.store, &*self.ids, self.reader(), t)
            .repair(dry_run)
            .await
    }

    /// After a commit found `q`'s manifest corrupt: repairs it if a second read confirms
    /// it ([`Repairer::confirmed`]), after this process's last checkpoint of it landed.
    /// True when the commit may try again.
    pub(super) async fn self_repair(&self, q: &Queue, rules: &Rules) -> bool {
        q.chore.done().await;
        let t = Target {
            topic: &q.topic,
            incarnation: &q.incarnation,
            partition: q.partition,
            key: &q.key,
            created_at_ms: q.created_at_ms,
            dedup_window_ms: rules.dedup_window_ms,
        };
        Repairer::new(&self.store, &*self.ids, self.reader(), t)
            .confirmed()
            .await
    }

    /// The manifest of `q` as stored now.
    ///
    /// Errors: store failures, [`BrokerError::Corrupt`].
    pub(super) async fn read_manifest(&self, q: &Queue) -> BrokerResult<Snapshot<Manifest>> {
        let cell = Cell::<Manifest>::new(&*self.store, &*self.ids, &q.key, &q.incarnation);
        Ok(cell.read::<BrokerError>().await?)
    }

    /// The write of the checkpoint `m` asked for, for the queue's [`super::chore`], and
    /// once it landed the delete of checkpoint `expired` (0: none) as a task of its own,
    /// which nothing waits for; `None` when `m` does not encode (a
    /// bug, logged). A failure is logged and otherwise ignored: the next checkpoint comes
    /// soon.
    pub(super) fn checkpoint_write(
        &self,
        q: &Queue,
        m: &Manifest,
        expired: u64,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let key = keys::checkpoint(&q.topic, q.partition, m.version);
        let body = match m.encode() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(%key, error = %e, "cannot encode a checkpoint (a bug)");
                return None;
            }
        };
        let old = (expired > 0).then(|| keys::checkpoint(&q.topic, q.partition, expired));
        let (store, tasks) = (self.store.clone(), self.tasks.clone());
        Some(async move {
            if let Err(e) = store.put_if_absent(&key, body).await {
                tracing::debug!(%key, error = %e, "checkpoint not written");
                return;
            }
            let Some(old) = old else { return };
            // Once the new one landed, on its own: no commit waits for this delete (the
            // chore holds the next commit's answer only until the checkpoint is written).
            let delete = async move {
                if let Err(e) = store.delete(&old).await {
                    tracing::debug!(key = %old, error = %e, "old checkpoint not deleted");
                }
            };
            if let Err(delete) = tasks.spawn(Kind::Chore, delete) {
                delete.await;
            }
        })
    }
}
