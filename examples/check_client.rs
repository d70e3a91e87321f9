//! An app asking its node-local gossamer before each unit of work, with the Rust client
//! (`clients/rust`, crate `gossamer_client`).
//!
//! - Admitted: go ahead.
//! - Denied: `acquire` waits the body's `retry_after_ms` (plus a little jitter), then asks
//!   again. Milliseconds: the `Retry-After` header says the same wait in whole seconds rounded
//!   up, so a 10/s rule's 100 ms wait would become a second.
//! - A cost that can never fit (`"outcome":"never"`): `Error::NeverAdmitted`; do not retry.
//! - No answer within the timeouts: this app fails open (does the work) and says so — a
//!   limiter that is restarting should not take the app down. Choose fail closed (the
//!   default) where over-admission costs more than an outage.
//!
//! Run a node (`cargo run --release -- serve --config docs/examples/tiers.toml`), then:
//!
//! ```sh
//! cargo run --example check_client -- http://127.0.0.1:7070 free tenant-42 70
//! ```
//!
//! Arguments (all optional): URL (or `GOSSAMER_URL`), rule, key, number of calls.

use std::time::{Duration, Instant};

use gossamer_client::{Client, Error};

/// The longest the app waits for its limiter to answer before failing open.
const TIMEOUT: Duration = Duration::from_millis(500);
/// The longest one call waits to be admitted.
const MAX_WAIT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("GOSSAMER_URL").ok())
        .unwrap_or_else(|| gossamer_client::DEFAULT_URL.to_owned());
    let rule = args.next().unwrap_or_else(|| "free".to_owned());
    let key = args.next().unwrap_or_else(|| "tenant-42".to_owned());
    let calls: u32 = args.next().map_or(Ok(5), |n| n.parse())?;
    let client = Client::builder(&url)
        .fail_open(true)
        .timeout(TIMEOUT)
        .build()?;

    for call in 1..=calls {
        let asked = Instant::now();
        match client.acquire(&rule, &key, 1, MAX_WAIT).await {
            Ok(decision) if decision.failed_open() => {
                println!("call {call}: limiter unavailable; failing open");
            }
            Ok(decision) => {
                let waited = asked.elapsed().as_millis();
                let left = decision.remaining.unwrap_or_default();
                println!("call {call}: admitted after {waited} ms ({left} left)");
            }
            Err(Error::NeverAdmitted { .. }) => {
                println!("call {call}: can never be admitted under \"{rule}\"; giving up");
                return Ok(());
            }
            Err(e @ Error::RateLimited { .. }) => {
                println!("call {call}: not admitted within {MAX_WAIT:?}: {e}");
            }
            // A 4xx: an unknown rule, a bad key. A bug to fix, not an outage to ride out.
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
