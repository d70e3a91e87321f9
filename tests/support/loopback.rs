//! Nodes of the real binary on loopback: free ports, and a guard that kills every process
//! and removes the test's directory however the test ends.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The processes a test started, and its temporary directory.
pub struct Nodes(pub Vec<Child>, pub PathBuf);

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// A UDP port on loopback that was free a moment ago.
pub fn free_udp() -> u16 {
    UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|s| s.local_addr())
        .expect("a free UDP port")
        .port()
}

/// A TCP port on loopback that was free a moment ago.
pub fn free_tcp() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|s| s.local_addr())
        .expect("a free TCP port")
        .port()
}

/// Starts `bin serve` as `node` in `dir` with `config`, answering on `http`, gossiping on
/// loopback port `gossip` with `seed` as its seed, its output discarded.
pub fn serve(
    bin: &str,
    dir: &Path,
    config: &Path,
    node: &str,
    http: SocketAddr,
    gossip: u16,
    seed: u16,
) -> Child {
    Command::new(bin)
        .current_dir(dir)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(["--node-id", node])
        .args(["--http", &http.to_string()])
        .args(["--gossip", &format!("127.0.0.1:{gossip}")])
        .args(["--seeds", &format!("127.0.0.1:{seed}")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gossamer serve starts")
}
