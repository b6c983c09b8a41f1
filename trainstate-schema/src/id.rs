//! The run id.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Rule, ValidationError};
use crate::limits::MAX_RUN_ID_LEN;

/// The rule of a run id, as a regular expression: 1 to
/// [`MAX_RUN_ID_LEN`] characters, each a letter, digit, `_` or `-`, safe in
/// URL paths.
pub const RUN_ID_PATTERN: &str = "^[A-Za-z0-9_-]{1,128}$";

///
/// Cloning one shares its text: the head keeps each id in several maps.
/// The id of one training run: `^[A-Za-z0-9_-]{1,128}$`, safe in URL paths.
///
/// New ids are UUID v7 rendered as 32 lowercase hex characters, so they sort
/// by creation time. Ids made elsewhere (Ray uses uuid4 hex) are accepted
/// when they meet the same rule.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(Arc<str>);

impl RunId {
    /// A fresh id: UUID v7 as 32 lowercase hex characters.
    pub fn new_v7() -> Self {
        Self(uuid::Uuid::now_v7().simple().to_string().into())
    }

    /// Checks `id` against the run-id rule.
    pub fn parse(id: &str) -> Result<Self, ValidationError> {
        Self::check(id).map_err(|rule| ValidationError::new("id", rule))?;
        Ok(Self(id.into()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn from_checked(id: String) -> Self {
        Self(id.into())
    }

    pub(crate) fn check(id: &str) -> Result<(), Rule> {
        let valid = !id.is_empty()
            && id.len() <= MAX_RUN_ID_LEN
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if valid { Ok(()) } else { Err(Rule::RunIdFormat) }
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for RunId {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for RunId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::check(&text).map_err(serde::de::Error::custom)?;
        Ok(Self(text.into()))
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for RunId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RunId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The id of one training run. New ids are UUID v7 as 32 lowercase hex characters; ids made elsewhere are accepted when they match the pattern.",
            "type": "string",
            "pattern": RUN_ID_PATTERN,
            "minLength": 1,
            "maxLength": MAX_RUN_ID_LEN,
        })
    }
}
