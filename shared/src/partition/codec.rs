//! The encoding of Narad's immutable binary objects other than segments (index objects,
//! idempotency-key chunks): four magic bytes, a postcard body, and a big-endian CRC-32 of
//! the body, checked on every read.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes `value` under `magic`.
///
/// Errors: a description of why it cannot be encoded (a bug).
pub fn seal<T: Serialize>(magic: &[u8; 4], value: &T) -> Result<Bytes, String> {
    let body = postcard::to_allocvec(value).map_err(|e| e.to_string())?;
    let mut out = magic.to_vec();
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    Ok(Bytes::from(out))
}

/// Decodes bytes written by [`seal`] with the same `magic`.
///
/// Errors: a bad magic, a checksum mismatch, or a body that does not decode.
pub fn open<T: DeserializeOwned>(magic: &[u8; 4], data: &[u8]) -> Result<T, String> {
    let rest = data.strip_prefix(magic.as_slice()).ok_or("bad magic")?;
    let split = rest.len().checked_sub(4).ok_or("truncated")?;
    let (body, crc) = rest.split_at(split);
    let mut want = [0u8; 4];
    want.copy_from_slice(crc);
    if crc32fast::hash(body) != u32::from_be_bytes(want) {
        return Err("checksum mismatch".into());
    }
    postcard::from_bytes(body).map_err(|e| e.to_string())
}
