//! The text of a panic, for the panic hook (telemetry.rs) and the servers'
//! catch-panic layers (server.rs): a leaf both use, so neither imports the
//! other.

/// The text of a panic payload (`panic!` with a literal or a format), or
/// empty for any other payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}
