//! The documents of token administration: bearer tokens with scopes, and
//! tokens bound to one cluster for forwarding.
//!
//! A token carries a set of [`TokenScope`]s; each route needs one (`read`,
//! `write` or `admin`). A token created with a `cluster` may only forward
//! runs of that cluster to a hub. The secret is shown once, in
//! [`CreateTokenResponse`]; the head keeps only its SHA-256 hash.

use serde::{Deserialize, Serialize};

/// What a token may do. A token has exactly the scopes it was created with:
/// none implies another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TokenScope {
    /// Read runs, the event stream, schemas, metrics (when reads are protected).
    Read,
    /// Write runs: register, change, forward, the rendezvous, Ray's writes.
    Write,
    /// Create, list and revoke tokens.
    Admin,
}

impl TokenScope {
    /// Every scope.
    pub const ALL: [TokenScope; 3] = [TokenScope::Read, TokenScope::Write, TokenScope::Admin];

    /// The wire spelling, for example `read`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Write => "write",
            TokenScope::Admin => "admin",
        }
    }

    /// The scope spelled `text`, if any.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for TokenScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest token name, in characters.
pub const MAX_TOKEN_NAME_LEN: usize = 256;

/// The longest lifetime a token may be given at its creation, in ms: ten
/// years of 365 days.
pub const MAX_TOKEN_EXPIRES_IN_MS: u64 = 10 * 365 * 86_400_000;

/// The shortest lifetime a token may be given at its creation, in ms.
pub const MIN_TOKEN_EXPIRES_IN_MS: u64 = 1_000;

/// The header that makes `POST /api/tokens` idempotent (the IETF
/// `Idempotency-Key` draft): a repeat with the same key answers the token
/// the first request created, with its secret, and creates none.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The shortest idempotency key, in characters: a key also unseals the
/// secret a repeat answers, so it is meant to be random.
pub const MIN_IDEMPOTENCY_KEY_LEN: usize = 16;

/// The longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// Checks an idempotency key: [`MIN_IDEMPOTENCY_KEY_LEN`] to
/// [`MAX_IDEMPOTENCY_KEY_LEN`] visible ASCII characters (no space).
pub fn check_idempotency_key(key: &str) -> Result<(), String> {
    let visible = key.bytes().all(|b| b.is_ascii_graphic());
    if (MIN_IDEMPOTENCY_KEY_LEN..=MAX_IDEMPOTENCY_KEY_LEN).contains(&key.len()) && visible {
        Ok(())
    } else {
        Err(format!(
            "an idempotency key is {MIN_IDEMPOTENCY_KEY_LEN} to {MAX_IDEMPOTENCY_KEY_LEN} visible \
             ASCII characters, best random"
        ))
    }
}

/// Body of `POST /api/tokens`: the token to create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CreateTokenRequest {
    /// What the token may do: one or more of `read`, `write`, `admin`.
    pub scopes: Vec<TokenScope>,
    /// Binds the token to this cluster: it may only forward runs whose
    /// `cluster` is this name (`PUT /api/train/forwarded/{id}`), and needs
    /// exactly the scope `write`.
    #[serde(default)]
    pub cluster: Option<String>,
    /// What the token is for, for the people who list tokens (at most 256
    /// characters, no control characters).
    #[serde(default)]
    pub name: Option<String>,
    /// How long the token is valid, in ms from its creation on the head's
    /// clock (1 s to ten years); past it the token is refused like an
    /// unknown one. Absent: it never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
}

impl CreateTokenRequest {
    /// A request for a token with `scopes`, unbound, unnamed, that never expires.
    pub fn new(scopes: Vec<TokenScope>) -> Self {
        Self { scopes, cluster: None, name: None, expires_in_ms: None }
    }

    /// The same request, for a token valid `expires_in_ms` ms from its creation.
    pub fn with_expires_in_ms(mut self, expires_in_ms: Option<u64>) -> Self {
        self.expires_in_ms = expires_in_ms;
        self
    }

    /// The same request, bound to `cluster`.
    pub fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.cluster = cluster;
        self
    }

    /// The same request, named.
    pub fn with_name(mut self, name: Option<String>) -> Self {
        self.name = name;
        self
    }
}

/// A token as the head lists it: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct TokenInfo {
    /// The token's id, which revokes it.
    pub id: String,
    /// What the token is for, if it was named.
    pub name: Option<String>,
    /// What the token may do.
    pub scopes: Vec<TokenScope>,
    /// The cluster the token is bound to, if any.
    pub cluster: Option<String>,
    /// When it was created (Unix ms).
    pub created_at_ms: u64,
    /// When it was revoked (Unix ms); null while it is valid.
    pub revoked_at_ms: Option<u64>,
    /// When it expires (Unix ms, on the head's clock); null: never.
    #[serde(default)]
    pub expires_at_ms: Option<u64>,
    /// True once the head's clock has reached `expires_at_ms`: the token is
    /// refused like an unknown one.
    #[serde(default)]
    pub expired: bool,
}

impl TokenInfo {
    /// A token's description.
    pub fn new(
        id: impl Into<String>,
        name: Option<String>,
        scopes: Vec<TokenScope>,
        cluster: Option<String>,
        created_at_ms: u64,
        revoked_at_ms: Option<u64>,
    ) -> Self {
        Self {
            id: id.into(),
            name,
            scopes,
            cluster,
            created_at_ms,
            revoked_at_ms,
            expires_at_ms: None,
            expired: false,
        }
    }

    /// The same description, with when it expires and whether it has.
    pub fn with_expiry(mut self, expires_at_ms: Option<u64>, expired: bool) -> Self {
        self.expires_at_ms = expires_at_ms;
        self.expired = expired;
        self
    }
}

/// Answer of `POST /api/tokens`: the token and its secret, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct CreateTokenResponse {
    /// The token created.
    pub token: TokenInfo,
    /// The bearer secret (`tsk_` and 43 base64url characters). The head
    /// keeps only its SHA-256 hash: it cannot show it again.
    pub secret: String,
}

impl CreateTokenResponse {
    /// A creation answer.
    pub fn new(token: TokenInfo, secret: impl Into<String>) -> Self {
        Self { token, secret: secret.into() }
    }
}

/// Answer of `GET /api/tokens`: every token, revoked ones included, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct TokenListResponse {
    /// The tokens.
    pub tokens: Vec<TokenInfo>,
}

impl TokenListResponse {
    /// A listing.
    pub fn new(tokens: Vec<TokenInfo>) -> Self {
        Self { tokens }
    }
}
