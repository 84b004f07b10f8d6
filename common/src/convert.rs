//! Conversions between protobuf well-known types and the types we store.

use chrono::{DateTime, TimeZone, Utc};
use prost_types::{ListValue, Struct, Timestamp, Value, value::Kind};

pub fn ts_to_chrono(ts: &Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(ts.nanos).ok()?;
    Utc.timestamp_opt(ts.seconds, nanos).single()
}

pub fn chrono_to_ts(dt: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: dt.timestamp(),
        nanos: dt.timestamp_subsec_nanos() as i32,
    }
}

pub fn struct_to_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

pub fn value_to_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
    }
}

/// JSON object → Struct; a non-object becomes an empty Struct.
pub fn json_to_struct(v: &serde_json::Value) -> Struct {
    match v {
        serde_json::Value::Object(m) => Struct {
            fields: m
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        },
        _ => Struct::default(),
    }
}

pub fn json_to_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_to_struct(v)),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_struct_round_trip() {
        let j = serde_json::json!({"a": 1.0, "b": ["x", true, null], "c": {"d": "e"}});
        assert_eq!(struct_to_json(&json_to_struct(&j)), j);
    }

    #[test]
    fn timestamp_round_trip() {
        let now = Utc::now();
        assert_eq!(ts_to_chrono(&chrono_to_ts(now)), Some(now));
        assert_eq!(
            ts_to_chrono(&Timestamp {
                seconds: 0,
                nanos: -1
            }),
            None
        );
    }
}
