//! A JSON document kept as it came, for the few fields whose shape is the
//! trainer's, not ours (Ray Train V2's `run_settings`).
//!
//! This crate reads JSON through serde only, so it holds such a field in a
//! small value type of its own; its bounds (depth and size) are checked
//! with the other rules, and named in [`crate::limits`].

use std::fmt;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A JSON value, object members in their order.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum JsonValue {
    /// `null`.
    #[default]
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A negative integer.
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    /// A number with a fraction or an exponent.
    Float(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<JsonValue>),
    /// An object, members in their order.
    Object(Vec<(String, JsonValue)>),
}

impl JsonValue {
    /// An empty object.
    pub fn object() -> Self {
        JsonValue::Object(Vec::new())
    }

    /// The same object with `key` set to `value` (appended when new).
    /// Anything but an object becomes an object first.
    pub fn with(mut self, key: &str, value: impl Into<JsonValue>) -> Self {
        if !matches!(self, JsonValue::Object(_)) {
            self = JsonValue::object();
        }
        if let JsonValue::Object(members) = &mut self {
            let value = value.into();
            match members.iter_mut().find(|(k, _)| k == key) {
                Some((_, existing)) => *existing = value,
                None => members.push((key.to_owned(), value)),
            }
        }
        self
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&JsonValue> {
        match self {
            JsonValue::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value as an integer, if it is one.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            JsonValue::Int(i) => Some(i),
            JsonValue::UInt(u) => i64::try_from(u).ok(),
            _ => None,
        }
    }

    /// The value as text, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            JsonValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// How deeply arrays and objects nest: 0 for a scalar.
    pub fn depth(&self) -> usize {
        match self {
            JsonValue::Array(items) => 1 + items.iter().map(JsonValue::depth).max().unwrap_or(0),
            JsonValue::Object(members) => {
                1 + members.iter().map(|(_, v)| v.depth()).max().unwrap_or(0)
            }
            _ => 0,
        }
    }

    /// About how many bytes its compact JSON takes: what the size bound
    /// counts.
    pub fn approximate_size(&self) -> usize {
        match self {
            JsonValue::Null | JsonValue::Bool(_) => 5,
            JsonValue::Int(_) | JsonValue::UInt(_) | JsonValue::Float(_) => 20,
            JsonValue::String(s) => s.len() + 2,
            JsonValue::Array(items) => {
                2 + items.iter().map(|v| v.approximate_size() + 1).sum::<usize>()
            }
            JsonValue::Object(members) => {
                2 + members.iter().map(|(k, v)| k.len() + 4 + v.approximate_size()).sum::<usize>()
            }
        }
    }
}

impl From<&str> for JsonValue {
    fn from(text: &str) -> Self {
        JsonValue::String(text.to_owned())
    }
}

impl From<String> for JsonValue {
    fn from(text: String) -> Self {
        JsonValue::String(text)
    }
}

impl From<bool> for JsonValue {
    fn from(value: bool) -> Self {
        JsonValue::Bool(value)
    }
}

impl From<i64> for JsonValue {
    fn from(value: i64) -> Self {
        if value >= 0 { JsonValue::UInt(value as u64) } else { JsonValue::Int(value) }
    }
}

impl From<Vec<JsonValue>> for JsonValue {
    fn from(items: Vec<JsonValue>) -> Self {
        JsonValue::Array(items)
    }
}

impl<T: Into<JsonValue>> From<Option<T>> for JsonValue {
    fn from(value: Option<T>) -> Self {
        value.map_or(JsonValue::Null, Into::into)
    }
}

impl Serialize for JsonValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            JsonValue::Null => serializer.serialize_unit(),
            JsonValue::Bool(b) => serializer.serialize_bool(*b),
            JsonValue::Int(i) => serializer.serialize_i64(*i),
            JsonValue::UInt(u) => serializer.serialize_u64(*u),
            JsonValue::Float(f) => serializer.serialize_f64(*f),
            JsonValue::String(s) => serializer.serialize_str(s),
            JsonValue::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            JsonValue::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (key, value) in members {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for JsonValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = JsonValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<JsonValue, E> {
        Ok(JsonValue::Null)
    }

    fn visit_none<E>(self) -> Result<JsonValue, E> {
        Ok(JsonValue::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<JsonValue, D::Error> {
        JsonValue::deserialize(deserializer)
    }

    fn visit_bool<E>(self, value: bool) -> Result<JsonValue, E> {
        Ok(JsonValue::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<JsonValue, E> {
        Ok(JsonValue::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<JsonValue, E> {
        Ok(JsonValue::UInt(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<JsonValue, E> {
        Ok(JsonValue::Float(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<JsonValue, E> {
        Ok(JsonValue::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<JsonValue, E> {
        Ok(JsonValue::String(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(JsonValue::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonValue, A::Error> {
        let mut members: Vec<(String, JsonValue)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while let Some((key, value)) = map.next_entry::<String, JsonValue>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
            }
            members.push((key, value));
        }
        Ok(JsonValue::Object(members))
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for JsonValue {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "JsonValue".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Any JSON value, kept as it came (bounded in depth and size)."
        })
    }
}
