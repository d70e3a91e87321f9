//! The JSON body of a check or status answer, written by hand: on the hot path, serde's
//! serializer cost more instructions than the limiter's decision. A property test pins the
//! output to serde_json's, byte for byte.

use serde::Serialize;

/// What a check or status answer says.
#[derive(Debug, Serialize)]
pub(super) struct DecisionBody<'a> {
    pub allowed: bool,
    pub rule: &'a str,
    pub key: &'a str,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: u64,
    /// `null` when the cost can never be admitted.
    pub retry_after_ms: Option<u64>,
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// An admitted reservation's id (`POST /v1/reserve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<&'a str>,
}

impl DecisionBody<'_> {
    /// Appends the body to `out`, exactly as `serde_json::to_writer` would.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"allowed":"#);
        out.extend_from_slice(if self.allowed { b"true" } else { b"false" });
        out.extend_from_slice(br#","rule":"#);
        string(out, self.rule);
        out.extend_from_slice(br#","key":"#);
        string(out, self.key);
        out.extend_from_slice(br#","limit":"#);
        number(out, self.limit);
        out.extend_from_slice(br#","remaining":"#);
        number(out, self.remaining);
        out.extend_from_slice(br#","reset_after_ms":"#);
        number(out, self.reset_after_ms);
        out.extend_from_slice(br#","retry_after_ms":"#);
        match self.retry_after_ms {
            Some(n) => number(out, n),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","outcome":"#);
        string(out, self.outcome);
        if let Some(n) = self.waited_ms {
            out.extend_from_slice(br#","waited_ms":"#);
            number(out, n);
        }
        if let Some(id) = self.reservation {
            out.extend_from_slice(br#","reservation":"#);
            string(out, id);
        }
        out.push(b'}');
    }
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string. Plain text (the usual key) is copied; anything needing an escape goes
/// through serde_json.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn encoded_body_is_what_serde_json_writes(
            allowed: bool, key in any::<String>(), rule in "[a-z.#_-]{1,8}",
            limit: u64, remaining: u64, reset: u64, retry: Option<u64>, waited: Option<u64>,
            outcome in prop::sample::select(vec!["allowed", "denied", "never", "store_full"]),
            reservation in prop::option::of("[0-9a-f]{32}"),
        ) {
            let body = DecisionBody {
                allowed, rule: &rule, key: &key, limit, remaining, reset_after_ms: reset,
                retry_after_ms: retry, outcome, waited_ms: waited,
                reservation: reservation.as_deref(),
            };
            let mut ours = Vec::new();
            body.encode(&mut ours);
            prop_assert_eq!(ours, serde_json::to_vec(&body).unwrap());
        }
    }

    #[test]
    fn keys_with_quotes_and_control_characters_are_escaped() {
        let body = DecisionBody {
            allowed: false,
            rule: "r",
            key: "a\"b\\c\n\u{1}é",
            limit: 1,
            remaining: 0,
            reset_after_ms: 5,
            retry_after_ms: None,
            outcome: "never",
            waited_ms: None,
            reservation: None,
        };
        let mut out = Vec::new();
        body.encode(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["key"], "a\"b\\c\n\u{1}é");
        assert_eq!(v["retry_after_ms"], serde_json::Value::Null);
    }
}
