//! The node's answer to a check or status, and reading one off an HTTP answer.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// How a decision came about: the body's `outcome`, or [`Outcome::FailOpen`] when the client
/// admitted a call the node could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted and charged.
    Allowed,
    /// Denied for now: `retry_after_ms` says until when.
    Denied,
    /// The cost exceeds what the rule can ever admit at once; retrying cannot help.
    Never,
    /// A new key arrived while the node holds its `max_keys` keys.
    StoreFull,
    /// Not the node's: it could not be reached and the client fails open.
    FailOpen,
    /// An outcome this client does not know (a newer node).
    #[serde(other)]
    Unknown,
}

impl Outcome {
    /// The name the node uses (`"allowed"`, `"store_full"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Never => "never",
            Outcome::StoreFull => "store_full",
            Outcome::FailOpen => "fail_open",
            Outcome::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the node said about one check (or status): the body of its answer. Serialized, it is
/// that body again, field for field.
///
/// The figures are the node's (its README, "Body"), and `None` only in a fail-open decision
/// (and `retry_after_ms` for a cost that can never fit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Decision {
    /// Admitted (for a status: whether a check of cost 1 would be admitted now).
    pub allowed: bool,
    /// The rule.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The binding limit's units per period.
    #[serde(default)]
    pub limit: Option<u64>,
    /// Units that could be spent right now (after this check, if it was admitted).
    #[serde(default)]
    pub remaining: Option<u64>,
    /// Milliseconds until the key is back to a fresh state (full bucket, empty window).
    #[serde(default)]
    pub reset_after_ms: Option<u64>,
    /// Milliseconds until the same check would be admitted: 0 when admitted, `None` when it
    /// never can be (outcome `never`).
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// How the decision came about.
    pub outcome: Outcome,
    /// How long a shaping rule held the call before admitting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// The HTTP status: 200 or 429 (0 for a fail-open decision).
    #[serde(skip)]
    pub status: u16,
}

impl Decision {
    /// The decision of a client that could not reach its node and fails open.
    pub(crate) fn fail_open(rule: &str, key: &str) -> Decision {
        Decision {
            allowed: true,
            rule: rule.to_owned(),
            key: key.to_owned(),
            limit: None,
            remaining: None,
            reset_after_ms: None,
            retry_after_ms: None,
            outcome: Outcome::FailOpen,
            waited_ms: None,
            status: 0,
        }
    }

    /// True when the node could not be reached and the client admitted the call anyway.
    pub fn failed_open(&self) -> bool {
        self.outcome == Outcome::FailOpen
    }

    /// True when the cost can never be admitted under the rule: retrying cannot help.
    pub fn never(&self) -> bool {
        self.outcome == Outcome::Never
    }

    /// `retry_after_ms` as a duration.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }

    /// `reset_after_ms` as a duration.
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_after_ms.map(Duration::from_millis)
    }
}

/// The `{"error", "message"}` body of a refused request.
#[derive(Debug, Deserialize)]
struct Refusal {
    error: String,
    #[serde(default)]
    message: String,
}

/// The decision in an answer with this status and body. 200 and 429 carry a decision; any
/// other 4xx but 408 is a [`Error::BadRequest`]; anything else (a 5xx, a body that is not a
/// decision) is [`Error::Unavailable`] for the node at `url`.
pub(crate) fn read_answer(url: &str, status: u16, body: &[u8]) -> Result<Decision, Error> {
    let unavailable = |reason: String| Error::Unavailable {
        url: url.to_owned(),
        reason,
    };
    if status == 200 || status == 429 {
        return match serde_json::from_slice::<Decision>(body) {
            Ok(mut decision) => {
                decision.status = status;
                Ok(decision)
            }
            Err(e) => Err(unavailable(format!(
                "HTTP {status} without a decision ({e}): {}",
                snippet(body)
            ))),
        };
    }
    Err(refused(url, status, body))
}

/// What an answer that is not the expected one means: any 4xx but 408 is a
/// [`Error::BadRequest`] with the node's `{"error","message"}` (`"http_error"` and the body's
/// start without one); anything else [`Error::Unavailable`].
pub(crate) fn refused(url: &str, status: u16, body: &[u8]) -> Error {
    // 408: the node did not receive the request in time, which is the network, not the caller.
    if (400..500).contains(&status) && status != 408 {
        return match serde_json::from_slice::<Refusal>(body) {
            Ok(r) => Error::BadRequest {
                status,
                error: r.error,
                message: r.message,
            },
            Err(_) => Error::BadRequest {
                status,
                error: "http_error".to_owned(),
                message: snippet(body),
            },
        };
    }
    Error::Unavailable {
        url: url.to_owned(),
        reason: format!("HTTP {status}: {}", snippet(body)),
    }
}

/// The start of a body, for a message.
pub(crate) fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://127.0.0.1:7070";

    #[test]
    fn reads_an_admission_with_its_status() {
        let body = br#"{"allowed":true,"rule":"api","key":"user-42","limit":10,"remaining":19,"reset_after_ms":100,"retry_after_ms":0,"outcome":"allowed"}"#;
        let d = read_answer(URL, 200, body).unwrap();
        assert!(d.allowed);
        assert_eq!((d.rule.as_str(), d.key.as_str()), ("api", "user-42"));
        assert_eq!(d.limit, Some(10));
        assert_eq!(d.remaining, Some(19));
        assert_eq!(d.reset_after_ms, Some(100));
        assert_eq!(d.retry_after_ms, Some(0));
        assert_eq!(d.outcome, Outcome::Allowed);
        assert_eq!(d.waited_ms, None);
        assert_eq!(d.status, 200);
    }

    #[test]
    fn reads_a_denial_in_milliseconds() {
        let body = br#"{"allowed":false,"rule":"free","key":"t","limit":60,"remaining":0,"reset_after_ms":60000,"retry_after_ms":13,"outcome":"denied"}"#;
        let d = read_answer(URL, 429, body).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.outcome, Outcome::Denied);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(13)));
        assert_eq!(d.status, 429);
    }

    #[test]
    fn reads_a_never_with_a_null_retry_and_a_shaped_wait() {
        let body = br#"{"allowed":false,"rule":"r","key":"k","limit":5,"remaining":5,"reset_after_ms":0,"retry_after_ms":null,"outcome":"never"}"#;
        let d = read_answer(URL, 429, body).unwrap();
        assert!(d.never());
        assert_eq!(d.retry_after_ms, None);
        let body = br#"{"allowed":true,"rule":"shaped","key":"k","limit":5,"remaining":0,"reset_after_ms":200,"retry_after_ms":0,"outcome":"allowed","waited_ms":150}"#;
        assert_eq!(read_answer(URL, 200, body).unwrap().waited_ms, Some(150));
    }

    #[test]
    fn an_unknown_outcome_or_extra_field_from_a_newer_node_still_reads() {
        let body = br#"{"allowed":false,"rule":"r","key":"k","limit":5,"remaining":0,"reset_after_ms":9,"retry_after_ms":9,"outcome":"shed","reservation":"abc"}"#;
        assert_eq!(
            read_answer(URL, 429, body).unwrap().outcome,
            Outcome::Unknown
        );
    }

    #[test]
    fn serializes_back_to_the_nodes_body_byte_for_byte() {
        let body = r#"{"allowed":false,"rule":"api","key":"u \"q\"","limit":10,"remaining":0,"reset_after_ms":2000,"retry_after_ms":100,"outcome":"denied"}"#;
        let d = read_answer(URL, 429, body.as_bytes()).unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), body);
        let shaped = r#"{"allowed":true,"rule":"s","key":"k","limit":1,"remaining":0,"reset_after_ms":1,"retry_after_ms":0,"outcome":"store_full","waited_ms":3}"#;
        let d = read_answer(URL, 200, shaped.as_bytes()).unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), shaped);
    }

    #[test]
    fn a_4xx_is_a_bad_request_with_the_nodes_code() {
        let body = br#"{"error":"unknown_rule","message":"no rule named \"nope\""}"#;
        match read_answer(URL, 404, body) {
            Err(Error::BadRequest {
                status,
                error,
                message,
            }) => {
                assert_eq!((status, error.as_str()), (404, "unknown_rule"));
                assert_eq!(message, r#"no rule named "nope""#);
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
        match read_answer(URL, 400, b"not json") {
            Err(Error::BadRequest { error, message, .. }) => {
                assert_eq!(
                    (error.as_str(), message.as_str()),
                    ("http_error", "not json")
                );
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
    }

    #[test]
    fn a_5xx_a_408_or_a_body_that_is_not_a_decision_is_unavailable() {
        for (status, body) in [
            (503, &b"{\"status\":\"draining\"}"[..]),
            (500, b""),
            (408, b"{\"error\":\"request_timeout\",\"message\":\"late\"}"),
            (200, b"<html>proxy</html>"),
            (429, b"{\"allowed\":false}"),
            (302, b""),
        ] {
            let e = read_answer(URL, status, body).unwrap_err();
            assert!(e.is_unavailable(), "{status}: {e}");
            assert!(
                e.to_string()
                    .starts_with("gossamer at http://127.0.0.1:7070: HTTP"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_fail_open_decision_admits_without_figures() {
        let d = Decision::fail_open("api", "k");
        assert!(d.allowed && d.failed_open() && !d.never());
        assert_eq!(
            (d.limit, d.remaining, d.retry_after_ms, d.status),
            (None, None, None, 0)
        );
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"allowed":true,"rule":"api","key":"k","limit":null,"remaining":null,"reset_after_ms":null,"retry_after_ms":null,"outcome":"fail_open"}"#
        );
    }
}
