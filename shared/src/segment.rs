//! Segment objects: immutable batches of messages.
//!
//! A segment is written once, with put-if-absent, before the manifest write that
//! makes its messages visible. Its encoding is four magic bytes followed by a
//! [postcard] encoding of [`Segment`]: `NSG1` when no message has headers (the format
//! every version reads), `NSG2` when one has (each message then carries its headers
//! after its checksum). Each message carries a CRC-32 of its payload followed by its
//! headers (name, NUL, value, NUL each; nothing for none, so `NSG1`'s CRC is the
//! payload's), checked on every read. A segment does not know its offsets: the manifest
//! maps its id to a base offset, so a segment whose commit raced and retried is reused
//! as is.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::cache::{Cache, Weigh};
use crate::formats::{Level, Magic, Unreadable};

/// Segment magics: `NSG` and the version.
const MAGIC: Magic = Magic {
    kind: b"NSG",
    what: "segment format",
    known: 4,
};
const MAGIC_V1: [u8; 4] = *b"NSG1";
const MAGIC_V2: [u8; 4] = *b"NSG2";
const MAGIC_V3: [u8; 4] = *b"NSG3";
/// The void marker: the magic alone.
const MAGIC_VOID: [u8; 4] = *b"NSG4";
/// Payload bytes below which a segment is not worth compressing.
const COMPRESS_FROM_BYTES: usize = 256;
/// The largest body an `NSG3` segment may say it holds (compaction writes at most a few
/// MiB; a larger claim is damage, and is refused before anything is allocated).
const MAX_BODY_BYTES: usize = 256 << 20;

/// A message's headers: lowercase name → value (docs/design.md §1).
pub(crate) type Headers = BTreeMap<String, String>;

/// The header a message produced with an `Idempotency-Key` is stored with, so that a
/// rebuilt partition (docs/design.md §7) remembers the keys of the messages it recovers.
/// It is the broker's own: consumers never see it ([`shown`]).
pub(crate) const IDEMPOTENCY_HEADER: &str = "narad-idempotency-key";

/// A stored message's headers as consumers see them: without [`IDEMPOTENCY_HEADER`].
pub(crate) fn shown(mut headers: Headers) -> Headers {
    headers.remove(IDEMPOTENCY_HEADER);
    headers
}

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
    /// CRC-32 of `payload` then `headers` ([`checksum`]).
    pub crc32: u32,
    /// Headers (empty for most messages).
    pub headers: Headers,
}

/// The CRC-32 a message carries: its payload, then each header as name, NUL, value, NUL.
fn checksum(payload: &[u8], headers: &Headers) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(payload);
    for (k, v) in headers {
        h.update(k.as_bytes());
        h.update(&[0]);
        h.update(v.as_bytes());
        h.update(&[0]);
    }
    h.finalize()
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
            headers: Headers::new(),
        }
    }

    /// The same message with `headers`, its checksum recomputed.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.crc32 = checksum(&self.payload, &headers);
        self.headers = headers;
        self
    }
}

/// A message as `NSG1` stores it (no headers), borrowed for encoding.
#[derive(Serialize)]
struct V1Ref<'a> {
    produced_at_ms: u64,
    key: &'a Option<String>,
    #[serde(with = "serde_bytes")]
    payload: &'a [u8],
    crc32: u32,
}

/// A message as `NSG1` stores it, decoded.
#[derive(Deserialize)]
struct V1Message {
    produced_at_ms: u64,
    key: Option<String>,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    crc32: u32,
}

/// A decoded segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Messages in offset order.
    pub messages: Vec<StoredMessage>,
    /// A void marker (`NSG4`) rather than a segment: written at the key of a segment that
    /// was written beside its manifest write and never stored, so that it never will be
    /// (docs/design.md §6); it holds no message.
    #[serde(skip)]
    pub void: bool,
}

impl Weigh for Segment {
    fn weight(&self) -> usize {
        self.messages
            .iter()
            .map(|m| {
                m.payload.len()
                    + m.key.as_ref().map_or(0, String::len)
                    + m.headers
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 32)
                        .sum::<usize>()
                    + 48
            })
            .sum::<usize>()
            + 32
    }
}

/// Decoded segments shared by the committer (which caches what it writes) and readers,
/// bounded in bytes (`NARAD_SEGMENT_CACHE_BYTES`).
pub(crate) type SegmentCache = Cache<Segment>;

/// A segment that cannot be encoded (a bug).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode a segment: {0}")]
pub struct UnencodableSegment(pub String);

impl Segment {
    /// A segment of `messages`.
    pub fn new(messages: Vec<StoredMessage>) -> Self {
        Self {
            messages,
            void: false,
        }
    }

    /// The void marker ([`Segment::void`]).
    pub fn void_marker() -> Self {
        Self {
            messages: Vec::new(),
            void: true,
        }
    }

    /// The bytes to store at fleet level `level`: `NSG1` unless a message has headers,
    /// then `NSG2`; at level 2 and up, `NSG3` (the `NSG2` body compressed) instead when
    /// the payloads reach [`COMPRESS_FROM_BYTES`] and compression saves an eighth or more.
    ///
    /// Errors: [`UnencodableSegment`] (a bug).
    pub fn encode(&self, level: Level) -> Result<Bytes, UnencodableSegment> {
        if self.void {
            return Ok(Bytes::from_static(&MAGIC_VOID));
        }
        let err = |e: postcard::Error| UnencodableSegment(e.to_string());
        let with_headers = self.messages.iter().any(|m| !m.headers.is_empty());
        let payload: usize = self.messages.iter().map(|m| m.payload.len()).sum();
        let (magic, body) = if level.compresses_segments() && payload >= COMPRESS_FROM_BYTES {
            let body = postcard::to_allocvec(self).map_err(err)?;
            let packed = lz4_flex::block::compress(&body);
            if (packed.len() + 4) * 8 <= body.len() * 7 {
                let mut out = Vec::with_capacity(8 + packed.len());
                out.extend_from_slice(&MAGIC_V3);
                out.extend_from_slice(&(body.len() as u32).to_le_bytes());
                out.extend_from_slice(&packed);
                return Ok(Bytes::from(out));
            }
            match with_headers {
                true => (MAGIC_V2, body),
                false => (MAGIC_V1, self.v1_body().map_err(err)?),
            }
        } else if with_headers {
            (MAGIC_V2, postcard::to_allocvec(self).map_err(err)?)
        } else {
            (MAGIC_V1, self.v1_body().map_err(err)?)
        };
        let mut out = Vec::with_capacity(4 + body.len());
        out.extend_from_slice(&magic);
        out.extend_from_slice(&body);
        Ok(Bytes::from(out))
    }

    /// The `NSG1` body: messages without headers.
    fn v1_body(&self) -> Result<Vec<u8>, postcard::Error> {
        let v1: Vec<V1Ref<'_>> = self
            .messages
            .iter()
            .map(|m| V1Ref {
                produced_at_ms: m.produced_at_ms,
                key: &m.key,
                payload: &m.payload,
                crc32: m.crc32,
            })
            .collect();
        postcard::to_allocvec(&(v1,))
    }

    /// Decodes stored bytes (`NSG1`, `NSG2`, `NSG3`, or the void marker `NSG4`) and
    /// verifies every checksum.
    ///
    /// Errors: [`Unreadable::Newer`] for a segment format above `NSG4`,
    /// [`Unreadable::Corrupt`] for anything that does not decode or check.
    pub fn decode(data: &[u8]) -> Result<Self, Unreadable> {
        let err = |e: postcard::Error| Unreadable::Corrupt(e.to_string());
        let seg = match MAGIC.open(data)? {
            (1, body) => {
                let (v1,): (Vec<V1Message>,) = postcard::from_bytes(body).map_err(err)?;
                Segment::new(
                    v1.into_iter()
                        .map(|m| StoredMessage {
                            produced_at_ms: m.produced_at_ms,
                            key: m.key,
                            payload: m.payload,
                            crc32: m.crc32,
                            headers: Headers::new(),
                        })
                        .collect(),
                )
            }
            (2, body) => postcard::from_bytes(body).map_err(err)?,
            (4, []) => Segment::void_marker(),
            (4, _) => return Err(Unreadable::Corrupt("a void marker with a body".into())),
            (_, packed) => postcard::from_bytes(&unpack(packed)?).map_err(err)?,
        };
        for (i, m) in seg.messages.iter().enumerate() {
            if checksum(&m.payload, &m.headers) != m.crc32 {
                return Err(Unreadable::Corrupt(format!(
                    "checksum mismatch in message {i}"
                )));
            }
        }
        Ok(seg)
    }
}

/// The body of an `NSG3` segment: a little-endian `u32` of its length, then LZ4.
fn unpack(packed: &[u8]) -> Result<Vec<u8>, Unreadable> {
    let corrupt = |why: String| Unreadable::Corrupt(why);
    let (len, block) = packed
        .split_first_chunk::<4>()
        .ok_or_else(|| corrupt("truncated".into()))?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_BODY_BYTES {
        return Err(corrupt(format!("claims a body of {len} bytes")));
    }
    let body = lz4_flex::block::decompress(block, len).map_err(|e| corrupt(e.to_string()))?;
    if body.len() != len {
        return Err(corrupt("body shorter than it claims".into()));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checksum() {
        let seg = Segment::new(vec![
            StoredMessage::new(1, None, b"hello".to_vec()),
            StoredMessage::new(2, Some("k".into()), vec![0, 255, 1]),
        ]);
        let bytes = seg.encode(Level::BEFORE_GATE).unwrap();
        assert_eq!(Segment::decode(&bytes).unwrap(), seg);
        let mut bad = bytes.to_vec();
        let n = bad.len();
        bad[n - 6] ^= 0xff;
        assert!(Segment::decode(&bad).is_err());
        assert!(Segment::decode(b"nope").is_err());
        assert_eq!(
            &bytes[..4],
            b"NSG1",
            "no headers: the format every version reads"
        );
    }

    #[test]
    fn headers_round_trip_in_nsg2_and_are_checksummed() {
        let mut h = Headers::new();
        h.insert("trace-id".into(), "abc".into());
        let seg = Segment::new(vec![
            StoredMessage::new(1, None, b"plain".to_vec()),
            StoredMessage::new(2, None, b"with".to_vec()).with_headers(h),
        ]);
        let bytes = seg.encode(Level::BEFORE_GATE).unwrap();
        assert_eq!(&bytes[..4], b"NSG2");
        assert_eq!(Segment::decode(&bytes).unwrap(), seg);
        // Damage the header value's last byte: only the checksum can tell.
        let mut bad = bytes.to_vec();
        let at = bad.windows(3).rposition(|w| w == b"abc").unwrap() + 2;
        bad[at] = b'x';
        assert!(Segment::decode(&bad).is_err());
    }

    #[test]
    fn compressed_only_from_level_2_and_only_when_it_pays() {
        let json = br#"{"order":12345,"status":"paid","items":[{"sku":"A-1","qty":2}]}"#;
        let seg = Segment::new(
            (0..20)
                .map(|i| StoredMessage::new(i, None, json.to_vec()))
                .collect(),
        );
        let before = seg.encode(Level::BEFORE_GATE).unwrap();
        assert_eq!(
            &before[..4],
            b"NSG1",
            "level 1 writes what every build reads"
        );
        let packed = seg.encode(Level(2)).unwrap();
        assert_eq!(&packed[..4], b"NSG3");
        assert!(
            packed.len() * 3 < before.len(),
            "{} vs {}",
            packed.len(),
            before.len()
        );
        assert_eq!(Segment::decode(&packed).unwrap(), seg);
        // Random payloads do not compress: written as before.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let seg = Segment::new(vec![StoredMessage::new(1, None, noise)]);
        assert_eq!(&seg.encode(Level(2)).unwrap()[..4], b"NSG1");
        // Small segments are not compressed either.
        let seg = Segment::new(vec![StoredMessage::new(
            1,
            None,
            b"aaaaaaaaaaaaaaaa".to_vec(),
        )]);
        assert_eq!(&seg.encode(Level(2)).unwrap()[..4], b"NSG1");
    }

    #[test]
    fn a_damaged_or_lying_nsg3_is_corrupt_not_a_panic() {
        let seg = Segment::new(vec![StoredMessage::new(1, None, vec![b'x'; 2000])]);
        let packed = seg.encode(Level(2)).unwrap();
        assert_eq!(&packed[..4], b"NSG3");
        let mut lying = packed.to_vec();
        lying[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Segment::decode(&lying),
            Err(Unreadable::Corrupt(_))
        ));
        let mut short = packed.to_vec();
        short[4..8].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            Segment::decode(&short),
            Err(Unreadable::Corrupt(_))
        ));
        for cut in [4, 6, 9, packed.len() - 1] {
            assert!(
                matches!(Segment::decode(&packed[..cut]), Err(Unreadable::Corrupt(_))),
                "{cut}"
            );
        }
        let mut flipped = packed.to_vec();
        let n = flipped.len();
        flipped[n - 2] ^= 0x55;
        assert!(Segment::decode(&flipped).is_err());
        match Segment::decode(b"NSG5anything") {
            Err(Unreadable::Newer(n)) => assert_eq!((n.found, n.known), (5, 4)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_void_marker_is_its_magic_alone_and_holds_no_message() {
        let marker = Segment::void_marker().encode(Level::NEWEST).unwrap();
        assert_eq!(&marker[..], b"NSG4");
        let read = Segment::decode(&marker).unwrap();
        assert!(read.void && read.messages.is_empty());
        assert!(matches!(
            Segment::decode(b"NSG4x"),
            Err(Unreadable::Corrupt(_))
        ));
        // A segment is never void, whatever it holds.
        let seg = Segment::new(vec![StoredMessage::new(1, None, b"m".to_vec())]);
        assert!(
            !Segment::decode(&seg.encode(Level::NEWEST).unwrap())
                .unwrap()
                .void
        );
    }

    #[test]
    fn the_v1_encoding_is_unchanged() {
        // Bytes written by the release before headers existed must still decode.
        let old = Segment::new(vec![StoredMessage::new(7, Some("k".into()), b"v".to_vec())]);
        let bytes = old.encode(Level::BEFORE_GATE).unwrap();
        let mut want = b"NSG1".to_vec();
        // postcard: 1 message; varint 7; Some; "k"; bytes "v"; crc32 as varint.
        want.extend_from_slice(&[1, 7, 1, 1, b'k', 1, b'v']);
        assert_eq!(&bytes[..want.len()], &want[..]);
        assert_eq!(Segment::decode(&bytes).unwrap(), old);
    }
}
