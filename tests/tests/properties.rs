//! Property tests for every parser of untrusted input (docs/security.md): whatever the bytes,
//! they never panic, and what they accept round-trips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use narad_shared::http::render;
use narad_shared::http::{basic_credentials, parse_wait};
use narad_shared::http::{parse_ack_batch, parse_produce_batch};
use narad_shared::settings::SettingsInput;
use narad_shared::stored::{Claims, ReceiptError, Receipts};
use proptest::prelude::*;

fn receipts() -> Receipts {
    Receipts::new(vec![b"property-test-key-0123456789".to_vec()]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn receipt_handles_never_panic(handle in ".{0,1200}", topic in "[a-z]{1,8}") {
        let r = receipts().verify(&handle, &topic);
        prop_assert!(r.is_err(), "an arbitrary string is never a valid handle");
    }

    #[test]
    fn receipt_handles_shaped_like_ours_never_panic(
        body in "[A-Za-z0-9_-]{0,200}", tag in "[A-Za-z0-9_-]{0,60}", topic in "[a-z]{1,8}",
    ) {
        let r = receipts().verify(&format!("v1.{body}.{tag}"), &topic);
        prop_assert!(matches!(r, Err(ReceiptError::Malformed) | Err(ReceiptError::Invalid)));
    }

    #[test]
    fn signed_claims_verify_and_any_change_does_not(
        topic in "[A-Za-z0-9._-]{1,40}", partition in any::<u32>(), offset in any::<u64>(),
        lease_id in any::<u64>(), incarnation in "[0-9a-f]{12}", flip in 0usize..200,
    ) {
        let claims = Claims { topic: topic.clone(), incarnation, partition, offset, lease_id, subscription: None };
        let r = receipts();
        let handle = r.sign(&claims);
        prop_assert_eq!(r.verify(&handle, &topic).unwrap(), claims);
        // One changed character anywhere after the version is never accepted.
        let mut bytes = handle.into_bytes();
        let i = 3 + flip % (bytes.len() - 3);
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(bytes).unwrap();
        prop_assert!(r.verify(&changed, &topic).is_err());
    }

    #[test]
    fn wait_never_panics_and_bare_numbers_are_seconds(v in ".{0,40}", n in 0u64..100_000) {
        let _ = parse_wait(&v);
        let d = parse_wait(&n.to_string()).unwrap();
        prop_assert_eq!(d.as_secs(), n.min(3600));
    }

    #[test]
    fn settings_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = SettingsInput::parse(&body);
    }

    #[test]
    fn settings_shaped_json_never_panics(
        key in "[a-z_]{1,30}", value in prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| format!("{f:?}")),
            "\"[a-z]{0,20}\"".prop_map(|s| s),
            Just("null".to_owned()), Just("[]".to_owned()), Just("{}".to_owned()),
        ],
    ) {
        let _ = SettingsInput::parse(format!(r#"{{"{key}":{value}}}"#).as_bytes());
    }

    #[test]
    fn rendered_payloads_parse_round_trip_and_stay_small(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..400),
            "[\\[\\]{}\":,a-z0-9 \\\\]{0,400}".prop_map(String::into_bytes),
            proptest::collection::vec(prop_oneof![Just(b'['), Just(b']')], 0..400),
        ],
    ) {
        prop_assume!(!bytes.is_empty());
        let r = render(&bytes);
        let text = r.json.get();
        prop_assert!(text.len() as f64 <= bytes.len() as f64 * 1.5 + 6.0, "{} -> {}", bytes.len(), text.len());
        // Inside a consume response (three levels deep) it parses with serde_json's limit.
        let wrapped = format!(r#"{{"messages":[{{"payload":{text}}}]}}"#);
        let v: serde_json::Value = serde_json::from_str(&wrapped).unwrap();
        let p = &v["messages"][0]["payload"];
        let ok = match r.encoding {
            Some(_) => {
                let s = p.as_str().unwrap();
                base64::engine::general_purpose::STANDARD.decode(s).unwrap() == bytes
            }
            // Embedded verbatim (without surrounding whitespace), or text as a string.
            None => {
                let trimmed = std::str::from_utf8(&bytes)
                    .map(|t| t.trim_matches([' ', '\t', '\n', '\r']));
                trimmed == Ok(text) || p.as_str().map(str::as_bytes) == Some(&bytes[..])
            }
        };
        prop_assert!(ok, "{:?} came back as {}", bytes, text);
    }

    #[test]
    fn batch_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_produce_batch(&body);
        let _ = parse_ack_batch(&body, None);
    }

    #[test]
    fn produce_batches_round_trip(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..50), 1..20),
        key in proptest::option::of("[a-z]{1,10}"),
    ) {
        let messages: Vec<serde_json::Value> = payloads
            .iter()
            .map(|p| serde_json::json!({
                "payload": base64::engine::general_purpose::STANDARD.encode(p),
                "payload_encoding": "base64",
                "key": key,
            }))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({ "messages": messages })).unwrap();
        let got = parse_produce_batch(&body).unwrap();
        prop_assert_eq!(got.len(), payloads.len());
        for (m, p) in got.iter().zip(&payloads) {
            prop_assert_eq!(&m.payload[..], &p[..]);
            prop_assert_eq!(&m.key, &key);
        }
    }

    #[test]
    fn ack_batches_take_true_zero_or_a_duration(
        handles in proptest::collection::vec("[a-zA-Z0-9._-]{1,40}", 1..30),
        extend in prop_oneof![
            Just("true"), Just("0"), Just("1"), Just("\"30s\""), Just("false"), Just("\"13h\""),
            Just("\"soon\""), Just("\"true\""), Just("null"), Just("-1"),
        ],
    ) {
        let body = format!(r#"{{"receipt_handles":{},"extend":{extend}}}"#, serde_json::to_string(&handles).unwrap());
        let r = parse_ack_batch(body.as_bytes(), None);
        match extend {
            // null is the same as no extend: ack. A number is seconds (retry later).
            "true" | "0" | "1" | "\"30s\"" | "\"true\"" | "null" => {
                prop_assert_eq!(r.unwrap().len(), handles.len())
            }
            _ => prop_assert!(r.is_err()),
        }
    }

    #[test]
    fn basic_credentials_never_panic_and_round_trip(
        header in ".{0,200}", user in "[^:]{0,30}", pass in ".{0,30}",
    ) {
        let _ = basic_credentials(&header);
        let h = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")));
        prop_assert_eq!(basic_credentials(&h), Some((user, pass)));
    }
}
