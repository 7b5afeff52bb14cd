//! Receipt handles: signed proof that a consumer holds a lease.
//!
//! A handle is `v1.{claims}.{mac}`, both parts unpadded base64url. The claims are a
//! small JSON object naming the signing key id, topic, the topic's incarnation (a tag of
//! it: a handle of a deleted topic is no good for a new topic of the same name),
//! partition, offset and lease id;
//! the MAC is HMAC-SHA256 over `narad-receipt-v1.{claims}` with the key the id names.
//! A lease of a subscription other than the default one gets a `v2` handle: its claims
//! also name the subscription and a tag of its id, and its MAC is over
//! `narad-receipt-v2.{claims}` (fleet level 5: builds before it answer such a handle 503
//! `upgrade_required`).
//! Several keys may be configured: the first signs, all verify, so keys can rotate.
//!
//! [`Receipts::verify`] runs before any storage call. A handle that does not parse is
//! [`ReceiptError::Malformed`] (HTTP 400); one with an unknown key id, a bad MAC or
//! another topic's name is [`ReceiptError::Invalid`] (HTTP 410, like any handle that is
//! no longer yours). Users treat handles as opaque.

use std::convert::Infallible;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cas::{CasError, Cell, Decision, JsonRecord, Pure};
use crate::clock::IdSource;
use crate::keys;
use crate::store::Store;

type HmacSha256 = Hmac<Sha256>;

const DOMAIN_V1: &[u8] = b"narad-receipt-v1.";
const DOMAIN_V2: &[u8] = b"narad-receipt-v2.";
/// The newest handle version this build reads.
const NEWEST_HANDLE: u32 = 2;
/// Handles longer than this are refused without further work.
const MAX_HANDLE_LEN: usize = 1024;

/// What a receipt handle proves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Topic name.
    #[serde(rename = "t")]
    pub topic: String,
    /// [`incarnation_tag`] of the topic incarnation the lease was granted in; empty in
    /// handles signed before it was added (those are checked without it).
    #[serde(rename = "i", default, skip_serializing_if = "String::is_empty")]
    pub incarnation: String,
    /// Partition.
    #[serde(rename = "p")]
    pub partition: u32,
    /// Offset of the message.
    #[serde(rename = "o")]
    pub offset: u64,
    /// The lease id (manifest version that granted the lease).
    #[serde(rename = "l")]
    pub lease_id: u64,
    /// The subscription the lease belongs to (`v2` handles); `None`: the topic's default.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub subscription: Option<SubscriptionClaim>,
}

/// Which subscription a lease belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionClaim {
    /// Its name.
    #[serde(rename = "n")]
    pub name: String,
    /// [`incarnation_tag`] of its id: a handle of a deleted subscription is no good for a
    /// new one of the same name.
    #[serde(rename = "i")]
    pub tag: String,
}

#[derive(Serialize, Deserialize)]
struct Signed {
    k: String,
    #[serde(flatten)]
    claims: Claims,
}

/// A handle that cannot be accepted.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum ReceiptError {
    /// Not a receipt handle at all.
    #[error("malformed receipt handle")]
    Malformed,
    /// Well formed, but not signed by a current key or not for this topic.
    #[error("receipt handle is not valid for this topic")]
    Invalid,
    /// A handle of a newer version than this build reads (`v2.` and up), signed by a
    /// newer build: for a newer build to check.
    #[error("receipt handle version {0} is newer than this build of Narad reads (2)")]
    Newer(u32),
}

/// The signing keys. The first signs; every one verifies.
#[derive(Clone)]
pub struct Receipts {
    keys: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Receipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("Receipts").field("key_ids", &ids).finish()
    }
}

/// A short tag of a topic incarnation for receipt claims: 12 hex digits of a hash (ids
/// created in the same millisecond share their first digits, so they are not used as is).
pub(crate) fn incarnation_tag(incarnation: &str) -> String {
    let d = Sha256::new()
        .chain_update(b"narad-incarnation")
        .chain_update(incarnation.as_bytes())
        .finalize();
    d[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of a key: 8 hex digits of a hash, safe to show.
pub(crate) fn key_id(key: &[u8]) -> String {
    let d = Sha256::new()
        .chain_update(b"narad-key-id")
        .chain_update(key)
        .finalize();
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}

impl Receipts {
    /// Keys in order of preference; `None` when the list is empty.
    pub fn new(keys: Vec<Vec<u8>>) -> Option<Self> {
        if keys.is_empty() {
            return None;
        }
        Some(Self {
            keys: keys.into_iter().map(|k| (key_id(&k), k)).collect(),
        })
    }

    fn mac(key: &[u8], version: u32, claims_b64: &str) -> HmacSha256 {
        // HMAC accepts keys of any length; this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
        mac.update(if version == 1 { DOMAIN_V1 } else { DOMAIN_V2 });
        mac.update(claims_b64.as_bytes());
        mac
    }

    /// Signs `claims` with the current key: a `v1` handle for the default subscription,
    /// `v2` for another.
    pub fn sign(&self, claims: &Claims) -> String {
        let version = if claims.subscription.is_some() { 2 } else { 1 };
        let (kid, key) = &self.keys[0];
        let signed = Signed {
            k: kid.clone(),
            claims: claims.clone(),
        };
        let json = serde_json::to_vec(&signed).unwrap_or_default();
        let body = B64.encode(json);
        let tag = Self::mac(key, version, &body).finalize().into_bytes();
        format!("v{version}.{body}.{}", B64.encode(tag))
    }

    /// Checks `handle` and that it names `topic`; returns its claims.
    ///
    /// Errors: [`ReceiptError::Malformed`] when it does not parse;
    /// [`ReceiptError::Invalid`] for an unknown key, a bad MAC or another topic.
    pub fn verify(&self, handle: &str, topic: &str) -> Result<Claims, ReceiptError> {
        if handle.len() > MAX_HANDLE_LEN {
            return Err(ReceiptError::Malformed);
        }
        let mut parts = handle.split('.');
        let (Some(version), Some(body), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ReceiptError::Malformed);
        };
        let version = match handle_version(version) {
            Some(v @ 1..=NEWEST_HANDLE) => v,
            Some(v) if v > NEWEST_HANDLE => return Err(ReceiptError::Newer(v)),
            _ => return Err(ReceiptError::Malformed),
        };
        let json = B64.decode(body).map_err(|_| ReceiptError::Malformed)?;
        let tag = B64.decode(tag).map_err(|_| ReceiptError::Malformed)?;
        let signed: Signed = serde_json::from_slice(&json).map_err(|_| ReceiptError::Malformed)?;
        let (_, key) = self
            .keys
            .iter()
            .find(|(id, _)| *id == signed.k)
            .ok_or(ReceiptError::Invalid)?;
        Self::mac(key, version, body)
            .verify_slice(&tag)
            .map_err(|_| ReceiptError::Invalid)?;
        // Signed, so a version and its claims agree unless a key signed both kinds
        // wrongly; checked all the same.
        if signed.claims.topic != topic || signed.claims.subscription.is_some() != (version == 2) {
            return Err(ReceiptError::Invalid);
        }
        Ok(signed.claims)
    }
}

/// The version of a handle's first part: `v1` → 1; `None` unless `v` and 1 to 4 digits
/// without a leading zero.
fn handle_version(part: &str) -> Option<u32> {
    let digits = part.strip_prefix('v')?;
    let plain = (1..=4).contains(&digits.len())
        && !digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| digits.parse().ok()).flatten()
}

/// The version of the stored key record this build reads and writes.
const KEY_FORMAT: u32 = 1;

/// The stored form of the generated key, `system/receipt-key.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredKey {
    key_b64: String,
    /// [`KEY_FORMAT`]; records without it (every one this build writes) are format 1.
    #[serde(default = "key_format_1", skip_serializing_if = "is_key_format_1")]
    format: u32,
}

fn key_format_1() -> u32 {
    KEY_FORMAT
}

fn is_key_format_1(f: &u32) -> bool {
    *f == KEY_FORMAT
}

impl JsonRecord for StoredKey {
    fn newer(&self) -> Option<crate::formats::Newer> {
        crate::formats::Newer::check("receipt key format", self.format.into(), KEY_FORMAT.into())
    }
}

/// The receipt key shared by every process on `store` when none is configured: read it,
/// or create it (put-if-absent) if no process has yet. Every process then accepts the
/// others' handles.
///
/// Errors: the store's failure, or a stored key that does not decode.
pub async fn shared_key(
    store: &dyn Store,
    ids: &dyn IdSource,
) -> Result<Vec<u8>, CasError<Infallible>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut fresh = vec![0u8; 32];
    rand::thread_rng().fill_bytes(&mut fresh);
    let cell = Cell::<Option<StoredKey>>::new(store, ids, keys::RECEIPT_KEY, &());
    let (stored, _) = cell
        .update(Pure(|cur: &mut Option<StoredKey>| {
            Ok(match cur {
                Some(k) => Decision::Keep(k.key_b64.clone()),
                None => {
                    let key_b64 = b64.encode(&fresh);
                    *cur = Some(StoredKey {
                        key_b64: key_b64.clone(),
                        format: KEY_FORMAT,
                    });
                    Decision::Commit(key_b64)
                }
            })
        }))
        .await?;
    b64.decode(stored).map_err(|e| CasError::Corrupt {
        key: keys::RECEIPT_KEY.to_owned(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            topic: "orders".into(),
            incarnation: "0123456789ab".into(),
            partition: 2,
            offset: 42,
            lease_id: 7,
            subscription: None,
        }
    }

    #[test]
    fn a_subscriptions_handle_is_v2_and_names_it() {
        let r = Receipts::new(vec![b"k".to_vec()]).unwrap();
        let sub = Claims {
            subscription: Some(SubscriptionClaim {
                name: "billing".into(),
                tag: incarnation_tag("s1"),
            }),
            ..claims()
        };
        let h = r.sign(&sub);
        assert!(h.starts_with("v2."));
        assert_eq!(r.verify(&h, "orders").unwrap(), sub);
        assert!(r.sign(&claims()).starts_with("v1."));
        // The same claims under the other version's label do not verify.
        let relabelled = format!("v1.{}", h.strip_prefix("v2.").unwrap());
        assert_eq!(r.verify(&relabelled, "orders"), Err(ReceiptError::Invalid));
        let v1 = r.sign(&claims());
        let relabelled = format!("v2.{}", v1.strip_prefix("v1.").unwrap());
        assert_eq!(r.verify(&relabelled, "orders"), Err(ReceiptError::Invalid));
    }

    #[test]
    fn sign_verify_and_rotate() {
        let old = Receipts::new(vec![b"old-key".to_vec()]).unwrap();
        let h = old.sign(&claims());
        assert_eq!(old.verify(&h, "orders").unwrap(), claims());
        let rotated = Receipts::new(vec![b"new-key".to_vec(), b"old-key".to_vec()]).unwrap();
        assert_eq!(rotated.verify(&h, "orders").unwrap(), claims());
        let other = Receipts::new(vec![b"new-key".to_vec()]).unwrap();
        assert_eq!(other.verify(&h, "orders"), Err(ReceiptError::Invalid));
    }

    #[test]
    fn tampering_and_other_topics() {
        let r = Receipts::new(vec![b"k".to_vec()]).unwrap();
        let h = r.sign(&claims());
        assert_eq!(r.verify(&h, "payments"), Err(ReceiptError::Invalid));
        let mut forged = claims();
        forged.offset = 43;
        let body = B64.encode(
            serde_json::to_vec(&Signed {
                k: key_id(b"k"),
                claims: forged,
            })
            .unwrap(),
        );
        let tag = h.rsplit('.').next().unwrap();
        assert_eq!(
            r.verify(&format!("v1.{body}.{tag}"), "orders"),
            Err(ReceiptError::Invalid)
        );
        for bad in [
            "",
            "v1",
            "v1.a.b.c",
            "v0.x.y",
            "v01.x.y",
            "v.x.y",
            "vx.x.y",
            "v2.x",
            "v1.!!!.abc",
            &"a".repeat(5000),
        ] {
            assert_eq!(
                r.verify(bad, "orders"),
                Err(ReceiptError::Malformed),
                "{bad}"
            );
        }
        // A newer build's handle is for a newer build to check, not malformed.
        assert_eq!(r.verify("v3.x.y", "orders"), Err(ReceiptError::Newer(3)));
        assert_eq!(r.verify("v17.x.y", "orders"), Err(ReceiptError::Newer(17)));
    }

    #[test]
    fn the_key_record_is_written_as_every_build_reads_it_and_a_newer_one_is_newer() {
        let k = StoredKey {
            key_b64: "a2V5".into(),
            format: KEY_FORMAT,
        };
        assert_eq!(serde_json::to_string(&k).unwrap(), r#"{"key_b64":"a2V5"}"#);
        let old: StoredKey = serde_json::from_str(r#"{"key_b64":"a2V5"}"#).unwrap();
        assert!(old.newer().is_none());
        let newer: StoredKey = serde_json::from_str(r#"{"key_b64":"a2V5","format":2}"#).unwrap();
        assert_eq!(newer.newer().map(|n| n.found), Some(2));
    }
}
