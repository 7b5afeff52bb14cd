//! Who may do what (docs/security.md): users, their passwords, and per-topic grants.
//!
//! Users come from a users file (`NARAD_USERS_FILE`, or its JSON in `NARAD_USERS`):
//!
//! ```json
//! {"users":[{"name":"alice","password_hash":"$argon2id$v=19$…",
//!            "grants":[{"topics":"orders*","actions":["produce","consume","admin"]}]}]}
//! ```
//!
//! `topics` is a name, or a prefix ending in `*` (`*` alone: every topic). Actions:
//! `produce` (produce, produce-batch), `consume` (consume, replay, ack, extend, nack) and
//! `admin` (create, change, delete). A user sees (lists and reads the stats of) the topics
//! it holds any grant on. Users from `NARAD_AUTH=user:pass` hold every right on every
//! topic, for local use.
//!
//! Passwords in the file are Argon2id (or any Argon2) PHC hashes, made by
//! `narad hash-password`. Verifying one costs tens of milliseconds by design, so a
//! successful verification is remembered for [`VERIFIED_FOR`] in a cache of at most
//! [`VERIFIED_MAX`] entries, keyed by an HMAC of `user:password` under a key drawn at
//! start (the cache holds no password, and its keys are useless to another process).

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::runtime::Instant;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{Config, ConfigError, Credential};

/// How long a verified password is remembered.
pub const VERIFIED_FOR: Duration = Duration::from_secs(60);
/// Most verified passwords remembered at once.
pub const VERIFIED_MAX: usize = 4096;

/// What a request does to a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Produce and produce-batch.
    Produce,
    /// Consume, replay, ack, extend, nack.
    Consume,
    /// Create, change, delete.
    Admin,
}

/// Topics a grant covers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Topics {
    Exact(String),
    Prefix(String),
}

impl Topics {
    fn parse(s: &str) -> Self {
        match s.strip_suffix('*') {
            Some(p) => Self::Prefix(p.to_owned()),
            None => Self::Exact(s.to_owned()),
        }
    }

    /// The pattern as a users file writes it: `orders`, or `orders-*` for a prefix.
    fn pattern(&self) -> String {
        match self {
            Self::Exact(t) => t.clone(),
            Self::Prefix(p) => format!("{p}*"),
        }
    }

    fn covers(&self, topic: &str) -> bool {
        match self {
            Self::Exact(t) => t == topic,
            Self::Prefix(p) => topic.starts_with(p.as_str()),
        }
    }
}

#[derive(Debug, Clone)]
struct Grant {
    topics: Topics,
    actions: Vec<Action>,
}

#[derive(Debug, Clone)]
enum Secret {
    /// SHA-256 of `user:password` (from `NARAD_AUTH`).
    Digest([u8; 32]),
    /// A PHC string (from a users file).
    Phc(String),
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct User {
    /// User name.
    pub name: String,
    secret: Secret,
    /// `None`: every right on every topic.
    grants: Option<Vec<Grant>>,
}

impl User {
    /// Whether this user may do `action` on `topic`.
    pub fn may(&self, action: Action, topic: &str) -> bool {
        match &self.grants {
            None => true,
            Some(gs) => gs
                .iter()
                .any(|g| g.topics.covers(topic) && g.actions.contains(&action)),
        }
    }

    /// This user's grants as a users file writes them (`GET /v1/whoami`): every right
    /// (`NARAD_AUTH`) is the one grant `*` with every action.
    pub fn grants(&self) -> Vec<GrantView> {
        match &self.grants {
            None => vec![GrantView {
                topics: "*".to_owned(),
                actions: vec![Action::Produce, Action::Consume, Action::Admin],
            }],
            Some(gs) => gs
                .iter()
                .map(|g| GrantView {
                    topics: g.topics.pattern(),
                    actions: g.actions.clone(),
                })
                .collect(),
        }
    }

    /// Whether this user holds any grant on `topic` (it may list it and read its stats).
    pub fn sees(&self, topic: &str) -> bool {
        match &self.grants {
            None => true,
            Some(gs) => gs.iter().any(|g| g.topics.covers(topic)),
        }
    }
}

/// One grant as `GET /v1/whoami` shows it: a topic pattern (`*` suffix: a prefix) and
/// the actions it allows there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantView {
    /// `orders` (exactly that topic) or `orders-*` (every topic with that prefix).
    pub topics: String,
    /// What the grant allows on those topics.
    pub actions: Vec<Action>,
}

/// A users file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("users file: {0}")]
pub struct UsersError(String);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUsers {
    users: Vec<FileUser>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUser {
    name: String,
    password_hash: String,
    #[serde(default)]
    grants: Vec<FileGrant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGrant {
    topics: String,
    actions: Vec<Action>,
}

/// The users a process admits, and the cache of verified passwords.
pub struct Users {
    users: Vec<Arc<User>>,
    cache_key: [u8; 32],
    verified: Mutex<lru::LruCache<[u8; 32], Instant>>,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.users.iter().map(|u| u.name.as_str()).collect();
        f.debug_struct("Users").field("names", &names).finish()
    }
}

impl Users {
    fn new(users: Vec<User>) -> Self {
        let mut cache_key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut cache_key);
        let cap = NonZeroUsize::new(VERIFIED_MAX).unwrap_or(NonZeroUsize::MIN);
        Self {
            users: users.into_iter().map(Arc::new).collect(),
            cache_key,
            verified: Mutex::new(lru::LruCache::new(cap)),
        }
    }

    /// The users of a users file (`NARAD_USERS` wins over `NARAD_USERS_FILE`) plus those of
    /// `NARAD_AUTH` (every right); `None` when none of them is set.
    ///
    /// Errors: [`ConfigError`] naming the variable whose file cannot be read or parsed.
    pub fn from_config(cfg: &Config) -> Result<Option<Self>, ConfigError> {
        let (var, json) = match (&cfg.users_json, &cfg.users_file) {
            (Some(j), _) => ("NARAD_USERS", j.as_bytes().to_vec()),
            (None, Some(path)) => (
                "NARAD_USERS_FILE",
                std::fs::read(path).map_err(|e| ConfigError {
                    var: "NARAD_USERS_FILE",
                    message: format!("cannot read {}: {e}", path.display()),
                })?,
            ),
            (None, None) => return Ok(cfg.auth.as_deref().map(Users::full_rights)),
        };
        let extra = cfg.auth.as_deref().unwrap_or_default();
        Users::parse_with(&json, extra)
            .map(Some)
            .map_err(|e| ConfigError {
                var,
                message: e.to_string(),
            })
    }

    /// Users with every right (from `NARAD_AUTH`).
    pub fn full_rights(creds: &[Credential]) -> Self {
        Self::new(
            creds
                .iter()
                .map(|c| User {
                    name: c.user.clone(),
                    secret: Secret::Digest(digest(&c.user, &c.password)),
                    grants: None,
                })
                .collect(),
        )
    }

    /// Parses a users file's JSON.
    ///
    /// Errors: [`UsersError`] naming what is wrong (bad JSON, an unknown field or action,
    /// an empty or repeated name, a password hash that is not a PHC string, an empty
    /// topic pattern).
    pub fn parse(json: &[u8]) -> Result<Self, UsersError> {
        Self::parse_with(json, &[])
    }

    /// Parses a users file's JSON and adds `full` (from `NARAD_AUTH`) with every right.
    ///
    /// Errors: as [`Users::parse`], and a name in both.
    pub fn parse_with(json: &[u8], full: &[Credential]) -> Result<Self, UsersError> {
        let file: FileUsers =
            serde_json::from_slice(json).map_err(|e| UsersError(e.to_string()))?;
        let mut users = Vec::new();
        for u in file.users {
            if u.name.is_empty() || u.name.contains(':') {
                return Err(UsersError(format!("bad user name {:?}", u.name)));
            }
            if users.iter().any(|x: &User| x.name == u.name) {
                return Err(UsersError(format!("user {:?} appears twice", u.name)));
            }
            PasswordHash::new(&u.password_hash)
                .map_err(|e| UsersError(format!("user {:?}: password_hash: {e}", u.name)))?;
            let mut grants = Vec::new();
            for g in u.grants {
                if g.topics.is_empty() {
                    return Err(UsersError(format!("user {:?}: empty topics", u.name)));
                }
                grants.push(Grant {
                    topics: Topics::parse(&g.topics),
                    actions: g.actions,
                });
            }
            users.push(User {
                name: u.name,
                secret: Secret::Phc(u.password_hash),
                grants: Some(grants),
            });
        }
        for c in full {
            if users.iter().any(|x: &User| x.name == c.user) {
                return Err(UsersError(format!(
                    "user {:?} is in the file and in NARAD_AUTH",
                    c.user
                )));
            }
            users.push(User {
                name: c.user.clone(),
                secret: Secret::Digest(digest(&c.user, &c.password)),
                grants: None,
            });
        }
        if users.is_empty() {
            return Err(UsersError("no users".into()));
        }
        Ok(Self::new(users))
    }

    /// The user `name` if `password` is theirs. Argon2 verifications run on the blocking
    /// pool; a successful one is remembered (see the module documentation).
    pub async fn authenticate(&self, name: &str, password: &str) -> Option<Arc<User>> {
        let user = self.users.iter().find(|u| u.name == name)?.clone();
        match &user.secret {
            Secret::Digest(d) => {
                let given = digest(name, password);
                // Compared through a hash so the time does not depend on where they differ.
                (Sha256::digest(given) == Sha256::digest(d)).then_some(user)
            }
            Secret::Phc(phc) => {
                let key = self.cache_entry(name, password);
                if self.recently_verified(&key) {
                    return Some(user);
                }
                let (phc, password) = (phc.clone(), password.to_owned());
                let ok = crate::runtime::blocking(move || verify_phc(&phc, &password))
                    .await
                    .unwrap_or(false);
                if ok {
                    self.lock().put(key, crate::runtime::now());
                    Some(user)
                } else {
                    None
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<[u8; 32], Instant>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cache_entry(&self, name: &str, password: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.cache_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(name.as_bytes());
        mac.update(b":");
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    fn recently_verified(&self, key: &[u8; 32]) -> bool {
        let mut c = self.lock();
        match c.get(key) {
            Some(at) if at.elapsed() < VERIFIED_FOR => true,
            Some(_) => {
                c.pop(key);
                false
            }
            None => false,
        }
    }
}

fn digest(user: &str, password: &str) -> [u8; 32] {
    Sha256::digest(format!("{user}:{password}").as_bytes()).into()
}

fn verify_phc(phc: &str, password: &str) -> bool {
    PasswordHash::new(phc)
        .map(|h| {
            Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok()
        })
        .unwrap_or(false)
}

/// An Argon2id PHC hash of `password` with a fresh random salt (`narad hash-password`).
///
/// Errors: only if hashing itself fails (it does not with the default parameters).
pub fn hash_password(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn file(hash: &str) -> String {
        format!(
            r#"{{"users":[
              {{"name":"alice","password_hash":"{hash}","grants":[
                {{"topics":"orders*","actions":["produce","consume"]}},
                {{"topics":"audit","actions":["admin"]}}]}},
              {{"name":"bob","password_hash":"{hash}"}}]}}"#
        )
    }

    #[tokio::test]
    async fn grants_and_passwords() {
        let h = hash_password("pw").unwrap();
        assert!(h.starts_with("$argon2id$"));
        let users = Users::parse(file(&h).as_bytes()).unwrap();
        let alice = users.authenticate("alice", "pw").await.unwrap();
        assert!(users.authenticate("alice", "wrong").await.is_none());
        assert!(users.authenticate("nobody", "pw").await.is_none());
        // Cached: the second check takes no Argon2 run but gives the same answer.
        assert!(users.authenticate("alice", "pw").await.is_some());
        assert!(users.authenticate("alice", "pw2").await.is_none());
        assert!(alice.may(Action::Produce, "orders"));
        assert!(alice.may(Action::Consume, "orders-eu"));
        assert!(!alice.may(Action::Admin, "orders"));
        assert!(alice.may(Action::Admin, "audit"));
        assert!(!alice.may(Action::Admin, "audit2"));
        assert!(alice.sees("audit") && !alice.sees("payroll"));
        let bob = users.authenticate("bob", "pw").await.unwrap();
        assert!(!bob.may(Action::Consume, "orders") && !bob.sees("orders"));
    }

    #[tokio::test]
    async fn full_rights_from_narad_auth() {
        let users = Users::full_rights(&[Credential {
            user: "u".into(),
            password: "p".into(),
        }]);
        let u = users.authenticate("u", "p").await.unwrap();
        assert!(u.may(Action::Admin, "anything") && u.sees("x"));
        assert!(users.authenticate("u", "q").await.is_none());
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let h = hash_password("pw").unwrap();
        for bad in [
            "{}".to_owned(),
            r#"{"users":[]}"#.to_owned(),
            r#"{"users":[{"name":"a","password_hash":"plain"}]}"#.to_owned(),
            format!(
                r#"{{"users":[{{"name":"a","password_hash":"{h}","grants":[{{"topics":"x","actions":["read"]}}]}}]}}"#
            ),
            format!(r#"{{"users":[{{"name":"a","password_hash":"{h}","extra":1}}]}}"#),
            format!(
                r#"{{"users":[{{"name":"a","password_hash":"{h}"}},{{"name":"a","password_hash":"{h}"}}]}}"#
            ),
            format!(r#"{{"users":[{{"name":"a:b","password_hash":"{h}"}}]}}"#),
        ] {
            assert!(Users::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
