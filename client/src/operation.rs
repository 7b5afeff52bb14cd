//! The API operations the client calls, named by the operationIds of the server's OpenAPI
//! document (`GET /openapi.json`). Every request the client sends takes its method and
//! path from here, and `tests/tests/client_types.rs` checks this table against the
//! server's document both ways, so the client cannot drift from the server unnoticed.

use reqwest::Method;

/// One operation of the API, as the OpenAPI document names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET /v1/whoami`.
    Whoami,
    /// `GET /v1/topics`.
    ListTopics,
    /// `PUT /v1/topics/{topic}`.
    CreateTopic,
    /// `GET /v1/topics/{topic}`.
    GetTopic,
    /// `PATCH /v1/topics/{topic}`.
    ChangeTopic,
    /// `DELETE /v1/topics/{topic}`.
    DeleteTopic,
    /// `POST /v1/topics/{topic}/purge`.
    PurgeTopic,
    /// `POST /v1/topics/{topic}/redrive`.
    Redrive,
    /// `POST /v1/topics/{topic}/produce`.
    Produce,
    /// `POST /v1/topics/{topic}/produce-batch`.
    ProduceBatch,
    /// `GET /v1/topics/{topic}/consume` (a lease, or with `partition` and `offset` a replay).
    Consume,
    /// `POST /v1/topics/{topic}/consume`.
    ConsumeAcking,
    /// `POST /v1/topics/{topic}/ack`.
    Ack,
    /// `DELETE /v1/topics/{topic}/messages/{partition}/{offset}`.
    CancelMessage,
    /// `GET /v1/topics/{topic}/subscriptions`.
    ListSubscriptions,
    /// `PUT /v1/topics/{topic}/subscriptions/{subscription}`.
    CreateSubscription,
    /// `GET /v1/topics/{topic}/subscriptions/{subscription}`.
    GetSubscription,
    /// `PATCH /v1/topics/{topic}/subscriptions/{subscription}`.
    PatchSubscription,
    /// `DELETE /v1/topics/{topic}/subscriptions/{subscription}`.
    DeleteSubscription,
}

impl Operation {
    /// Every operation the client calls.
    pub const ALL: [Operation; 19] = [
        Self::Whoami,
        Self::ListTopics,
        Self::CreateTopic,
        Self::GetTopic,
        Self::ChangeTopic,
        Self::DeleteTopic,
        Self::PurgeTopic,
        Self::Redrive,
        Self::Produce,
        Self::ProduceBatch,
        Self::Consume,
        Self::ConsumeAcking,
        Self::Ack,
        Self::CancelMessage,
        Self::ListSubscriptions,
        Self::CreateSubscription,
        Self::GetSubscription,
        Self::PatchSubscription,
        Self::DeleteSubscription,
    ];

    /// The operationId, the method and the path template, as the document writes them.
    pub fn spec(self) -> (&'static str, Method, &'static str) {
        const TOPIC: &str = "/v1/topics/{topic}";
        const SUB: &str = "/v1/topics/{topic}/subscriptions/{subscription}";
        match self {
            Self::Whoami => ("whoami", Method::GET, "/v1/whoami"),
            Self::ListTopics => ("listTopics", Method::GET, "/v1/topics"),
            Self::CreateTopic => ("createTopic", Method::PUT, TOPIC),
            Self::GetTopic => ("getTopic", Method::GET, TOPIC),
            Self::ChangeTopic => ("changeTopic", Method::PATCH, TOPIC),
            Self::DeleteTopic => ("deleteTopic", Method::DELETE, TOPIC),
            Self::PurgeTopic => ("purgeTopic", Method::POST, "/v1/topics/{topic}/purge"),
            Self::Redrive => ("redrive", Method::POST, "/v1/topics/{topic}/redrive"),
            Self::Produce => ("produce", Method::POST, "/v1/topics/{topic}/produce"),
            Self::ProduceBatch => (
                "produceBatch",
                Method::POST,
                "/v1/topics/{topic}/produce-batch",
            ),
            Self::Consume => ("consume", Method::GET, "/v1/topics/{topic}/consume"),
            Self::ConsumeAcking => ("consumeAcking", Method::POST, "/v1/topics/{topic}/consume"),
            Self::Ack => ("ack", Method::POST, "/v1/topics/{topic}/ack"),
            Self::CancelMessage => (
                "cancelMessage",
                Method::DELETE,
                "/v1/topics/{topic}/messages/{partition}/{offset}",
            ),
            Self::ListSubscriptions => (
                "listSubscriptions",
                Method::GET,
                "/v1/topics/{topic}/subscriptions",
            ),
            Self::CreateSubscription => ("createSubscription", Method::PUT, SUB),
            Self::GetSubscription => ("getSubscription", Method::GET, SUB),
            Self::PatchSubscription => ("patchSubscription", Method::PATCH, SUB),
            Self::DeleteSubscription => ("deleteSubscription", Method::DELETE, SUB),
        }
    }

    /// The path with each `{name}` of the template replaced by the next of `params`,
    /// percent-encoded (letters, digits, `-`, `_` and `.` stay as they are). A template
    /// with more names than `params` keeps the rest as written (a 404 from the server).
    pub(crate) fn path(self, params: &[&str]) -> String {
        let (_, _, template) = self.spec();
        let mut out = String::with_capacity(template.len() + 32);
        let mut params = params.iter();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            match params.next() {
                Some(p) => out.push_str(&encode(p)),
                None => out.push_str(&rest[open..open + close + 1]),
            }
            rest = &rest[open + close + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// A path segment, percent-encoded.
fn encode(segment: &str) -> String {
    let mut enc = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    enc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_fill_the_template_with_encoded_segments() {
        assert_eq!(Operation::Ack.path(&["orders"]), "/v1/topics/orders/ack");
        assert_eq!(Operation::GetTopic.path(&["a/b c"]), "/v1/topics/a%2Fb%20c");
        assert_eq!(
            Operation::GetSubscription.path(&["orders", "bill ing"]),
            "/v1/topics/orders/subscriptions/bill%20ing"
        );
        assert_eq!(
            Operation::CancelMessage.path(&["t", "3", "17"]),
            "/v1/topics/t/messages/3/17"
        );
        assert_eq!(Operation::ListTopics.path(&[]), "/v1/topics");
    }

    #[test]
    fn every_operation_is_listed_once() {
        let mut ids: Vec<&str> = Operation::ALL.iter().map(|o| o.spec().0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), Operation::ALL.len());
    }
}
