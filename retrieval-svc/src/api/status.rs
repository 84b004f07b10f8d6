//! The one mapping of a gRPC status to an HTTP answer, shared by the
//! Foundry routes (http.rs) and the REST routes (rest.rs): the HTTP code
//! and `{"error": {code, message}}`, where the message names the field and
//! the rule.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

fn http_code(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A gRPC status as the API's error: the HTTP code and `{"error": {code,
/// message}}`, where the message names the field and the rule.
pub fn status_response(status: tonic::Status) -> Response {
    let body = json!({
        "error": {
            "code": format!("{:?}", status.code()),
            "message": status.message(),
        }
    });
    (http_code(status.code()), axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_http() {
        assert_eq!(
            http_code(tonic::Code::InvalidArgument),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            http_code(tonic::Code::PermissionDenied),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            http_code(tonic::Code::Unauthenticated),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            http_code(tonic::Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
