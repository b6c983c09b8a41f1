//! Ray's export events: what Ray Train V2 writes about its runs to
//! `<session>/logs/export_events/event_EXPORT_TRAIN_STATE.log` when the
//! export API is on, ingested with no change to the user's code.
//!
//! - [`decode_line`] turns one line (protobuf JSON) into Ray's own
//!   documents, [`ray_v2::TrainRun`](trainstate_schema::ray_v2::TrainRun)
//!   and [`ray_v2::TrainRunAttempt`](trainstate_schema::ray_v2::TrainRunAttempt),
//!   exactly as Ray's dashboard would serve them. Pure: no I/O.

mod decode;

pub use decode::{
    DecodeError, Decoded, EXPORT_TRAIN_RUN, EXPORT_TRAIN_RUN_ATTEMPT, ExportEvent, base64_to_hex,
    decode_line, run_settings_value,
};
