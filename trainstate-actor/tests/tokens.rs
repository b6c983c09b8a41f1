//! Bearer tokens: scopes decide what a token may call, a token bound to a
//! cluster forwards only that cluster's runs, a revoked token is refused,
//! and a secret is never stored in clear.

use std::sync::Arc;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::ManualClock;
use trainstate_actor::http::HttpConfig;
use trainstate_client::StateHandle;
use trainstate_client::api::{CreateTokenRequest, TokenScope};
use trainstate_schema::routes::{Access, routes};
use trainstate_schema::{RunStatus, TrainRunInfo};

use crate::common::{Server, run};
use crate::contract::send;
use crate::stores::{Fresh, on_both_stores};

const T0: u64 = 1_760_000_000_000;

/// The head's own token: every scope.
pub(crate) const HEAD_TOKEN: &str = "head-token-with-every-scope";

/// A hub on `fresh` that checks tokens, reads included when `protect_reads`.
pub(crate) async fn hub(fresh: &Fresh, protect_reads: bool) -> Server {
    let http = HttpConfig::default()
        .with_token(Some(HEAD_TOKEN.into()))
        .with_protected_reads(protect_reads);
    Server::start(fresh.config().with_cluster(Some("hub".into())), http).await
}

/// Creates a token through `url` with the head's token; answers its id and secret.
pub(crate) async fn create(
    url: &str,
    scopes: &[TokenScope],
    cluster: Option<&str>,
) -> (String, String) {
    let admin = StateHandle::connect(url, Some(HEAD_TOKEN.into())).unwrap();
    let request = CreateTokenRequest::new(scopes.to_vec()).with_cluster(cluster.map(str::to_owned));
    let created = admin.create_token(&request).await.unwrap();
    assert_eq!(created.token.scopes, scopes);
    assert!(created.secret.starts_with("tsk_"), "{}", created.secret);
    (created.token.id, created.secret)
}

fn json_body(value: &impl serde::Serialize) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

/// `run` as the head of `cluster` stores it, with `status` (ended 500 ms
/// after its start when terminal).
fn of_cluster(run: &TrainRunInfo, cluster: &str, status: RunStatus) -> Value {
    let run = if status.is_terminal() {
        trainstate_testkit::runs::ended(run, status)
    } else {
        run.clone()
    };
    let mut draft = run.into_draft();
    draft.cluster = Some(cluster.to_owned());
    serde_json::to_value(draft.validate().unwrap()).unwrap()
}

/// `run` with the id `id`, which the run-id rule accepts.
fn with_id(run: &TrainRunInfo, id: &str) -> TrainRunInfo {
    let mut draft = run.clone().into_draft();
    draft.id = id.to_owned();
    draft.validate().unwrap()
}

/// A concrete path for a route template.
fn concrete(template: &str) -> String {
    template
        .replace("{id}", "0192f0c5a4e27c3db1c1a2b3c4d5e6f7")
        .replace("{attempt_id}", "1")
        .replace("{name}", "TrainRunInfo")
        .replace("{key}", "torchrun:4f1c")
        .replace("{rank}", "0")
}

fn method(route: &trainstate_schema::routes::Route) -> Method {
    Method::from_bytes(route.method.as_lower_str().to_uppercase().as_bytes()).unwrap()
}

on_both_stores! {
    async fn regression_a_read_token_lists_and_streams_but_every_write_and_admin_route_is_forbidden(store) {
        let fresh = store.fresh("read-token").await;
        let hub = hub(&fresh, true).await;
        let http = Client::new();
        let (_, read) = create(&hub.url, &[TokenScope::Read], None).await;

        let (status, page) =
            send(&http, Method::GET, &format!("{}/api/train/runs", hub.url), None, Some(&read)).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        // The event stream, as a browser opens it (the token in the query).
        let mut stream = http
            .get(format!("{}/api/train/events?access_token={read}", hub.url))
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), StatusCode::OK);
        let first = stream.chunk().await.unwrap().expect("the stream starts");
        assert!(String::from_utf8_lossy(&first).contains("event: snapshot"));
        drop(stream);

        // Every write and admin route of the route table: 403, naming the scope.
        let guarded: Vec<_> =
            routes().into_iter().filter(|r| matches!(r.access, Access::Write | Access::Admin)).collect();
        assert_eq!(guarded.len(), 16, "the table's thirteen writes (with the stacks' POST) and three admin routes");
        for route in guarded {
            let url = format!("{}{}", hub.url, concrete(route.path));
            let (status, answer) = send(&http, method(&route), &url, json_body(&json!({})), Some(&read)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{} {}: {answer}", route.method.as_lower_str(), route.path);
            assert_eq!(answer["error"]["code"], "forbidden");
            let needed = if route.access == Access::Admin { "admin" } else { "write" };
            assert!(
                answer["error"]["message"].as_str().unwrap().contains(&format!("scope {needed}")),
                "{answer}"
            );
        }
        // Nothing was written.
        let (_, page) =
            send(&http, Method::GET, &format!("{}/api/train/runs", hub.url), None, Some(&read)).await;
        assert_eq!(page["total"], 0, "{page}");
        // A wrong token is still unauthorized, not forbidden.
        let (status, _) =
            send(&http, Method::GET, &format!("{}/api/train/runs", hub.url), None, Some("tsk_nope")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        hub.stop().await;
    }

    async fn regression_a_cluster_token_cannot_change_nor_invent_another_clusters_runs(store) {
        let fresh = store.fresh("cluster-token").await;
        let hub = hub(&fresh, false).await;
        let http = Client::new();
        let (_, token_a) = create(&hub.url, &[TokenScope::Write], Some("a")).await;
        let (_, token_b) = create(&hub.url, &[TokenScope::Write], Some("b")).await;
        let forward = |body: Value, token: String| {
            let (http, base) = (http.clone(), hub.url.clone());
            async move {
                let url = format!("{base}/api/train/forwarded/{}", body["id"].as_str().unwrap());
                send(&http, Method::PUT, &url, json_body(&body), Some(&token)).await
            }
        };

        // Cluster b's head forwards its live run.
        let run_b = run("b-run", T0);
        let (status, answer) = forward(of_cluster(&run_b, "b", RunStatus::Running), token_b.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");

        // a's token cannot abort it claiming b; claiming a, the aborted
        // run is a's own, under a's qualified id, and b's is untouched.
        let (status, answer) =
            forward(of_cluster(&run_b, "b", RunStatus::Aborted), token_a.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
        assert_eq!(answer["error"]["code"], "forbidden");
        assert!(answer["error"]["message"].as_str().unwrap().contains("\"a\""), "{answer}");
        let (status, answer) =
            forward(of_cluster(&run_b, "a", RunStatus::Aborted), token_a.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["id"], format!("a:{}", run_b.id()));
        let (_, held) =
            send(&http, Method::GET, &format!("{}/api/train/runs/{}", hub.url, run_b.id()), None, None).await;
        assert_eq!((&held["cluster"], &held["run_status"]), (&json!("b"), &json!("RUNNING")));
        // Nor make up a run claiming cluster b.
        let made_up = run("made-up", T0);
        let (status, answer) = forward(of_cluster(&made_up, "b", RunStatus::Running), token_a.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
        assert_eq!(answer["error"]["field"], "cluster");
        let (status, _) =
            send(&http, Method::GET, &format!("{}/api/train/runs/{}", hub.url, made_up.id()), None, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "the made-up run is not stored");
        // Nor write any other way: a bound token only forwards.
        let (status, answer) = send(
            &http,
            Method::POST,
            &format!("{}/api/train/runs/{}/status", hub.url, run_b.id()),
            json_body(&json!({"status": "ABORTED"})),
            Some(&token_a),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");

        // b's own end is accepted, and the run is b's as b left it.
        let (status, answer) = forward(of_cluster(&run_b, "b", RunStatus::Finished), token_b.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["run_status"], "FINISHED");
        // a forwards its own runs as before.
        let run_a = run("a-run", T0);
        let (status, answer) = forward(of_cluster(&run_a, "a", RunStatus::Running), token_a.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        hub.stop().await;
    }

    async fn regression_run_ids_squatted_on_the_hub_are_the_squatters_own_and_never_block_the_holder(store) {
        let fresh = store.fresh("squatted-ids").await;
        let hub = hub(&fresh, false).await;
        let http = Client::new();
        let (_, token_a) = create(&hub.url, &[TokenScope::Write], Some("a")).await;
        let (_, token_b) = create(&hub.url, &[TokenScope::Write], Some("b")).await;
        let put = |id: String, body: Value, token: String| {
            let (http, base) = (http.clone(), hub.url.clone());
            async move {
                let url = format!("{base}/api/train/forwarded/{id}");
                send(&http, Method::PUT, &url, json_body(&body), Some(&token)).await
            }
        };
        let get = |id: String| {
            let (http, base) = (http.clone(), hub.url.clone());
            async move {
                let (status, run) =
                    send(&http, Method::GET, &format!("{base}/api/train/runs/{id}"), None, None).await;
                assert_eq!(status, StatusCode::OK, "{id}: {run}");
                run
            }
        };

        // b's run id, learnt from b's event stream, forwarded first by a.
        let run_b = run("b-run", T0);
        let id = run_b.id().to_string();
        let qualified = format!("b:{id}");
        let squat = trainstate_testkit::runs::run_with(run_b.id(), "squat", "job1", T0, 8);
        let (status, answer) = put(id.clone(), of_cluster(&squat, "a", RunStatus::Running), token_a.clone()).await;
        assert_eq!((status, &answer["id"]), (StatusCode::OK, &json!(id)), "{answer}");

        // b's own forward is accepted, under b's qualified id, and every
        // later one of b's goes there.
        let (status, answer) = put(id.clone(), of_cluster(&run_b, "b", RunStatus::Running), token_b.clone()).await;
        assert_eq!(status, StatusCode::OK, "b's forward is not refused: {answer}");
        assert_eq!((&answer["id"], &answer["cluster"]), (&json!(qualified), &json!("b")));
        assert_eq!(answer["name"], "b-run");
        let held = get(id.clone()).await;
        assert_eq!((&held["cluster"], &held["name"]), (&json!("a"), &json!("squat")));
        assert_eq!(get(qualified.clone()).await, answer);

        // Each cluster's later forwards change its own run only.
        let (status, answer) = put(id.clone(), of_cluster(&squat, "a", RunStatus::Aborted), token_a.clone()).await;
        assert_eq!((status, &answer["id"]), (StatusCode::OK, &json!(id)), "{answer}");
        assert_eq!(get(qualified.clone()).await["run_status"], "RUNNING", "the squatter never changes b's run");
        let (status, answer) = put(id.clone(), of_cluster(&run_b, "b", RunStatus::Finished), token_b.clone()).await;
        assert_eq!((status, &answer["id"]), (StatusCode::OK, &json!(qualified)), "{answer}");
        assert_eq!(answer["run_status"], "FINISHED");
        let held = get(id.clone()).await;
        assert_eq!((&held["name"], &held["run_status"]), (&json!("squat"), &json!("ABORTED")));
        for (cluster, want) in [("a", &id), ("b", &qualified)] {
            let url = format!("{}/api/train/runs?cluster={cluster}", hub.url);
            let (status, listed) = send(&http, Method::GET, &url, None, None).await;
            assert_eq!(status, StatusCode::OK, "{listed}");
            let ids: Vec<&Value> = listed["train_runs"].as_array().unwrap().iter().map(|r| &r["id"]).collect();
            assert_eq!(ids, [&json!(want)], "{cluster}: {listed}");
        }

        // Nobody else makes a qualified id: not a forward of another
        // cluster's (whichever cluster it claims), not a registration.
        let (status, answer) = put(qualified.clone(), of_cluster(&with_id(&squat, &qualified), "a", RunStatus::Running), token_a.clone()).await;
        assert_eq!((status, &answer["error"]["field"]), (StatusCode::UNPROCESSABLE_ENTITY, &json!("id")), "{answer}");
        let (status, answer) = put(qualified.clone(), of_cluster(&with_id(&squat, &qualified), "b", RunStatus::Running), token_a.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
        let (status, answer) = put(format!("a:{id}"), of_cluster(&with_id(&squat, &format!("a:{id}")), "a", RunStatus::Running), token_a.clone()).await;
        assert_eq!(status, StatusCode::OK, "a run of a's may carry a's own qualifier: {answer}");
        let fresh_id = format!("b:{}", trainstate_schema::RunId::new_v7());
        let registered = with_id(&run("invented", T0), &fresh_id);
        let (status, answer) = send(
            &http,
            Method::POST,
            &format!("{}/api/train/runs", hub.url),
            json_body(&registered),
            Some(HEAD_TOKEN),
        )
        .await;
        assert_eq!((status, &answer["error"]["field"]), (StatusCode::UNPROCESSABLE_ENTITY, &json!("id")), "{answer}");
        assert_eq!(get(qualified.clone()).await["run_status"], "FINISHED");
        hub.stop().await;
    }

    async fn regression_a_token_create_retried_with_its_idempotency_key_creates_one_token_even_across_a_restart(store) {
        let fresh = store.fresh("idempotent-create").await;
        let mut hub = hub(&fresh, true).await;
        let http = Client::new();
        let admin = StateHandle::connect(&hub.url, Some(HEAD_TOKEN.into())).unwrap();
        let request = CreateTokenRequest::new(vec![TokenScope::Read]).with_name(Some("dashboards".into()));
        let key = "retry-0123456789abcdef";
        let first = admin.create_token_with_key(&request, key).await.unwrap();
        // The retry of a create whose answer was lost (a 503 after the
        // token was stored) answers the same token and secret.
        let again = admin.create_token_with_key(&request, key).await.unwrap();
        assert_eq!((&again.token.id, &again.secret), (&first.token.id, &first.secret));
        assert_eq!(admin.list_tokens().await.unwrap().tokens.len(), 1);

        // Another request with the same key: 409 naming the key; a
        // malformed key: 422 naming the header. Neither creates a token.
        let post = |body: Value, key: &'static str| {
            let (http, url) = (http.clone(), format!("{}/api/tokens", hub.url));
            async move {
                let response = http
                    .post(url)
                    .bearer_auth(HEAD_TOKEN)
                    .header("Idempotency-Key", key)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                (response.status(), response.json::<Value>().await.unwrap())
            }
        };
        let (status, answer) = post(json!({"scopes": ["read", "write"]}), key).await;
        assert_eq!(status, StatusCode::CONFLICT, "{answer}");
        assert_eq!(answer["error"]["field"], "Idempotency-Key");
        assert!(answer["error"]["message"].as_str().unwrap().contains(key), "{answer}");
        let (status, answer) = post(json!({"scopes": ["read"]}), "short").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(answer["error"]["field"], "Idempotency-Key");
        assert_eq!(admin.list_tokens().await.unwrap().tokens.len(), 1);

        // The key is kept with the token: after a restart, the same.
        hub.stop().await;
        hub = crate::tokens::hub(&fresh, true).await;
        let admin = StateHandle::connect(&hub.url, Some(HEAD_TOKEN.into())).unwrap();
        let after = admin.create_token_with_key(&request, key).await.unwrap();
        assert_eq!((&after.token.id, &after.secret), (&first.token.id, &first.secret));
        assert_eq!(admin.list_tokens().await.unwrap().tokens.len(), 1);
        let (status, _) =
            send(&http, Method::GET, &format!("{}/api/train/runs", hub.url), None, Some(&after.secret)).await;
        assert_eq!(status, StatusCode::OK, "the secret answered again is the token's");
        // A new key makes a new token.
        let other = admin.create_token(&request).await.unwrap();
        assert_ne!(other.token.id, first.token.id);
        assert_eq!(admin.list_tokens().await.unwrap().tokens.len(), 2);
        hub.stop().await;
    }

    async fn regression_tokens_never_expire_now_one_past_its_expiry_is_refused_on_the_heads_clock(store) {
        let fresh = store.fresh("token-expiry").await;
        let clock = Arc::new(ManualClock::new(T0));
        let http_config = HttpConfig::default()
            .with_token(Some(HEAD_TOKEN.into()))
            .with_protected_reads(true);
        let hub = Server::start(fresh.config().with_clock(clock.clone()), http_config).await;
        let http = Client::new();
        let admin = StateHandle::connect(&hub.url, Some(HEAD_TOKEN.into())).unwrap();
        let expiring = admin
            .create_token(&CreateTokenRequest::new(vec![TokenScope::Read]).with_expires_in_ms(Some(60_000)))
            .await
            .unwrap();
        assert_eq!((expiring.token.expires_at_ms, expiring.token.expired), (Some(T0 + 60_000), false));
        let (_, forever) = create(&hub.url, &[TokenScope::Read], None).await;
        let runs = format!("{}/api/train/runs", hub.url);
        let read = |secret: String| {
            let (http, runs) = (http.clone(), runs.clone());
            async move { send(&http, Method::GET, &runs, None, Some(&secret)).await }
        };
        clock.advance_ms(59_999);
        assert_eq!(read(expiring.secret.clone()).await.0, StatusCode::OK);

        // At its expiry it is refused exactly like an unknown token.
        clock.advance_ms(1);
        let refused = read(expiring.secret.clone()).await;
        assert_eq!(refused.0, StatusCode::UNAUTHORIZED, "{}", refused.1);
        assert_eq!(refused, read("tsk_unknown".into()).await);
        assert_eq!(read(forever).await.0, StatusCode::OK, "a token without expiry never expires");
        // Both were created at the same time: listed in either order.
        let listed = admin.list_tokens().await.unwrap().tokens;
        let mut shown: Vec<_> = listed.iter().map(|t| (t.expires_at_ms, t.expired)).collect();
        shown.sort();
        assert_eq!(shown, [(None, false), (Some(T0 + 60_000), true)]);

        // Bad lifetimes are refused naming the field, and create nothing.
        let tokens = format!("{}/api/tokens", hub.url);
        for lifetime in [json!(0), json!(999), json!(315_360_000_001u64), json!("30d"), json!(-1)] {
            let body = json!({"scopes": ["read"], "expires_in_ms": lifetime});
            let (status, answer) = send(&http, Method::POST, &tokens, json_body(&body), Some(HEAD_TOKEN)).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
            assert_eq!(answer["error"]["field"], "expires_in_ms", "{body}: {answer}");
        }
        assert_eq!(admin.list_tokens().await.unwrap().tokens.len(), 2);
        hub.stop().await;
    }

    async fn regression_a_revoked_token_is_refused_at_once_and_bad_requests_create_nothing(store) {
        let fresh = store.fresh("revoke").await;
        let hub = hub(&fresh, true).await;
        let http = Client::new();
        let admin = StateHandle::connect(&hub.url, Some(HEAD_TOKEN.into())).unwrap();
        let (id, secret) = create(&hub.url, &[TokenScope::Read, TokenScope::Write], None).await;
        let runs = format!("{}/api/train/runs", hub.url);
        let (status, _) = send(&http, Method::GET, &runs, None, Some(&secret)).await;
        assert_eq!(status, StatusCode::OK);

        let revoked = admin.revoke_token(&id).await.unwrap();
        assert!(revoked.revoked_at_ms.is_some());
        // The next request after the answer is refused: no waiting at all.
        let (status, answer) = send(&http, Method::GET, &runs, None, Some(&secret)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
        let listed = admin.list_tokens().await.unwrap();
        assert_eq!(listed.tokens.len(), 1);
        assert_eq!(listed.tokens[0].revoked_at_ms, revoked.revoked_at_ms);
        // Revoking again answers the first revocation; an unknown id is 404.
        assert_eq!(admin.revoke_token(&id).await.unwrap().revoked_at_ms, revoked.revoked_at_ms);
        let (status, _) = send(
            &http,
            Method::DELETE,
            &format!("{}/api/tokens/00000000deadbeef", hub.url),
            None,
            Some(HEAD_TOKEN),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // Bad requests name their field and create nothing.
        let tokens = format!("{}/api/tokens", hub.url);
        for (body, field) in [
            (json!({"scopes": ["owner"]}), "scopes[0]"),
            (json!({"scopes": []}), "scopes"),
            (json!({"scopes": ["read"], "cluster": "a"}), "cluster"),
            (json!({"scopes": ["write", "admin"], "cluster": "a"}), "cluster"),
            (json!({"scopes": ["read"], "name": "a\u{7}b"}), "name"),
        ] {
            let (status, answer) = send(&http, Method::POST, &tokens, json_body(&body), Some(HEAD_TOKEN)).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
            assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
        }
        assert_eq!(admin.list_tokens().await.unwrap().tokens.len(), 1);

        // The secret is kept only as its hash.
        let stored_text = match fresh.url() {
            Some(url) => {
                let client = crate::stores::connect(url).await;
                let rows = client
                    .query("SELECT row_to_json(t)::text FROM trainstate_tokens t", &[])
                    .await
                    .unwrap();
                rows.iter().map(|r| r.get::<_, String>(0)).collect::<String>()
            }
            None => {
                let mut bytes = std::fs::read(fresh.sqlite_path()).unwrap();
                let wal = fresh.sqlite_path().with_extension("db-wal");
                bytes.extend(std::fs::read(wal).unwrap_or_default());
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let hash: String = {
            use sha2::Digest;
            sha2::Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
        };
        assert!(stored_text.contains(&hash), "the store keeps the secret's hash");
        assert!(!stored_text.contains(&secret), "the store never keeps the secret");
        assert!(!stored_text.contains(&secret["tsk_".len()..]), "not even without its prefix");
        hub.stop().await;
    }
}

#[tokio::test]
async fn a_head_without_its_own_token_checks_none_and_administers_none() {
    let server = Server::start(
        trainstate_actor::StateConfig::in_memory()
            .with_name(crate::common::unique_name("no-token")),
        HttpConfig::default(),
    )
    .await;
    let http = Client::new();
    let (status, answer) = send(
        &http,
        Method::POST,
        &format!("{}/api/tokens", server.url),
        json_body(&json!({"scopes": ["read"]})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("--token-file"));
    let (status, _) = send(
        &http,
        Method::POST,
        &format!("{}/api/train/runs", server.url),
        json_body(&run("open", T0)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "writes stay open, as before");
    server.stop().await;
}

#[tokio::test]
async fn the_openapi_document_names_each_routes_access() {
    let document = trainstate_schema::openapi::document();
    for route in routes() {
        let operation = &document["paths"][route.path][route.method.as_lower_str()];
        assert_eq!(operation["x-trainstate-access"], route.access.as_str(), "{}", route.path);
    }
    assert_eq!(document["paths"]["/api/tokens"]["post"]["x-trainstate-access"], "admin");
}
