//! The route table of the head service: every route it serves, what each
//! takes and what each answers, as data. The head builds its router from
//! this table, the remote client its URLs, and the OpenAPI document is
//! generated from it, so none can list a route the others lack.
//!
//! The table names no HTTP library: a method is an [`HttpMethod`], a path a
//! template with `{name}` parameters. The documents each route takes and
//! answers are described (as JSON Schema generators) with the `schemars`
//! feature; without it the table still has every route's method, path,
//! access and error codes, and [`SchemaFn`] describes nothing.

#[cfg(feature = "schemars")]
use schemars::{JsonSchema, Schema, SchemaGenerator};

use crate::api::NotifyResponse;
use crate::api::{
    AttemptRequest, ErrorCode, EventsQuery, HealthResponse, HeartbeatResponse, JoinRequest,
    ListQuery, MetricsQuery, MetricsResponse, NodeDetailResponse, NodeListResponse, NodeQuery,
    NodesQuery, ProgressReport, ProgressResponse, RankEndRequest, RankHeartbeatRequest,
    RayRunListResponse, RayWriteQuery, RegisterMinimalResponse, RegisterRequest, RegisterResponse,
    RendezvousResponse, RunEvent, RunListResponse, SnapshotEvent, StatusRequest, VersionResponse,
};
use crate::api::{CreateTokenRequest, CreateTokenResponse, TokenListResponse, TokenScope};
use crate::api::{GoodputQuery, GoodputResponse};
use crate::api::{StackCapture, StacksRequest, StacksResponse};
use crate::{TrainRunInfo, ray_v2};

/// One operation of the HTTP API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `GET /api/train/runs`.
    ListRuns,
    /// `POST /api/train/runs`.
    RegisterRun,
    /// `GET /api/train/v2/runs`.
    ListRunsRay,
    /// `GET /api/train/v2/runs/v1`: Ray Train V2's runs, as Ray serves them.
    ListRunsRayV2,
    /// `PUT /api/train/v2/runs/{id}`: Ray Train V2's run upsert.
    UpsertRayRun,
    /// `PUT /api/train/v2/runs/{id}/attempts/{attempt_id}`: Ray Train V2's attempt upsert.
    UpsertRayAttempt,
    /// `GET /api/train/runs/{id}`.
    GetRun,
    /// `GET /api/train/runs/{id}/metrics`.
    GetRunMetrics,
    /// `GET /api/train/runs/{id}/stacks`.
    GetRunStacks,
    /// `POST /api/train/runs/{id}/stacks`.
    PostRunStacks,
    /// `DELETE /api/train/runs/{id}`.
    DeleteRun,
    /// `POST /api/train/runs/{id}/status`.
    SetRunStatus,
    /// `POST /api/train/runs/{id}/attempts`.
    StartRunAttempt,
    /// `POST /api/train/runs/{id}/heartbeat`.
    HeartbeatRun,
    /// `POST /api/train/runs/{id}/progress`.
    ReportProgress,
    /// `PUT /api/train/forwarded/{id}`.
    ForwardRun,
    /// `GET /api/train/events`.
    RunEvents,
    /// `GET /api/schemas/{name}`.
    GetSchema,
    /// `GET /openapi.json`.
    GetOpenApi,
    /// `GET /api/version`.
    GetVersion,
    /// `GET /api/links`.
    GetLinks,
    /// `GET /healthz`.
    Health,
    /// `GET /metrics`.
    Metrics,
    /// `GET /`: the web page.
    Page,
    /// `GET /runs/{id}`: the web page, opened on one run.
    RunPage,
    /// `GET /nodes`: the web page, opened on the node ledger.
    NodesPage,
    /// `GET /app.js`.
    PageScript,
    /// `GET /style.css`.
    PageStyle,
    /// `GET /contract.js`: the paths, statuses and limits the page's script uses.
    PageContract,
    /// `POST /api/train/rendezvous/{key}/join`.
    JoinRendezvous,
    /// `POST /api/train/runs/{id}/ranks/{rank}/heartbeat`.
    HeartbeatRank,
    /// `POST /api/train/runs/{id}/ranks/{rank}/end`.
    EndRank,
    /// `POST /api/tokens`.
    CreateToken,
    /// `GET /api/tokens`.
    ListTokens,
    /// `DELETE /api/tokens/{id}`.
    RevokeToken,
    /// `GET /api/notify`: the notification targets and their delivery.
    GetNotify,
    /// `GET /api/train/nodes`: the node ledger.
    ListNodes,
    /// `GET /api/train/nodes/{node}`: one node and the runs behind its counts.
    GetNode,
    /// `GET /api/train/goodput`: the fleet's goodput, summed by cluster, node or name.
    GetGoodput,
    /// `GET /goodput`: the web page, opened on the fleet's goodput.
    GoodputPage,
}

/// An HTTP method the API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HttpMethod {
    /// GET.
    Get,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// DELETE.
    Delete,
}

impl HttpMethod {
    /// The lower-case name OpenAPI keys operations by.
    pub fn as_lower_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "get",
            HttpMethod::Post => "post",
            HttpMethod::Put => "put",
            HttpMethod::Delete => "delete",
        }
    }

    /// True for methods that change nothing.
    pub fn is_read(self) -> bool {
        matches!(self, HttpMethod::Get)
    }
}

/// Generates the JSON Schema of one document type.
#[cfg(feature = "schemars")]
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// Names one document type; without the `schemars` feature it generates
/// nothing.
#[cfg(not(feature = "schemars"))]
pub type SchemaFn = fn();

/// The schema of `T`, as a reference into the generator's definitions.
#[cfg(feature = "schemars")]
pub fn schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The schema of `T` itself, not a reference: what a query type's
/// properties are read from.
#[cfg(feature = "schemars")]
pub fn inline_schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    T::json_schema(generator)
}

/// Names the document `T` (nothing to generate without `schemars`).
#[cfg(not(feature = "schemars"))]
pub fn schema_of<T>() {}

/// Names the query type `T` (nothing to generate without `schemars`).
#[cfg(not(feature = "schemars"))]
pub fn inline_schema_of<T>() {}

/// What a body is.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum Body {
    /// JSON of this schema (`application/json`).
    Json(SchemaFn),
    /// A JSON document of its own kind (a JSON Schema, the OpenAPI
    /// document), of this media type.
    Document(&'static str),
    /// Server-Sent Events whose data is one of these schemas.
    EventStream(&'static [SchemaFn]),
    /// Text of this media type.
    Text(&'static str),
    /// No body.
    Empty,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Body::Json(_) => "Json",
            Body::Document(media) => media,
            Body::EventStream(_) => "EventStream",
            Body::Text(media) => media,
            Body::Empty => "Empty",
        })
    }
}

/// One successful answer of a route.
#[derive(Debug, Clone, Copy)]
pub struct Success {
    /// Its HTTP status.
    pub status: u16,
    /// When it is given.
    pub description: &'static str,
    /// What it carries.
    pub body: Body,
}

/// A path parameter.
#[derive(Debug, Clone, Copy)]
pub struct PathParam {
    /// Its name in the path template.
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// The pattern it must match, if any.
    pub pattern: Option<&'static str>,
}

/// Who may call a route: the scope its bearer token needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// A write: needs a token with the scope `write` when the head has
    /// tokens. A token bound to a cluster may only forward that cluster's runs.
    Write,
    /// A read: needs a token with the scope `read` only when reads are protected.
    Read,
    /// Token administration: needs a token with the scope `admin`.
    Admin,
    /// Always open (the page, so it can ask for a token, and liveness).
    Open,
}

impl Access {
    /// The lower-case name the OpenAPI document gives it (`x-trainstate-access`).
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Write => "write",
            Access::Read => "read",
            Access::Admin => "admin",
            Access::Open => "open",
        }
    }

    /// The scope a token needs for this access; `None` for open routes.
    pub fn scope(self) -> Option<TokenScope> {
        match self {
            Access::Write => Some(TokenScope::Write),
            Access::Read => Some(TokenScope::Read),
            Access::Admin => Some(TokenScope::Admin),
            Access::Open => None,
        }
    }
}

/// One route of the API.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Route {
    /// What it does.
    pub operation: Operation,
    /// The OpenAPI `operationId`.
    pub operation_id: &'static str,
    /// Its method.
    pub method: HttpMethod,
    /// Its path template, with `{name}` parameters (axum and OpenAPI agree).
    pub path: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Its path parameters.
    pub path_params: &'static [PathParam],
    /// Its query parameters: the properties of this schema's object.
    pub query: Option<SchemaFn>,
    /// Its request body.
    pub request: Option<SchemaFn>,
    /// Its successful answers.
    pub success: &'static [Success],
    /// The error codes it may answer, each with its status and an
    /// [`ErrorResponse`](crate::api::ErrorResponse) body.
    pub errors: &'static [ErrorCode],
    /// False for the event stream, which has no request deadline.
    pub timed: bool,
}

const RUN_ID: PathParam =
    PathParam { name: "id", description: "The run id.", pattern: Some(crate::RUN_ID_PATTERN) };

const RENDEZVOUS_KEY: PathParam = PathParam {
    name: "key",
    description: "The key every rank of one launch shares (the launcher's job id, for example).",
    pattern: Some(crate::api::RENDEZVOUS_KEY_PATTERN),
};

const RANK: PathParam = PathParam {
    name: "rank",
    description: "The rank's world rank.",
    pattern: Some("^[0-9]{1,5}$"),
};

/// What every rendezvous route answers.
const RENDEZVOUS_ANSWER: &[Success] = &[Success {
    status: 200,
    description: "Where the rank's group stands.",
    body: Body::Json(schema_of::<RendezvousResponse>),
}];

/// The errors any write may answer.
const WRITE_ERRORS: &[ErrorCode] = &[
    ErrorCode::BadRequest,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::NotFound,
    ErrorCode::Conflict,
    ErrorCode::IllegalTransition,
    ErrorCode::PayloadTooLarge,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::Invalid,
    ErrorCode::Corrupt,
    ErrorCode::Unavailable,
    ErrorCode::Overloaded,
    ErrorCode::Timeout,
    ErrorCode::RequestTimeout,
];

/// The errors of an unpaged listing: a read's, and `overloaded` when the
/// answers slow clients have not read yet hold the budget of answer bytes.
const LISTING_ERRORS: &[ErrorCode] = &[
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::Corrupt,
    ErrorCode::Unavailable,
    ErrorCode::Overloaded,
    ErrorCode::Timeout,
];

/// The errors of a read that cannot fail but for its token.
const READ_ERRORS: &[ErrorCode] = &[ErrorCode::Unauthorized, ErrorCode::Forbidden];

/// The errors of token administration.
const ADMIN_ERRORS: &[ErrorCode] = &[
    ErrorCode::BadRequest,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::NotFound,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::PayloadTooLarge,
    ErrorCode::Invalid,
    ErrorCode::Unavailable,
    ErrorCode::Timeout,
];

/// The errors of a token's creation: those of administration, and a
/// conflict (an idempotency key used with another request).
const CREATE_TOKEN_ERRORS: &[ErrorCode] = &[
    ErrorCode::BadRequest,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::NotFound,
    ErrorCode::Conflict,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::PayloadTooLarge,
    ErrorCode::Invalid,
    ErrorCode::Unavailable,
    ErrorCode::Timeout,
];

const NODE: PathParam = PathParam {
    name: "node",
    description: "The node: a worker's `node_name`, or its `node_id` where it has none. At most 1,024 characters, no control characters.",
    pattern: None,
};

/// The errors of the node routes.
const NODE_ERRORS: &[ErrorCode] = &[
    ErrorCode::Invalid,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::Unavailable,
    ErrorCode::Timeout,
];

const TOKEN_ID: PathParam =
    PathParam { name: "id", description: "The token's id.", pattern: Some("^[0-9a-f]{16}$") };

/// The run as the answers of writes and reads carry it.
const RUN: SchemaFn = schema_of::<TrainRunInfo>;

/// What a registration answers: the run as stored, or without it when the
/// request says `Prefer: return=minimal`.
#[cfg(feature = "schemars")]
fn register_answer(generator: &mut SchemaGenerator) -> Schema {
    let full = schema_of::<RegisterResponse>(generator);
    let minimal = schema_of::<RegisterMinimalResponse>(generator);
    schemars::json_schema!({ "oneOf": [full, minimal] })
}

/// Names what a registration answers (nothing to generate without `schemars`).
#[cfg(not(feature = "schemars"))]
fn register_answer() {
    schema_of::<(RegisterResponse, RegisterMinimalResponse)>()
}

/// Every route the head serves, in documentation order.
pub fn routes() -> Vec<Route> {
    use Access::{Admin, Open, Read, Write};
    use HttpMethod::{Delete, Get, Post, Put};
    let route = |operation, operation_id, method, path, summary, access| Route {
        operation,
        operation_id,
        method,
        path,
        summary,
        access,
        path_params: &[],
        query: None,
        request: None,
        success: &[],
        errors: &[],
        timed: true,
    };
    vec![
        Route {
            query: Some(inline_schema_of::<ListQuery>),
            success: &[Success {
                status: 200,
                description: "One page.",
                body: Body::Json(schema_of::<RunListResponse>),
            }],
            errors: &[
                ErrorCode::BadRequest,
                ErrorCode::Invalid,
                ErrorCode::Unauthorized,
                ErrorCode::Forbidden,
                ErrorCode::Corrupt,
                ErrorCode::Unavailable,
                ErrorCode::Overloaded,
                ErrorCode::Timeout,
            ],
            ..route(
                Operation::ListRuns,
                "listRuns",
                Get,
                "/api/train/runs",
                "List runs, newest first (start_time_ms desc, id desc), filtered and paged.",
                Read,
            )
        },
        Route {
            request: Some(schema_of::<RegisterRequest>),
            success: &[
                Success {
                    status: 201,
                    description: "Registered. With `Prefer: return=minimal`, the answer omits the run (RegisterMinimalResponse) and says `Preference-Applied: return=minimal`.",
                    body: Body::Json(register_answer),
                },
                Success {
                    status: 200,
                    description: "Already registered with the same metadata. With `Prefer: return=minimal`, the answer omits the run (RegisterMinimalResponse) and says `Preference-Applied: return=minimal`.",
                    body: Body::Json(register_answer),
                },
            ],
            errors: WRITE_ERRORS,
            ..route(
                Operation::RegisterRun,
                "registerRun",
                Post,
                "/api/train/runs",
                "Register a run. Repeating it with identical static metadata is a no-op (200); with different metadata, 409. An ended run that retention would evict at once (the most runs are kept, and it started before every ended run kept) is refused with 409 and not stored. A new live run past the head's bound on live runs (--max-live-runs) is refused with 503 overloaded and not stored.",
                Write,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Every run.",
                body: Body::Json(schema_of::<RayRunListResponse>),
            }],
            errors: LISTING_ERRORS,
            ..route(
                Operation::ListRunsRay,
                "listRunsRay",
                Get,
                "/api/train/v2/runs",
                "Every retained run, newest first, unpaged: Ray 2.60's dashboard route for Train V1 state.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Every run, as Ray's TrainRunsResponse.",
                body: Body::Json(schema_of::<ray_v2::TrainRunsResponse>),
            }],
            errors: LISTING_ERRORS,
            ..route(
                Operation::ListRunsRayV2,
                "listRunsRayV2",
                Get,
                "/api/train/v2/runs/v1",
                "Every retained run, newest first, unpaged, as Ray 2.60 answers its Train V2 route: DecoratedTrainRuns with their attempts and workers. Runs registered the V1 way get what V2 requires (an attempt, framework_versions, complete default run_settings).",
                Read,
            )
        },
        Route {
            path_params: &[RUN_ID],
            query: Some(inline_schema_of::<RayWriteQuery>),
            request: Some(schema_of::<ray_v2::TrainRun>),
            success: &[Success {
                status: 200,
                description: "The run after the write.",
                body: Body::Json(RUN),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::UpsertRayRun,
                "upsertRayRun",
                Put,
                "/api/train/v2/runs/{id}",
                "Create or update a run from Ray Train V2's whole TrainRun (its id must be the path's). Idempotent; a terminal run never moves back to live; static metadata never changes. A new ended run that retention would evict at once is refused with 409 and not stored. A new live run past the head's bound on live runs (--max-live-runs) is refused with 503 overloaded and not stored.",
                Write,
            )
        },
        Route {
            path_params: &[
                RUN_ID,
                PathParam { name: "attempt_id", description: "The attempt id.", pattern: None },
            ],
            query: Some(inline_schema_of::<RayWriteQuery>),
            request: Some(schema_of::<ray_v2::TrainRunAttempt>),
            success: &[Success {
                status: 200,
                description: "The run after the write.",
                body: Body::Json(RUN),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::UpsertRayAttempt,
                "upsertRayAttempt",
                Put,
                "/api/train/v2/runs/{id}/attempts/{attempt_id}",
                "Create or update an attempt from Ray Train V2's whole TrainRunAttempt (run_id and attempt_id must be the path's). Idempotent; a terminal attempt never moves back to live, and an ended run's attempt never changes its status (409); a new attempt ends the one before it.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID],
            success: &[Success { status: 200, description: "The run.", body: Body::Json(RUN) }],
            errors: &[
                ErrorCode::Invalid,
                ErrorCode::Unauthorized,
                ErrorCode::Forbidden,
                ErrorCode::NotFound,
                ErrorCode::Corrupt,
                ErrorCode::Unavailable,
                ErrorCode::Timeout,
            ],
            ..route(Operation::GetRun, "getRun", Get, "/api/train/runs/{id}", "One run.", Read)
        },
        Route {
            path_params: &[RUN_ID],
            query: Some(inline_schema_of::<MetricsQuery>),
            success: &[Success {
                status: 200,
                description: "The run's metric series.",
                body: Body::Json(schema_of::<MetricsResponse>),
            }],
            errors: &[
                ErrorCode::Invalid,
                ErrorCode::Unauthorized,
                ErrorCode::Forbidden,
                ErrorCode::NotFound,
                ErrorCode::Unavailable,
                ErrorCode::Timeout,
            ],
            ..route(
                Operation::GetRunMetrics,
                "getRunMetrics",
                Get,
                "/api/train/runs/{id}/metrics",
                "The history of each metric the ranks of a rendezvous run reported with their progress (current attempt, memory only), downsampled to at most 1,000 points a metric; optionally one name, one rank and a range of steps.",
                Read,
            )
        },
        Route {
            path_params: &[RUN_ID],
            success: &[Success {
                status: 200,
                description: "The run's captures, newest first: when, why, each rank's stack or that it did not answer, the groups and the suspects.",
                body: Body::Json(schema_of::<StacksResponse>),
            }],
            errors: &[
                ErrorCode::Unauthorized,
                ErrorCode::Forbidden,
                ErrorCode::NotFound,
                ErrorCode::Unavailable,
                ErrorCode::Timeout,
            ],
            ..route(
                Operation::GetRunStacks,
                "getRunStacks",
                Get,
                "/api/train/runs/{id}/stacks",
                "Where every rank of a run is (or was) stuck: the captures of its ranks' stacks (the run stalled, or someone asked), newest first, each with every rank's stack or that it did not answer, the ranks grouped by the same stack, and the ranks outside the largest group named as suspects with their innermost frame.",
                Read,
            )
        },
        Route {
            path_params: &[RUN_ID],
            request: Some(schema_of::<StacksRequest>),
            success: &[
                Success {
                    status: 200,
                    description: "The ranks' stacks were kept: the capture as it now stands.",
                    body: Body::Json(schema_of::<StackCapture>),
                },
                Success {
                    status: 202,
                    description: "A capture was opened: the run's ranks are asked for their stacks.",
                    body: Body::Json(schema_of::<StackCapture>),
                },
            ],
            errors: WRITE_ERRORS,
            ..route(
                Operation::PostRunStacks,
                "postRunStacks",
                Post,
                "/api/train/runs/{id}/stacks",
                "With no ranks: ask a live run's ranks for their stacks (202; 409 while a capture is pending or within 30 s of the last). With capture_id and ranks: the ranks' answer to that capture. With ranks and no capture_id: a capture a controller made itself. A stack over the byte bound is kept cut and marked truncated; an unknown run is 404, an ended attempt or a rank not in it 409 or 422 naming the field.",
                Write,
            )
        },
        Route {
            query: Some(inline_schema_of::<NodesQuery>),
            success: &[Success {
                status: 200,
                description: "Every node seen under runs in the window, suspects first, then by failures; with `format=exclude`, the suspects' names as one comma-separated line (`text/plain`).",
                body: Body::Json(schema_of::<NodeListResponse>),
            }],
            errors: NODE_ERRORS,
            ..route(
                Operation::ListNodes,
                "listNodes",
                Get,
                "/api/train/nodes",
                "The node ledger: per node, attempts hosted, failures by class where one of its ranks failed first or it was lost, times named a stall suspect or straggler, last seen, and the verdict `suspect` with its reason (docs/nodes.md). `format=exclude` answers the suspects as a scheduler exclude list.",
                Read,
            )
        },
        Route {
            query: Some(inline_schema_of::<GoodputQuery>),
            success: &[Success {
                status: 200,
                description: "Every retained run's time in the window, weighted by its GPUs (its workers when it has none) and summed by cluster, node or run name, most GPU time lost first, with the total.",
                body: Body::Json(schema_of::<GoodputResponse>),
            }],
            errors: NODE_ERRORS,
            ..route(
                Operation::GetGoodput,
                "getGoodput",
                Get,
                "/api/train/goodput",
                "The fleet's goodput: the share of the GPU time runs held that went into progress that was kept, and where the rest went by bucket (waiting to start, restarting, stalled, checkpointing, progress lost, slower than pace), per cluster, node or run name (docs/goodput.md). A window that starts before the oldest retained run counts what is retained and says so (`beyond_retention`).",
                Read,
            )
        },
        Route {
            path_params: &[NODE],
            query: Some(inline_schema_of::<NodeQuery>),
            success: &[Success {
                status: 200,
                description: "The node in each cluster it was seen in, with the runs behind each count.",
                body: Body::Json(schema_of::<NodeDetailResponse>),
            }],
            errors: &[
                ErrorCode::Invalid,
                ErrorCode::Unauthorized,
                ErrorCode::Forbidden,
                ErrorCode::NotFound,
                ErrorCode::Unavailable,
                ErrorCode::Timeout,
            ],
            ..route(
                Operation::GetNode,
                "getNode",
                Get,
                "/api/train/nodes/{node}",
                "One node of the ledger and the runs behind each of its counts (404 for a node never seen under a retained run).",
                Read,
            )
        },
        Route {
            path_params: &[RUN_ID],
            success: &[Success { status: 204, description: "Deleted.", body: Body::Empty }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::DeleteRun,
                "deleteRun",
                Delete,
                "/api/train/runs/{id}",
                "Delete an ended run (409 while it is live).",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID],
            request: Some(schema_of::<StatusRequest>),
            success: &[Success {
                status: 200,
                description: "The run after the change.",
                body: Body::Json(RUN),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::SetRunStatus,
                "setRunStatus",
                Post,
                "/api/train/runs/{id}/status",
                "Set a run's status along a legal transition. Repeating the current terminal status (same cause) is a no-op.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID],
            request: Some(schema_of::<AttemptRequest>),
            success: &[Success {
                status: 200,
                description: "The run after the change.",
                body: Body::Json(RUN),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::StartRunAttempt,
                "startRunAttempt",
                Post,
                "/api/train/runs/{id}/attempts",
                "Replace a live run's worker group with a new attempt. Repeating the current attempt is a no-op.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID],
            success: &[Success {
                status: 200,
                description: "The renewed lease.",
                body: Body::Json(schema_of::<HeartbeatResponse>),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::HeartbeatRun,
                "heartbeatRun",
                Post,
                "/api/train/runs/{id}/heartbeat",
                "Renew a live run's lease.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID],
            request: Some(schema_of::<ProgressReport>),
            success: &[Success {
                status: 200,
                description: "Taken: the run's lease is renewed, and the progress recorded while the run is RUNNING.",
                body: Body::Json(schema_of::<ProgressResponse>),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::ReportProgress,
                "reportProgress",
                Post,
                "/api/train/runs/{id}/progress",
                "A controller says where the training loop of some of its run's ranks is: each rank's step, phase and metrics (memory only; served as the run's rank_progress and metric histories, from which the head decides its health). A report is a sign of life of the run: it renews its lease, like its heartbeat. A bad report is refused whole (422, naming the field, such as ranks[2].progress.metrics[\"loss\"]) and nothing of it is recorded. 404 for an unknown run; 409 for an ended run, a run of the rendezvous (its ranks report with their heartbeats), an attempt that is not the current one, a rank that is not one of the attempt's workers, or a step lower than the rank's previous one.",
                Write,
            )
        },
        Route {
            path_params: &[RENDEZVOUS_KEY],
            request: Some(schema_of::<JoinRequest>),
            success: RENDEZVOUS_ANSWER,
            errors: WRITE_ERRORS,
            ..route(
                Operation::JoinRendezvous,
                "joinRendezvous",
                Post,
                "/api/train/rendezvous/{key}/join",
                "Join one rank of a launch without a controller (torchrun, Slurm) into its group. The first join assigns the run id; the join that completes the group registers the run (or a new attempt of a live run of the same key) and is answered once committed. Repeating a join is a no-op; a second process for a rank, a world size that disagrees, or a join into a closed group or an ended run is refused (409). A group whose ranks do not all join within its join timeout is registered as ended: ABORTED (SYSTEM_ERROR), or ERRORED if a rank reported an error.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID, RANK],
            request: Some(schema_of::<RankHeartbeatRequest>),
            success: RENDEZVOUS_ANSWER,
            errors: WRITE_ERRORS,
            ..route(
                Operation::HeartbeatRank,
                "heartbeatRank",
                Post,
                "/api/train/runs/{id}/ranks/{rank}/heartbeat",
                "A rank is alive: renews the run's lease and records when the rank was last heard from and, when the body carries progress, its step, phase and metrics (memory only; served as the run's rank_last_heartbeat_ms and rank_progress, from which the head decides its health). 404 when the head does not know the rank's group (after a head restart, join again); 409 when the rank's attempt was replaced.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID, RANK],
            request: Some(schema_of::<RankEndRequest>),
            success: RENDEZVOUS_ANSWER,
            errors: WRITE_ERRORS,
            ..route(
                Operation::EndRank,
                "endRank",
                Post,
                "/api/train/runs/{id}/ranks/{rank}/end",
                "Report how one rank ended. The run FINISHES when every rank of its current attempt has finished; it is ERRORED (with the rank and its traceback) or ABORTED at the first rank that errored or was interrupted, unless restarts_remaining says the launcher restarts the workers. An end that ends the run is answered once committed; an end after the run ended answers its status.",
                Write,
            )
        },
        Route {
            path_params: &[RUN_ID],
            request: Some(RUN),
            success: &[Success {
                status: 200,
                description: "The run as stored here (unchanged when it was already).",
                body: Body::Json(RUN),
            }],
            errors: WRITE_ERRORS,
            ..route(
                Operation::ForwardRun,
                "forwardRun",
                Put,
                "/api/train/forwarded/{id}",
                "Store a run forwarded by the head of another cluster (`trainstate serve --forward-to`), as it is: the write of a hub. It must name its cluster. Runs are keyed by cluster and id: when a run of another cluster holds the id, the run is stored (and answered) as `<cluster>:<id>`, where its later forwards go; an id qualified by another cluster is refused (422 naming `id`). Repeating it is a no-op; a run never goes back to an earlier state, and its static metadata never changes (409). A new live run past the head's bound on live runs (--max-live-runs) is refused with 503 overloaded and not stored.",
                Write,
            )
        },
        Route {
            request: Some(schema_of::<CreateTokenRequest>),
            success: &[Success {
                status: 201,
                description: "Created; the secret is in this answer only.",
                body: Body::Json(schema_of::<CreateTokenResponse>),
            }],
            errors: CREATE_TOKEN_ERRORS,
            ..route(
                Operation::CreateToken,
                "createToken",
                Post,
                "/api/tokens",
                "Create a bearer token with scopes (read, write, admin), optionally bound to one cluster (scope write only: it may then only forward that cluster's runs), optionally expiring (`expires_in_ms` from its creation, on the head's clock; past it the token is refused like an unknown one). The secret is answered once; the head keeps its SHA-256 hash. With an `Idempotency-Key` header (16 to 128 visible ASCII characters, best random), a repeat of the same request with the same key answers the token the first created, with its secret, and creates none, across restarts too; another request with that key is 409 naming the key. Without one, each call creates a token.",
                Admin,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Every token, oldest first, without secrets.",
                body: Body::Json(schema_of::<TokenListResponse>),
            }],
            errors: ADMIN_ERRORS,
            ..route(
                Operation::ListTokens,
                "listTokens",
                Get,
                "/api/tokens",
                "Every token created (revoked ones with their revocation time); never a secret.",
                Admin,
            )
        },
        Route {
            path_params: &[TOKEN_ID],
            success: &[Success {
                status: 200,
                description: "The token, revoked.",
                body: Body::Json(schema_of::<crate::api::TokenInfo>),
            }],
            errors: ADMIN_ERRORS,
            ..route(
                Operation::RevokeToken,
                "revokeToken",
                Delete,
                "/api/tokens/{id}",
                "Revoke a token: this head refuses it at once, every head sharing the store within a second. Repeating it answers the token as revoked first.",
                Admin,
            )
        },
        Route {
            query: Some(inline_schema_of::<EventsQuery>),
            success: &[Success {
                status: 200,
                description: "The event stream: a `snapshot` event (a SnapshotEvent), then one RunEvent per committed change, named by its kind, with its sequence number as id. An `error` event carries an ErrorResponse.",
                body: Body::EventStream(&[
                    schema_of::<SnapshotEvent>,
                    schema_of::<RunEvent>,
                    schema_of::<crate::api::ErrorResponse>,
                ]),
            }],
            errors: &[
                ErrorCode::BadRequest,
                ErrorCode::Invalid,
                ErrorCode::Unauthorized,
                ErrorCode::Forbidden,
                ErrorCode::Unavailable,
                ErrorCode::TooManySubscribers,
            ],
            timed: false,
            ..route(
                Operation::RunEvents,
                "runEvents",
                Get,
                "/api/train/events",
                "Server-Sent Events: every run, then every committed change. Reconnect with Last-Event-ID (or last_event_id) to resume without gaps; when the head no longer keeps those events (or the id is another head's or another process's: each names its own stream, at random, in the id's high bits) it sends a fresh snapshot instead. A subscriber that falls behind gets a fresh snapshot at S, then only events above S: within a stream, ids always increase.",
                Read,
            )
        },
        Route {
            path_params: &[PathParam {
                name: "name",
                description: "A wire type, for example TrainRunInfo (a .schema.json or .json suffix is allowed).",
                pattern: None,
            }],
            success: &[Success {
                status: 200,
                description: "The schema.",
                body: Body::Document("application/schema+json"),
            }],
            errors: &[ErrorCode::Unauthorized, ErrorCode::Forbidden, ErrorCode::NotFound],
            ..route(
                Operation::GetSchema,
                "getSchema",
                Get,
                "/api/schemas/{name}",
                "The JSON Schema (2020-12) of a wire type.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The OpenAPI document.",
                body: Body::Document("application/json"),
            }],
            errors: READ_ERRORS,
            ..route(
                Operation::GetOpenApi,
                "getOpenApi",
                Get,
                "/openapi.json",
                "This document.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Versions.",
                body: Body::Json(schema_of::<VersionResponse>),
            }],
            errors: READ_ERRORS,
            ..route(
                Operation::GetVersion,
                "getVersion",
                Get,
                "/api/version",
                "Service and schema versions.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The templates; null where none is configured.",
                body: Body::Json(schema_of::<crate::api::LinksResponse>),
            }],
            errors: READ_ERRORS,
            ..route(
                Operation::GetLinks,
                "getLinks",
                Get,
                "/api/links",
                "The URL templates of links out to logs and metrics dashboards, as the operator configured them.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Every target, in the order given; none when the head notifies nobody.",
                body: Body::Json(schema_of::<NotifyResponse>),
            }],
            errors: READ_ERRORS,
            ..route(
                Operation::GetNotify,
                "getNotify",
                Get,
                "/api/notify",
                "The notification targets (webhooks, Slack, Alertmanager; URLs without secrets) and how their delivery goes: position, pending, sent, failures, dropped, the last error.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Healthy; `loaded` says whether every stored run is loaded.",
                body: Body::Json(schema_of::<HealthResponse>),
            }],
            errors: &[ErrorCode::Unavailable, ErrorCode::Timeout],
            ..route(
                Operation::Health,
                "health",
                Get,
                "/healthz",
                "Liveness: 200 while the head serves and its state actor answers. Readiness: `loaded` is false while a starting head loads its stored runs (other requests wait for the load meanwhile), true once every stored run is loaded.",
                Open,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "Metrics.",
                body: Body::Text("text/plain"),
            }],
            errors: READ_ERRORS,
            ..route(
                Operation::Metrics,
                "metrics",
                Get,
                "/metrics",
                "Prometheus text exposition: runs by status, requests by route and code, request latency, store commits, subscribers.",
                Read,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The page.",
                body: Body::Text("text/html"),
            }],
            ..route(Operation::Page, "page", Get, "/", "The web page: every run, live.", Open)
        },
        Route {
            path_params: &[RUN_ID],
            success: &[Success {
                status: 200,
                description: "The page.",
                body: Body::Text("text/html"),
            }],
            ..route(
                Operation::RunPage,
                "runPage",
                Get,
                "/runs/{id}",
                "The web page, opened on one run.",
                Open,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The page.",
                body: Body::Text("text/html"),
            }],
            ..route(
                Operation::NodesPage,
                "nodesPage",
                Get,
                "/nodes",
                "The web page, opened on the node ledger (suspects first).",
                Open,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The page.",
                body: Body::Text("text/html"),
            }],
            ..route(
                Operation::GoodputPage,
                "goodputPage",
                Get,
                "/goodput",
                "The web page, opened on the fleet's goodput (by cluster, node or run name).",
                Open,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The page's script.",
                body: Body::Text("text/javascript"),
            }],
            ..route(Operation::PageScript, "pageScript", Get, "/app.js", "The page's script.", Open)
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The page's style sheet.",
                body: Body::Text("text/css"),
            }],
            ..route(
                Operation::PageStyle,
                "pageStyle",
                Get,
                "/style.css",
                "The page's style sheet.",
                Open,
            )
        },
        Route {
            success: &[Success {
                status: 200,
                description: "The contract the page's script reads.",
                body: Body::Text("text/javascript"),
            }],
            ..route(
                Operation::PageContract,
                "pageContract",
                Get,
                "/contract.js",
                "The route table's paths, the statuses, event kinds, error codes and limits, as the page's script reads them (generated).",
                Open,
            )
        },
    ]
}

/// The route of `operation`.
pub fn route(operation: Operation) -> Route {
    routes()
        .into_iter()
        .find(|route| route.operation == operation)
        .expect("every operation has one route")
}

impl Route {
    /// This route's path with each `{name}` parameter of its template
    /// replaced by its value in `params`, percent-encoded as one path
    /// segment (every byte but RFC 3986's unreserved characters), so any
    /// text reaches the head as the one value it was.
    ///
    /// # Panics
    ///
    /// When `params` has no value for a parameter of the template: the
    /// caller and the table disagree.
    pub fn path_with(&self, params: &[(&str, &str)]) -> String {
        let mut path = String::with_capacity(self.path.len() + 40);
        for (i, segment) in self.path.split('/').enumerate() {
            if i > 0 {
                path.push('/');
            }
            match segment.strip_prefix('{').and_then(|rest| rest.strip_suffix('}')) {
                Some(name) => {
                    let value = params
                        .iter()
                        .find_map(|(key, value)| (*key == name).then_some(*value))
                        .unwrap_or_else(|| {
                            panic!("{} needs the path parameter {name}", self.operation_id)
                        });
                    percent_encode_segment(value, &mut path);
                }
                None => path.push_str(segment),
            }
        }
        path
    }
}

/// Appends `value` to `out` with every byte but RFC 3986's unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) written as `%XX`.
fn percent_encode_segment(value: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &byte in value.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
    }
}

/// The route whose template matches `method` and the concrete `path`
/// (without its query string), if any.
pub fn route_for(method: HttpMethod, path: &str) -> Option<Route> {
    routes().into_iter().find(|route| route.method == method && template_matches(route.path, path))
}

/// True when `path` fits `template`, each `{param}` standing for one
/// non-empty segment.
pub fn template_matches(template: &str, path: &str) -> bool {
    let (mut want, mut have) = (template.split('/'), path.split('/'));
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some(w), Some(h)) if w.starts_with('{') && w.ends_with('}') => {
                if h.is_empty() {
                    return false;
                }
            }
            (Some(w), Some(h)) if w == h => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_one_route_and_a_unique_id() {
        let routes = routes();
        let mut ids: Vec<_> = routes.iter().map(|r| r.operation_id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), routes.len());
        let mut keys: Vec<_> = routes.iter().map(|r| (r.path, r.method.as_lower_str())).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), routes.len());
    }

    #[test]
    fn a_filled_path_has_each_parameter_as_one_encoded_segment() {
        let path = route(Operation::UpsertRayAttempt)
            .path_with(&[("id", "r-1_x"), ("attempt_id", "a b/c%d?é~.")]);
        assert_eq!(path, "/api/train/v2/runs/r-1_x/attempts/a%20b%2Fc%25d%3F%C3%A9~.");
        assert_eq!(route(Operation::ListRuns).path_with(&[]), "/api/train/runs");
        assert_eq!(route(Operation::Page).path_with(&[]), "/");
        let rank = route(Operation::EndRank).path_with(&[("rank", "3"), ("id", "r1")]);
        assert_eq!(rank, "/api/train/runs/r1/ranks/3/end");
    }

    #[test]
    fn every_route_filled_matches_its_own_template_and_finds_itself() {
        for listed in routes() {
            let names: Vec<&str> = listed
                .path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            let params: Vec<(&str, &str)> = names.iter().map(|name| (*name, "v/1")).collect();
            let path = listed.path_with(&params);
            assert!(template_matches(listed.path, &path), "{path} for {}", listed.path);
            assert_eq!(route(listed.operation).operation_id, listed.operation_id);
        }
    }

    #[test]
    #[should_panic(expected = "getRun needs the path parameter id")]
    fn a_missing_parameter_is_named() {
        route(Operation::GetRun).path_with(&[("run", "r1")]);
    }

    #[test]
    fn templates_match_one_segment_per_parameter() {
        let cases = [
            ("/api/train/runs/{id}", "/api/train/runs/abc", true),
            ("/api/train/runs/{id}", "/api/train/runs/", false),
            ("/api/train/runs/{id}", "/api/train/runs/abc/status", false),
            ("/api/train/runs/{id}/status", "/api/train/runs/abc/status", true),
            ("/", "/", true),
            ("/", "/app.js", false),
        ];
        for (template, path, expected) in cases {
            assert_eq!(template_matches(template, path), expected, "{template} {path}");
        }
    }
}
