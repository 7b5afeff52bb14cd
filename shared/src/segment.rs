//! Segment objects: immutable batches of messages.
//!
//! A segment is written once, with put-if-absent, before the manifest write that
//! makes its messages visible. Its encoding is the magic bytes `NSG1` followed by a
//! [postcard] encoding of [`Segment`]; each message carries a CRC-32 of its payload,
//! checked on every read. A segment does not know its offsets: the manifest maps its
//! id to a base offset, so a segment whose commit raced and retried is reused as is.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::cache::{Cache, Weigh};

const MAGIC: &[u8; 4] = b"NSG1";

/// One stored message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// When the broker accepted it, wall-clock ms.
    pub produced_at_ms: u64,
    /// The producer's key, if any.
    pub key: Option<String>,
    /// The raw payload bytes.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// CRC-32 of `payload`.
    pub crc32: u32,
}

impl StoredMessage {
    /// A message with its checksum filled in.
    pub fn new(produced_at_ms: u64, key: Option<String>, payload: Vec<u8>) -> Self {
        let crc32 = crc32fast::hash(&payload);
        Self {
            produced_at_ms,
            key,
            payload,
            crc32,
        }
    }
}

/// A decoded segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Messages in offset order.
    pub messages: Vec<StoredMessage>,
}

impl Weigh for Segment {
    fn weight(&self) -> usize {
        self.messages
            .iter()
            .map(|m| m.payload.len() + m.key.as_ref().map_or(0, String::len) + 48)
            .sum::<usize>()
            + 32
    }
}

/// Decoded segments shared by the committer (which caches what it writes) and readers,
/// bounded in bytes (`NARAD_SEGMENT_CACHE_BYTES`).
pub type SegmentCache = Cache<Segment>;

/// A segment that does not decode or whose checksum fails.
#[derive(Debug, thiserror::Error)]
#[error("corrupt segment: {0}")]
pub struct CorruptSegment(pub String);

impl Segment {
    /// The bytes to store.
    pub fn encode(&self) -> Result<Bytes, CorruptSegment> {
        let mut out = MAGIC.to_vec();
        let body = postcard::to_allocvec(self).map_err(|e| CorruptSegment(e.to_string()))?;
        out.extend_from_slice(&body);
        Ok(Bytes::from(out))
    }

    /// Decodes stored bytes and verifies every checksum.
    pub fn decode(data: &[u8]) -> Result<Self, CorruptSegment> {
        let body = data
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| CorruptSegment("bad magic".into()))?;
        let seg: Segment = postcard::from_bytes(body).map_err(|e| CorruptSegment(e.to_string()))?;
        for (i, m) in seg.messages.iter().enumerate() {
            if crc32fast::hash(&m.payload) != m.crc32 {
                return Err(CorruptSegment(format!("checksum mismatch in message {i}")));
            }
        }
        Ok(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checksum() {
        let seg = Segment {
            messages: vec![
                StoredMessage::new(1, None, b"hello".to_vec()),
                StoredMessage::new(2, Some("k".into()), vec![0, 255, 1]),
            ],
        };
        let bytes = seg.encode().unwrap();
        assert_eq!(Segment::decode(&bytes).unwrap(), seg);
        let mut bad = bytes.to_vec();
        let n = bad.len();
        bad[n - 6] ^= 0xff;
        assert!(Segment::decode(&bad).is_err());
        assert!(Segment::decode(b"nope").is_err());
    }
}
