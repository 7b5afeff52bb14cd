//! The encoding of Narad's immutable binary objects other than segments (index objects,
//! idempotency-key chunks): four magic bytes (the kind and its version,
//! [`crate::formats::Magic`]), a postcard body, and a big-endian CRC-32 of the body,
//! checked on every read.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cas::EncodeError;
use crate::formats::{Magic, Newer, Unreadable};

/// Encodes `value` under `magic`'s newest version.
///
/// Errors: why it cannot be encoded (a bug).
pub(crate) fn seal<T: Serialize>(magic: &Magic, value: &T) -> Result<Bytes, EncodeError> {
    let body = postcard::to_allocvec(value)?;
    let mut out = magic.bytes(magic.known).to_vec();
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    Ok(Bytes::from(out))
}

/// Decodes bytes written by [`seal`] with the same kind of `magic`, of a type whose first
/// field is a `u32` format: `format` names it and the newest this build reads. The format
/// is checked before the rest is decoded, so a newer body is told apart from a damaged one.
///
/// Errors: [`Unreadable::Newer`] for a newer version of the kind or a newer format;
/// [`Unreadable::Corrupt`] for a bad magic, a checksum mismatch, or a body that does not
/// decode.
pub(crate) fn open<T: DeserializeOwned>(
    magic: &Magic,
    format: (&'static str, u32),
    data: &[u8],
) -> Result<T, Unreadable> {
    let (_, rest) = magic.open(data)?;
    let corrupt = |why: &str| Unreadable::Corrupt(why.to_owned());
    let split = rest
        .len()
        .checked_sub(4)
        .ok_or_else(|| corrupt("truncated"))?;
    let (body, crc) = rest.split_at(split);
    let mut want = [0u8; 4];
    want.copy_from_slice(crc);
    if crc32fast::hash(body) != u32::from_be_bytes(want) {
        return Err(corrupt("checksum mismatch"));
    }
    let (found, _) = postcard::take_from_bytes::<u32>(body).map_err(|e| corrupt(&e.to_string()))?;
    if let Some(newer) = Newer::check(format.0, found.into(), format.1.into()) {
        return Err(Unreadable::Newer(newer));
    }
    postcard::from_bytes(body).map_err(|e| corrupt(&e.to_string()))
}
