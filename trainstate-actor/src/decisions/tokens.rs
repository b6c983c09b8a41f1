//! Bearer tokens as the head keeps them: a random secret shown once, its
//! SHA-256 hash stored, the scopes it grants and the cluster it is bound to.
//!
//! Pure: making a secret, hashing it, checking a creation request and
//! turning a stored token into its description. Where tokens are stored is
//! the store's business (`store/`); how a request's token is checked, the
//! HTTP layer's (`http/auth.rs`).

#![cfg_attr(not(feature = "server"), allow(dead_code))]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use trainstate_client::api::{
    CreateTokenRequest, MAX_TOKEN_EXPIRES_IN_MS, MAX_TOKEN_NAME_LEN, MIN_TOKEN_EXPIRES_IN_MS,
    TokenInfo, TokenScope,
};

/// The prefix of every secret the head makes, so that a leaked one is
/// recognisable (by a person or a secret scanner).
pub(crate) const SECRET_PREFIX: &str = "tsk_";

/// The SHA-256 hash of a secret: all the head keeps of it.
pub(crate) type SecretHash = [u8; 32];

/// A token as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredToken {
    pub(crate) id: String,
    pub(crate) name: Option<String>,
    pub(crate) scopes: Vec<TokenScope>,
    pub(crate) cluster: Option<String>,
    pub(crate) hash: SecretHash,
    pub(crate) created_at_ms: u64,
    pub(crate) revoked_at_ms: Option<u64>,
    /// When it expires (Unix ms, on the head's clock); `None`: never.
    pub(crate) expires_at_ms: Option<u64>,
    /// The idempotency key it was created with, if any.
    pub(crate) idempotency: Option<Idempotency>,
}

/// What a token created with an idempotency key keeps of it, so that a
/// repeat answers the same token, with its secret, and creates none: the
/// key's hash (to find it), the request's hash (a different request with
/// the same key is refused) and the secret sealed by the key (only a
/// caller with the key recovers it; the store alone does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Idempotency {
    pub(crate) key_hash: SecretHash,
    pub(crate) request_hash: SecretHash,
    pub(crate) sealed_secret: SecretHash,
}

impl Idempotency {
    /// What a token `id` with `secret`, created by `request` with `key`, keeps.
    pub(crate) fn new(key: &str, request: &CreateTokenRequest, id: &str, secret: &str) -> Self {
        let secret_bytes = secret_bytes(secret);
        Self {
            key_hash: hash_secret(key),
            request_hash: request_hash(request),
            sealed_secret: xor(&secret_bytes, &seal_pad(key, id)),
        }
    }

    /// The secret, unsealed with `key`.
    pub(crate) fn secret(&self, key: &str, id: &str) -> String {
        let bytes = xor(&self.sealed_secret, &seal_pad(key, id));
        format!("{SECRET_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }
}

/// The hash of an idempotency key, as the store finds a token by it.
pub(crate) fn idempotency_key_hash(key: &str) -> SecretHash {
    hash_secret(key)
}

/// The hash of a creation request, whatever key it came with.
pub(crate) fn request_hash(request: &CreateTokenRequest) -> SecretHash {
    let text = serde_json::to_vec(request).expect("a token request serializes");
    Sha256::digest(&text).into()
}

/// The 32 random bytes of a secret the head made.
fn secret_bytes(secret: &str) -> SecretHash {
    let mut bytes = [0u8; 32];
    let decoded = URL_SAFE_NO_PAD
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        .unwrap_or_default();
    let n = decoded.len().min(32);
    bytes[..n].copy_from_slice(&decoded[..n]);
    bytes
}

/// The pad that seals the secret of the token `id` under `key`.
fn seal_pad(key: &str, id: &str) -> SecretHash {
    let mut hasher = Sha256::new();
    hasher.update(b"trainstate token secret sealed by its idempotency key\0");
    hasher.update(key.as_bytes());
    hasher.update(b"\0");
    hasher.update(id.as_bytes());
    hasher.finalize().into()
}

fn xor(a: &SecretHash, b: &SecretHash) -> SecretHash {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// A hash as the stores keep it: 64 lower-case hex digits.
pub(crate) fn hex(hash: &SecretHash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

impl StoredToken {
    /// Its description at `now_ms` (on the head's clock), without the hash.
    pub(crate) fn info(&self, now_ms: u64) -> TokenInfo {
        TokenInfo::new(
            self.id.clone(),
            self.name.clone(),
            self.scopes.clone(),
            self.cluster.clone(),
            self.created_at_ms,
            self.revoked_at_ms,
        )
        .with_expiry(self.expires_at_ms, self.expired(now_ms))
    }

    /// True once the head's clock (`now_ms`) has reached its expiry.
    pub(crate) fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|at| now_ms >= at)
    }

    /// The scopes as the stores keep them: `read,write`.
    pub(crate) fn scopes_text(&self) -> String {
        self.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The hash as the stores keep it: 64 lower-case hex digits.
    pub(crate) fn hash_hex(&self) -> String {
        hex(&self.hash)
    }
}

/// Scopes from their stored text; an unknown word is an error naming it.
pub(crate) fn scopes_from_text(text: &str) -> Result<Vec<TokenScope>, String> {
    text.split(',')
        .filter(|w| !w.is_empty())
        .map(|w| TokenScope::parse(w).ok_or_else(|| format!("unknown stored scope {w:?}")))
        .collect()
}

/// A hash from its stored hex text.
pub(crate) fn hash_from_hex(text: &str) -> Result<SecretHash, String> {
    let bad = || format!("a stored token hash is 64 hex digits, not {text:?}");
    if text.len() != 64 {
        return Err(bad());
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(hash)
}

/// The SHA-256 hash of `secret`.
pub(crate) fn hash_secret(secret: &str) -> SecretHash {
    Sha256::digest(secret.as_bytes()).into()
}

/// Compares without an early exit, so timing says nothing about either side.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// A new token's id (16 hex digits) and secret (`tsk_` and 32 random
/// bytes in base64url), from the operating system's generator.
pub(crate) fn new_id_and_secret() -> Result<(String, String), String> {
    let mut bytes = [0u8; 40];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a token: {e}"))?;
    let id = bytes[..8].iter().map(|b| format!("{b:02x}")).collect();
    let secret = format!("{SECRET_PREFIX}{}", URL_SAFE_NO_PAD.encode(&bytes[8..]));
    Ok((id, secret))
}

/// Checks a creation request: at least one scope, each once; a cluster
/// only with exactly the scope `write`, and a valid cluster name; a name
/// within its limit. The error names the field and the rule.
pub(crate) fn check_request(request: &CreateTokenRequest) -> Result<(), (&'static str, String)> {
    if request.scopes.is_empty() {
        return Err(("scopes", "a token needs at least one scope: read, write or admin".into()));
    }
    let mut seen = Vec::new();
    for scope in &request.scopes {
        if seen.contains(scope) {
            return Err(("scopes", format!("the scope {scope} is listed twice")));
        }
        seen.push(*scope);
    }
    if let Some(cluster) = &request.cluster {
        if request.scopes != [TokenScope::Write] {
            return Err((
                "cluster",
                "a token bound to a cluster forwards that cluster's runs: its scopes must be \
                 exactly [\"write\"]"
                    .into(),
            ));
        }
        trainstate_schema::validate_name("cluster", cluster)
            .map_err(|e| ("cluster", e.to_string()))?;
    }
    if let Some(name) = &request.name
        && (name.is_empty()
            || name.chars().count() > MAX_TOKEN_NAME_LEN
            || name.chars().any(char::is_control))
    {
        return Err((
            "name",
            format!(
                "a token's name is 1 to {MAX_TOKEN_NAME_LEN} characters without control characters"
            ),
        ));
    }
    if let Some(ms) = request.expires_in_ms
        && !(MIN_TOKEN_EXPIRES_IN_MS..=MAX_TOKEN_EXPIRES_IN_MS).contains(&ms)
    {
        return Err((
            "expires_in_ms",
            format!(
                "a token's lifetime is {MIN_TOKEN_EXPIRES_IN_MS} ms (one second) to \
                 {MAX_TOKEN_EXPIRES_IN_MS} ms (ten years), not {ms}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_prefixed_random_and_hashes_round_trip() {
        let (id_a, secret_a) = new_id_and_secret().unwrap();
        let (id_b, secret_b) = new_id_and_secret().unwrap();
        assert_ne!(secret_a, secret_b);
        assert_ne!(id_a, id_b);
        assert!(secret_a.starts_with(SECRET_PREFIX));
        assert_eq!(secret_a.len(), SECRET_PREFIX.len() + 43);
        assert_eq!(id_a.len(), 16);
        let token = StoredToken {
            id: id_a,
            name: None,
            scopes: vec![TokenScope::Read, TokenScope::Admin],
            cluster: None,
            hash: hash_secret(&secret_a),
            created_at_ms: 1,
            revoked_at_ms: None,
            expires_at_ms: Some(10),
            idempotency: None,
        };
        assert!(!token.expired(9) && token.expired(10));
        assert_eq!(token.info(10).expires_at_ms, Some(10));
        assert!(token.info(10).expired);
        assert_eq!(hash_from_hex(&token.hash_hex()).unwrap(), token.hash);
        assert_eq!(scopes_from_text(&token.scopes_text()).unwrap(), token.scopes);
        assert!(hash_from_hex("zz").is_err());
        assert!(scopes_from_text("read,owner").unwrap_err().contains("owner"));
    }

    #[test]
    fn requests_name_the_field_they_break() {
        let write = |cluster: Option<&str>, scopes| {
            CreateTokenRequest::new(scopes).with_cluster(cluster.map(Into::into))
        };
        assert!(check_request(&write(Some("a"), vec![TokenScope::Write])).is_ok());
        assert_eq!(check_request(&write(None, vec![])).unwrap_err().0, "scopes");
        assert_eq!(
            check_request(&write(None, vec![TokenScope::Read, TokenScope::Read])).unwrap_err().0,
            "scopes"
        );
        for scopes in [vec![TokenScope::Read], vec![TokenScope::Write, TokenScope::Admin]] {
            assert_eq!(check_request(&write(Some("a"), scopes)).unwrap_err().0, "cluster");
        }
        assert_eq!(
            check_request(&write(Some(""), vec![TokenScope::Write])).unwrap_err().0,
            "cluster"
        );
        let named = CreateTokenRequest::new(vec![TokenScope::Read]).with_name(Some("a\nb".into()));
        assert_eq!(check_request(&named).unwrap_err().0, "name");
        for ms in [0, 999, MAX_TOKEN_EXPIRES_IN_MS + 1] {
            let expiring =
                CreateTokenRequest::new(vec![TokenScope::Read]).with_expires_in_ms(Some(ms));
            assert_eq!(check_request(&expiring).unwrap_err().0, "expires_in_ms", "{ms}");
        }
    }

    #[test]
    fn a_sealed_secret_opens_with_its_key_only() {
        let (id, secret) = new_id_and_secret().unwrap();
        let request = CreateTokenRequest::new(vec![TokenScope::Read]);
        let kept = Idempotency::new("0123456789abcdef", &request, &id, &secret);
        assert_eq!(kept.secret("0123456789abcdef", &id), secret);
        assert_ne!(kept.secret("0123456789abcdeF", &id), secret);
        assert_ne!(hex(&kept.sealed_secret), hex(&secret_bytes(&secret)));
        let other = CreateTokenRequest::new(vec![TokenScope::Write]);
        assert_ne!(request_hash(&request), request_hash(&other));
    }

    #[test]
    fn constant_time_eq_compares_whole_values() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
