//! The store URL: `s3://BUCKET[/PREFIX]` parsed, and endpoints shown without secrets.

use crate::store::{StoreError, StoreResult};

/// Splits `BUCKET[/PREFIX]` into the bucket and the prefix (empty, or ending in one `/`).
pub(super) fn parse_location(rest: &str) -> StoreResult<(String, String)> {
    let (bucket, prefix) = match rest.split_once('/') {
        Some((b, p)) => (b, p.trim_matches('/')),
        None => (rest, ""),
    };
    if bucket.is_empty() {
        return Err(StoreError::other(format!(
            "S3 store URL s3://{rest} names no bucket: expected s3://BUCKET[/PREFIX]"
        )));
    }
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    Ok((bucket.to_string(), prefix))
}

/// `scheme://user:pass@host/...` → `scheme://host/...`, so `describe` never shows secrets.
pub(super) fn strip_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    match scheme {
        Some(s) => format!("{s}://{rest}"),
        None => rest.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_bucket_and_prefix() {
        let p = |s| parse_location(s).unwrap();
        assert_eq!(p("b"), ("b".to_string(), String::new()));
        assert_eq!(p("b/"), ("b".to_string(), String::new()));
        assert_eq!(p("b/x"), ("b".to_string(), "x/".to_string()));
        assert_eq!(p("b/x/y/"), ("b".to_string(), "x/y/".to_string()));
        assert!(matches!(parse_location(""), Err(StoreError::Other(_))));
        assert!(matches!(parse_location("/x"), Err(StoreError::Other(_))));
    }

    #[test]
    fn describe_hides_userinfo() {
        assert_eq!(
            strip_userinfo("http://127.0.0.1:4566"),
            "http://127.0.0.1:4566"
        );
        assert_eq!(
            strip_userinfo("https://u:secret@host:9000/p"),
            "https://host:9000/p"
        );
        assert_eq!(strip_userinfo("host/a@b"), "host/a@b");
    }
}
