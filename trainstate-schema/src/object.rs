//! Nested documents that must be JSON objects.
//!
//! serde's derived `Deserialize` takes a struct from a JSON array as well,
//! field by field in declaration order, so `["FINISHED"]` would read as a
//! status request and a worker written as an array would be stored. Every
//! document the API takes is an object: the fields that hold one go through
//! these functions (`#[serde(deserialize_with = "…")]`), which ask the
//! deserializer for a map and refuse anything else with serde's "invalid
//! type" error, naming the path like any other.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A `T` read only from a JSON object.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer.deserialize_map(ObjectVisitor(PhantomData)).map(Object)
    }
}

/// One object.
pub(crate) fn one<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    Object::deserialize(deserializer).map(|o| o.0)
}

/// An object or `null`. The field needs `#[serde(default)]` to be optional.
pub(crate) fn option<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    Option::<Object<T>>::deserialize(deserializer).map(|o| o.map(|o| o.0))
}

/// An array of objects.
pub(crate) fn vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    struct ObjectsVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectsVisitor<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of JSON objects")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            // A hint from the input is not trusted beyond a small bound.
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(Object(item)) = seq.next_element()? {
                items.push(item);
            }
            Ok(items)
        }
    }

    deserializer.deserialize_seq(ObjectsVisitor(PhantomData))
}

/// An array of objects, or `null`. The field needs `#[serde(default)]` to
/// be optional.
pub(crate) fn option_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Vec<T>>, D::Error> {
    struct Objects<T>(Vec<T>);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Objects<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            vec(deserializer).map(Objects)
        }
    }

    Option::<Objects<T>>::deserialize(deserializer).map(|o| o.map(|o| o.0))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        #[serde(deserialize_with = "super::one")]
        one: Inner,
        #[serde(default, deserialize_with = "super::option")]
        option: Option<Inner>,
        #[serde(default, deserialize_with = "super::vec")]
        vec: Vec<Inner>,
        #[serde(default, deserialize_with = "super::option_vec")]
        option_vec: Option<Vec<Inner>>,
    }

    #[test]
    fn objects_are_read_and_arrays_in_their_place_refused() {
        let read: Outer = serde_json::from_str(
            r#"{"one":{"a":1},"option":{"a":2},"vec":[{"a":3}],"option_vec":[{"a":4}]}"#,
        )
        .unwrap();
        assert_eq!(read.one, Inner { a: 1 });
        assert_eq!(read.option, Some(Inner { a: 2 }));
        assert_eq!(read.vec, vec![Inner { a: 3 }]);
        assert_eq!(read.option_vec, Some(vec![Inner { a: 4 }]));

        let absent: Outer = serde_json::from_str(r#"{"one":{"a":1},"option":null}"#).unwrap();
        assert_eq!((absent.option, absent.vec.len(), absent.option_vec), (None, 0, None));

        for (body, path) in [
            (r#"{"one":[1]}"#, "one"),
            (r#"{"one":{"a":1},"option":[2]}"#, "option"),
            (r#"{"one":{"a":1},"vec":[[3]]}"#, "vec[0]"),
            (r#"{"one":{"a":1},"option_vec":[{"a":4},[5]]}"#, "option_vec[1]"),
        ] {
            let de = &mut serde_json::Deserializer::from_str(body);
            let err = serde_path_to_error::deserialize::<_, Outer>(de).unwrap_err();
            assert_eq!(err.path().to_string(), path, "{body}");
            assert!(err.inner().to_string().contains("expected a JSON object"), "{body}: {err}");
        }
    }
}
