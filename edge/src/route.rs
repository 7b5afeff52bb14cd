//! Which Durable Object serves a request: a plain function of its path, so that every
//! request naming one topic meets the same broker (one commit queue per partition, one
//! cache), while any object could serve any request correctly (they share the bucket).

/// The name of the Durable Object for a request to `path`: `topic/<name>` for a path
/// below `/v1/topics/<name>`, `root` for everything else (topic lists and creation,
/// health, metrics, the console). The name segment is taken as sent; two spellings of
/// one name meet two objects, which is slower, not wrong.
pub fn object_for(path: &str) -> String {
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some("topics"), Some(name)) if !name.is_empty() => format!("topic/{name}"),
        _ => "root".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::object_for;

    #[test]
    fn a_topic_path_goes_to_its_topic_object_and_the_rest_to_the_root() {
        assert_eq!(object_for("/v1/topics/orders"), "topic/orders");
        assert_eq!(object_for("/v1/topics/orders/produce"), "topic/orders");
        assert_eq!(
            object_for("/v1/topics/orders/subscriptions/a/consume"),
            "topic/orders"
        );
        assert_eq!(object_for("/v1/topics"), "root");
        assert_eq!(object_for("/v1/topics/"), "root");
        assert_eq!(object_for("/healthz"), "root");
        assert_eq!(object_for("/metrics"), "root");
        assert_eq!(object_for("/"), "root");
        assert_eq!(object_for("/v2/topics/x"), "root");
    }
}
