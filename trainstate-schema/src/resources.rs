//! A worker's resources: resource name to amount.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// Resource name (`"CPU"`, `"GPU"`, `"memory"`, ...) to amount, as Ray reports
/// a worker's resources.
///
/// Deserializing rejects a JSON object that repeats a key, rather than
/// silently keeping one of the values. Amounts are checked (finite, ≥ 0)
/// when the enclosing worker is validated.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Resources(BTreeMap<String, f64>);

impl Resources {
    /// An empty set of resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// The amount of `name`, if present.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// Adds `amount` of `name`, replacing an earlier amount of it.
    pub fn insert(&mut self, name: impl Into<String>, amount: f64) {
        self.0.insert(name.into(), amount);
    }

    /// Resource entries, sorted by name.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, f64)> {
        self.0.iter().map(|(name, amount)| (name.as_str(), *amount))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Into<String>> FromIterator<(K, f64)> for Resources {
    fn from_iter<I: IntoIterator<Item = (K, f64)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl<'de> Deserialize<'de> for Resources {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ResourcesVisitor;

        impl<'de> Visitor<'de> for ResourcesVisitor {
            type Value = Resources;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of resource name to number")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Resources, A::Error> {
                let mut entries = BTreeMap::new();
                while let Some((name, amount)) = map.next_entry::<String, f64>()? {
                    if entries.contains_key(&name) {
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate resource name `{name}`"
                        )));
                    }
                    entries.insert(name, amount);
                }
                Ok(Resources(entries))
            }
        }

        deserializer.deserialize_map(ResourcesVisitor)
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for Resources {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Resources".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Resource name (CPU, GPU, memory, ...) to amount. Names are unique; amounts are finite and zero or more.",
            "type": "object",
            "additionalProperties": { "type": "number", "minimum": 0 },
        })
    }
}
