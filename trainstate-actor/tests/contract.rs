//! The HTTP contract, checked: every answer a test receives is validated
//! against the schema that the served OpenAPI document gives for its route
//! and status, so the document cannot drift from what is served. And the
//! router serves exactly the routes the document lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::routes::template_matches;

use crate::common::{Server, unique_name};

/// The OpenAPI document the head serves (equal to the committed one: see
/// `every_endpoint_answers_its_success_path`).
fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(trainstate_schema::openapi::document)
}

/// The documented path template that `path` (no query string) matches.
fn template_of(path: &str) -> Option<&'static str> {
    let paths = document()["paths"].as_object().expect("the document has paths");
    // A literal path wins over a template (`/api/train/runs` vs `{id}`).
    paths
        .keys()
        .find(|t| t.as_str() == path)
        .or_else(|| paths.keys().find(|t| template_matches(t, path)))
        .map(String::as_str)
}

/// Validates `instance` against `schema`, whose references point into the
/// document's components. Validators are compiled once per schema.
fn validate(schema: &Value, instance: &Value, what: &str) {
    static VALIDATORS: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> =
        OnceLock::new();
    let key = schema.to_string();
    let cached = VALIDATORS.get_or_init(Mutex::default).lock().unwrap().get(&key).cloned();
    let validator = cached.unwrap_or_else(|| {
        let mut root = schema.clone();
        if let Some(object) = root.as_object_mut() {
            object.insert("components".into(), document()["components"].clone());
        }
        let validator =
            Arc::new(jsonschema::validator_for(&root).expect("the document's schemas compile"));
        VALIDATORS.get().unwrap().lock().unwrap().insert(key, validator.clone());
        validator
    });
    let errors: Vec<String> =
        validator.iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{what} breaks its documented schema: {errors:?}\n{instance}");
}

/// Checks one answer against the document: its route and status must be
/// listed, and a JSON body must match the schema given for them. An
/// undocumented route must answer the router's 404 or 405 error.
pub(crate) fn check_answer(method: &Method, url: &str, status: StatusCode, body: &[u8]) {
    let path = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = path.find('/').map_or("/", |at| &path[at..]);
    let path = path.split('?').next().unwrap_or(path);
    let what = format!("{method} {path} → {status}");
    let Some(template) = template_of(path) else {
        assert!(
            matches!(status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED),
            "{what}: an undocumented route must be refused"
        );
        let error = document()["components"]["schemas"]["ErrorResponse"].clone();
        validate(&error, &serde_json::from_slice(body).expect("a JSON error"), &what);
        return;
    };
    let operation = &document()["paths"][template][method.as_str().to_lowercase()];
    if operation.is_null() {
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{what}: undocumented method");
        return;
    }
    let response = &operation["responses"][status.as_str()];
    assert!(!response.is_null(), "{what}: the document lists no such answer for {template}");
    let content = &response["content"];
    if content.is_null() {
        assert!(body.is_empty(), "{what}: documented without a body, but has one");
    } else if let Some(schema) = content.get("application/json").map(|c| &c["schema"]) {
        let instance: Value = serde_json::from_slice(body)
            .unwrap_or_else(|e| panic!("{what}: documented as JSON, does not parse: {e}"));
        validate(schema, &instance, &what);
    }
}

/// Checks the data of one event of the live stream against the schemas the
/// document gives the stream.
pub(crate) fn check_event(data: &Value) {
    let schema = &document()["paths"]["/api/train/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
        ["schema"];
    validate(schema, data, "an event of /api/train/events");
}

/// Sends a request and checks its answer against the document; returns
/// the status and the body (JSON, or a string when it is not JSON).
pub(crate) async fn send(
    client: &Client,
    method: Method,
    url: &str,
    body: Option<(&str, Vec<u8>)>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = client.request(method.clone(), url);
    if let Some((content_type, bytes)) = body {
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        request = request.body(bytes);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let bytes = response.bytes().await.unwrap();
    check_answer(&method, url, status, &bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// Sends a request with an optional JSON body and checks its answer
/// against the document; returns the status and the body.
pub(crate) async fn send_json(
    client: &Client,
    method: Method,
    url: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let body = body.map(|body| ("application/json", body.to_string().into_bytes()));
    send(client, method, url, body, None).await
}

/// A concrete path for a documented template.
fn concrete(template: &str) -> String {
    template
        .replace("{id}", "0192f0c5a4e27c3db1c1a2b3c4d5e6f7")
        .replace("{name}", "TrainRunInfo")
        .replace("{key}", "torchrun:4f1c")
        .replace("{rank}", "0")
}

#[tokio::test]
async fn the_router_serves_exactly_the_routes_the_openapi_document_lists() {
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("contract")),
        HttpConfig::default(),
    )
    .await;
    let client = Client::new();
    let (_, served) =
        send(&client, Method::GET, &format!("{}/openapi.json", server.url), None, None).await;
    assert_eq!(&served, document(), "the head serves the generated document");
    let methods = [Method::GET, Method::POST, Method::PUT, Method::DELETE];
    for (template, item) in served["paths"].as_object().unwrap() {
        let url = format!("{}{}", server.url, concrete(template));
        for method in &methods {
            let documented = item.get(method.as_str().to_lowercase()).is_some();
            let request = client.request(method.clone(), &url);
            let request = if *method == Method::GET {
                request
            } else {
                request.header("content-type", "application/json").body("{}")
            };
            let response = request.send().await.unwrap();
            let status = response.status();
            let routed = status != StatusCode::METHOD_NOT_ALLOWED
                && !(status == StatusCode::NOT_FOUND && response_is_route_fallback(response).await);
            assert_eq!(
                routed, documented,
                "{method} {template}: served {routed}, documented {documented}"
            );
        }
    }
    // A path the document lacks is not served.
    for path in ["/api/train/runs/x/y", "/api/train", "/api/v1/runs", "/runs", "/index.html"] {
        let (status, body) =
            send(&client, Method::GET, &format!("{}{path}", server.url), None, None).await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (StatusCode::NOT_FOUND, &json!("no_such_route")),
            "{path}"
        );
    }
    server.stop().await;
}

/// True when a 404 is the router's "no such route", not a handler's "no
/// such run".
async fn response_is_route_fallback(response: reqwest::Response) -> bool {
    let bytes = response.bytes().await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    body["error"]["code"] == "no_such_route"
}
