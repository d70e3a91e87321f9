//! An app asking its node-local gossamer before each unit of work, with reqwest.
//!
//! - 200: go ahead.
//! - 429: wait the body's `retry_after_ms`, then ask again. Milliseconds: the `Retry-After`
//!   header says the same wait in whole seconds rounded up, so a 10/s rule's 100 ms wait
//!   would become a second. The header is the fallback for a body without the field.
//! - 429 with `"retry_after_ms": null` (`"outcome":"never"`): the cost can never fit; do not
//!   retry.
//! - Anything else, or no answer within the timeout: fail open (do the work) and say so —
//!   a limiter that is restarting should not take the app down. Choose fail closed instead
//!   where over-admission costs more than an outage.
//!
//! Run a node (`cargo run --release -- serve --config docs/examples/tiers.toml`), then:
//!
//! ```sh
//! cargo run --example check_client -- http://127.0.0.1:7070 free tenant-42 70
//! ```
//!
//! Arguments (all optional): URL (or `GOSSAMER_URL`), rule, key, number of calls.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

/// The longest the app waits for its limiter before failing open.
const TIMEOUT: Duration = Duration::from_millis(500);
/// The longest a single wait is honoured for (a guard against a bad answer).
const MAX_WAIT: Duration = Duration::from_secs(120);

/// The fields of a decision this app uses (the body has more: see README, "Body").
#[derive(Debug, Deserialize)]
struct Decision {
    remaining: u64,
    outcome: String,
    /// Until the same check would be admitted; `None` (JSON `null`) when it never can.
    retry_after_ms: Option<u64>,
}

/// What the limiter said about one call.
#[derive(Debug)]
enum Answer {
    Go { remaining: u64 },
    RetryAfter(Duration),
    Never,
    Unavailable(String),
}

async fn ask(client: &reqwest::Client, url: &str, rule: &str, key: &str) -> Answer {
    let body = serde_json::json!({ "rule": rule, "key": key, "cost": 1 });
    let response = match client
        .post(format!("{url}/v1/check"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return Answer::Unavailable(e.to_string()),
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let decision = response.json::<Decision>().await;
    match (status, decision) {
        (StatusCode::OK, Ok(d)) => Answer::Go {
            remaining: d.remaining,
        },
        (StatusCode::TOO_MANY_REQUESTS, Ok(d)) => match (d.retry_after_ms, retry_after) {
            (Some(ms), _) => Answer::RetryAfter(Duration::from_millis(ms.max(1)).min(MAX_WAIT)),
            (None, _) if d.outcome == "never" => Answer::Never,
            (None, Some(wait)) => Answer::RetryAfter(wait.min(MAX_WAIT)),
            (None, None) => Answer::RetryAfter(Duration::from_secs(1)),
        },
        (status, _) => Answer::Unavailable(format!("HTTP {status}")),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("GOSSAMER_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:7070".to_owned());
    let rule = args.next().unwrap_or_else(|| "free".to_owned());
    let key = args.next().unwrap_or_else(|| "tenant-42".to_owned());
    let calls: u32 = args.next().map_or(Ok(5), |n| n.parse())?;
    let client = reqwest::Client::builder().timeout(TIMEOUT).build()?;

    for call in 1..=calls {
        loop {
            match ask(&client, &url, &rule, &key).await {
                Answer::Go { remaining } => {
                    println!("call {call}: admitted ({remaining} left)");
                    break;
                }
                Answer::RetryAfter(wait) => {
                    println!("call {call}: limited; retrying in {wait:?} (retry_after_ms)");
                    tokio::time::sleep(wait).await;
                }
                Answer::Never => {
                    println!("call {call}: can never be admitted under \"{rule}\"; giving up");
                    return Ok(());
                }
                Answer::Unavailable(why) => {
                    println!("call {call}: limiter unavailable ({why}); failing open");
                    break;
                }
            }
        }
    }
    Ok(())
}
