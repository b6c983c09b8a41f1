//! Ray's export events: what Ray Train V2 writes about its runs to
//! `<session>/logs/export_events/event_EXPORT_TRAIN_STATE.log` when the
//! export API is on, ingested with no change to the user's code.
//!
//! - [`decode_line`] turns one line (protobuf JSON) into Ray's own
//!   documents, [`ray_v2::TrainRun`](trainstate_schema::ray_v2::TrainRun)
//!   and [`ray_v2::TrainRunAttempt`](trainstate_schema::ray_v2::TrainRunAttempt),
//!   exactly as Ray's dashboard would serve them. Pure: no I/O.
//! - [`ingest`] follows the file as Ray appends to it and applies each
//!   event, in order, through a [`StateHandle`](crate::StateHandle)
//!   (the `trainstate ingest ray-export` command), from a durable position
//!   that survives restarts of the ingester and of the head. Its guarantees
//!   are written down in `docs/ray.md`.

mod decode;
#[cfg(unix)]
mod follow;
#[cfg(unix)]
mod position;

pub use decode::{
    Death, DecodeError, Decoded, EXPORT_ACTOR, EXPORT_DRIVER_JOB, EXPORT_NODE, EXPORT_TRAIN_RUN,
    EXPORT_TRAIN_RUN_ATTEMPT, ExportEvent, NodeDeath, base64_to_hex, decode_line,
    run_settings_value,
};
#[cfg(unix)]
pub use follow::{
    ACTOR_FILE, DRIVER_JOB_FILE, FOLLOWED_FILES, FilePosition, IngestConfig, IngestError,
    IngestReport, NODE_FILE, SESSION_EVENTS_DIR, TRAIN_FILES, TRAIN_RUN_FILE, TRAIN_STATE_FILE,
    ingest,
};
