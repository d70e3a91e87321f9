//! Reserve, then settle: a reserve's answer ([`Reservation`]), a settle's ([`Settlement`]),
//! what [`Client::settle`](crate::Client::settle) takes ([`SettleTarget`]), and reading both
//! answers off HTTP.

use std::ops::Deref;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, read_answer, refused, snippet};
use crate::error::Error;

/// What [`Client::reserve`](crate::Client::reserve) returns: the node's [`Decision`] (its
/// fields read through `Deref`: `r.allowed`, `r.remaining`, ...), the reservation's id, and
/// the reserved cost.
///
/// `reservation` is `Some` exactly when the node admitted the reserve and holds the
/// estimate; `None` when denied (nothing is held: nothing to settle) and when the client
/// failed open with the node unreachable (outcome [`FailOpen`](crate::Outcome::FailOpen):
/// nothing was charged, and a settle of it does nothing). Serialized, it is the node's body
/// again (`cost` is the client's, not in the body).
///
/// It is plain data: unlike the Python client's, it does not remember whether it was
/// settled. Settle it once, at the node that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Reservation {
    /// The node's answer, as a check's.
    #[serde(flatten)]
    pub decision: Decision,
    /// The id to settle (32 hex digits), when admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// The cost reserved (the estimate).
    #[serde(skip)]
    pub cost: u64,
}

impl Reservation {
    /// The reservation of a client that could not reach its node and fails open.
    pub(crate) fn fail_open(rule: &str, key: &str, cost: u64) -> Reservation {
        Reservation {
            decision: Decision::fail_open(rule, key),
            reservation: None,
            cost,
        }
    }

    /// The id to settle, when admitted.
    pub fn id(&self) -> Option<&str> {
        self.reservation.as_deref()
    }
}

impl Deref for Reservation {
    type Target = Decision;

    fn deref(&self) -> &Decision {
        &self.decision
    }
}

impl From<Reservation> for Decision {
    fn from(reservation: Reservation) -> Decision {
        reservation.decision
    }
}

/// What the node did when a reservation was settled: the body of `POST /v1/settle`'s 200.
/// Serialized, it is that body again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Settlement {
    /// The reservation's id.
    pub reservation: String,
    /// Its rule.
    pub rule: String,
    /// Its key.
    pub key: String,
    /// The cost reserved (the estimate).
    pub reserved: u64,
    /// The actual cost settled.
    pub cost: u64,
    /// Units given back: up to `reserved - cost`, less when the window closed or the bucket
    /// refilled meanwhile (the node gives back only what a check of the actual cost would
    /// have left).
    pub refunded: u64,
    /// Units charged beyond the estimate (whatever the room: the key may go past its limit).
    pub charged: u64,
    /// Units beyond the estimate the node could not charge (a clustered key whose node held
    /// no room for them).
    pub unpaid: u64,
    /// The binding limit's units per period, as the key stands now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Units that could be spent now (the cluster's figure on a global rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// Milliseconds until the key is back to a fresh state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_after_ms: Option<u64>,
}

impl Settlement {
    /// `reset_after_ms` as a duration.
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_after_ms.map(Duration::from_millis)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for str {}
    impl Sealed for String {}
    impl Sealed for super::Reservation {}
}

/// What [`Client::settle`](crate::Client::settle) takes: a [`Reservation`], or its id (`&str`
/// or `&String`).
pub trait SettleTarget: sealed::Sealed {
    /// The id to settle; `Ok(None)` for a fail-open reservation (nothing to settle);
    /// [`Error::NothingToSettle`] for a reservation the node did not admit, or an empty id.
    fn reservation_id(&self) -> Result<Option<&str>, Error>;
}

impl SettleTarget for str {
    fn reservation_id(&self) -> Result<Option<&str>, Error> {
        if self.is_empty() {
            return Err(Error::NothingToSettle("an empty reservation id".to_owned()));
        }
        Ok(Some(self))
    }
}

impl SettleTarget for String {
    fn reservation_id(&self) -> Result<Option<&str>, Error> {
        self.as_str().reservation_id()
    }
}

impl SettleTarget for Reservation {
    fn reservation_id(&self) -> Result<Option<&str>, Error> {
        match &self.reservation {
            Some(id) => id.as_str().reservation_id(),
            None if self.failed_open() => Ok(None),
            None => Err(Error::NothingToSettle(format!(
                "the reserve of rule {:?}, key {:?} was not admitted ({})",
                self.rule, self.key, self.outcome
            ))),
        }
    }
}

/// The reservation in a reserve's answer: a check's (see [`read_answer`]) with its
/// `reservation` id. An admission without an id is not a reserve's answer (a node or proxy
/// that does not know `/v1/reserve`): [`Error::Unavailable`].
pub(crate) fn read_reservation(
    url: &str,
    status: u16,
    body: &[u8],
    cost: u64,
) -> Result<Reservation, Error> {
    /// The one field a reserve's answer adds to a check's.
    #[derive(Deserialize)]
    struct Held {
        #[serde(default)]
        reservation: Option<String>,
    }
    let decision = read_answer(url, status, body)?;
    // read_answer read a JSON object: this cannot fail but for a `reservation` not a string.
    let held: Held = serde_json::from_slice(body).map_err(|e| Error::Unavailable {
        url: url.to_owned(),
        reason: format!("HTTP {status} with a malformed reservation ({e})"),
    })?;
    let reservation = held.reservation.filter(|id| !id.is_empty());
    if decision.allowed && reservation.is_none() {
        return Err(Error::Unavailable {
            url: url.to_owned(),
            reason: format!("HTTP {status}: admitted without a reservation id"),
        });
    }
    Ok(Reservation {
        decision,
        reservation,
        cost,
    })
}

/// The settlement in a settle's answer for reservation `id`: 200 carries one. The node's
/// refusals of the reservation are their own errors (404 `unknown_reservation`
/// [`Error::UnknownReservation`], 409 `already_settled` [`Error::AlreadySettled`], 410
/// `reservation_expired` [`Error::ReservationExpired`]; by the error code, so that a 404 from
/// something else stays a [`Error::BadRequest`]); any other 4xx but 408 is a
/// [`Error::BadRequest`]; anything else [`Error::Unavailable`].
pub(crate) fn read_settlement(
    url: &str,
    id: &str,
    status: u16,
    body: &[u8],
) -> Result<Settlement, Error> {
    if status == 200 {
        return serde_json::from_slice(body).map_err(|e| Error::Unavailable {
            url: url.to_owned(),
            reason: format!("HTTP 200 without a settlement ({e}): {}", snippet(body)),
        });
    }
    let reservation = id.to_owned();
    Err(match refused(url, status, body) {
        Error::BadRequest { error, message, .. } if error == "unknown_reservation" => {
            Error::UnknownReservation {
                reservation,
                message,
            }
        }
        Error::BadRequest { error, message, .. } if error == "already_settled" => {
            Error::AlreadySettled {
                reservation,
                message,
            }
        }
        Error::BadRequest { error, message, .. } if error == "reservation_expired" => {
            Error::ReservationExpired {
                reservation,
                message,
            }
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;

    const URL: &str = "http://127.0.0.1:7070";
    const ID: &str = "0000000000000001e44ddbb64463e3f0";

    #[test]
    fn reads_an_admitted_reserve_with_its_id_and_serializes_it_back() {
        let body = r#"{"allowed":true,"rule":"llm","key":"user-42","limit":100000,"remaining":98000,"reset_after_ms":1200,"retry_after_ms":0,"outcome":"allowed","reservation":"0000000000000001e44ddbb64463e3f0"}"#;
        let r = read_reservation(URL, 200, body.as_bytes(), 2000).unwrap();
        assert!(r.allowed && !r.failed_open());
        assert_eq!(r.id(), Some(ID));
        assert_eq!((r.remaining, r.status, r.cost), (Some(98000), 200, 2000));
        assert_eq!(r.outcome, Outcome::Allowed);
        assert_eq!(r.reservation_id().unwrap(), Some(ID));
        assert_eq!(serde_json::to_string(&r).unwrap(), body);
        let d: Decision = r.into();
        assert_eq!(d.key, "user-42");
    }

    #[test]
    fn a_shaped_reserve_keeps_its_wait() {
        let body = r#"{"allowed":true,"rule":"s","key":"k","limit":1,"remaining":0,"reset_after_ms":1,"retry_after_ms":0,"outcome":"allowed","waited_ms":3,"reservation":"ab"}"#;
        let r = read_reservation(URL, 200, body.as_bytes(), 1).unwrap();
        assert_eq!((r.waited_ms, r.id()), (Some(3), Some("ab")));
        assert_eq!(serde_json::to_string(&r).unwrap(), body);
    }

    #[test]
    fn a_denied_reserve_has_no_id_and_nothing_to_settle() {
        for (body, outcome) in [
            (
                r#"{"allowed":false,"rule":"one","key":"k","limit":1,"remaining":0,"reset_after_ms":9,"retry_after_ms":9,"outcome":"denied"}"#,
                Outcome::Denied,
            ),
            (
                r#"{"allowed":false,"rule":"one","key":"k","limit":1,"remaining":1,"reset_after_ms":0,"retry_after_ms":null,"outcome":"never"}"#,
                Outcome::Never,
            ),
            (
                r#"{"allowed":false,"rule":"one","key":"k","limit":1,"remaining":1,"reset_after_ms":0,"retry_after_ms":1000,"outcome":"store_full","reservation":null}"#,
                Outcome::StoreFull,
            ),
        ] {
            let r = read_reservation(URL, 429, body.as_bytes(), 1).unwrap();
            assert_eq!((r.allowed, r.outcome, r.id()), (false, outcome, None));
            match r.reservation_id() {
                Err(Error::NothingToSettle(why)) => assert!(why.contains("not admitted"), "{why}"),
                other => panic!("expected NothingToSettle, got {other:?}"),
            }
        }
    }

    #[test]
    fn an_admission_without_an_id_or_a_bad_id_is_not_a_reserves_answer() {
        for body in [
            r#"{"allowed":true,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":1,"retry_after_ms":0,"outcome":"allowed"}"#,
            r#"{"allowed":true,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":1,"retry_after_ms":0,"outcome":"allowed","reservation":""}"#,
            r#"{"allowed":true,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":1,"retry_after_ms":0,"outcome":"allowed","reservation":7}"#,
        ] {
            let e = read_reservation(URL, 200, body.as_bytes(), 1).unwrap_err();
            assert!(e.is_unavailable(), "{body}: {e}");
        }
        // And what a check's answer refuses, a reserve's does too.
        let e = read_reservation(URL, 404, br#"{"error":"unknown_rule","message":"m"}"#, 1);
        assert!(matches!(e, Err(Error::BadRequest { status: 404, .. })));
        assert!(
            read_reservation(URL, 503, b"", 1)
                .unwrap_err()
                .is_unavailable()
        );
    }

    #[test]
    fn a_fail_open_reservation_has_nothing_to_settle() {
        let r = Reservation::fail_open("llm", "k", 2000);
        assert!(r.allowed && r.failed_open());
        assert_eq!((r.id(), r.cost, r.status), (None, 2000, 0));
        assert_eq!(r.reservation_id().unwrap(), None);
    }

    #[test]
    fn ids_settle_as_themselves_but_not_an_empty_one() {
        assert_eq!(ID.reservation_id().unwrap(), Some(ID));
        assert_eq!(ID.to_owned().reservation_id().unwrap(), Some(ID));
        assert!(matches!(
            "".reservation_id(),
            Err(Error::NothingToSettle(_))
        ));
    }

    #[test]
    fn reads_a_settlement_and_serializes_it_back() {
        let body = r#"{"reservation":"0000000000000001e44ddbb64463e3f0","rule":"llm","key":"user-42","reserved":2000,"cost":500,"refunded":1500,"charged":0,"unpaid":0,"limit":100000,"remaining":99500,"reset_after_ms":300}"#;
        let s = read_settlement(URL, ID, 200, body.as_bytes()).unwrap();
        assert_eq!(
            (s.reservation.as_str(), s.rule.as_str(), s.key.as_str()),
            (ID, "llm", "user-42")
        );
        assert_eq!(
            (s.reserved, s.cost, s.refunded, s.charged, s.unpaid),
            (2000, 500, 1500, 0, 0)
        );
        assert_eq!((s.limit, s.remaining), (Some(100_000), Some(99_500)));
        assert_eq!(s.reset_after(), Some(Duration::from_millis(300)));
        assert_eq!(serde_json::to_string(&s).unwrap(), body);
        // Without the key's standing (a rule gone since), and with a field from a newer node.
        let body = br#"{"reservation":"ab","rule":"r","key":"k","reserved":5,"cost":9,"refunded":0,"charged":3,"unpaid":1,"credit":2}"#;
        let s = read_settlement(URL, "ab", 200, body).unwrap();
        assert_eq!(
            (s.charged, s.unpaid, s.limit, s.remaining),
            (3, 1, None, None)
        );
    }

    #[test]
    fn a_settles_refusals_of_the_reservation_are_typed_errors() {
        let refusal = |error: &str| format!(r#"{{"error":"{error}","message":"m {error}"}}"#);
        let e = read_settlement(URL, ID, 404, refusal("unknown_reservation").as_bytes());
        match e {
            Err(Error::UnknownReservation {
                reservation,
                message,
            }) => assert_eq!(
                (reservation.as_str(), message.as_str()),
                (ID, "m unknown_reservation")
            ),
            other => panic!("expected UnknownReservation, got {other:?}"),
        }
        let e = read_settlement(URL, ID, 409, refusal("already_settled").as_bytes());
        assert!(
            matches!(&e, Err(Error::AlreadySettled { reservation, .. }) if reservation == ID),
            "{e:?}"
        );
        let e = read_settlement(URL, ID, 410, refusal("reservation_expired").as_bytes());
        let e = e.unwrap_err();
        assert!(matches!(e, Error::ReservationExpired { .. }), "{e:?}");
        assert!(e.to_string().contains("expired"), "{e}");
        assert!(!e.is_unavailable());
    }

    #[test]
    fn other_refusals_are_bad_requests_and_the_rest_unavailable() {
        let e = read_settlement(URL, ID, 400, br#"{"error":"invalid_cost","message":"m"}"#);
        match e {
            Err(Error::BadRequest { status, error, .. }) => {
                assert_eq!((status, error.as_str()), (400, "invalid_cost"));
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
        // A 404 that is not the node's refusal of a reservation (a node without /v1/settle,
        // a proxy) stays a BadRequest.
        let e = read_settlement(URL, ID, 404, b"Not Found");
        assert!(
            matches!(e, Err(Error::BadRequest { status: 404, ref error, .. }) if error == "http_error")
        );
        for (status, body) in [
            (503, &b"{\"status\":\"draining\"}"[..]),
            (408, b""),
            (200, b"{\"reservation\":\"ab\"}"),
            (200, b"<html>"),
        ] {
            let e = read_settlement(URL, ID, status, body).unwrap_err();
            assert!(e.is_unavailable(), "{status}: {e}");
        }
    }
}
