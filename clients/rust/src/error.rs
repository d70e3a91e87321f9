//! Every way a call of this crate fails.

use std::time::Duration;

use crate::decision::Decision;

/// Why a call did not return a decision (or, for [`acquire`](crate::Client::acquire) and
/// [`rate_limited`](crate::Client::rate_limited), an admitting one).
///
/// A denial by [`check`](crate::Client::check) is not an error: it is a [`Decision`] with
/// `allowed == false`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not `http://host[:port][/prefix]`.
    #[error("invalid URL {0:?}: expected http://host:port")]
    Url(String),
    /// A [`ClientBuilder`](crate::ClientBuilder) setting is out of range.
    #[error("invalid client setting: {0}")]
    Config(&'static str),
    /// Denied, and the node's wait would end after the caller's timeout (at once for a
    /// timeout of zero). `decision` is the last denial: its `retry_after_ms` says how long
    /// until the same call could pass.
    #[error(
        "rate limited: rule {:?}, key {:?} ({}, retry after {})",
        decision.rule, decision.key, decision.outcome, Millis(decision.retry_after_ms)
    )]
    RateLimited {
        /// The last denial.
        decision: Box<Decision>,
    },
    /// The cost exceeds what the rule can ever admit at once (outcome `never`): waiting
    /// cannot help, so `acquire` fails with this at once whatever its timeout.
    #[error(
        "never admitted: rule {:?}, key {:?}: the cost can never fit under this rule",
        decision.rule, decision.key
    )]
    NeverAdmitted {
        /// The denial, with outcome [`Outcome::Never`](crate::Outcome::Never).
        decision: Box<Decision>,
    },
    /// The node could not be reached within the connect timeout, did not answer within the
    /// timeout, or answered with something that is not a gossamer answer (a 5xx, a body that
    /// is not a decision). Returned by `check`, `acquire`, `rate_limited`, `reserve`,
    /// `reserved` and `settle` only when the client fails closed; failing open, they admit the
    /// call instead (`settle` answers `Ok(None)`: the reservation keeps its estimate).
    /// `status` always returns it: it admits nothing, so there is nothing to fail open to.
    #[error("gossamer at {url}: {reason}")]
    Unavailable {
        /// The node's URL, as given to the client.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The node refused the request as malformed (a 4xx other than 429 and 408), for
    /// example an unknown rule (404, `error == "unknown_rule"`) or a cost of 0 (400,
    /// `"invalid_cost"`, also a settle's cost above 2^40). A bug in the caller, not an outage:
    /// returned whether the client fails open or closed, and nothing was counted. A settle's
    /// refusals of the reservation itself have variants of their own:
    /// [`UnknownReservation`](Error::UnknownReservation),
    /// [`AlreadySettled`](Error::AlreadySettled),
    /// [`ReservationExpired`](Error::ReservationExpired).
    #[error("HTTP {status} {error}: {message}")]
    BadRequest {
        /// The HTTP status.
        status: u16,
        /// The node's machine-readable `error` code (`"http_error"` if it sent none).
        error: String,
        /// The node's `message`.
        message: String,
    },
    /// [`settle`](crate::Client::settle): the node holds no such reservation (404,
    /// `"unknown_reservation"`): another node's (settle at the node you reserved at), one
    /// from before the node restarted, one settled or expired long ago, or not an id at all.
    /// Nothing changed. Returned whether the client fails open or closed.
    #[error("reservation {reservation:?} unknown at this node: {message}")]
    UnknownReservation {
        /// The id sent.
        reservation: String,
        /// The node's `message`.
        message: String,
    },
    /// [`settle`](crate::Client::settle): the reservation was settled already (409,
    /// `"already_settled"`); this settle changed nothing. Returned whether the client fails
    /// open or closed.
    #[error("reservation {reservation:?} already settled: {message}")]
    AlreadySettled {
        /// The id sent.
        reservation: String,
        /// The node's `message`.
        message: String,
    },
    /// [`settle`](crate::Client::settle): the reservation was not settled within the node's
    /// `reservation_timeout` (410, `"reservation_expired"`): its estimate stood, and nothing
    /// is given back or charged now. Returned whether the client fails open or closed.
    #[error("reservation {reservation:?} expired, its estimate stood: {message}")]
    ReservationExpired {
        /// The id sent.
        reservation: String,
        /// The node's `message`.
        message: String,
    },
    /// [`settle`](crate::Client::settle) was given nothing to settle: a
    /// [`Reservation`](crate::Reservation) the node did not admit (denied, so it holds
    /// nothing), or an empty id. A bug in the caller; nothing was sent.
    #[error("nothing to settle: {0}")]
    NothingToSettle(String),
}

impl Error {
    /// The denial behind [`Error::RateLimited`] or [`Error::NeverAdmitted`].
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Error::RateLimited { decision } | Error::NeverAdmitted { decision } => Some(decision),
            _ => None,
        }
    }

    /// How long until the denied call could pass: `None` unless rate limited, and for a cost
    /// that can never fit.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision().and_then(Decision::retry_after)
    }

    /// True for [`Error::Unavailable`]: the node, not the caller or the limit.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}

/// `N ms`, or `never` for a wait that cannot end.
struct Millis(Option<u64>);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ms) => write!(f, "{ms} ms"),
            None => f.write_str("never"),
        }
    }
}
