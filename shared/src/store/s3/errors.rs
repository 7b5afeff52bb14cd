//! The one place S3 errors are classified ([`map_err`], the table in the module
//! documentation of [`super`]) and ETags are read ([`etag_of`]).

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::store::{ETag, Failure, StoreError, StoreResult};

/// The one place ETags are read: verbatim, quotes and all, as S3 sent them.
pub(super) fn etag_of(op: &str, key: &str, etag: Option<&str>) -> StoreResult<ETag> {
    match etag {
        Some(e) if !e.is_empty() => Ok(ETag::new(e)),
        _ => Err(StoreError::other(format!(
            "{op} {key}: response has no ETag"
        ))),
    }
}

/// Whether a failed body read failed the SDK's response checksum check (the stored bytes
/// do not match their stored checksum; S3 itself never serves such an object, but an
/// emulator interrupted mid-write may: localstack/README.md).
pub(super) fn is_checksum_mismatch(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(f) if f.message().contains("checksum mismatch"))
}

/// Classifies every S3 error (see the table in the module documentation). The SDK error
/// is kept as the source of the returned [`Failure`].
pub(super) fn map_err<E>(op: &str, key: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    enum Class {
        Conflict,
        NotFound,
        Unavailable,
        Other,
    }
    let mut message = format!("{op} {key}: {}", DisplayErrorContext(&err));
    let class = match &err {
        SdkError::ConstructionFailure(_) => Class::Other,
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => Class::Unavailable,
        SdkError::DispatchFailure(f) if f.is_user() => Class::Other,
        SdkError::DispatchFailure(_) => Class::Unavailable,
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            match (status, err.code()) {
                (_, Some("NoSuchBucket")) => {
                    message = format!(
                        "{op} {key}: the bucket does not exist: {}",
                        DisplayErrorContext(&err)
                    );
                    Class::Other
                }
                (412, _) | (_, Some("PreconditionFailed")) => Class::Conflict,
                (409, _) | (_, Some("ConditionalRequestConflict")) => Class::Conflict,
                (404, _) | (_, Some("NoSuchKey")) => Class::NotFound,
                // Permanent: the server does not implement what was asked (e.g. a condition).
                (501, _) | (_, Some("NotImplemented")) => {
                    message.push_str(&format!(" (HTTP {status})"));
                    Class::Other
                }
                (500..=599, _) | (429, _) => Class::Unavailable,
                (
                    _,
                    Some(
                        "SlowDown"
                        | "RequestTimeout"
                        | "InternalError"
                        | "ServiceUnavailable"
                        | "Throttling"
                        | "ThrottlingException"
                        | "RequestLimitExceeded"
                        | "TooManyRequestsException",
                    ),
                ) => Class::Unavailable,
                _ => {
                    message.push_str(&format!(" (HTTP {status})"));
                    Class::Other
                }
            }
        }
        _ => Class::Other,
    };
    match class {
        Class::Conflict => StoreError::Conflict,
        Class::NotFound => StoreError::NotFound,
        Class::Unavailable => StoreError::Unavailable(Failure::caused_by(message, err)),
        Class::Other => StoreError::Other(Failure::caused_by(message, err)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn service_err(
        status: u16,
        code: &str,
    ) -> SdkError<aws_sdk_s3::operation::put_object::PutObjectError, HttpResponse> {
        use aws_sdk_s3::error::ErrorMetadata;
        use aws_sdk_s3::operation::put_object::PutObjectError;
        use aws_sdk_s3::primitives::SdkBody;
        let mut meta = ErrorMetadata::builder();
        if !code.is_empty() {
            meta = meta.code(code);
        }
        let raw = HttpResponse::new(status.try_into().unwrap(), SdkBody::empty());
        SdkError::service_error(PutObjectError::generic(meta.build()), raw)
    }

    #[test]
    fn maps_errors() {
        let m = |status, code| map_err("PutObject", "k", service_err(status, code));
        assert!(matches!(m(412, "PreconditionFailed"), StoreError::Conflict));
        assert!(matches!(
            m(409, "ConditionalRequestConflict"),
            StoreError::Conflict
        ));
        assert!(matches!(m(404, "NoSuchKey"), StoreError::NotFound));
        assert!(matches!(m(404, ""), StoreError::NotFound));
        assert!(matches!(m(404, "NoSuchBucket"), StoreError::Other(_)));
        assert!(matches!(m(503, "SlowDown"), StoreError::Unavailable(_)));
        assert!(matches!(
            m(500, "InternalError"),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(m(502, ""), StoreError::Unavailable(_)));
        assert!(matches!(
            m(400, "RequestTimeout"),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(m(403, "AccessDenied"), StoreError::Other(_)));
        assert!(matches!(m(501, "NotImplemented"), StoreError::Other(_)));
        let timeout: SdkError<aws_sdk_s3::operation::put_object::PutObjectError, HttpResponse> =
            SdkError::timeout_error("slow");
        assert!(matches!(
            map_err("PutObject", "k", timeout),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn etag_is_verbatim() {
        assert_eq!(
            etag_of("op", "k", Some("\"abc\"")).unwrap().as_str(),
            "\"abc\""
        );
        assert!(etag_of("op", "k", None).is_err());
    }

    #[test]
    fn a_body_checksum_mismatch_is_told_apart() {
        let mismatch = StoreError::unavailable(
            "GetObject k: reading the body failed: body checksum mismatch. expected body checksum to be 98e36520 but it was 35461ec5",
        );
        assert!(is_checksum_mismatch(&mismatch));
        assert!(!is_checksum_mismatch(&StoreError::unavailable("timed out")));
        assert!(!is_checksum_mismatch(&StoreError::Conflict));
    }
}
