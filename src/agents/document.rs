//! JSON values between `serde_json` (what ironflow's steps, schemas and tools use) and the
//! Converse API's `Document` (tool inputs, tool schemas, tool results).

use std::collections::HashMap;

use aws_smithy_types::{Document, Number};
use serde_json::{Map, Value};

/// `value` as a `Document`. A number that fits no integer type stays a float.
pub(crate) fn to_document(value: &Value) -> Document {
    match value {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Number::PosInt(u),
            (None, Some(i)) => Number::NegInt(i),
            _ => Number::Float(n.as_f64().unwrap_or(0.0)),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(items) => Document::Array(items.iter().map(to_document).collect()),
        Value::Object(map) => Document::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), to_document(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

/// `document` as a JSON value. A float JSON cannot hold (NaN, infinity) becomes `null`.
pub(crate) fn to_value(document: &Document) -> Value {
    match document {
        Document::Null => Value::Null,
        Document::Bool(b) => Value::Bool(*b),
        Document::Number(Number::PosInt(u)) => Value::from(*u),
        Document::Number(Number::NegInt(i)) => Value::from(*i),
        Document::Number(Number::Float(f)) => {
            serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number)
        }
        Document::String(s) => Value::String(s.clone()),
        Document::Array(items) => Value::Array(items.iter().map(to_value).collect()),
        Document::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), to_value(v)))
                .collect::<Map<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_survive_the_round_trip() {
        let value = serde_json::json!({
            "s": "x", "n": -3, "u": 18446744073709551615u64, "f": 1.5, "b": true,
            "z": null, "a": [1, {"k": []}]
        });
        assert_eq!(to_value(&to_document(&value)), value);
    }
}
