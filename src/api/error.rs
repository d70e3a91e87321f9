//! The one mapping from refused requests to responses: a status and a JSON body
//! `{"error": "<code>", "message": "<text>"}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::reserve::SettleError;

/// Why a request was refused. Every variant is a client error: nothing here is a 5xx.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or not a JSON object of the expected shape.
    #[error("{0}")]
    MalformedJson(String),
    /// A query string could not be read.
    #[error("{0}")]
    InvalidQuery(String),
    /// `rule` or `key` is absent or empty.
    #[error("\"{0}\" is required")]
    MissingField(&'static str),
    /// A field the API does not know (a typo such as `cots` would otherwise go unnoticed).
    #[error("unknown field \"{0}\"")]
    UnknownField(String),
    /// `cost` is not a whole number ≥ 1.
    #[error("\"cost\" must be a whole number of at least 1, got {0}")]
    InvalidCost(String),
    /// A settle's `cost` is not a whole number from 0 to
    /// [`MAX_SETTLE_COST`](crate::reserve::MAX_SETTLE_COST).
    #[error(
        "\"cost\" must be a whole number from 0 to {max}, got {0}",
        max = crate::reserve::MAX_SETTLE_COST
    )]
    InvalidSettleCost(String),
    /// A settle's `reservation` is not one open here (see [`SettleError`]).
    #[error("{0}")]
    Settle(SettleError),
    /// `wait_ms` is not a whole number ≥ 0.
    #[error("\"wait_ms\" must be a whole number of milliseconds, got {0}")]
    InvalidWait(String),
    /// `key` is longer than [`MAX_KEY_BYTES`](super::MAX_KEY_BYTES).
    #[error("\"key\" is {0} bytes long; the most is {max}", max = super::MAX_KEY_BYTES)]
    KeyTooLong(usize),
    /// No rule has that name.
    #[error("no rule named \"{0}\"")]
    UnknownRule(String),
    /// The body exceeds [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES).
    #[error("the request body is larger than {max} bytes", max = super::MAX_BODY_BYTES)]
    BodyTooLarge,
    /// The client took too long to send its request.
    #[error("the request was not received in time")]
    Timeout,
    /// The path exists, but not for this method.
    #[error("method not allowed here; allowed: {0}")]
    MethodNotAllowed(&'static str),
    /// No such path.
    #[error("no such endpoint")]
    NotFound,
}

/// The machine-readable `error` code of an [`ApiError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 400, see [`ApiError::MalformedJson`].
    MalformedJson,
    /// 400, see [`ApiError::InvalidQuery`].
    InvalidQuery,
    /// 400, see [`ApiError::MissingField`].
    MissingField,
    /// 400, see [`ApiError::UnknownField`].
    UnknownField,
    /// 400, see [`ApiError::InvalidCost`].
    InvalidCost,
    /// 400, see [`ApiError::InvalidWait`].
    InvalidWait,
    /// 400, see [`ApiError::KeyTooLong`].
    KeyTooLong,
    /// 404, see [`ApiError::UnknownRule`].
    UnknownRule,
    /// 413, see [`ApiError::BodyTooLarge`].
    BodyTooLarge,
    /// 408, see [`ApiError::Timeout`].
    Timeout,
    /// 405, see [`ApiError::MethodNotAllowed`].
    MethodNotAllowed,
    /// 404, see [`ApiError::NotFound`].
    NotFound,
    /// 404, see [`SettleError::Unknown`].
    UnknownReservation,
    /// 409, see [`SettleError::AlreadySettled`].
    AlreadySettled,
    /// 410, see [`SettleError::Expired`].
    ReservationExpired,
}

impl ErrorCode {
    /// Every code, in the order metrics list them.
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::MalformedJson,
        ErrorCode::InvalidQuery,
        ErrorCode::MissingField,
        ErrorCode::UnknownField,
        ErrorCode::InvalidCost,
        ErrorCode::InvalidWait,
        ErrorCode::KeyTooLong,
        ErrorCode::UnknownRule,
        ErrorCode::BodyTooLarge,
        ErrorCode::Timeout,
        ErrorCode::MethodNotAllowed,
        ErrorCode::NotFound,
        ErrorCode::UnknownReservation,
        ErrorCode::AlreadySettled,
        ErrorCode::ReservationExpired,
    ];

    /// The code as it appears in bodies and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::UnknownField => "unknown_field",
            ErrorCode::InvalidCost => "invalid_cost",
            ErrorCode::InvalidWait => "invalid_wait",
            ErrorCode::KeyTooLong => "key_too_long",
            ErrorCode::UnknownRule => "unknown_rule",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::Timeout => "request_timeout",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::NotFound => "not_found",
            ErrorCode::UnknownReservation => "unknown_reservation",
            ErrorCode::AlreadySettled => "already_settled",
            ErrorCode::ReservationExpired => "reservation_expired",
        }
    }
}

impl ApiError {
    /// The error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::MalformedJson(_) => ErrorCode::MalformedJson,
            ApiError::InvalidQuery(_) => ErrorCode::InvalidQuery,
            ApiError::MissingField(_) => ErrorCode::MissingField,
            ApiError::UnknownField(_) => ErrorCode::UnknownField,
            ApiError::InvalidCost(_) | ApiError::InvalidSettleCost(_) => ErrorCode::InvalidCost,
            ApiError::InvalidWait(_) => ErrorCode::InvalidWait,
            ApiError::KeyTooLong(_) => ErrorCode::KeyTooLong,
            ApiError::UnknownRule(_) => ErrorCode::UnknownRule,
            ApiError::BodyTooLarge => ErrorCode::BodyTooLarge,
            ApiError::Timeout => ErrorCode::Timeout,
            ApiError::MethodNotAllowed(_) => ErrorCode::MethodNotAllowed,
            ApiError::NotFound => ErrorCode::NotFound,
            ApiError::Settle(SettleError::Unknown) => ErrorCode::UnknownReservation,
            ApiError::Settle(SettleError::AlreadySettled) => ErrorCode::AlreadySettled,
            ApiError::Settle(SettleError::Expired) => ErrorCode::ReservationExpired,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self.code() {
            ErrorCode::UnknownRule | ErrorCode::NotFound | ErrorCode::UnknownReservation => {
                StatusCode::NOT_FOUND
            }
            ErrorCode::AlreadySettled => StatusCode::CONFLICT,
            ErrorCode::ReservationExpired => StatusCode::GONE,
            ErrorCode::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": self.code().as_str(),
            "message": self.to_string(),
        });
        let mut response = (self.status(), Json(body)).into_response();
        if let ApiError::MethodNotAllowed(allow) = self {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if self.status() == StatusCode::REQUEST_TIMEOUT {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
