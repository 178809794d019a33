//! The spec's error body, `{"status": "<HTTP status name>", "errorCode", "message"}`, for every non-200
//! answer but a 401 (whose body is empty, as the origin's).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An answer other than 200.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code (`GROUP_NOT_FOUND`, `MALFORMED_BODY`, ...).
    pub error_code: &'static str,
    /// What went wrong, for a human. Never carries credentials.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, error_code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            error_code,
            message: message.into(),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "status": status_name(self.status),
            "errorCode": self.error_code,
            "message": self.message,
        })
    }
}

/// `BAD_REQUEST` for 400, as Spring's `HttpStatus` names it (the origin is a Spring application).
pub fn status_name(status: StatusCode) -> String {
    status
        .canonical_reason()
        .unwrap_or("UNKNOWN")
        .to_ascii_uppercase()
        .replace([' ', '-'], "_")
        .replace('\'', "")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_are_springs() {
        assert_eq!(status_name(StatusCode::BAD_REQUEST), "BAD_REQUEST");
        assert_eq!(
            status_name(StatusCode::PAYLOAD_TOO_LARGE),
            "PAYLOAD_TOO_LARGE"
        );
        assert_eq!(status_name(StatusCode::NOT_FOUND), "NOT_FOUND");
        assert_eq!(
            status_name(StatusCode::SERVICE_UNAVAILABLE),
            "SERVICE_UNAVAILABLE"
        );
        let body = ApiError::new(StatusCode::FORBIDDEN, "FORBIDDEN", "needs READ").body();
        assert_eq!(
            body,
            serde_json::json!({"status": "FORBIDDEN", "errorCode": "FORBIDDEN", "message": "needs READ"})
        );
    }
}
