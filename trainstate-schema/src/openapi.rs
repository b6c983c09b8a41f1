//! The JSON Schemas of the wire types and the OpenAPI 3.1 document of the
//! head service's HTTP API, generated from the Rust types.
//!
//! `cargo xtask codegen` commits their output under `schemas/`, and the head
//! serves the same documents, so a frontend can take either.

use crate::{
    ActorStatus, AttemptStatus, CauseKind, Resources, RunAttempt, RunCause, RunId, RunStatus,
    TrainDatasetInfo, TrainRunInfo, TrainWorkerInfo, ray_v2,
};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::api::{
    AttemptRequest, Cursor, ErrorCode, ErrorResponse, EventKind, HealthResponse, HeartbeatResponse,
    JoinRequest, ListQuery, ProgressReport, ProgressResponse, RankEndRequest, RankHeartbeatRequest,
    RankProgress, RayRunListResponse, RegisterMinimalResponse, RegisterResponse,
    RendezvousResponse, RunEvent, RunListResponse, SnapshotEvent, StatusRequest, VersionResponse,
};
use crate::api::{
    CreateTokenRequest, CreateTokenResponse, TokenInfo, TokenListResponse, TokenScope,
};
use crate::api::{GoodputQuery, GoodputResponse};
use crate::api::{
    NodeDetailResponse, NodeListResponse, NotifyEvent, NotifyResponse, StackCapture, StacksRequest,
    StacksResponse,
};
use crate::routes::{Access, Body, Route, routes};

/// The JSON Schema (2020-12) of every public wire type, by type name, in
/// documentation order. These are deserialize contracts: what is accepted.
pub fn wire_schemas() -> Vec<(&'static str, Schema)> {
    fn of<T: JsonSchema>(name: &'static str) -> (&'static str, Schema) {
        let generator = SchemaSettings::draft2020_12().for_deserialize().into_generator();
        let mut schema = generator.into_root_schema_for::<T>();
        if name == "TrainRunInfo" {
            add_served_members(schema.as_object_mut().expect("a run's schema is an object"));
        }
        (name, schema)
    }
    vec![
        of::<TrainRunInfo>("TrainRunInfo"),
        of::<TrainWorkerInfo>("TrainWorkerInfo"),
        of::<TrainDatasetInfo>("TrainDatasetInfo"),
        of::<RunAttempt>("RunAttempt"),
        of::<RunStatus>("RunStatus"),
        of::<AttemptStatus>("AttemptStatus"),
        of::<ActorStatus>("ActorStatus"),
        of::<RunCause>("RunCause"),
        of::<CauseKind>("CauseKind"),
        of::<RunId>("RunId"),
        of::<Resources>("Resources"),
        // The documents of the HTTP API.
        of::<StatusRequest>("StatusRequest"),
        of::<AttemptRequest>("AttemptRequest"),
        of::<RegisterResponse>("RegisterResponse"),
        of::<RegisterMinimalResponse>("RegisterMinimalResponse"),
        of::<RunListResponse>("RunListResponse"),
        of::<RayRunListResponse>("RayRunListResponse"),
        of::<HeartbeatResponse>("HeartbeatResponse"),
        of::<VersionResponse>("VersionResponse"),
        of::<HealthResponse>("HealthResponse"),
        of::<RunEvent>("RunEvent"),
        of::<SnapshotEvent>("SnapshotEvent"),
        of::<EventKind>("EventKind"),
        of::<ErrorResponse>("ErrorResponse"),
        of::<ErrorCode>("ErrorCode"),
        of::<ListQuery>("ListQuery"),
        of::<Cursor>("Cursor"),
        // Ray Train V2's documents.
        of::<ray_v2::TrainRun>("RayTrainRun"),
        of::<ray_v2::TrainRunAttempt>("RayTrainRunAttempt"),
        of::<ray_v2::TrainRunsResponse>("RayTrainRunsResponse"),
        // The rendezvous.
        of::<JoinRequest>("JoinRequest"),
        of::<RankHeartbeatRequest>("RankHeartbeatRequest"),
        of::<RankProgress>("RankProgress"),
        of::<RankEndRequest>("RankEndRequest"),
        of::<RendezvousResponse>("RendezvousResponse"),
        // Progress a controller reports.
        of::<ProgressReport>("ProgressReport"),
        of::<ProgressResponse>("ProgressResponse"),
        // Token administration.
        of::<TokenScope>("TokenScope"),
        of::<CreateTokenRequest>("CreateTokenRequest"),
        of::<CreateTokenResponse>("CreateTokenResponse"),
        of::<TokenInfo>("TokenInfo"),
        of::<TokenListResponse>("TokenListResponse"),
        // Notifications: what a webhook receives, and the targets' state.
        of::<NotifyEvent>("NotifyEvent"),
        of::<NotifyResponse>("NotifyResponse"),
        // The node ledger.
        of::<NodeListResponse>("NodeListResponse"),
        of::<NodeDetailResponse>("NodeDetailResponse"),
        // Stack captures.
        of::<StacksRequest>("StacksRequest"),
        of::<StackCapture>("StackCapture"),
        of::<StacksResponse>("StacksResponse"),
        // Goodput: a run's and the fleet's.
        of::<crate::RunGoodput>("RunGoodput"),
        of::<GoodputQuery>("GoodputQuery"),
        of::<GoodputResponse>("GoodputResponse"),
    ]
}

/// Adds to a run's schema the members the head writes when it serves a run
/// and keeps apart from the stored run, because they change with every
/// heartbeat (memory only). They are ignored on input.
fn add_served_members(run: &mut Map<String, Value>) {
    let member = json!({
        "type": "array",
        "items": { "type": ["integer", "null"], "format": "uint64", "minimum": 0 },
        "description": "Extension, served only: for a run assembled by the rendezvous, when each rank of its current attempt was last heard from (Unix ms), indexed by world rank; null for a rank not heard from. Kept in the head's memory while it tracks the group (a live run, or one aborted for a lost controller); absent otherwise. Ignored on input."
    });
    let progress = json!({
        "type": "array",
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "step": { "type": ["integer", "null"], "format": "uint64", "minimum": 0 },
                        "total_steps": { "type": ["integer", "null"], "format": "uint64", "minimum": 0 },
                        "phase": { "type": ["string", "null"] },
                        "last_advance_ms": { "type": ["integer", "null"], "format": "uint64", "minimum": 0 },
                        "metrics": { "type": "object", "additionalProperties": { "type": "number" } }
                    },
                    "required": ["step", "total_steps", "phase", "last_advance_ms", "metrics"]
                },
                { "type": "null" }
            ]
        },
        "description": "Extension, served only: for a run whose ranks report progress (a rendezvous run's ranks with their heartbeats, or a run's controller for them), each rank's latest progress report, indexed by world rank (null for a rank that never reported): its step, total_steps, phase and metrics, and last_advance_ms, when its step last grew (Unix ms, the head's clock; after a head restart, from the restart). Kept in the head's memory for the current attempt of a live run (a rendezvous run's while the head tracks its group); absent otherwise. Ignored on input."
    });
    if let Some(Value::Object(properties)) = run.get_mut("properties") {
        properties.insert("rank_last_heartbeat_ms".into(), member);
        properties.insert("rank_progress".into(), progress);
    }
}

/// The text of a generated document: pretty JSON and a final newline, as
/// committed under `schemas/` and as the head serves it.
pub fn to_document_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    text
}

/// The wire schema of `name`, if it is a public wire type.
pub fn wire_schema(name: &str) -> Option<Schema> {
    wire_schemas().into_iter().find(|(n, _)| *n == name).map(|(_, s)| s)
}

/// The OpenAPI 3.1 document of the head service, generated from the route
/// table ([`crate::routes::routes`]) and the document types.
pub fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12().for_deserialize();
    settings.definitions_path = "/components/schemas".into();
    let mut generator = settings.into_generator();
    let mut paths = Map::new();
    for route in routes() {
        let operation = operation(&route, &mut generator);
        let item = paths.entry(route.path).or_insert_with(|| json!({}));
        item[route.method.as_lower_str()] = operation;
    }
    let mut components = generator.take_definitions(true);
    if let Some(Value::Object(run)) = components.get_mut("TrainRunInfo") {
        add_served_members(run);
    }
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "trainstate head service",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Run-state tracking for distributed training. Runs serialise as Ray Train's V1 TrainRunInfo plus trainstate's extensions. Every error answer has the shape {\"error\": {\"code\", \"message\", \"field\"}}. When the head has a token, every route but the open ones needs `Authorization: Bearer <token>` with the scope its `x-trainstate-access` names: `write`, `admin`, and `read` when reads are protected (GET requests may pass `access_token` as a query parameter instead). A valid token without the scope gets 403 `forbidden`; a token bound to a cluster may only forward that cluster's runs.",
            "license": { "name": "MIT OR Apache-2.0", "identifier": "MIT OR Apache-2.0" }
        },
        "components": {
            "schemas": components,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        },
        "paths": paths
    })
}

/// The OpenAPI operation object of one route.
fn operation(route: &Route, generator: &mut SchemaGenerator) -> Value {
    let mut parameters: Vec<Value> = route
        .path_params
        .iter()
        .map(|param| {
            let mut schema = json!({ "type": "string" });
            if let Some(pattern) = param.pattern {
                schema["pattern"] = pattern.into();
            }
            json!({
                "name": param.name, "in": "path", "required": true,
                "description": param.description, "schema": schema
            })
        })
        .collect();
    if let Some(query) = route.query {
        parameters.extend(query_parameters(query(generator)));
    }
    let mut responses = Map::new();
    for success in route.success {
        let mut response = json!({ "description": success.description });
        if let Some(content) = content(success.body, generator) {
            response["content"] = content;
        }
        responses.insert(success.status.to_string(), response);
    }
    let error = generator.subschema_for::<ErrorResponse>().to_value();
    // Every route may refuse a `Host` that names no address of the head,
    // and answer `unavailable` while a starting head loads its stored runs
    // for longer than a request is held.
    let mut errors: Vec<ErrorCode> = route.errors.to_vec();
    for always in [ErrorCode::MisdirectedRequest, ErrorCode::Unavailable] {
        if !errors.contains(&always) {
            errors.push(always);
        }
    }
    let mut statuses: Vec<u16> = errors.iter().map(|c| c.http_status()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    for status in statuses {
        let codes: Vec<&str> =
            errors.iter().filter(|c| c.http_status() == status).map(|c| c.as_str()).collect();
        let schema = json!({
            "allOf": [
                error,
                { "properties": { "error": { "properties": { "code": { "enum": codes } } } } }
            ]
        });
        responses.insert(
            status.to_string(),
            json!({
                "description": format!("An error: {}.", codes.join(", ")),
                "content": { "application/json": { "schema": schema } }
            }),
        );
    }
    let mut operation = json!({
        "operationId": route.operation_id,
        "summary": route.summary,
        "responses": responses,
    });
    if !parameters.is_empty() {
        operation["parameters"] = parameters.into();
    }
    if let Some(request) = route.request {
        operation["requestBody"] = json!({
            "required": true,
            "content": { "application/json": { "schema": request(generator).to_value() } }
        });
    }
    if matches!(route.access, Access::Write | Access::Admin) {
        operation["security"] = json!([{ "bearer": [] }]);
    }
    operation["x-trainstate-access"] = route.access.as_str().into();
    operation
}

/// The OpenAPI content map of a body, if it has one.
fn content(body: Body, generator: &mut SchemaGenerator) -> Option<Value> {
    Some(match body {
        Body::Json(schema) => {
            json!({ "application/json": { "schema": schema(generator).to_value() } })
        }
        Body::Document(media) => json!({ media: { "schema": { "type": "object" } } }),
        Body::EventStream(schemas) => {
            let one_of: Vec<Value> = schemas.iter().map(|s| s(generator).to_value()).collect();
            json!({ "text/event-stream": { "schema": { "oneOf": one_of } } })
        }
        Body::Text(media) => json!({ media: { "schema": { "type": "string" } } }),
        Body::Empty => return None,
    })
}

/// The schema of a query parameter: a query string has no null, so an
/// optional property's `null` alternative is dropped.
fn without_null(mut schema: Value) -> Value {
    if let Some(any_of) = schema.get("anyOf").and_then(Value::as_array) {
        let rest: Vec<&Value> =
            any_of.iter().filter(|s| s.get("type") != Some(&json!("null"))).collect();
        if let [only] = rest.as_slice() {
            return (*only).clone();
        }
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        schema["type"] = if rest.len() == 1 { rest[0].clone() } else { rest.into() };
    }
    schema
}

/// One optional query parameter per property of a query type's schema.
fn query_parameters(schema: Schema) -> Vec<Value> {
    let value = schema.to_value();
    let properties =
        value.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    properties
        .into_iter()
        .map(|(name, mut schema)| {
            let description = schema
                .as_object_mut()
                .and_then(|s| s.remove("description"))
                .unwrap_or_else(|| Value::String(String::new()));
            json!({
                "name": name, "in": "query", "required": false,
                "description": description, "schema": without_null(schema)
            })
        })
        .collect()
}
