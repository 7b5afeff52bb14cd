//! How a stored payload appears in a JSON response (the seed's payload rule).
//!
//! * Bytes that parse as exactly one JSON value are embedded verbatim: the raw text is
//!   copied, never re-serialised, so `1.0`, key order, numbers beyond 2^64 and inner
//!   whitespace survive byte for byte (whitespace around the value is not part of it).
//! * Other valid UTF-8 becomes a JSON string.
//! * Anything else is base64 (standard alphabet, padded) and flagged with
//!   `"payload_encoding": "base64"`.

use base64::Engine;
use serde_json::value::RawValue;

/// A payload ready to embed in a response.
#[derive(Debug)]
pub struct RenderedPayload {
    /// The JSON text for the `payload` field.
    pub json: Box<RawValue>,
    /// `Some("base64")` when the payload had to be wrapped.
    pub encoding: Option<&'static str>,
}

/// Renders raw payload bytes by the rule in the module documentation.
pub fn render(bytes: &[u8]) -> RenderedPayload {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(raw) = serde_json::from_str::<Box<RawValue>>(text) {
            return RenderedPayload {
                json: raw,
                encoding: None,
            };
        }
        if let Some(json) = quoted(text) {
            return RenderedPayload {
                json,
                encoding: None,
            };
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    match quoted(&b64) {
        Some(json) => RenderedPayload {
            json,
            encoding: Some("base64"),
        },
        // A base64 string always serialises; this arm is unreachable in practice.
        None => RenderedPayload {
            json: RawValue::NULL.to_owned(),
            encoding: Some("base64"),
        },
    }
}

fn quoted(s: &str) -> Option<Box<RawValue>> {
    serde_json::to_string(s)
        .ok()
        .and_then(|q| RawValue::from_string(q).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_verbatim() {
        for s in [
            r#"{"b":1.0,"a":[1, 2]}"#,
            "123456789012345678901234567890",
            "1.0",
            r#""hi""#,
            "[ ]",
            "null",
        ] {
            let r = render(s.as_bytes());
            assert_eq!(r.json.get(), s);
            assert!(r.encoding.is_none());
        }
        assert_eq!(render(b"  {\"a\":1}\n").json.get(), "{\"a\":1}");
    }

    #[test]
    fn text_and_binary() {
        let r = render(b"hello world");
        assert_eq!(r.json.get(), "\"hello world\"");
        assert!(r.encoding.is_none());
        let r = render(b"{\"a\":1} trailing");
        assert_eq!(r.json.get(), "\"{\\\"a\\\":1} trailing\"");
        let r = render(&[0xff, 0x00, 0x10]);
        assert_eq!(r.json.get(), "\"/wAQ\"");
        assert_eq!(r.encoding, Some("base64"));
    }
}
