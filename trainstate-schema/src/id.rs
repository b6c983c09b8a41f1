//! The run id.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Rule, ValidationError};
use crate::limits::MAX_RUN_ID_LEN;

/// The rule of a run id, as a regular expression: 1 to
/// [`MAX_RUN_ID_LEN`] characters, each a letter, digit, `_` or `-`, safe in
/// URL paths; on a hub, optionally qualified by a cluster: a qualifier of 1
/// to [`MAX_RUN_ID_QUALIFIER_LEN`] such characters and one `:` before it.
pub const RUN_ID_PATTERN: &str = "^([A-Za-z0-9_-]{1,64}:)?[A-Za-z0-9_-]{1,128}$";

/// The longest qualifier of a qualified run id (`<qualifier>:<id>`).
pub const MAX_RUN_ID_QUALIFIER_LEN: usize = 64;

/// The id of one training run: `^[A-Za-z0-9_-]{1,128}$`, safe in URL paths.
///
/// New ids are UUID v7 rendered as 32 lowercase hex characters, so they sort
/// by creation time. Ids made elsewhere (Ray uses uuid4 hex) are accepted
/// when they meet the same rule.
///
/// A hub keys the runs other clusters forward by their cluster and their
/// id: when a second cluster forwards a run whose id another cluster's run
/// holds, the hub stores it as `<qualifier>:<id>`, its cluster's qualifier
/// before the id it has at home. Only the hub's forwarding makes such an id:
/// a registration carrying one is refused.
///
/// Cloning one shares its text: the head keeps each id in several maps.
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

    /// The id `id` is under the qualifier `qualifier`: `<qualifier>:<id>`.
    /// `id` must not be qualified already, and `qualifier` must be 1 to
    /// [`MAX_RUN_ID_QUALIFIER_LEN`] letters, digits, `_` or `-`.
    pub fn qualified(qualifier: &str, id: &RunId) -> Result<Self, ValidationError> {
        if id.qualifier().is_some() {
            return Err(ValidationError::new("id", Rule::RunIdFormat));
        }
        Self::parse(&format!("{qualifier}:{id}"))
    }

    /// The qualifier of a qualified id (the part before its `:`), if any.
    pub fn qualifier(&self) -> Option<&str> {
        self.0.split_once(':').map(|(qualifier, _)| qualifier)
    }

    /// The id without its qualifier: the id the run has on its own cluster.
    pub fn unqualified(&self) -> &str {
        self.0.split_once(':').map_or(&self.0, |(_, id)| id)
    }

    /// True when `text` may be the qualifier of a qualified id.
    pub fn is_qualifier(text: &str) -> bool {
        Self::plain(text, MAX_RUN_ID_QUALIFIER_LEN)
    }

    pub(crate) fn check(id: &str) -> Result<(), Rule> {
        let valid = match id.split_once(':') {
            Some((qualifier, rest)) => {
                Self::is_qualifier(qualifier) && Self::plain(rest, MAX_RUN_ID_LEN)
            }
            None => Self::plain(id, MAX_RUN_ID_LEN),
        };
        if valid { Ok(()) } else { Err(Rule::RunIdFormat) }
    }

    /// 1 to `max` letters, digits, `_` or `-`.
    fn plain(text: &str, max: usize) -> bool {
        !text.is_empty()
            && text.len() <= max
            && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
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
            "description": "The id of one training run. New ids are UUID v7 as 32 lowercase hex characters; ids made elsewhere are accepted when they match the pattern. On a hub, a run of a second cluster whose id another cluster's run holds is stored as `<qualifier>:<id>`, its cluster's qualifier before its id.",
            "type": "string",
            "pattern": RUN_ID_PATTERN,
            "minLength": 1,
            "maxLength": MAX_RUN_ID_QUALIFIER_LEN + 1 + MAX_RUN_ID_LEN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qualified_id_is_a_qualifier_one_colon_and_an_id() {
        let id = RunId::parse("0192f0c5a4e27c3d").unwrap();
        assert_eq!(id.qualifier(), None);
        let qualified = RunId::qualified("east-1", &id).unwrap();
        assert_eq!(qualified.as_str(), "east-1:0192f0c5a4e27c3d");
        assert_eq!(qualified.qualifier(), Some("east-1"));
        assert_eq!(qualified.unqualified(), id.as_str());
        assert_eq!(RunId::parse(qualified.as_str()).unwrap(), qualified);
        assert!(RunId::qualified("x", &qualified).is_err(), "qualified once only");
        let long = format!("{}:a", "q".repeat(65));
        for bad in [":a", "a:", "a:b:c", "a b:c", long.as_str()] {
            assert!(RunId::parse(bad).is_err(), "{bad}");
        }
        assert!(RunId::parse(&format!("{}:{}", "q".repeat(64), "i".repeat(128))).is_ok());
    }
}
