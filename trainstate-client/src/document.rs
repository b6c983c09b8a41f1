//! A stored run as it is served: its canonical JSON ([`RunJson`]) and the
//! document a reader gets ([`RunDocument`]), with the heartbeat time kept
//! apart and written as a member. A leaf: it names nothing else of the
//! client.

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use trainstate_schema::TrainRunInfo;
use trainstate_schema::api::RankProgressServed;
use trainstate_schema::{HealthState, RunGoodput};

use crate::error::StateError;

/// The canonical JSON of a stored run, kept in the shape it is served in.
///
/// An ended run is one raw JSON object, served by copying it. A live run is
/// kept as its members, each raw, so that its heartbeat time (which changes
/// with every heartbeat and is kept apart) is served as one more member
/// without parsing or editing the stored text.
#[derive(Debug, Clone)]
pub struct RunJson(Repr);

#[derive(Debug, Clone)]
enum Repr {
    /// The text stays in the allocation it was read or written into:
    /// copying it into an `Arc<RawValue>` left a hole a little too small
    /// for the next run's copy behind every run, about a KiB each.
    Whole(Arc<Box<RawValue>>),
    /// The members, and about how many bytes their object takes.
    Members(Arc<[(&'static str, Box<RawValue>)]>, usize),
}

impl RunJson {
    /// The JSON of `run`: whole when it has ended, as members while it is live.
    ///
    /// The run is serialized once and its text read once (whole: checked
    /// as JSON; live: split into members), so this is linear in its size.
    pub fn of(run: &TrainRunInfo) -> Self {
        Self::of_with_text(run).0
    }

    /// [`RunJson::of`], and for a live run also the text it was split
    /// from, which is what [`RunJson::text`] would join its members into
    /// again: a store can write it without a second serialization. `None`
    /// for an ended run (its JSON is that text) and for a run that carries
    /// a heartbeat time, which the stored text leaves out.
    pub fn of_with_text(run: &TrainRunInfo) -> (Self, Option<String>) {
        let text = serde_json::to_string(run).expect("a validated run serializes");
        if run.status().is_live() {
            let json = Self::members_of(&text).expect("a serialized run is a JSON object");
            (json, run.last_heartbeat_ms().is_none().then_some(text))
        } else {
            let whole = RawValue::from_string(text).expect("a serialized run is JSON");
            (Self(Repr::Whole(Arc::new(whole))), None)
        }
    }

    /// Reads a stored run's JSON text, as members when `live`.
    pub fn from_text(text: String, live: bool) -> Result<Self, serde_json::Error> {
        let whole = RawValue::from_string(text)?;
        if live { Self::members_of(whole.get()) } else { Ok(Self(Repr::Whole(Arc::new(whole)))) }
    }

    /// The same JSON kept as members, as a live run's is.
    pub fn into_members(self) -> Result<Self, serde_json::Error> {
        match &self.0 {
            Repr::Whole(whole) => Self::members_of(whole.get()),
            Repr::Members(..) => Ok(self),
        }
    }

    /// Splits `whole` into its members. A run with a member this version
    /// does not know (written by a newer head) stays whole: it is served
    /// correctly, its members read again at every serve.
    fn members_of(whole: &str) -> Result<Self, serde_json::Error> {
        let members: Members<'_> = serde_json::from_str(whole)?;
        let members: Option<Vec<_>> = members
            .0
            .into_iter()
            .map(|(key, value)| Some((intern(key)?, value.to_owned())))
            .collect();
        Ok(Self(match members {
            Some(members) => Repr::Members(members.into(), whole.len()),
            None => Repr::Whole(Arc::new(RawValue::from_string(whole.to_owned())?)),
        }))
    }

    /// About how many bytes the run's JSON takes: to size a buffer.
    pub fn approximate_len(&self) -> usize {
        match &self.0 {
            Repr::Whole(raw) => raw.get().len(),
            Repr::Members(_, len) => *len,
        }
    }

    /// The name of the top-level member whose value takes the most bytes
    /// (`None` for an empty object): to say what makes a run large.
    pub fn largest_member(&self) -> Option<String> {
        let largest = |members: &mut dyn Iterator<Item = (&str, usize)>| {
            members.max_by_key(|(_, len)| *len).map(|(key, _)| key.to_owned())
        };
        match &self.0 {
            Repr::Whole(raw) => {
                let members: Members<'_> = serde_json::from_str(raw.get()).ok()?;
                largest(&mut members.0.iter().map(|(k, v)| (*k, v.get().len())))
            }
            Repr::Members(members, _) => {
                largest(&mut members.iter().map(|(k, v)| (*k, v.get().len())))
            }
        }
    }

    /// The state of the run's `health` (`STALLED`, `PROGRESSING`), read
    /// without parsing the whole run: from its members, or from the end of
    /// its whole text, where the canonical order puts `health` (only
    /// `health_history` and `goodput` follow it). `None` for a run with no
    /// health.
    pub fn health_state(&self) -> Option<HealthState> {
        #[derive(Deserialize)]
        struct StateOnly {
            state: HealthState,
        }
        match &self.0 {
            Repr::Members(members, _) => {
                let (_, raw) = members.iter().find(|(k, _)| *k == "health")?;
                serde_json::from_str::<StateOnly>(raw.get()).ok().map(|h| h.state)
            }
            Repr::Whole(raw) => {
                const KEY: &str = ",\"health\":";
                const HISTORY: &str = ",\"health_history\":";
                const GOODPUT: &str = ",\"goodput\":";
                let text = raw.get();
                let tail = &text[text.rfind(KEY)? + KEY.len()..];
                let mut values = serde_json::Deserializer::from_str(tail).into_iter::<StateOnly>();
                let state = values.next()?.ok()?.state;
                let mut rest = &tail[values.byte_offset()..];
                if let Some(history) = rest.strip_prefix(HISTORY) {
                    let mut values = serde_json::Deserializer::from_str(history)
                        .into_iter::<serde::de::IgnoredAny>();
                    values.next()?.ok()?;
                    rest = &history[values.byte_offset()..];
                }
                if let Some(goodput) = rest.strip_prefix(GOODPUT) {
                    let mut values = serde_json::Deserializer::from_str(goodput)
                        .into_iter::<serde::de::IgnoredAny>();
                    values.next()?.ok()?;
                    rest = &goodput[values.byte_offset()..];
                }
                // A `health` nested deeper (in `run_settings`) is followed
                // by more than the run's closing brace.
                (rest == "}").then_some(state)
            }
        }
    }

    /// The run's `goodput` as stored; `None` for a run with none. Only
    /// that member is parsed: the last one in the canonical order.
    pub fn goodput(&self) -> Option<RunGoodput> {
        match &self.0 {
            Repr::Members(members, _) => {
                let (_, raw) = members.iter().find(|(k, _)| *k == GOODPUT)?;
                serde_json::from_str(raw.get()).ok()
            }
            Repr::Whole(raw) => {
                const KEY: &str = ",\"goodput\":";
                let text = raw.get();
                let tail = &text[text.rfind(KEY)? + KEY.len()..];
                let mut values = serde_json::Deserializer::from_str(tail).into_iter::<RunGoodput>();
                let goodput = values.next()?.ok()?;
                // A `goodput` nested deeper (in `run_settings`) is followed
                // by more than the run's closing brace.
                (&tail[values.byte_offset()..] == "}").then_some(goodput)
            }
        }
    }

    /// The JSON text (without a heartbeat time).
    pub fn text(&self) -> Cow<'_, str> {
        match &self.0 {
            Repr::Whole(raw) => Cow::Borrowed(raw.get()),
            Repr::Members(..) => Cow::Owned(serde_json::to_string(self).expect("serializes")),
        }
    }

    /// Serializes the run, adding `last_heartbeat_ms` and
    /// `rank_last_heartbeat_ms` when given.
    fn serialize_with<S: Serializer>(
        &self,
        heartbeat: Option<u64>,
        ranks: Option<&[Option<u64>]>,
        progress: Option<&[Option<RankProgressServed>]>,
        goodput: Option<&RunGoodput>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        // A served goodput (counted to the read) replaces the stored one.
        let served = |k: &str| {
            k != LAST_HEARTBEAT
                && k != RANK_HEARTBEATS
                && k != RANK_PROGRESS
                && (goodput.is_none() || k != GOODPUT)
        };
        let extra = usize::from(heartbeat.is_some())
            + usize::from(ranks.is_some())
            + usize::from(progress.is_some())
            + usize::from(goodput.is_some());
        match (&self.0, extra) {
            (Repr::Whole(raw), 0) => raw.serialize(serializer),
            (Repr::Whole(raw), _) => {
                // Not the served path of live runs: a document read back from elsewhere.
                let members: Members<'_> =
                    serde_json::from_str(raw.get()).map_err(serde::ser::Error::custom)?;
                let mut map = serializer.serialize_map(Some(members.0.len() + extra))?;
                for (key, value) in members.0.iter().filter(|(k, _)| served(k)) {
                    map.serialize_entry(key, value)?;
                }
                serialize_times(&mut map, heartbeat, ranks, progress)?;
                if let Some(goodput) = goodput {
                    map.serialize_entry(GOODPUT, goodput)?;
                }
                map.end()
            }
            (Repr::Members(members, _), _) => {
                let mut map = serializer.serialize_map(Some(members.len() + extra))?;
                for (key, value) in members.iter().filter(|(k, _)| served(k)) {
                    map.serialize_entry(key, value)?;
                }
                serialize_times(&mut map, heartbeat, ranks, progress)?;
                if let Some(goodput) = goodput {
                    map.serialize_entry(GOODPUT, goodput)?;
                }
                map.end()
            }
        }
    }
}

/// The members a served run gains from the head's memory.
fn serialize_times<M: SerializeMap>(
    map: &mut M,
    heartbeat: Option<u64>,
    ranks: Option<&[Option<u64>]>,
    progress: Option<&[Option<RankProgressServed>]>,
) -> Result<(), M::Error> {
    if let Some(at) = heartbeat {
        map.serialize_entry(LAST_HEARTBEAT, &at)?;
    }
    if let Some(by_rank) = ranks {
        map.serialize_entry(RANK_HEARTBEATS, by_rank)?;
    }
    if let Some(by_rank) = progress {
        map.serialize_entry(RANK_PROGRESS, by_rank)?;
    }
    Ok(())
}

impl Serialize for RunJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize_with(None, None, None, None, serializer)
    }
}

/// The member names of a run, shared rather than allocated per run: every
/// member a run of this version serializes, and the heartbeat members a
/// served document carries. `None` for any other name.
fn intern(key: &str) -> Option<&'static str> {
    const KNOWN: &[&str] = &[
        "name",
        "id",
        "job_id",
        "controller_actor_id",
        "workers",
        "datasets",
        "run_status",
        "status",
        "status_detail",
        "start_time_ms",
        "end_time_ms",
        "resources",
        "attempts",
        "cause",
        "restored_from",
        "controller_log_file_path",
        "framework_versions",
        "run_settings",
        "heartbeats",
        "cluster",
        "status_history",
        "health",
        "health_history",
        GOODPUT,
        LAST_HEARTBEAT,
        RANK_HEARTBEATS,
        RANK_PROGRESS,
    ];
    KNOWN.iter().find(|k| **k == key).copied()
}

/// A stored run as served: its JSON and, for a live run, the time its
/// controller was last heard from. Cheap to clone and to send.
///
/// It serializes as the run's JSON object, the heartbeat time written as
/// the `last_heartbeat_ms` member. [`RunDocument::parse`] gives the typed
/// run.
#[derive(Debug, Clone)]
pub struct RunDocument {
    json: RunJson,
    last_heartbeat_ms: Option<u64>,
    /// When each rank of a rendezvous group was last heard from, by world
    /// rank (memory only, like the heartbeat time).
    rank_heartbeats: Option<Arc<[Option<u64>]>>,
    /// Each rank's latest progress report, by world rank (memory only,
    /// like the heartbeat times).
    rank_progress: Option<Arc<[Option<RankProgressServed>]>>,
    /// A live run's goodput counted to the moment of the read, served in
    /// place of the stored `goodput`.
    goodput: Option<Arc<RunGoodput>>,
}

impl PartialEq for RunDocument {
    fn eq(&self, other: &Self) -> bool {
        self.body() == other.body()
            && self.last_heartbeat_ms == other.last_heartbeat_ms
            && self.rank_heartbeats == other.rank_heartbeats
            && self.rank_progress == other.rank_progress
            && self.goodput == other.goodput
    }
}

impl Eq for RunDocument {}

impl RunDocument {
    /// A run's JSON and the time its controller was last heard from.
    pub fn new(json: RunJson, last_heartbeat_ms: Option<u64>) -> Self {
        Self { json, last_heartbeat_ms, rank_heartbeats: None, rank_progress: None, goodput: None }
    }

    /// The same document, with the run's goodput counted to the moment of
    /// the read, served as the `goodput` member in place of the stored one.
    pub fn with_goodput(mut self, goodput: RunGoodput) -> Self {
        self.goodput = Some(Arc::new(goodput));
        self
    }

    /// The run's goodput as stored (what [`RunDocument::with_goodput`]
    /// counts from).
    pub fn stored_goodput(&self) -> Option<RunGoodput> {
        self.json.goodput()
    }

    /// The same document, with each rank's latest progress report (by
    /// world rank; `None` for a rank that never reported), served as the
    /// `rank_progress` member.
    pub fn with_rank_progress(mut self, by_rank: Arc<[Option<RankProgressServed>]>) -> Self {
        self.rank_progress = Some(by_rank);
        self
    }

    /// Each rank's latest progress report, by world rank, while the head
    /// tracks the run's group and a rank has reported.
    pub fn rank_progress(&self) -> Option<&[Option<RankProgressServed>]> {
        self.rank_progress.as_deref()
    }

    /// The same document, with when each rank of its rendezvous group was
    /// last heard from (by world rank; `None` for a rank not heard from),
    /// served as the `rank_last_heartbeat_ms` member.
    pub fn with_rank_heartbeats(mut self, by_rank: Arc<[Option<u64>]>) -> Self {
        self.rank_heartbeats = Some(by_rank);
        self
    }

    /// When each rank of the run's rendezvous group was last heard from,
    /// by world rank, while the head tracks the group.
    pub fn rank_heartbeats(&self) -> Option<&[Option<u64>]> {
        self.rank_heartbeats.as_deref()
    }

    /// The canonical JSON of `run`, as a document with no heartbeat time.
    pub fn of(run: &TrainRunInfo) -> Self {
        Self::new(RunJson::of(run), None)
    }

    /// The stored JSON without the heartbeat time.
    pub fn body(&self) -> Cow<'_, str> {
        self.json.text()
    }

    /// When the controller was last heard from (Unix ms), for live runs.
    pub fn last_heartbeat_ms(&self) -> Option<u64> {
        self.last_heartbeat_ms
    }

    /// About how many bytes the served JSON takes: to size a buffer.
    pub fn approximate_len(&self) -> usize {
        self.json.approximate_len() + 40
    }

    /// The full JSON of the run.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a run document serializes")
    }

    /// The typed run.
    pub fn parse(&self) -> Result<TrainRunInfo, StateError> {
        serde_json::from_str(&self.to_json())
            .map_err(|e| StateError::Corrupt { reason: e.to_string() })
    }
}

impl Serialize for RunDocument {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize_with(
            self.last_heartbeat_ms,
            self.rank_heartbeats.as_deref(),
            self.rank_progress.as_deref(),
            self.goodput.as_deref(),
            serializer,
        )
    }
}

impl<'de> Deserialize<'de> for RunDocument {
    /// Keeps the JSON object as it came, heartbeat time included.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let body = Box::<RawValue>::deserialize(deserializer)?;
        if !body.get().starts_with('{') {
            return Err(serde::de::Error::custom("a run must be a JSON object"));
        }
        Ok(Self::new(RunJson(Repr::Whole(Arc::new(body))), None))
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for RunDocument {
    fn schema_name() -> Cow<'static, str> {
        TrainRunInfo::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        TrainRunInfo::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        TrainRunInfo::json_schema(generator)
    }
}

/// The member a live run's heartbeat time is written as.
const LAST_HEARTBEAT: &str = "last_heartbeat_ms";

/// The member the ranks' heartbeat times of a rendezvous group are written as.
const RANK_HEARTBEATS: &str = "rank_last_heartbeat_ms";

/// The member each rank's latest progress report is written as.
const RANK_PROGRESS: &str = "rank_progress";

/// The member a run's goodput is written as (stored, or served counted to
/// the read).
const GOODPUT: &str = "goodput";

/// The top-level members of a stored run, in stored order, values unparsed.
struct Members<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(entry) = map.next_entry::<&'de str, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_a_run_can_have_is_a_known_name_so_live_runs_split() {
        let schema = serde_json::to_value(schemars::schema_for!(TrainRunInfo)).unwrap();
        let properties = schema["properties"].as_object().expect("a run has properties");
        assert!(properties.len() > 15);
        for name in properties.keys() {
            assert!(intern(name).is_some(), "{name} is not a known member name");
        }
        assert_eq!(intern("no-such-member"), None);
    }

    #[test]
    fn a_served_goodput_replaces_the_stored_one_and_is_read_from_the_end() {
        let badput = r#"{"waiting_to_start_ms":0,"restarting_ms":0,"stalled_ms":0,"checkpointing_ms":0,"progress_lost_ms":0,"slower_than_pace_ms":0}"#;
        let stored = format!(r#"{{"wall_ms":0,"productive_ms":0,"badput":{badput},"as_of_ms":1}}"#);
        let text = format!(r#"{{"id":"r1","run_settings":{{"goodput":1}},"goodput":{stored}}}"#);
        for live in [true, false] {
            let json = RunJson::from_text(text.clone(), live).unwrap();
            assert_eq!(json.goodput().unwrap().as_of_ms, 1, "live: {live}");
            let mut served = json.goodput().unwrap();
            served.as_of_ms = 5;
            let document = RunDocument::new(json, Some(7)).with_goodput(served);
            let out = document.to_json();
            assert_eq!(out.matches("\"goodput\":{").count(), 1, "{out}");
            let value: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(
                (value["goodput"]["as_of_ms"].as_u64(), value["last_heartbeat_ms"].as_u64()),
                (Some(5), Some(7))
            );
        }
        let nested =
            RunJson::from_text(r#"{"id":"r1","run_settings":{"goodput":{}}}"#.into(), false);
        assert!(nested.unwrap().goodput().is_none(), "never from the settings");
    }

    #[test]
    fn a_runs_health_is_read_from_its_end_and_never_from_its_settings() {
        let health = r#""health":{"state":"STALLED","since_ms":1,"ranks":[],"detail":""}"#;
        let history = r#""health_history":[{"state":"STALLED","at_ms":1,"ranks":[]}]"#;
        let goodput = r#""goodput":{"wall_ms":0,"productive_ms":0,"badput":{},"as_of_ms":1}"#;
        let cases = [
            (format!(r#"{{"id":"r1",{health}}}"#), Some(HealthState::Stalled)),
            (format!(r#"{{"id":"r1",{health},{history}}}"#), Some(HealthState::Stalled)),
            (format!(r#"{{"id":"r1",{health},{history},{goodput}}}"#), Some(HealthState::Stalled)),
            (format!(r#"{{"id":"r1",{health},{goodput}}}"#), Some(HealthState::Stalled)),
            (format!(r#"{{"id":"r1","run_settings":{{{health}}}}}"#), None),
            (format!(r#"{{"id":"r1","run_settings":{{"a":1,{health},{history}}}}}"#), None),
            (r#"{"id":"r1"}"#.to_owned(), None),
        ];
        for (text, expected) in cases {
            let whole = RunJson::from_text(text.clone(), false).unwrap();
            assert_eq!(whole.health_state(), expected, "whole: {text}");
        }
        let live = format!(r#"{{"id":"r1",{health}}}"#);
        let members = RunJson::from_text(live, true).unwrap();
        assert!(matches!(members.0, Repr::Members(..)));
        assert_eq!(members.health_state(), Some(HealthState::Stalled));
    }

    #[test]
    fn a_live_run_with_a_member_this_version_does_not_know_is_served_whole() {
        let text = r#"{"id":"r1","from_a_newer_head":1}"#;
        let json = RunJson::from_text(text.to_owned(), true).unwrap();
        assert!(matches!(json.0, Repr::Whole(_)));
        let served = serde_json::to_string(&RunDocument::new(json, Some(7))).unwrap();
        assert_eq!(served, r#"{"id":"r1","from_a_newer_head":1,"last_heartbeat_ms":7}"#);
    }
}
