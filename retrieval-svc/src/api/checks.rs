//! What the gateway's operator-paced calls on search-svc share (listing,
//! conflict review): the checks of their short text fields and the mapping
//! of search-svc's status. A module of its own so that `memory` and
//! `conflicts` both depend on it and not on each other.

use engram_common::text::check_short_text;

use crate::error::Error;

/// Each `(field, text, max)`: plain text of at most `max` characters.
pub fn check_short_texts(fields: &[(&'static str, &str, usize)]) -> Result<(), Error> {
    for &(field, s, max) in fields {
        check_short_text(s, max).map_err(|rule| Error::invalid(field, rule))?;
    }
    Ok(())
}

/// search-svc's status as the gateway reports it (as listing does).
pub fn search_error(status: tonic::Status) -> Error {
    match status.code() {
        // tonic's own end of the grpc-timeout set on the request.
        tonic::Code::Cancelled if status.message() == "Timeout expired" => Error::DeadlineExceeded,
        tonic::Code::Unavailable | tonic::Code::Unknown => Error::DownstreamUnavailable {
            service: "search",
            reason: status.message().to_string(),
        },
        _ => Error::Downstream {
            service: "search",
            status,
        },
    }
}
