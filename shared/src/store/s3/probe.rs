//! The startup probe ([`S3Store::probe`]): the bucket, the credentials and conditional-write
//! support, checked once, and how the server answers `If-Match` on a missing key (see the
//! module documentation of [`super`]).

use aws_sdk_s3::error::ProvideErrorMetadata;
use bytes::Bytes;

use super::errors::map_err;
use super::{Condition, S3Store};
use crate::store::{ETag, Store, StoreError, StoreResult};

/// Folder (under the store prefix) of the startup probe's objects.
const PROBE_DIR: &str = ".narad-probe";

/// How a server answers `PutObject` with `If-Match` on a key that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MissingOnMatch {
    /// 404 `NoSuchKey`, as AWS and LocalStack answer: the status says it.
    NotFound,
    /// 412 `PreconditionFailed`, as SeaweedFS answers: a 412 is told apart with `HeadObject`.
    PreconditionFailed,
}

impl S3Store {
    /// Checks the bucket and conditional-write support once, at startup, and learns how the
    /// server answers `If-Match` on a missing key.
    pub(super) async fn probe(&self) -> StoreResult<MissingOnMatch> {
        let desc = self.describe();
        // A ListObjectsV2 under the store's own prefix (not HeadBucket): IAM authorises it
        // as s3:ListBucket with an s3:prefix, so a policy can limit listing to the prefix.
        let listed = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&self.prefix)
            .max_keys(1)
            .send()
            .await;
        if let Err(err) = listed {
            let status = err.raw_response().map(|r| r.status().as_u16());
            let msg = match (status, err.code()) {
                (Some(404), _) | (_, Some("NoSuchBucket")) => format!(
                    "S3 store {desc}: bucket {:?} does not exist (ListObjectsV2 404)",
                    self.bucket
                ),
                (Some(403), _) => format!(
                    "S3 store {desc}: access to bucket {:?} denied (ListObjectsV2 403): the \
                     credentials are invalid or lack permission",
                    self.bucket
                ),
                (Some(301), _) | (Some(400), _) => {
                    let actual = err
                        .raw_response()
                        .and_then(|r| r.headers().get("x-amz-bucket-region"))
                        .unwrap_or("unknown");
                    format!(
                        "S3 store {desc}: bucket {:?} is not in region {} (it is in {actual}); \
                         set AWS_REGION (ListObjectsV2 {})",
                        self.bucket,
                        self.region,
                        status.unwrap_or_default()
                    )
                }
                _ => format!(
                    "S3 store {desc}: ListObjectsV2 on {:?} failed: {}",
                    self.bucket,
                    map_err("ListObjectsV2", &self.bucket, err)
                ),
            };
            return Err(StoreError::other(msg));
        }

        let key = format!("{PROBE_DIR}/{}", uuid::Uuid::new_v4());
        let result = self.probe_conditional_writes(&key).await;
        // Best effort: a leftover probe object is harmless, so a failed delete is ignored.
        let _ = self.delete(&key).await;
        result.map_err(|why| {
            StoreError::other(format!(
                "S3 store {desc}: conditional writes are not supported: {why} (Narad needs \
                 If-None-Match: * and If-Match on PutObject)"
            ))
        })
    }

    /// The conditional-write part of the probe. Returns why it failed.
    async fn probe_conditional_writes(&self, key: &str) -> Result<MissingOnMatch, String> {
        let data = Bytes::from_static(b"narad startup probe");
        let full = self.full_key(key);
        self.put_if_absent(key, data.clone())
            .await
            .map_err(|e| format!("creating {full:?} with If-None-Match: * failed: {e}"))?;
        match self.put_if_absent(key, data.clone()).await {
            Err(StoreError::Conflict) => {}
            Ok(_) => {
                return Err(format!(
                "a second If-None-Match: * PUT of {full:?} succeeded instead of failing with 412"
            ))
            }
            Err(e) => {
                return Err(format!(
                    "a second If-None-Match: * PUT of {full:?} failed with {e} instead of 412"
                ))
            }
        }
        match self
            .put_if_match(key, data, &ETag::new("\"narad-probe-wrong-etag\""))
            .await
        {
            Err(StoreError::Conflict) => {}
            Ok(_) => {
                return Err(format!(
                "an If-Match PUT of {full:?} with a wrong ETag succeeded instead of failing with 412"
            ))
            }
            Err(e) => {
                return Err(format!(
                    "an If-Match PUT of {full:?} with a wrong ETag failed with {e} instead of 412"
                ))
            }
        }
        let missing = format!("{key}-missing");
        let full_missing = self.full_key(&missing);
        let answer = self
            .put_once(
                &missing,
                Bytes::from_static(b"x"),
                Condition::Matches(&ETag::new("\"narad-probe\"")),
            )
            .await;
        match answer {
            Err(StoreError::NotFound) => Ok(MissingOnMatch::NotFound),
            Err(StoreError::Conflict) => Ok(MissingOnMatch::PreconditionFailed),
            Ok(_) => {
                let _ = self.delete(&missing).await;
                Err(format!(
                    "an If-Match PUT of the missing key {full_missing:?} created it instead of \
                     failing with 404 or 412"
                ))
            }
            Err(e) => Err(format!(
                "an If-Match PUT of the missing key {full_missing:?} failed with {e} instead of \
                 404 or 412"
            )),
        }
    }
}
