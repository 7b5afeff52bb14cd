//! How a stored payload appears in a JSON response (the seed's payload rule).
//!
//! * Bytes that parse as exactly one JSON value nested at most [`MAX_EMBEDDED_DEPTH`]
//!   deep are embedded verbatim: the raw text is copied, never re-serialised, so `1.0`,
//!   key order, numbers beyond 2^64 and inner whitespace survive byte for byte
//!   (whitespace around the value is not part of it). Deeper JSON would make common
//!   parsers (Python's `json`, jq) fail on the whole response, so it is treated as text.
//! * Other valid UTF-8 becomes a JSON string, unless escaping would make it more than
//!   [`MAX_STRING_GROWTH`] times longer (control characters escape to six bytes each).
//! * Anything else is base64 (standard alphabet, padded) and flagged with
//!   `"payload_encoding": "base64"`.
//!
//! So a payload never grows by more than half when rendered (base64 grows by a third).

use base64::Engine;
use serde_json::value::RawValue;

/// Deepest nesting of arrays and objects embedded verbatim.
pub(crate) const MAX_EMBEDDED_DEPTH: usize = 64;

/// Most a text payload may grow by JSON string escaping before base64 is used instead.
pub(crate) const MAX_STRING_GROWTH: f64 = 1.5;

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
        if nesting_depth(text) <= MAX_EMBEDDED_DEPTH {
            if let Ok(raw) = serde_json::from_str::<Box<RawValue>>(text) {
                return RenderedPayload {
                    json: raw,
                    encoding: None,
                };
            }
        }
        if let Some(json) = quoted(text) {
            if json.get().len() as f64 <= text.len() as f64 * MAX_STRING_GROWTH + 2.0 {
                return RenderedPayload {
                    json,
                    encoding: None,
                };
            }
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

/// The deepest nesting of `[`/`{` in `text`, outside JSON strings (a bound for any text:
/// it need not be JSON).
fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
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

    #[test]
    fn deep_json_is_text_and_parses_anywhere() {
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_EMBEDDED_DEPTH),
            "]".repeat(MAX_EMBEDDED_DEPTH)
        );
        assert_eq!(render(ok.as_bytes()).json.get(), ok);
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let r = render(deep.as_bytes());
        assert!(r.encoding.is_none());
        assert!(r.json.get().starts_with("\"[[["), "rendered as a string");
        // Brackets inside strings do not count.
        let s = format!("{{\"a\":\"{}\"}}", "[".repeat(1000));
        assert_eq!(render(s.as_bytes()).json.get(), s);
    }

    #[test]
    fn escaping_never_grows_a_payload_by_more_than_half() {
        let control = vec![1u8; 1000];
        let r = render(&control);
        assert_eq!(r.encoding, Some("base64"));
        assert!(r.json.get().len() <= 1000 * 4 / 3 + 6);
        let text = "line one\nline \"two\"\n".repeat(50);
        let r = render(text.as_bytes());
        assert!(r.encoding.is_none());
        for len in [1usize, 10, 1000] {
            for bytes in [
                vec![0u8; len],
                vec![b'"'; len],
                vec![0xffu8; len],
                "é".repeat(len).into_bytes(),
            ] {
                let r = render(&bytes);
                assert!(
                    r.json.get().len() as f64 <= bytes.len() as f64 * 1.5 + 6.0,
                    "{len}"
                );
            }
        }
    }
}
