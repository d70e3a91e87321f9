//! Frames between nodes over QUIC: one frame per unidirectional stream.
//!
//! A [`QuicTransport`] is a handle on a QUIC endpoint that both listens and connects.
//! Frames are opaque bytes here (see [`wire`](crate::wire) for their meaning), at most
//! [`MAX_FRAME_BYTES`] each.
//!
//! # Connections
//! Each node sends over its own outbound connections and receives over inbound ones, so
//! two nodes talking both ways hold two connections. An outbound connection per peer is
//! opened on the first frame, cached, and reopened on demand. After a failed attempt, or a
//! connection the peer refused, attempts back off from 100 ms to 2 s; frames arriving
//! meanwhile are dropped and counted. The client
//! connects with the TLS server name set to the peer's node id, then sends its own node id
//! on the connection's first stream (the *hello*). The server accepts frames only after the
//! hello: in Mutual mode, only if the client's verified certificate names that id.
//!
//! # Bounds
//! - [`QuicTransport::send`] never waits: each peer has a queue of [`PEER_QUEUE`] frames
//!   served by its own task, so a slow or dead peer delays only its own frames; a full queue
//!   drops the frame (counted in [`TransportStats::queue_drops`]).
//! - A peer may hold [`MAX_STREAMS`] streams open at once; a stream longer than
//!   [`MAX_FRAME_BYTES`] is stopped and counted, the connection stays up.
//! - Connect (with hello) is bounded by [`CONNECT_TIMEOUT`], a frame's write and read by
//!   [`FRAME_TIMEOUT`]; keep-alive every [`KEEP_ALIVE`], a silent connection dies after
//!   [`IDLE_TIMEOUT`].
//! - At most [`MAX_INBOUND_CONNECTIONS`] inbound connections at once; more are refused.
//!   Each buffers at most 4 frames' worth of stream data (QUIC flow control), so inbound
//!   buffering is bounded by about 4 MiB per connection.
//!
//! # Delivery
//! At most once, in order per connection: frames from one peer are read one stream after
//! the other. [`TransportStats::frames_sent`] counts frames handed to QUIC, not frames
//! acknowledged; frames queued or in flight when a connection breaks or the transport shuts
//! down are lost. Gossip must tolerate loss (deltas are idempotent and anti-entropy repairs).
//!
//! The inbound channel has room for [`INBOUND_QUEUE`] frames; when the application falls
//! behind, reading stops and QUIC flow control pushes back on the senders.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use quinn::{
    Connection, ConnectionError, Endpoint, IdleTimeout, Incoming, ReadToEndError, TransportConfig,
    VarInt,
};
use rustls::pki_types::CertificateDer;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, timeout};

use crate::cluster::tls::{self, MAX_NODE_ID_LEN, NodeTls, Security, TlsError};
use crate::wire::MAX_FRAME_BYTES;

/// Frames waiting per peer before new ones are dropped.
pub const PEER_QUEUE: usize = 1024;
/// Frames received but not yet taken by the application before reading pauses.
pub const INBOUND_QUEUE: usize = 1024;
/// Unidirectional streams a peer may hold open on one connection.
pub const MAX_STREAMS: u32 = 16;
/// Inbound connections (handshaking or established) held at once.
pub const MAX_INBOUND_CONNECTIONS: usize = 256;
/// Bound on connecting to a peer, TLS handshake and hello included.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on writing or reading one frame (and on receiving the hello).
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Keep-alive interval: far below [`IDLE_TIMEOUT`] so a quiet but live peer keeps its
/// connection, and a dead one is noticed within seconds.
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);
/// A connection that hears nothing for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The UDP receive buffer asked for the transport's socket. A round's frames from every peer
/// arrive at once, and a large one (a full frame, a key storm) is many datagrams: at the
/// kernel's usual 208 KiB, a burst overflowed it (on 3 release nodes on loopback, 4,034
/// datagrams dropped in one `benches/key_storm.sh` run), and a dropped datagram's frame
/// waits for QUIC's loss recovery to resend it (not measured here; at 4 MiB no drops were
/// seen). Linux grants at most `net.core.rmem_max`; the buffer the node got is logged at
/// start.
pub const RECV_BUFFER: usize = 8 << 20;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// At most one warning of a kind per interval; the others are counted and reported with it.
const WARN_INTERVAL: Duration = Duration::from_secs(5);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// QUIC application error codes (connection close and stream stop).
const CODE_SHUTDOWN: u32 = 0;
const CODE_REFUSED: u32 = 1;
const CODE_TOO_LARGE: u32 = 2;
const CODE_TIMEOUT: u32 = 3;

/// A frame from a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inbound {
    /// The sender's node id: authenticated by its certificate in Mutual mode; in Ephemeral
    /// mode only what the peer announced (anyone can claim any id).
    pub peer: String,
    /// The sender's address (its endpoint, which is also where it listens).
    pub addr: SocketAddr,
    /// The frame, at most [`MAX_FRAME_BYTES`].
    pub frame: Bytes,
}

/// Counters since [`QuicTransport::bind`]; a snapshot from [`QuicTransport::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames written to a stream and finished (not necessarily acknowledged).
    pub frames_sent: u64,
    /// Frames received whole and passed to the inbound channel.
    pub frames_received: u64,
    /// Bytes of the frames counted in `frames_sent` (payload only, not QUIC overhead).
    pub bytes_sent: u64,
    /// Bytes of the frames counted in `frames_received`.
    pub bytes_received: u64,
    /// Queued frames not sent: no connection (connect failed or backing off) or the write
    /// failed.
    pub send_failures: u64,
    /// Frames dropped because the peer's queue was full.
    pub queue_drops: u64,
    /// Outbound connection attempts that failed (unreachable, timed out, TLS refused).
    pub connect_failures: u64,
    /// Inbound connections refused: TLS handshake failed (no certificate, foreign CA, wrong
    /// protocol), bad or missing hello, a certificate not naming the announced id, or too
    /// many connections.
    pub handshakes_refused: u64,
    /// Frames over [`MAX_FRAME_BYTES`], refused on send or on receipt.
    pub oversized_refused: u64,
    /// Connections open now, inbound and outbound.
    pub connections_open: u64,
}

/// Why a transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The TLS files are unusable (the error names the file) or the node id is not valid.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The TLS configuration cannot be used for QUIC (it lacks TLS 1.3's AES-128-GCM suite).
    #[error("TLS configuration unusable for QUIC: {0}")]
    Crypto(#[from] NoInitialCipherSuite),
    /// The UDP socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: io::Error,
    },
}

/// A handle on the QUIC transport; clones share it. When the last handle is dropped the
/// endpoint closes (peers see the connections close at once) and its tasks end.
#[derive(Clone, Debug)]
pub struct QuicTransport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Everything the background tasks need; they never hold `Inner`, so dropping the last
    /// handle runs `Inner::drop`.
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    secure: bool,
    /// The queue of each peer's sending task, by node id. A task ends when its sender is
    /// dropped, closing its connection.
    peers: Mutex<HashMap<String, mpsc::Sender<Outbound>>>,
    /// Where `send` (a plain function) spawns peer tasks.
    runtime: tokio::runtime::Handle,
}

#[derive(Debug)]
struct Shared {
    endpoint: Endpoint,
    node_id: String,
    secure: bool,
    client: quinn::ClientConfig,
    stats: Counters,
    refused_log: LogGate,
    send_log: LogGate,
}

#[derive(Debug)]
struct Outbound {
    addr: SocketAddr,
    frame: Bytes,
}

#[derive(Debug, Default)]
struct Counters {
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    send_failures: AtomicU64,
    queue_drops: AtomicU64,
    connect_failures: AtomicU64,
    handshakes_refused: AtomicU64,
    oversized_refused: AtomicU64,
    connections_open: AtomicU64,
}

/// A peer task's connection.
struct Outgoing<'a> {
    conn: Connection,
    opened: Instant,
    _open: OpenGuard<'a>,
}

/// When a peer task may next try to connect.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    until: Option<Instant>,
}

/// Holds one count in `connections_open` while alive.
struct OpenGuard<'a>(&'a AtomicU64);

/// Rate-limits one kind of warning.
#[derive(Debug, Default)]
struct LogGate {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

/// Why a frame could not be sent.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("cannot connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection: {0}")]
    Connection(#[from] ConnectionError),
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
    #[error("stream already closed")]
    Closed(#[from] quinn::ClosedStream),
    #[error("timed out")]
    Timeout,
    #[error("no connection (backing off after a failed attempt)")]
    BackingOff,
}

/// Why an inbound connection was refused.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("handshake failed: {0}")]
    Handshake(ConnectionError),
    #[error("no hello: {0}")]
    NoHello(String),
    #[error("hello is not a node id: {0}")]
    BadHello(String),
    #[error("certificate does not name node id {0:?}")]
    WrongName(String),
    #[error("too many inbound connections")]
    Busy,
}

/// A UDP socket bound to `listen` with a receive buffer of up to [`RECV_BUFFER`] (what the
/// kernel allows): logged, with a hint when it is less than asked.
fn udp_socket(listen: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(listen),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    if let Err(e) = socket.set_recv_buffer_size(RECV_BUFFER) {
        tracing::warn!(%e, "could not size the cluster socket's receive buffer");
    }
    socket.bind(&listen.into())?;
    // Linux reports twice what it grants (its bookkeeping overhead included).
    let granted = socket.recv_buffer_size().unwrap_or(0) / 2;
    if granted < RECV_BUFFER {
        tracing::info!(
            granted_kib = granted >> 10,
            asked_kib = RECV_BUFFER >> 10,
            "the cluster socket's receive buffer is smaller than asked (raise the host's \
             net.core.rmem_max to {} to keep a burst of frames from being dropped)",
            RECV_BUFFER
        );
    } else {
        tracing::debug!(granted_kib = granted >> 10, "cluster socket receive buffer");
    }
    Ok(socket.into())
}

impl QuicTransport {
    /// Loads `security` for `node_id` (see [`Security::load`]), binds a UDP socket on
    /// `listen`, and starts accepting. Returns the handle and the channel of inbound frames.
    pub async fn bind(
        listen: SocketAddr,
        node_id: &str,
        security: &Security,
    ) -> Result<(QuicTransport, mpsc::Receiver<Inbound>), TransportError> {
        let tls = security.load(node_id)?;
        Self::bind_tls(listen, node_id, &tls)
    }

    /// Binds with a prepared TLS configuration, announcing `node_id` to peers. Not public:
    /// `node_id` is not checked against the certificate (tests use that to lie).
    fn bind_tls(
        listen: SocketAddr,
        node_id: &str,
        tls: &NodeTls,
    ) -> Result<(QuicTransport, mpsc::Receiver<Inbound>), TransportError> {
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(
            tls.server_config(),
        )?));
        server.transport_config(Arc::new(transport_config(MAX_STREAMS)));
        let mut client =
            quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls.client_config())?));
        // Peers never open streams towards the connecting side.
        client.transport_config(Arc::new(transport_config(0)));

        let bind_error = |source| TransportError::Bind {
            addr: listen,
            source,
        };
        let socket = udp_socket(listen).map_err(bind_error)?;
        let runtime = quinn::default_runtime()
            .ok_or_else(|| bind_error(io::Error::other("no async runtime found")))?;
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server),
            socket,
            runtime,
        )
        .map_err(bind_error)?;
        let local_addr = endpoint.local_addr().map_err(bind_error)?;
        let shared = Arc::new(Shared {
            endpoint,
            node_id: node_id.to_owned(),
            secure: tls.secure(),
            client,
            stats: Counters::default(),
            refused_log: LogGate::default(),
            send_log: LogGate::default(),
        });
        let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
        let runtime = tokio::runtime::Handle::current();
        runtime.spawn(accept_loop(Arc::clone(&shared), inbound_tx));
        tracing::info!(
            addr = %local_addr,
            node_id,
            secure = tls.secure(),
            "cluster transport listening"
        );
        let inner = Inner {
            shared,
            local_addr,
            secure: tls.secure(),
            peers: Mutex::new(HashMap::new()),
            runtime,
        };
        Ok((
            QuicTransport {
                inner: Arc::new(inner),
            },
            inbound_rx,
        ))
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Whether peers are authenticated (Mutual TLS) or not (Ephemeral).
    pub fn secure(&self) -> bool {
        self.inner.secure
    }

    /// Queues `frame` for node `peer`, listening at `addr`, and returns at once.
    ///
    /// A frame over [`MAX_FRAME_BYTES`] is refused; a frame for a peer whose queue is full
    /// is dropped (both counted). The connection to `peer` is reused, and replaced when
    /// `addr` changes.
    pub fn send(&self, peer: &str, addr: SocketAddr, frame: Bytes) {
        if frame.len() > MAX_FRAME_BYTES {
            let stats = &self.inner.shared.stats;
            stats.oversized_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                peer,
                len = frame.len(),
                "refused to send an oversized frame"
            );
            return;
        }
        self.enqueue(peer, addr, frame);
    }

    /// Stops sending to `peer`: its queue is dropped and its connection closed. A later
    /// [`send`](Self::send) starts afresh.
    pub fn forget(&self, peer: &str) {
        self.inner.peers().remove(peer);
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TransportStats {
        let s = &self.inner.shared.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportStats {
            frames_sent: get(&s.frames_sent),
            frames_received: get(&s.frames_received),
            bytes_sent: get(&s.bytes_sent),
            bytes_received: get(&s.bytes_received),
            send_failures: get(&s.send_failures),
            queue_drops: get(&s.queue_drops),
            connect_failures: get(&s.connect_failures),
            handshakes_refused: get(&s.handshakes_refused),
            oversized_refused: get(&s.oversized_refused),
            connections_open: get(&s.connections_open),
        }
    }

    /// Closes every connection and the endpoint, waiting up to a second for peers to be
    /// told. Frames still queued are lost. Other clones of the handle stop working too.
    pub async fn shutdown(self) {
        self.inner.peers().clear();
        let endpoint = &self.inner.shared.endpoint;
        endpoint.close(VarInt::from_u32(CODE_SHUTDOWN), b"shutdown");
        let _ = timeout(SHUTDOWN_GRACE, endpoint.wait_idle()).await;
    }

    /// Queues a frame without the size check (tests use it to send oversized frames).
    fn enqueue(&self, peer: &str, addr: SocketAddr, frame: Bytes) {
        let mut peers = self.inner.peers();
        let item = Outbound { addr, frame };
        let item = match peers.get(peer) {
            None => item,
            Some(tx) => match tx.try_send(item) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    let stats = &self.inner.shared.stats;
                    stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // The task is gone (it only ends when its queue is dropped, or by a
                // panic): start another.
                Err(mpsc::error::TrySendError::Closed(item)) => item,
            },
        };
        let (tx, rx) = mpsc::channel(PEER_QUEUE);
        // A fresh queue has room.
        let _ = tx.try_send(item);
        self.inner.runtime.spawn(peer_task(
            Arc::clone(&self.inner.shared),
            peer.to_owned(),
            rx,
        ));
        peers.insert(peer.to_owned(), tx);
    }
}

impl Inner {
    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<Outbound>>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared
            .endpoint
            .close(VarInt::from_u32(CODE_SHUTDOWN), b"shutdown");
    }
}

impl<'a> OpenGuard<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        OpenGuard(gauge)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: BACKOFF_MIN,
            until: None,
        }
    }

    fn waiting(&self) -> bool {
        self.until.is_some_and(|t| Instant::now() < t)
    }

    /// An attempt failed: wait, longer each time.
    fn failed(&mut self) {
        self.until = Some(Instant::now() + self.next);
        self.next = (self.next * 2).min(BACKOFF_MAX);
    }

    /// Connected; but the peer may still refuse us, so the delay is kept until `reset`.
    fn connected(&mut self) {
        self.until = None;
    }

    /// The peer has proven it accepts us.
    fn reset(&mut self) {
        *self = Backoff::new();
    }
}

impl LogGate {
    /// `Some(n)` if a warning may be logged now, `n` being how many were suppressed since
    /// the last one; `None` (and one more suppressed) otherwise.
    fn check(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|t| now.duration_since(t) < WARN_INTERVAL) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Settings for one side of a connection; `streams` is how many the peer may open.
fn transport_config(streams: u32) -> TransportConfig {
    let mut config = TransportConfig::default();
    config
        .max_concurrent_uni_streams(VarInt::from_u32(streams))
        .max_concurrent_bidi_streams(VarInt::from_u32(0))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(IdleTimeout::from(VarInt::from_u32(
            IDLE_TIMEOUT.as_millis().try_into().unwrap_or(u32::MAX),
        ))))
        .datagram_receive_buffer_size(None);
    // One whole frame may be in flight per stream; a few frames per connection.
    let frame = u32::try_from(MAX_FRAME_BYTES).unwrap_or(u32::MAX);
    config
        .stream_receive_window(VarInt::from_u32(frame))
        .receive_window(VarInt::from_u32(frame.saturating_mul(4)));
    config
}

/// Serves one peer's queue: connects on demand, one stream per frame.
async fn peer_task(shared: Arc<Shared>, peer: String, mut queue: mpsc::Receiver<Outbound>) {
    let stats = &shared.stats;
    let mut conn: Option<Outgoing<'_>> = None;
    let mut backoff = Backoff::new();
    loop {
        let item = match &conn {
            Some(out) => tokio::select! {
                item = queue.recv() => Ok(item),
                reason = out.conn.closed() => Err(reason),
            },
            None => Ok(queue.recv().await),
        };
        let item = match item {
            Ok(item) => item,
            Err(reason) => {
                conn = None;
                if refused_us(&reason) {
                    // Refused after the handshake (wrong name, foreign CA): reconnecting at
                    // once would be refused again, once per frame.
                    stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                    if let Some(suppressed) = shared.send_log.check() {
                        tracing::warn!(peer, error = %reason, suppressed, "peer refused this node");
                    }
                    backoff.failed();
                } else {
                    // Closed by the peer, the idle timeout or our endpoint: reconnect on
                    // demand.
                    backoff.reset();
                }
                continue;
            }
        };
        let Some(Outbound { addr, frame }) = item else {
            break;
        };
        if let Some(out) = conn.take_if(|out| out.conn.remote_address() != addr) {
            out.conn
                .close(VarInt::from_u32(CODE_SHUTDOWN), b"peer moved");
        }
        // A cached connection may have died unnoticed: on failure retry once, afresh.
        let mut result = Err(SendError::Timeout);
        for _ in 0..2 {
            if conn.is_none() {
                if backoff.waiting() {
                    result = Err(SendError::BackingOff);
                    break;
                }
                match connect(&shared, &peer, addr).await {
                    Ok(c) => {
                        conn = Some(Outgoing {
                            conn: c,
                            opened: Instant::now(),
                            _open: OpenGuard::new(&stats.connections_open),
                        });
                        backoff.connected();
                    }
                    Err(e) => {
                        stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                        if let Some(suppressed) = shared.send_log.check() {
                            tracing::warn!(peer, %addr, error = %e, suppressed, "cannot connect to peer");
                        }
                        backoff.failed();
                        result = Err(e);
                        break;
                    }
                }
            }
            let Some(out) = &conn else { break };
            result = match timeout(FRAME_TIMEOUT, write_frame(&out.conn, frame.clone())).await {
                Ok(r) => r,
                Err(_) => Err(SendError::Timeout),
            };
            if result.is_ok() {
                if out.opened.elapsed() > BACKOFF_MAX {
                    backoff.reset();
                }
                break;
            }
            if let Some(out) = conn.take() {
                out.conn
                    .close(VarInt::from_u32(CODE_TIMEOUT), b"write failed");
            }
        }
        match result {
            Ok(()) => {
                stats
                    .bytes_sent
                    .fetch_add(frame.len() as u64, Ordering::Relaxed);
                stats.frames_sent.fetch_add(1, Ordering::Relaxed)
            }
            Err(e) => {
                if let Some(suppressed) = shared.send_log.check() {
                    tracing::warn!(peer, %addr, error = %e, suppressed, "frame not sent");
                }
                stats.send_failures.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
    if let Some(out) = conn {
        out.conn
            .close(VarInt::from_u32(CODE_SHUTDOWN), b"forgotten");
    }
}

/// Whether the peer closed a connection because it refused this node (as opposed to
/// shutting down or timing out): our hello or certificate, or a TLS alert.
fn refused_us(reason: &ConnectionError) -> bool {
    match reason {
        ConnectionError::ApplicationClosed(close) => {
            close.error_code == VarInt::from_u32(CODE_REFUSED)
        }
        ConnectionError::ConnectionClosed(_) | ConnectionError::TransportError(_) => true,
        _ => false,
    }
}

/// Connects to `peer` at `addr` and sends the hello, within [`CONNECT_TIMEOUT`].
async fn connect(shared: &Shared, peer: &str, addr: SocketAddr) -> Result<Connection, SendError> {
    let connecting = shared
        .endpoint
        .connect_with(shared.client.clone(), addr, peer)?;
    let handshake = async {
        let conn = connecting.await?;
        let mut hello = conn.open_uni().await?;
        hello.write_all(shared.node_id.as_bytes()).await?;
        hello.finish()?;
        Ok::<_, SendError>(conn)
    };
    timeout(CONNECT_TIMEOUT, handshake)
        .await
        .map_err(|_| SendError::Timeout)?
}

async fn write_frame(conn: &Connection, frame: Bytes) -> Result<(), SendError> {
    let mut stream = conn.open_uni().await?;
    stream.write_chunk(frame).await?;
    stream.finish()?;
    Ok(())
}

async fn accept_loop(shared: Arc<Shared>, inbound: mpsc::Sender<Inbound>) {
    let slots = Arc::new(Semaphore::new(MAX_INBOUND_CONNECTIONS));
    while let Some(incoming) = shared.endpoint.accept().await {
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            let addr = incoming.remote_address();
            incoming.refuse();
            refused(&shared, addr, &Refusal::Busy);
            continue;
        };
        let shared = Arc::clone(&shared);
        let inbound = inbound.clone();
        tokio::spawn(async move {
            serve_connection(&shared, incoming, inbound).await;
            drop(slot);
        });
    }
}

fn refused(shared: &Shared, addr: SocketAddr, why: &Refusal) {
    shared
        .stats
        .handshakes_refused
        .fetch_add(1, Ordering::Relaxed);
    if let Some(suppressed) = shared.refused_log.check() {
        tracing::warn!(peer = %addr, reason = %why, suppressed, "refused a cluster connection");
    }
}

/// Handshake, hello, then frames until the connection ends.
async fn serve_connection(shared: &Shared, incoming: Incoming, inbound: mpsc::Sender<Inbound>) {
    let addr = incoming.remote_address();
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(e) => return refused(shared, addr, &Refusal::Handshake(e)),
    };
    let peer = match timeout(FRAME_TIMEOUT, identify(shared, &conn)).await {
        Ok(Ok(peer)) => peer,
        Ok(Err(why)) => {
            conn.close(VarInt::from_u32(CODE_REFUSED), b"refused");
            return refused(shared, addr, &why);
        }
        Err(_) => {
            conn.close(VarInt::from_u32(CODE_REFUSED), b"no hello");
            return refused(shared, addr, &Refusal::NoHello("timed out".into()));
        }
    };
    let stats = &shared.stats;
    let _open = OpenGuard::new(&stats.connections_open);
    tracing::debug!(peer, %addr, "peer connected");
    while let Ok(mut stream) = conn.accept_uni().await {
        match timeout(FRAME_TIMEOUT, stream.read_to_end(MAX_FRAME_BYTES)).await {
            Ok(Ok(frame)) => {
                stats.frames_received.fetch_add(1, Ordering::Relaxed);
                stats
                    .bytes_received
                    .fetch_add(frame.len() as u64, Ordering::Relaxed);
                let frame = Inbound {
                    peer: peer.clone(),
                    addr,
                    frame: Bytes::from(frame),
                };
                // The application has stopped listening: keep draining the peer.
                let _ = inbound.send(frame).await;
            }
            Ok(Err(ReadToEndError::TooLong)) => {
                stats.oversized_refused.fetch_add(1, Ordering::Relaxed);
                let _ = stream.stop(VarInt::from_u32(CODE_TOO_LARGE));
                if let Some(suppressed) = shared.refused_log.check() {
                    tracing::warn!(peer, %addr, suppressed, "refused an oversized frame");
                }
            }
            // The stream was reset, or the connection is ending (the next accept says so).
            Ok(Err(ReadToEndError::Read(_))) => {}
            Err(_) => {
                let _ = stream.stop(VarInt::from_u32(CODE_TIMEOUT));
            }
        }
    }
}

/// Reads the hello and checks it against the peer's certificate (Mutual mode).
async fn identify(shared: &Shared, conn: &Connection) -> Result<String, Refusal> {
    let mut hello = conn
        .accept_uni()
        .await
        .map_err(|e| Refusal::NoHello(e.to_string()))?;
    let bytes = hello
        .read_to_end(MAX_NODE_ID_LEN)
        .await
        .map_err(|e| Refusal::NoHello(e.to_string()))?;
    let id = String::from_utf8(bytes).map_err(|_| Refusal::BadHello("not UTF-8".into()))?;
    tls::check_node_id(&id).map_err(|e| Refusal::BadHello(e.to_string()))?;
    if shared.secure {
        let named = conn
            .peer_identity()
            .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
            .and_then(|chain| chain.first().map(|leaf| tls::cert_names(leaf, &id)))
            .unwrap_or(false);
        if !named {
            return Err(Refusal::WrongName(id));
        }
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tls::tests::{TempDir, nodes, unchecked_mutual};
    use crate::cluster::tls::write_certs;
    use std::future::Future;

    /// Every test's bound.
    const LIMIT: Duration = Duration::from_secs(30);
    /// How long to wait for a frame that must arrive.
    const ARRIVES: Duration = Duration::from_secs(5);
    /// How long to watch for a frame that must not arrive.
    const QUIET: Duration = Duration::from_millis(700);

    fn any_port() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// The transport's socket gets the receive buffer it asks for, or as much as the kernel
    /// allows (`net.core.rmem_max`): not the default, which a burst of frames overflowed.
    #[test]
    fn the_socket_asks_for_a_large_receive_buffer() {
        let socket = udp_socket(any_port()).unwrap();
        let granted = socket2::SockRef::from(&socket).recv_buffer_size().unwrap() / 2;
        let max = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(0);
        assert!(
            granted >= RECV_BUFFER.min(max),
            "granted {granted} B, asked {RECV_BUFFER} B, rmem_max {max} B"
        );
    }

    async fn bounded<F: Future<Output = ()>>(test: F) {
        timeout(LIMIT, test).await.expect("test finished in time");
    }

    async fn next(rx: &mut mpsc::Receiver<Inbound>) -> Inbound {
        timeout(ARRIVES, rx.recv())
            .await
            .expect("a frame arrives in time")
            .expect("the transport is running")
    }

    async fn nothing(rx: &mut mpsc::Receiver<Inbound>) {
        if let Ok(Some(frame)) = timeout(QUIET, rx.recv()).await {
            panic!("unexpected frame {frame:?}");
        }
    }

    /// Polls `stat` of `t` until it is at least `min`.
    async fn wait_stat(t: &QuicTransport, min: u64, stat: fn(&TransportStats) -> u64) {
        let deadline = Instant::now() + ARRIVES;
        while stat(&t.stats()) < min {
            assert!(Instant::now() < deadline, "stats stayed at {:?}", t.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn cluster(
        dir: &TempDir,
        names: &[&str],
    ) -> Vec<(QuicTransport, mpsc::Receiver<Inbound>)> {
        write_certs(dir.path(), &nodes(names), false).unwrap();
        let mut out = Vec::new();
        for name in names {
            out.push(
                QuicTransport::bind(any_port(), name, &dir.mutual(name))
                    .await
                    .unwrap(),
            );
        }
        out
    }

    #[tokio::test]
    async fn mutual_tls_peers_exchange_frames_both_ways_in_order() {
        bounded(async {
            let dir = TempDir::new("quic-mutual");
            let mut bound = cluster(&dir, &["node-a", "node-b"]).await;
            let (b, mut b_rx) = bound.pop().unwrap();
            let (a, mut a_rx) = bound.pop().unwrap();
            assert!(a.secure() && b.secure());

            a.send("node-b", b.local_addr(), Bytes::from_static(b"to b"));
            let got = next(&mut b_rx).await;
            assert_eq!(got.peer, "node-a");
            assert_eq!(got.addr, a.local_addr());
            assert_eq!(got.frame, Bytes::from_static(b"to b"));

            b.send("node-a", a.local_addr(), Bytes::from_static(b"to a"));
            let got = next(&mut a_rx).await;
            assert_eq!(got.peer, "node-b");
            assert_eq!(got.frame, Bytes::from_static(b"to a"));

            for i in 0..100u32 {
                a.send(
                    "node-b",
                    b.local_addr(),
                    Bytes::from(i.to_be_bytes().to_vec()),
                );
            }
            for i in 0..100u32 {
                assert_eq!(
                    next(&mut b_rx).await.frame,
                    Bytes::from(i.to_be_bytes().to_vec())
                );
            }
            let (sa, sb) = (a.stats(), b.stats());
            assert_eq!(sa.frames_sent, 101);
            assert_eq!(sb.frames_received, 101);
            assert_eq!(sa.send_failures + sa.queue_drops + sb.handshakes_refused, 0);
            // a's outbound + a's inbound from b.
            assert_eq!(sa.connections_open, 2);
            a.shutdown().await;
            b.shutdown().await;
        })
        .await;
    }

    #[tokio::test]
    async fn a_peer_with_a_foreign_ca_cert_is_refused() {
        bounded(async {
            let dir = TempDir::new("quic-ours");
            let foreign = TempDir::new("quic-foreign");
            let mut bound = cluster(&dir, &["node-a"]).await;
            let (a, mut a_rx) = bound.pop().unwrap();
            write_certs(foreign.path(), &nodes(&["node-c"]), false).unwrap();
            // Trusts our CA (so it accepts a's certificate) but holds a foreign one.
            let tls = unchecked_mutual(
                &dir.path().join("ca.pem"),
                &foreign.path().join("node-c.pem"),
                &foreign.path().join("node-c-key.pem"),
            );
            let (c, _c_rx) = QuicTransport::bind_tls(any_port(), "node-c", &tls).unwrap();
            c.send("node-a", a.local_addr(), Bytes::from_static(b"let me in"));
            wait_stat(&a, 1, |s| s.handshakes_refused).await;
            nothing(&mut a_rx).await;
            assert_eq!(a.stats().frames_received, 0);

            // A whole foreign cluster is refused by both sides.
            let (d, _d_rx) = QuicTransport::bind(any_port(), "node-c", &foreign.mutual("node-c"))
                .await
                .unwrap();
            d.send("node-a", a.local_addr(), Bytes::from_static(b"let me in"));
            wait_stat(&d, 1, |s| s.connect_failures).await;
            nothing(&mut a_rx).await;
            a.shutdown().await;
        })
        .await;
    }

    #[tokio::test]
    async fn a_peer_claiming_another_nodes_id_is_refused() {
        bounded(async {
            let dir = TempDir::new("quic-impostor");
            let mut bound = cluster(&dir, &["node-a", "node-b", "node-c"]).await;
            drop(bound.pop());
            drop(bound.pop());
            let (a, mut a_rx) = bound.pop().unwrap();
            // node-c's own, valid certificate, announcing itself as node-b.
            let tls = dir.mutual("node-c").load("node-c").unwrap();
            let (impostor, _rx) = QuicTransport::bind_tls(any_port(), "node-b", &tls).unwrap();
            impostor.send("node-a", a.local_addr(), Bytes::from_static(b"i am b"));
            wait_stat(&a, 1, |s| s.handshakes_refused).await;
            nothing(&mut a_rx).await;

            // Refused, the impostor backs off instead of reconnecting for every frame.
            for _ in 0..100 {
                impostor.send("node-a", a.local_addr(), Bytes::from_static(b"i am b"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let refusals = a.stats().handshakes_refused;
            assert!((2..=10).contains(&refusals), "{refusals} refusals in ~1 s");
            assert!(
                impostor.stats().send_failures > 50,
                "{:?}",
                impostor.stats()
            );
            nothing(&mut a_rx).await;

            // Binding with a certificate for another id fails up front.
            let err = QuicTransport::bind(any_port(), "node-b", &dir.mutual("node-c"))
                .await
                .unwrap_err();
            assert!(
                matches!(err, TransportError::Tls(TlsError::WrongName { .. })),
                "{err}"
            );
        })
        .await;
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_and_the_transport_keeps_working() {
        bounded(async {
            let dir = TempDir::new("quic-oversized");
            let mut bound = cluster(&dir, &["node-a", "node-b"]).await;
            let (b, mut b_rx) = bound.pop().unwrap();
            let (a, _a_rx) = bound.pop().unwrap();
            let huge = Bytes::from(vec![7u8; MAX_FRAME_BYTES + 1]);

            // Refused by the sender...
            a.send("node-b", b.local_addr(), huge.clone());
            assert_eq!(a.stats().oversized_refused, 1);
            // ...and, from a sender that skips the check, by the receiver.
            a.enqueue("node-b", b.local_addr(), huge);
            wait_stat(&b, 1, |s| s.oversized_refused).await;

            let largest = Bytes::from(vec![1u8; MAX_FRAME_BYTES]);
            a.send("node-b", b.local_addr(), largest.clone());
            a.send("node-b", b.local_addr(), Bytes::from_static(b"after"));
            assert_eq!(next(&mut b_rx).await.frame, largest);
            assert_eq!(next(&mut b_rx).await.frame, Bytes::from_static(b"after"));
            assert_eq!(b.stats().frames_received, 2);
            assert_eq!(b.stats().handshakes_refused, 0);
        })
        .await;
    }

    #[tokio::test]
    async fn ephemeral_peers_exchange_frames_but_are_not_secure() {
        bounded(async {
            let (a, mut a_rx) = QuicTransport::bind(any_port(), "node-a", &Security::Ephemeral)
                .await
                .unwrap();
            let (b, mut b_rx) = QuicTransport::bind(any_port(), "node-b", &Security::Ephemeral)
                .await
                .unwrap();
            assert!(!a.secure() && !b.secure());
            a.send("node-b", b.local_addr(), Bytes::from_static(b"hi"));
            b.send("node-a", a.local_addr(), Bytes::from_static(b"hello"));
            let got = next(&mut b_rx).await;
            assert_eq!((got.peer.as_str(), &got.frame[..]), ("node-a", &b"hi"[..]));
            let got = next(&mut a_rx).await;
            assert_eq!(
                (got.peer.as_str(), &got.frame[..]),
                ("node-b", &b"hello"[..])
            );
        })
        .await;
    }

    #[tokio::test]
    async fn ephemeral_and_mutual_nodes_refuse_each_other() {
        bounded(async {
            let dir = TempDir::new("quic-mixed");
            let mut bound = cluster(&dir, &["node-a"]).await;
            let (a, mut a_rx) = bound.pop().unwrap();
            let (e, mut e_rx) = QuicTransport::bind(any_port(), "node-e", &Security::Ephemeral)
                .await
                .unwrap();
            e.send("node-a", a.local_addr(), Bytes::from_static(b"no cert"));
            wait_stat(&a, 1, |s| s.handshakes_refused).await;
            a.send("node-e", e.local_addr(), Bytes::from_static(b"self-signed"));
            wait_stat(&a, 1, |s| s.connect_failures).await;
            nothing(&mut a_rx).await;
            nothing(&mut e_rx).await;
        })
        .await;
    }

    #[tokio::test]
    async fn a_peer_that_restarts_on_the_same_port_gets_frames_again() {
        bounded(async {
            let dir = TempDir::new("quic-restart");
            let mut bound = cluster(&dir, &["node-a", "node-b"]).await;
            let (b, mut b_rx) = bound.pop().unwrap();
            let (a, _a_rx) = bound.pop().unwrap();
            let addr = b.local_addr();
            a.send("node-b", addr, Bytes::from_static(b"first"));
            assert_eq!(next(&mut b_rx).await.frame, Bytes::from_static(b"first"));

            drop(b);
            drop(b_rx);
            let deadline = Instant::now() + ARRIVES;
            let (_b, mut b_rx) = loop {
                match QuicTransport::bind(addr, "node-b", &dir.mutual("node-b")).await {
                    Ok(bound) => break bound,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "cannot rebind: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            };
            let got = loop {
                a.send("node-b", addr, Bytes::from_static(b"again"));
                if let Ok(Some(got)) = timeout(Duration::from_millis(100), b_rx.recv()).await {
                    break got;
                }
            };
            assert_eq!(
                (got.peer.as_str(), &got.frame[..]),
                ("node-a", &b"again"[..])
            );
        })
        .await;
    }

    #[tokio::test]
    async fn a_dead_peer_does_not_stall_sends_to_others() {
        bounded(async {
            let dir = TempDir::new("quic-dead");
            let mut bound = cluster(&dir, &["node-a", "node-b"]).await;
            let (b, mut b_rx) = bound.pop().unwrap();
            let (a, _a_rx) = bound.pop().unwrap();
            // A socket that swallows every packet: connecting to it times out.
            let sink = std::net::UdpSocket::bind(any_port()).unwrap();
            let dead = sink.local_addr().unwrap();

            let started = Instant::now();
            for _ in 0..PEER_QUEUE + 100 {
                a.send("node-z", dead, Bytes::from_static(b"void"));
            }
            a.send("node-b", b.local_addr(), Bytes::from_static(b"still here"));
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "send blocked"
            );
            assert_eq!(
                next(&mut b_rx).await.frame,
                Bytes::from_static(b"still here")
            );
            assert!(a.stats().queue_drops >= 99, "{:?}", a.stats());

            a.forget("node-z");
            drop(sink);
        })
        .await;
    }
}
