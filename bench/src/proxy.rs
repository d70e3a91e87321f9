//! A delaying TCP proxy: one network hop between the application and a central Redis.
//!
//! The kernel here has no `netem` qdisc, so the hop is made in user space. Every chunk read
//! from one side is stamped with its arrival time and queued; a writer thread per direction
//! sends each chunk to the other side at arrival + delay. Chunks keep their order and each is
//! delayed from its own arrival, so a burst of requests is not serialised behind one sleep:
//! the proxy adds latency, not a throughput limit. Threads (not tokio tasks), because tokio's
//! timer has 1 ms granularity; each writer sets its timer slack to 1 ns so that `nanosleep`
//! wakes close to the deadline. What the proxy costs by itself (0 µs delay) and what the
//! delay really adds are measured and reported (`report::hop_table`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Serves until killed: accepts on `listen`, connects each client to `upstream`.
pub fn serve(listen: &str, upstream: &str, delay: Duration) -> Result<(), String> {
    let listener = TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
    for down in listener.incoming() {
        let down = match down {
            Ok(s) => s,
            Err(e) => {
                eprintln!("proxy: accept: {e}");
                continue;
            }
        };
        let up = match TcpStream::connect(upstream) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("proxy: connect {upstream}: {e}");
                continue;
            }
        };
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let pair = down
            .try_clone()
            .and_then(|d| up.try_clone().map(|u| (d, u)));
        match pair {
            Ok((down2, up2)) => {
                std::thread::spawn(move || pipe(down, up2, delay));
                std::thread::spawn(move || pipe(up, down2, delay));
            }
            Err(e) => eprintln!("proxy: clone: {e}"),
        }
    }
    Ok(())
}

/// Reads `from` and queues each chunk, stamped, for a writer thread that sends it to `to`.
fn pipe(mut from: TcpStream, to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || deliver(rx, to, delay));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}

fn deliver(rx: mpsc::Receiver<(Instant, Vec<u8>)>, mut to: TcpStream, delay: Duration) {
    // SAFETY: prctl(PR_SET_TIMERSLACK) changes only this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    // How late a sleep wakes, on average (an exponential moving average, in ns): sleeps are
    // shortened by it, so that chunks leave at arrival + delay on average rather than later.
    let mut late_ns = 0f64;
    while let Ok((arrived, chunk)) = rx.recv() {
        let due = arrived + delay;
        let wake = due
            .checked_sub(Duration::from_nanos(late_ns as u64))
            .unwrap_or(due);
        let now = Instant::now();
        if wake > now {
            std::thread::sleep(wake - now);
            let late = Instant::now().saturating_duration_since(wake).as_nanos() as f64;
            late_ns = (0.9 * late_ns + 0.1 * late).min(delay.as_nanos() as f64 / 2.0);
        }
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
