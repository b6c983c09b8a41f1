//! Who may call what: the bearer token of a request, the scopes it grants,
//! the cluster it is bound to, and the handlers that create, list and
//! revoke tokens.
//!
//! A head with a token (`serve --token-file`) checks every request against
//! the access rule of its route in the route table
//! (`trainstate_schema::routes`): `open` routes need nothing, `read` routes
//! a token with the scope `read` when reads are protected, `write` routes
//! the scope `write`, `admin` routes the scope `admin`. The head's own
//! token has every scope. Other tokens are created through the API and
//! kept in the store as SHA-256 hashes; this head refuses a revoked one at
//! once, and every head sharing the store within [`REFRESH_EVERY`] plus a
//! read of the store. A head without a token checks nothing, as before.
//!
//! A token bound to a cluster (scope `write` only) may call one write,
//! `PUT /api/train/forwarded/{id}`, and only for a run of its cluster: the
//! body must claim it. The hub keys forwarded runs by their cluster and
//! their id, so a run another cluster holds is never changed by it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use axum::Json;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OnceCell, watch};
use trainstate_client::api::{
    CreateTokenRequest, CreateTokenResponse, ErrorCode, IDEMPOTENCY_KEY_HEADER, TokenInfo,
    TokenListResponse, TokenScope, check_idempotency_key,
};
use trainstate_schema::routes::{Access, HttpMethod, Operation};

use super::AppState;
use super::body::JsonBody;
use crate::engine::error::ApiError;
use crate::engine::supervisor::{
    Idempotency, SecretHash, StateService, StoredToken, check_token_request, constant_time_eq,
    hash_secret, idempotency_key_hash, new_id_and_secret, request_hash,
};

/// How often a head sharing its store reads the tokens again, so that a
/// token revoked on another head is refused here within a second.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// What a request's token grants, handed to the handlers.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    scopes: Vec<TokenScope>,
    /// The cluster the token is bound to: it forwards this cluster's runs only.
    pub(crate) cluster: Option<String>,
}

/// A valid (not revoked) token this head knows.
#[derive(Debug, Clone)]
struct Valid {
    hash: SecretHash,
    grant: Grant,
    /// When it expires (Unix ms, on the head's clock); `None`: never.
    expires_at_ms: Option<u64>,
}

/// The access rule of every route, and the tokens this head accepts.
pub(crate) struct Auth {
    /// The hash of the head's own token (every scope); `None`: nothing is checked.
    head_token: Option<SecretHash>,
    protect_reads: bool,
    routes: HashMap<(Method, &'static str), (Access, Operation)>,
    valid: RwLock<Arc<Vec<Valid>>>,
    loaded: OnceCell<()>,
    /// Held from a read of the store to its result's taking effect, so that
    /// an older read never replaces a newer one (a revocation undone).
    refreshing: tokio::sync::Mutex<()>,
}

impl Auth {
    pub(crate) fn new(head_token: Option<&str>, protect_reads: bool) -> Self {
        let routes = trainstate_schema::routes::routes()
            .into_iter()
            .map(|route| ((method(route.method), route.path), (route.access, route.operation)))
            .collect();
        Self {
            head_token: head_token.map(hash_secret),
            protect_reads,
            routes,
            valid: RwLock::default(),
            loaded: OnceCell::new(),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// The access rule and operation of the route `path` (a template, as
    /// matched) serves for `method`. A request no route serves is a read
    /// or a write by its method.
    fn rule(&self, method: &Method, path: Option<&str>) -> (Access, Option<Operation>) {
        let method = if method == Method::HEAD { Method::GET } else { method.clone() };
        let is_read = matches!(method, Method::GET | Method::OPTIONS);
        path.and_then(|path| self.routes.get(&(method, path)))
            .map_or((if is_read { Access::Read } else { Access::Write }, None), |(a, o)| {
                (*a, Some(*o))
            })
    }

    /// Puts every valid stored token in place of the ones known.
    fn replace(&self, tokens: &[StoredToken]) {
        let valid = tokens.iter().filter(|t| t.revoked_at_ms.is_none()).map(valid).collect();
        *self.valid.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(valid);
    }

    /// Reads the stored tokens.
    async fn refresh(&self, service: &StateService) -> Result<(), String> {
        let _turn = self.refreshing.lock().await;
        let tokens = service.tokens().await?;
        self.replace(&tokens);
        Ok(())
    }

    /// What `secret` grants, if it is the head's token or a valid token.
    /// Every known hash is compared, in constant time, whichever matches.
    async fn grant_for(
        &self,
        secret: &str,
        service: &StateService,
    ) -> Result<Option<Grant>, ApiError> {
        self.loaded.get_or_try_init(|| async { self.refresh(service).await }).await.map_err(
            |e| ApiError::new(ErrorCode::Unavailable, format!("cannot read the tokens: {e}")),
        )?;
        let hash = hash_secret(secret);
        let now_ms = service.now_ms();
        let mut found = None;
        if self.head_token.is_some_and(|head| constant_time_eq(&head, &hash)) {
            found = Some(Grant { scopes: TokenScope::ALL.to_vec(), cluster: None });
        }
        let valid = self.valid.read().unwrap_or_else(|e| e.into_inner()).clone();
        for token in valid.iter() {
            // An expired token is refused like an unknown one.
            let expired = token.expires_at_ms.is_some_and(|at| now_ms >= at);
            if constant_time_eq(&token.hash, &hash) && found.is_none() && !expired {
                found = Some(token.grant.clone());
            }
        }
        Ok(found)
    }
}

fn valid(token: &StoredToken) -> Valid {
    Valid {
        hash: token.hash,
        grant: Grant { scopes: token.scopes.clone(), cluster: token.cluster.clone() },
        expires_at_ms: token.expires_at_ms,
    }
}

fn method(method: HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
        other => panic!("the head serves no {other:?} route"),
    }
}

/// Reads the stored tokens every [`REFRESH_EVERY`] until shutdown, for a
/// head that shares its store: other heads create and revoke tokens too.
pub(crate) fn refresh_while_shared(
    auth: &Arc<Auth>,
    service: &Arc<StateService>,
    mut shutdown: watch::Receiver<bool>,
) {
    if auth.head_token.is_none() || service.shared_store().is_none() {
        return;
    }
    let (auth, service): (Weak<Auth>, Weak<StateService>) =
        (Arc::downgrade(auth), Arc::downgrade(service));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(REFRESH_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let (Some(auth), Some(service)) = (auth.upgrade(), service.upgrade()) else { return };
            if let Err(err) = auth.refresh(&service).await {
                tracing::warn!(error = %err, "cannot read the tokens; keeping the ones known");
            }
        }
    });
}

/// The middleware: checks the request's bearer token against its route's
/// access rule, and hands the handlers what the token grants.
pub(crate) async fn authorize(
    State(app): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let auth = &app.auth;
    if auth.head_token.is_none() {
        return next.run(request).await;
    }
    let path = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let (access, operation) = auth.rule(request.method(), path.as_deref());
    let Some(scope) = access.scope() else {
        return next.run(request).await;
    };
    if access == Access::Read && !auth.protect_reads {
        return next.run(request).await;
    }
    let Some(given) = given_token(&request, access == Access::Read) else {
        return ApiError::unauthorized().into_response();
    };
    let grant = match auth.grant_for(&given, &app.service).await {
        Ok(Some(grant)) => grant,
        Ok(None) => return ApiError::unauthorized().into_response(),
        Err(err) => return err.into_response(),
    };
    if !grant.scopes.contains(&scope) {
        let has: Vec<&str> = grant.scopes.iter().map(|s| s.as_str()).collect();
        return forbidden(format!(
            "this route needs a token with the scope {scope}; this token has {}",
            has.join(", ")
        ))
        .into_response();
    }
    if let Some(cluster) = &grant.cluster
        && access == Access::Write
        && operation != Some(Operation::ForwardRun)
    {
        return forbidden(format!(
            "a token bound to cluster {cluster:?} may only forward that cluster's runs \
             (PUT /api/train/forwarded/{{id}})"
        ))
        .into_response();
    }
    request.extensions_mut().insert(grant);
    next.run(request).await
}

/// The token a request carries: `Authorization: Bearer`, or for a read
/// `access_token` in the query (a browser's EventSource cannot send headers).
fn given_token(request: &Request, is_read: bool) -> Option<String> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(str::to_owned)
        .or_else(|| {
            if !is_read {
                return None;
            }
            // Percent-decoded: a browser encodes it (`encodeURIComponent`).
            Query::<TokenQuery>::try_from_uri(request.uri()).ok()?.0.access_token
        })
}

/// The credentials of an `Authorization: Bearer <token>` value. The scheme
/// is case-insensitive (RFC 9110 §11.1), so `bearer` and `BEARER` count too.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start_matches(' '))
}

/// The token a read may carry in its query string.
#[derive(serde::Deserialize)]
struct TokenQuery {
    access_token: Option<String>,
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, message)
}

/// Refuses a forwarded run unless the request's token may write it: a
/// token bound to a cluster writes only runs that claim that cluster
/// (`claimed`). Such a run never changes another cluster's: the hub keys
/// forwarded runs by their cluster and their id (see the actor's `upsert`).
pub(crate) fn check_cluster(grant: Option<&Grant>, claimed: Option<&str>) -> Result<(), ApiError> {
    let Some(bound) = grant.and_then(|g| g.cluster.as_deref()) else {
        return Ok(());
    };
    if claimed != Some(bound) {
        return Err(forbidden(format!(
            "this token is bound to cluster {bound:?}: the run must claim it, not {}",
            claimed.map_or("no cluster".to_owned(), |c| format!("{c:?}"))
        ))
        .with_field("cluster"));
    }
    Ok(())
}

/// `POST /api/tokens`. With an `Idempotency-Key` header, a repeat of the
/// same request with the same key (a retry after a lost answer, on this
/// head or another, before or after a restart) answers the token the first
/// one created, with its secret, and creates none; another request with
/// that key is a 409 naming the key.
pub(crate) async fn create_token(
    State(app): State<AppState>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<CreateTokenRequest>,
) -> Result<Response, ApiError> {
    administered(&app)?;
    check_token_request(&request).map_err(|(field, rule)| ApiError::invalid(field, rule))?;
    let key = idempotency_key(&headers)?;
    if let Some(key) = &key
        && let Some(answer) = replay(&app, key, &request).await?
    {
        return Ok(answer);
    }
    let (id, secret) = new_id_and_secret().map_err(|e| ApiError::new(ErrorCode::Internal, e))?;
    let token = StoredToken {
        idempotency: key.as_deref().map(|key| Idempotency::new(key, &request, &id, &secret)),
        expires_at_ms: request.expires_in_ms.map(|ms| app.service.now_ms().saturating_add(ms)),
        id,
        name: request.name.clone(),
        scopes: request.scopes.clone(),
        cluster: request.cluster.clone(),
        hash: hash_secret(&secret),
        created_at_ms: 0,
        revoked_at_ms: None,
    };
    let stored = match app.service.insert_token(token).await {
        Ok(stored) => stored,
        Err(err) => {
            // Another creation with the same key may have come first.
            if let Some(key) = &key
                && let Some(answer) = replay(&app, key, &request).await?
            {
                return Ok(answer);
            }
            return Err(unavailable(err));
        }
    };
    app.auth.refresh(&app.service).await.map_err(unavailable)?;
    let answer = CreateTokenResponse::new(stored.info(app.service.now_ms()), secret);
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The idempotency key of a creation, if it has one; a malformed one is
/// refused naming the header.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY_HEADER) else { return Ok(None) };
    let key = value.to_str().map_err(|_| {
        ApiError::invalid(IDEMPOTENCY_KEY_HEADER, "is visible ASCII characters".to_owned())
    })?;
    check_idempotency_key(key).map_err(|rule| ApiError::invalid(IDEMPOTENCY_KEY_HEADER, rule))?;
    Ok(Some(key.to_owned()))
}

/// The answer to a repeat of a creation with `key`, if a token was created
/// with it: the same token (as it is now) and its secret, unsealed by the
/// key; a 409 naming the key when it came with another request.
async fn replay(
    app: &AppState,
    key: &str,
    request: &CreateTokenRequest,
) -> Result<Option<Response>, ApiError> {
    let tokens = app.service.tokens().await.map_err(unavailable)?;
    let key_hash = idempotency_key_hash(key);
    let Some((token, kept)) = tokens.iter().find_map(|token| {
        token.idempotency.as_ref().filter(|kept| kept.key_hash == key_hash).map(|k| (token, k))
    }) else {
        return Ok(None);
    };
    if kept.request_hash != request_hash(request) {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "the idempotency key {key:?} created token {} with another request; a new \
                 request needs a new key",
                token.id
            ),
        )
        .with_field(IDEMPOTENCY_KEY_HEADER));
    }
    let secret = kept.secret(key, &token.id);
    if hash_secret(&secret) != token.hash {
        return Err(ApiError::new(
            ErrorCode::Internal,
            format!("the secret of token {} does not unseal with its key", token.id),
        ));
    }
    // The first creation may have been stored without this head's taking
    // it in (its answer was lost): take it in now.
    app.auth.refresh(&app.service).await.map_err(unavailable)?;
    let answer = CreateTokenResponse::new(token.info(app.service.now_ms()), secret);
    Ok(Some((StatusCode::CREATED, Json(answer)).into_response()))
}

/// `GET /api/tokens`.
pub(crate) async fn list_tokens(
    State(app): State<AppState>,
) -> Result<Json<TokenListResponse>, ApiError> {
    administered(&app)?;
    let tokens = app.service.tokens().await.map_err(unavailable)?;
    let now_ms = app.service.now_ms();
    Ok(Json(TokenListResponse::new(tokens.iter().map(|t| t.info(now_ms)).collect())))
}

/// `DELETE /api/tokens/{id}`: refused by this head from its answer on.
pub(crate) async fn revoke_token(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TokenInfo>, ApiError> {
    administered(&app)?;
    let revoked = app.service.revoke_token(&id).await.map_err(unavailable)?;
    let Some(revoked) = revoked else {
        return Err(ApiError::not_found(format!("no token has the id {id:?}")));
    };
    app.auth.refresh(&app.service).await.map_err(unavailable)?;
    Ok(Json(revoked.info(app.service.now_ms())))
}

/// Tokens are administered only on a head that checks them.
fn administered(app: &AppState) -> Result<(), ApiError> {
    if app.auth.head_token.is_none() {
        return Err(forbidden(
            "this head checks no tokens (it has none of its own): start it with --token-file \
             to create, list and revoke tokens"
                .into(),
        ));
    }
    Ok(())
}

fn unavailable(reason: String) -> ApiError {
    ApiError::new(ErrorCode::Unavailable, format!("the token store cannot serve now: {reason}"))
}

#[cfg(test)]
mod tests {
    use axum::http::Method;
    use trainstate_schema::routes::{Access, Operation, routes};

    use super::{Auth, Grant, bearer_token, check_cluster};

    #[test]
    fn each_route_is_checked_by_its_own_access_rule() {
        let auth = Auth::new(Some("head"), true);
        for route in routes() {
            let method = super::method(route.method);
            assert_eq!(
                auth.rule(&method, Some(route.path)),
                (route.access, Some(route.operation)),
                "{method} {}",
                route.path
            );
        }
        assert_eq!(auth.rule(&Method::HEAD, Some("/healthz")).0, Access::Open);
        assert_eq!(auth.rule(&Method::DELETE, Some("/api/tokens/{id}")).0, Access::Admin);
        assert_eq!(
            auth.rule(&Method::PUT, Some("/api/train/forwarded/{id}")),
            (Access::Write, Some(Operation::ForwardRun))
        );
        // What no route serves is a read or a write by its method.
        assert_eq!(auth.rule(&Method::GET, None), (Access::Read, None));
        assert_eq!(auth.rule(&Method::POST, Some("/healthz")), (Access::Write, None));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for value in ["Bearer t0k", "bearer t0k", "BEARER t0k", "bEaReR  t0k"] {
            assert_eq!(bearer_token(value), Some("t0k"), "{value}");
        }
        assert_eq!(bearer_token("Basic t0k"), None);
        assert_eq!(bearer_token("Bearert0k"), None);
    }

    #[test]
    fn a_bound_token_writes_only_its_clusters_runs() {
        let bound = Grant { scopes: Vec::new(), cluster: Some("a".into()) };
        assert!(check_cluster(Some(&bound), Some("a")).is_ok());
        assert!(check_cluster(Some(&bound), Some("b")).is_err());
        assert!(check_cluster(Some(&bound), None).is_err());
        let unbound = Grant { scopes: Vec::new(), cluster: None };
        assert!(check_cluster(Some(&unbound), Some("b")).is_ok());
        assert!(check_cluster(None, None).is_ok());
    }
}
