//! The OpenAPI 3.1 document of the REST routes, generated from the route
//! table (`rest::ROUTES`) and the protobuf descriptors, so it cannot drift
//! from what the gateway serves. `docs/openapi.json` is this document,
//! committed; a test fails when the two differ (rerun it with
//! `ENGRAM_WRITE_OPENAPI=1` to write the file again).

use std::collections::BTreeMap;

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use super::rest::{MEMORY_PATH, POOL, ROUTES, Route};

const PREFIX: &str = "engram.v1.";

/// The whole document.
pub fn document() -> Value {
    let mut schemas = BTreeMap::new();
    let mut paths = Map::new();
    for r in ROUTES {
        let op = operation(r, true, &mut schemas);
        paths.insert(r.path.to_string(), json!({ r.method: op }));
    }
    paths.insert(MEMORY_PATH.to_string(), one_memory(&mut schemas));
    schemas.insert("Error".into(), error_schema());
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "engram",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Long-term memory retrieval for AI agents. Every route is one gRPC \
                method of engram.v1; bodies are its messages in the protobuf JSON mapping \
                (field names as in the .proto files).",
        },
        "security": [{ "bearer": [] }],
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas,
        },
        "paths": paths,
    })
}

fn operation(r: &Route, body: bool, schemas: &mut BTreeMap<String, Value>) -> Value {
    let mut op = json!({
        "operationId": r.rpc.replace('/', "_"),
        "summary": r.summary,
        "responses": responses(r.response, schemas),
    });
    if body {
        op["requestBody"] = json!({
            "required": false,
            "content": { "application/json": { "schema": message_ref(r.request, schemas) } },
        });
    }
    op
}

/// `GET` and `DELETE /v1/memories/{id}`.
fn one_memory(schemas: &mut BTreeMap<String, Value>) -> Value {
    let id = json!([{
        "name": "id", "in": "path", "required": true, "schema": { "type": "string" },
    }]);
    let route = |rpc: &str| ROUTES.iter().find(|r| r.rpc == rpc);
    let mut path = Map::new();
    for (method, rpc) in [
        ("get", "MemoryService/Get"),
        ("delete", "MemoryService/Delete"),
    ] {
        if let Some(r) = route(rpc) {
            let mut op = operation(r, false, schemas);
            op["operationId"] = json!(format!("{}_{}", r.rpc.replace('/', "_"), "ById"));
            op["parameters"] = id.clone();
            path.insert(method.into(), op);
        }
    }
    Value::Object(path)
}

fn responses(response: &str, schemas: &mut BTreeMap<String, Value>) -> Value {
    let error = json!({
        "description": "the gRPC status as HTTP: 400 names the field and the rule, \
            401 no or a bad key, 403 not this key's, 404 not found, 429 over the tenant's \
            limits, 503 a downstream is unavailable",
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
    });
    json!({
        "200": {
            "description": "the RPC's answer",
            "content": { "application/json": { "schema": message_ref(response, schemas) } },
        },
        "default": error,
    })
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "properties": { "error": {
            "type": "object",
            "properties": {
                "code": { "type": "string" },
                "message": { "type": "string" },
            },
        }},
    })
}

/// A reference to the message's schema, adding it (and every message it
/// holds) to `schemas` first.
fn message_ref(full_name: &str, schemas: &mut BTreeMap<String, Value>) -> Value {
    match POOL
        .as_ref()
        .ok()
        .and_then(|p| p.get_message_by_name(full_name))
    {
        Some(desc) => message_schema(&desc, schemas),
        None => json!({}),
    }
}

fn message_schema(desc: &MessageDescriptor, schemas: &mut BTreeMap<String, Value>) -> Value {
    match desc.full_name() {
        "google.protobuf.Timestamp" => return json!({ "type": "string", "format": "date-time" }),
        "google.protobuf.Struct" => return json!({ "type": "object" }),
        "google.protobuf.Value" => return json!({}),
        "google.protobuf.ListValue" => return json!({ "type": "array" }),
        _ => {}
    }
    let name = desc.full_name().trim_start_matches(PREFIX).to_string();
    if !schemas.contains_key(&name) {
        // Placed first, so a message that holds itself ends the walk.
        schemas.insert(name.clone(), json!({}));
        let mut properties = Map::new();
        for f in desc.fields() {
            properties.insert(f.name().to_string(), field_schema(&f, schemas));
        }
        schemas.insert(
            name.clone(),
            json!({ "type": "object", "properties": properties }),
        );
    }
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn field_schema(f: &FieldDescriptor, schemas: &mut BTreeMap<String, Value>) -> Value {
    if f.is_map() {
        let value = match f.kind() {
            Kind::Message(entry) => entry.map_entry_value_field(),
            _ => return json!({ "type": "object" }),
        };
        return json!({ "type": "object", "additionalProperties": field_schema(&value, schemas) });
    }
    let one = kind_schema(&f.kind(), schemas);
    if f.is_list() {
        return json!({ "type": "array", "items": one });
    }
    match f.kind() {
        // An unset message field may be written as null.
        Kind::Message(_) => json!({ "anyOf": [one, { "type": "null" }] }),
        _ => one,
    }
}

fn kind_schema(kind: &Kind, schemas: &mut BTreeMap<String, Value>) -> Value {
    match kind {
        Kind::Double | Kind::Float => json!({ "type": ["number", "string"] }),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            json!({ "type": "integer", "format": "int32" })
        }
        Kind::Uint32 | Kind::Fixed32 => json!({ "type": "integer", "minimum": 0 }),
        // The JSON mapping writes 64-bit integers as strings and reads both.
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => {
            json!({ "type": ["string", "integer"] })
        }
        Kind::Bool => json!({ "type": "boolean" }),
        Kind::String => json!({ "type": "string" }),
        Kind::Bytes => json!({ "type": "string", "contentEncoding": "base64" }),
        Kind::Enum(e) => {
            let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
            json!({ "anyOf": [{ "type": "string", "enum": names }, { "type": "integer" }] })
        }
        Kind::Message(m) => message_schema(m, schemas),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");

    #[test]
    fn the_committed_document_is_the_generated_one() {
        let doc = document();
        let text = serde_json::to_string_pretty(&doc).expect("json") + "\n";
        if std::env::var_os("ENGRAM_WRITE_OPENAPI").is_some() {
            std::fs::write(COMMITTED, &text).expect("write docs/openapi.json");
        }
        let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
        assert!(
            committed == text,
            "docs/openapi.json is not what the gateway serves; \
             run `ENGRAM_WRITE_OPENAPI=1 cargo test -p retrieval-svc openapi`"
        );
    }

    #[test]
    fn every_route_and_every_message_it_names_is_described() {
        let doc = document();
        for r in ROUTES {
            assert!(doc["paths"][r.path][r.method].is_object(), "{}", r.path);
        }
        assert!(doc["paths"][MEMORY_PATH]["get"].is_object());
        let schemas = &doc["components"]["schemas"];
        for name in [
            "RetrieveRequest",
            "RetrieveResponse",
            "Memory",
            "UpsertRequest",
        ] {
            assert!(schemas[name]["properties"].is_object(), "{name}");
        }
        assert_eq!(
            schemas["Memory"]["properties"]["event_time"]["anyOf"][0]["format"],
            "date-time"
        );
    }
}
