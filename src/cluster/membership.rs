//! Cluster membership: which nodes exist, which are alive, and what each one publishes about
//! itself, as a thin layer over [chitchat] gossip.
//!
//! A [`Membership`] runs one chitchat node (UDP, or any [`Transport`] in tests), publishes
//! this node's [`NodeMeta`] as chitchat key-values and keeps a sorted list of [`Member`]s up
//! to date, readable at any time ([`Membership::members`]) or as a
//! [`tokio::sync::watch`] ([`Membership::watch`]).
//!
//! # What chitchat gives
//! - Scuttlebutt anti-entropy gossip: every round (the `gossip_interval`) each node exchanges
//!   a digest with up to three live peers, a random dead node now and then, and a seed, so
//!   every node eventually holds every other node's key-values.
//! - A phi-accrual failure detector on heartbeats. Heartbeats travel in digests, so they
//!   also arrive *indirectly*: a node whose link to us is cut but which still talks to a third
//!   node stays alive in our view. Only a node nobody reachable hears from goes dead.
//! - Restarts as new incarnations: a node is identified by (node id, generation, gossip
//!   address), and a restarted node with a larger generation is a new chitchat node.
//! - Seeds as `host:port` strings. DNS names are resolved at start and then re-resolved about
//!   every 60 s (chitchat's fixed `DNS_POLLING_DURATION`), so a new seed address behind a name
//!   is picked up within about a minute.
//! - Dead nodes are forgotten after `dead_node_grace_period`.
//!
//! # What chitchat does not give
//! - **No authentication and no encryption.** Gossip is plain UDP. The cluster id is a string
//!   sent in clear and checked for equality, not a secret: anyone who can send datagrams to
//!   the gossip port can join, claim any node id and publish any key-values (a bogus QUIC
//!   address, a bogus rules hash). Keep the gossip port on a private network or behind a
//!   firewall; trust between nodes must come from the QUIC layer's mutual TLS, not from here.
//! - No agreement: each node's view is its own and views differ for a few rounds after every
//!   change. There is no "the cluster is N nodes" fact to read.
//! - No leave message. [`Membership::leave`] publishes a marker key before stopping so peers
//!   drop the node within a round or two; a crashed or [`shutdown`](Membership::shutdown)
//!   node is found dead by the failure detector only (see the timings below).
//! - Size limits: one gossip datagram is at most 65,507 B and every round's handshake carries
//!   a digest of every node, which bounds the cluster to some hundreds of nodes.
//! - Key-values are strings and a node writes only its own.
//!
//! # What this module adds
//! - [`NodeMeta`] (QUIC address, version, rules hash) as three keys; a peer whose keys are
//!   missing or do not parse has `meta: None` instead of an error.
//! - Superseded generations: when the same node id appears with several generations, only
//!   the newest can be alive; older ones are reported dead at once (without waiting for the
//!   failure detector) until chitchat forgets them.
//! - `last_seen`: how long ago this node last saw the member's heartbeat grow, tracked here on
//!   `tokio::time::Instant` because chitchat keeps that instant private.
//! - Rules-hash mismatches ([`Membership::mismatched_rules`]), logged with `tracing::warn!`
//!   once per change of (peer, its hash, our hash).
//! - The failure detector's `initial_interval` set to the gossip interval: with chitchat's
//!   default (5 s) a node killed right after start takes ~17 s to be found dead.
//!
//! # Timings
//! Measured at the default 100 ms gossip interval and phi threshold 8 (`tests/membership.rs`,
//! run with `--nocapture`). On `ChannelTransport` with paused tokio time, in virtual time
//! quantised by 10 ms polls: three nodes started from one seed all see each other with their
//! meta after 0.2–0.3 s; a node that stops without leaving is reported dead by the others
//! after 0.4–0.5 s (0.6 s if it stops right after joining); an isolated node and the rest
//! see each other dead after 0.4–0.5 s and alive again 0.2 s after the links return; a node
//! that [`leave`](Membership::leave)s is reported dead after 0.1 s. On real UDP loopback:
//! three nodes converge in ~0.3 s and a stopped node is dead after ~0.5 s. Real networks add
//! their latency and loss to every figure; virtual time has neither.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::UdpTransport;
use chitchat::{
    Chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, NodeState,
    ProtocolVersion, spawn_chitchat,
};
use tokio::sync::{Mutex, Notify, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

pub use chitchat::transport::{ChannelTransport, Transport};

/// Default time between gossip rounds.
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
/// Default phi threshold: a peer is dead once no heartbeat came for about this many mean
/// heartbeat intervals (chitchat's phi is elapsed time over the mean interval).
pub const DEFAULT_PHI_THRESHOLD: f64 = 8.0;
/// Default time a dead node is remembered (and reported dead) before chitchat forgets it.
pub const DEFAULT_DEAD_NODE_GRACE_PERIOD: Duration = Duration::from_secs(60 * 60);
/// Default time a deleted key's tombstone is kept. A peer that was away for longer than this
/// gets a full reset of that node's state instead of a delta.
pub const DEFAULT_MARKED_FOR_DELETION_GRACE_PERIOD: Duration = Duration::from_secs(60 * 60);

/// Heartbeat intervals longer than this are not sampled by the failure detector
/// (chitchat's default), so one long pause does not teach it to wait that long again.
const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// How many heartbeat intervals the failure detector remembers (chitchat's default).
const SAMPLING_WINDOW_SIZE: usize = 1_000;
/// How many gossip rounds [`Membership::leave`] waits for the leaving marker to spread.
const LEAVE_ROUNDS: u32 = 2;

const KEY_QUIC_ADDR: &str = "gossamer.quic_addr";
const KEY_VERSION: &str = "gossamer.version";
const KEY_RULES_HASH: &str = "gossamer.rules_hash";
/// The numbers of the node's global rules' limits (JSON: rule name to `[limit, burst]` per
/// limit), which peers take the smaller of; absent on nodes that publish none.
const KEY_LIMITS: &str = "gossamer.limits";
/// Present on a node that is leaving on purpose: `through N` when its round frames from
/// round N on carry every admission it made; over the aggregation tree, `carried N G ID`
/// when member ID (generation G) reports its admissions from round N on; any other value
/// when it cannot say.
const KEY_LEAVING: &str = "gossamer.leaving";

/// How to run this node's membership.
#[derive(Debug, Clone, PartialEq)]
pub struct MembershipConfig {
    /// This node's stable id, unique in the cluster. It survives restarts; `generation` is
    /// what changes.
    pub node_id: String,
    /// This incarnation of the node: must grow on every restart (the start time in
    /// milliseconds works). Peers treat a larger generation of the same `node_id` as the
    /// node's new life and the older ones as dead.
    pub generation: u64,
    /// The UDP address the gossip socket binds. Port 0 is refused: chitchat advertises a fixed
    /// address and cannot learn the port it was given.
    pub listen: SocketAddr,
    /// The address peers use to reach `listen` (differs from it behind NAT or when `listen` is
    /// `0.0.0.0`). Must be a concrete address and port.
    pub advertise: SocketAddr,
    /// Seeds as `host:port`. DNS names are allowed and re-resolved about every 60 s. A node
    /// may list itself; an empty list starts a cluster of one that others can join.
    pub seeds: Vec<String>,
    /// Gossip between different cluster ids is refused. A label, not a secret.
    pub cluster_id: String,
    /// Time between gossip rounds; also the failure detector's prior heartbeat interval.
    pub gossip_interval: Duration,
    /// Failure detector threshold: a peer is dead after roughly `phi_threshold` mean heartbeat
    /// intervals without one. Lower finds deaths sooner and flaps more under load.
    pub phi_threshold: f64,
    /// How long a dead node is still reported (as dead) before it is forgotten.
    pub dead_node_grace_period: Duration,
    /// How long deleted keys' tombstones are kept (see
    /// [`DEFAULT_MARKED_FOR_DELETION_GRACE_PERIOD`]).
    pub marked_for_deletion_grace_period: Duration,
}

/// What a node publishes about itself, as chitchat key-values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeMeta {
    /// Where the node accepts QUIC connections from peers.
    pub quic_addr: SocketAddr,
    /// The gossamer version the node runs.
    pub version: String,
    /// A hash of the node's loaded rules: nodes with different hashes enforce different
    /// limits, and their global counts should not be mixed.
    pub rules_hash: String,
    /// The numbers of the node's global rules' limits, as the cluster layer writes them
    /// (empty: none published, as by a node of an earlier version).
    pub limits: String,
}

/// One node incarnation as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The node's stable id.
    pub node_id: String,
    /// The incarnation; a restarted node shows up again with a larger one.
    pub generation: u64,
    /// The gossip address the node advertises.
    pub gossip_addr: SocketAddr,
    /// What the node publishes, or `None` until its keys have arrived, or if they are missing
    /// or do not parse.
    pub meta: Option<NodeMeta>,
    /// Alive in this node's view: the failure detector hears its heartbeat, it is not leaving,
    /// and no newer generation of the same node id is known. This node itself is always
    /// alive.
    pub alive: bool,
    /// The member announced that it is leaving on purpose ([`Membership::leave`]): it has
    /// published its last counts and admits nothing more.
    pub leaving: bool,
    /// With `leaving`: the round from which its frames carry every admission it made (the
    /// value of its leaving marker), if it said.
    pub published_through: Option<u64>,
    /// With `leaving`, over the aggregation tree: the member that took its admissions, if it
    /// said ([`Membership::leave_carried`]).
    pub carried: Option<Carried>,
    /// How long ago this node last saw the member's heartbeat grow (counted from when the
    /// member was first seen, and as of the last refresh, so up to one gossip interval
    /// stale). `None` before any heartbeat was heard.
    pub last_seen: Option<Duration>,
    /// Whether this is the node that produced the list.
    pub is_self: bool,
}

/// A leaving member's admissions, taken over by another member (the aggregation tree's
/// handoff): the carrier reports them as its own from round `from` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// The carrier's node id.
    pub node_id: String,
    /// The carrier's generation.
    pub generation: u64,
    /// The round from which the carrier reports them.
    pub from: u64,
}

impl Carried {
    /// The leaving marker's value: `carried FROM GENERATION NODE_ID`.
    fn marker(&self) -> String {
        format!("carried {} {} {}", self.from, self.generation, self.node_id)
    }

    /// Reads a marker written by [`Carried::marker`].
    fn parse(marker: &str) -> Option<Carried> {
        let mut fields = marker.strip_prefix("carried ")?.splitn(3, ' ');
        let from = fields.next()?.parse().ok()?;
        let generation = fields.next()?.parse().ok()?;
        let node_id = fields.next().filter(|id| !id.is_empty())?.to_owned();
        Some(Carried {
            node_id,
            generation,
            from,
        })
    }
}

/// Why membership could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// A config field cannot work.
    #[error("membership config: {field}: {reason}")]
    InvalidConfig {
        /// The [`MembershipConfig`] field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Chitchat could not start, for example because the listen address is taken.
    #[error("cannot start gossip on {listen}: {source}")]
    Start {
        /// The address that was to be bound.
        listen: SocketAddr,
        /// Chitchat's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The gossip task failed or panicked while stopping.
    #[error("gossip did not stop cleanly: {0}")]
    Stop(Box<dyn std::error::Error + Send + Sync>),
}

/// A running membership: the handle to this node's gossip. Stop it with
/// [`leave`](Membership::leave) or [`shutdown`](Membership::shutdown); dropping it also stops
/// gossip, without waiting.
pub struct Membership {
    chitchat: ChitchatHandle,
    self_id: ChitchatId,
    gossip_interval: Duration,
    /// The published list; also what [`Membership::members`] reads.
    members: watch::Receiver<Vec<Member>>,
    /// Wakes the refresher after this node changed its own keys.
    refresh: Arc<Notify>,
    stop_refresher: oneshot::Sender<()>,
    refresher: JoinHandle<()>,
}

/// Publishes keys of this node's gossip state (see [`Membership::meta_publisher`]).
#[derive(Clone)]
pub struct MetaPublisher {
    chitchat: Arc<Mutex<Chitchat>>,
    refresh: Arc<Notify>,
}

impl fmt::Debug for MetaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MetaPublisher")
    }
}

impl MetaPublisher {
    /// Sets `keys` in this node's state and wakes the refresher.
    async fn set(&self, keys: impl IntoIterator<Item = (&'static str, String)>) {
        {
            let mut chitchat = self.chitchat.lock().await;
            let state = chitchat.self_node_state();
            for (key, value) in keys {
                state.set(key, value);
            }
        }
        self.refresh.notify_one();
    }

    /// Replaces the published numbers of the global rules' limits ([`NodeMeta::limits`]).
    pub async fn limits(&self, limits: &str) {
        self.set([(KEY_LIMITS, limits.to_owned())]).await;
    }

    /// Replaces the published rules hash; peers compare it with theirs.
    pub async fn rules_hash(&self, rules_hash: &str) {
        self.set([(KEY_RULES_HASH, rules_hash.to_owned())]).await;
    }
}

/// A member's rules hash differs from ours: the refresher logs each one once.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RulesMismatch {
    peer: String,
    peer_hash: String,
    our_hash: String,
}

/// What chitchat holds about one node, copied out under its lock.
#[derive(Debug, Clone)]
struct Observed {
    id: ChitchatId,
    heartbeat: u64,
    meta: Option<NodeMeta>,
    leaving: bool,
    published_through: Option<u64>,
    carried: Option<Carried>,
    /// Alive according to chitchat's failure detector.
    detector_alive: bool,
}

/// Turns successive [`Observed`] snapshots into [`Member`] lists. Owns the state chitchat
/// does not keep for us; reads no clock and does no I/O (`now` is an argument).
#[derive(Debug)]
struct Tracker {
    self_id: ChitchatId,
    /// Last heartbeat seen per node and when it was first seen at that value.
    heartbeats: HashMap<ChitchatId, (u64, Instant)>,
    /// Per peer, the (peer hash, our hash) pair already reported as a mismatch.
    reported_mismatches: HashMap<String, (String, String)>,
    /// The newer generation of our own node id already reported, if any.
    reported_newer_self: Option<u64>,
}

impl MembershipConfig {
    /// A config with the defaults: no seeds, [`DEFAULT_GOSSIP_INTERVAL`],
    /// [`DEFAULT_PHI_THRESHOLD`], [`DEFAULT_DEAD_NODE_GRACE_PERIOD`] and
    /// [`DEFAULT_MARKED_FOR_DELETION_GRACE_PERIOD`].
    pub fn new(
        node_id: impl Into<String>,
        generation: u64,
        listen: SocketAddr,
        advertise: SocketAddr,
        cluster_id: impl Into<String>,
    ) -> Self {
        Self {
            node_id: node_id.into(),
            generation,
            listen,
            advertise,
            seeds: Vec::new(),
            cluster_id: cluster_id.into(),
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            phi_threshold: DEFAULT_PHI_THRESHOLD,
            dead_node_grace_period: DEFAULT_DEAD_NODE_GRACE_PERIOD,
            marked_for_deletion_grace_period: DEFAULT_MARKED_FOR_DELETION_GRACE_PERIOD,
        }
    }

    fn validate(&self) -> Result<(), MembershipError> {
        let invalid = |field, reason: &str| {
            Err(MembershipError::InvalidConfig {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.node_id.is_empty() {
            return invalid("node_id", "must not be empty");
        }
        if self.cluster_id.is_empty() {
            return invalid("cluster_id", "must not be empty");
        }
        if self.listen.port() == 0 {
            return invalid("listen", "port 0 cannot be advertised; choose a port");
        }
        if self.advertise.port() == 0 || self.advertise.ip().is_unspecified() {
            return invalid("advertise", "must be an address and port peers can reach");
        }
        if self.gossip_interval.is_zero() {
            return invalid("gossip_interval", "must be longer than zero");
        }
        if !(self.phi_threshold.is_finite() && self.phi_threshold > 0.0) {
            return invalid("phi_threshold", "must be a positive number");
        }
        Ok(())
    }

    fn chitchat_config(&self) -> ChitchatConfig {
        ChitchatConfig {
            chitchat_id: self.chitchat_id(),
            cluster_id: self.cluster_id.clone(),
            gossip_interval: self.gossip_interval,
            listen_addr: self.listen,
            seed_nodes: self.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: self.phi_threshold,
                sampling_window_size: SAMPLING_WINDOW_SIZE,
                max_interval: MAX_HEARTBEAT_INTERVAL,
                // The prior for the mean heartbeat interval. Chitchat's 5 s default makes a
                // node that dies young look alive for ~17 s.
                initial_interval: self.gossip_interval,
                dead_node_grace_period: self.dead_node_grace_period,
            },
            marked_for_deletion_grace_period: self.marked_for_deletion_grace_period,
            catchup_callback: None,
            extra_liveness_predicate: None,
            // Every gossamer node runs chitchat 0.13, which decodes both formats; V1
            // compresses the digest, leaving more of each datagram for deltas.
            protocol_version: ProtocolVersion::V1,
        }
    }

    fn chitchat_id(&self) -> ChitchatId {
        ChitchatId::new(self.node_id.as_str(), self.generation, self.advertise)
    }
}

impl NodeMeta {
    fn key_values(&self) -> [(&'static str, String); 4] {
        [
            (KEY_QUIC_ADDR, self.quic_addr.to_string()),
            (KEY_VERSION, self.version.clone()),
            (KEY_RULES_HASH, self.rules_hash.clone()),
            (KEY_LIMITS, self.limits.clone()),
        ]
    }

    /// Reads the meta back from a node's keys; `None` if any required one is missing or does
    /// not parse (the limits are optional).
    fn from_keys<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<NodeMeta> {
        Some(NodeMeta {
            quic_addr: get(KEY_QUIC_ADDR)?.parse().ok()?,
            version: get(KEY_VERSION)?.to_owned(),
            rules_hash: get(KEY_RULES_HASH)?.to_owned(),
            limits: get(KEY_LIMITS).unwrap_or_default().to_owned(),
        })
    }
}

impl Membership {
    /// Starts gossip on real UDP at `cfg.listen`, publishing `meta`.
    pub async fn start(
        cfg: MembershipConfig,
        meta: NodeMeta,
    ) -> Result<Membership, MembershipError> {
        Self::start_with_transport(cfg, meta, &UdpTransport).await
    }

    /// Starts gossip over `transport` (for tests: [`ChannelTransport`], which can cut links).
    pub async fn start_with_transport(
        cfg: MembershipConfig,
        meta: NodeMeta,
        transport: &dyn Transport,
    ) -> Result<Membership, MembershipError> {
        cfg.validate()?;
        let initial = meta
            .key_values()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let chitchat = spawn_chitchat(cfg.chitchat_config(), initial, transport)
            .await
            .map_err(|e| MembershipError::Start {
                listen: cfg.listen,
                source: e.into(),
            })?;
        let self_id = cfg.chitchat_id();
        let shared = chitchat.chitchat();
        let mut tracker = Tracker::new(self_id.clone());
        let first = {
            let guard = shared.lock().await;
            tracker.update(observe(&guard), Instant::now())
        };
        let (tx, members) = watch::channel(first.members);
        let refresh = Arc::new(Notify::new());
        let (stop_refresher, stop_rx) = oneshot::channel();
        let refresher = tokio::spawn(refresh_loop(
            shared,
            tracker,
            tx,
            Arc::clone(&refresh),
            stop_rx,
            cfg.gossip_interval,
        ));
        info!(
            node_id = %cfg.node_id,
            generation = cfg.generation,
            listen = %cfg.listen,
            advertise = %cfg.advertise,
            seeds = ?cfg.seeds,
            cluster_id = %cfg.cluster_id,
            "membership started"
        );
        Ok(Membership {
            chitchat,
            self_id,
            gossip_interval: cfg.gossip_interval,
            members,
            refresh,
            stop_refresher,
            refresher,
        })
    }

    /// Every member this node knows, itself and dead ones included, sorted by node id and
    /// then generation (so a restarted node's newest incarnation comes last).
    pub fn members(&self) -> Vec<Member> {
        self.members.borrow().clone()
    }

    /// The member list as a watch. It is marked changed when a member joins, goes, changes
    /// liveness or meta; `last_seen` refreshes silently every gossip interval.
    pub fn watch(&self) -> watch::Receiver<Vec<Member>> {
        self.members.clone()
    }

    /// Node ids of the alive peers whose rules hash differs from this node's. Peers whose
    /// meta has not arrived (or does not parse) are not counted.
    pub fn mismatched_rules(&self) -> Vec<String> {
        mismatched_rules(&self.members.borrow())
    }

    /// A handle that publishes this node's meta (the rules hash after a reload), usable
    /// while the membership runs and harmless after it stopped.
    pub fn meta_publisher(&self) -> MetaPublisher {
        MetaPublisher {
            chitchat: self.chitchat.chitchat(),
            refresh: self.refresh.clone(),
        }
    }

    /// Publishes new meta for this node.
    pub async fn set_meta(&self, meta: NodeMeta) {
        self.meta_publisher().set(meta.key_values()).await;
    }

    /// Leaves on purpose: publishes a leaving marker, pushes it to every known peer, waits
    /// two gossip rounds for it to spread, then stops. Peers that got the marker report this
    /// node dead at once instead of after the failure detector's ~1 s. The marker carries
    /// `published_through`, the round from which this node's frames hold all it admitted.
    pub async fn leave(self, published_through: Option<u64>) -> Result<(), MembershipError> {
        let marker = published_through.map_or_else(|| "1".to_owned(), |r| format!("through {r}"));
        self.leave_marked(&marker).await
    }

    /// Leaves on purpose as [`Membership::leave`] does, with a marker naming the member that
    /// took this node's admissions over the aggregation tree: peers that see the marker
    /// freeze nothing when this node leaves their view.
    pub async fn leave_carried(self, carried: &Carried) -> Result<(), MembershipError> {
        self.leave_marked(&carried.marker()).await
    }

    async fn leave_marked(self, marker: &str) -> Result<(), MembershipError> {
        let peers = self
            .chitchat
            .with_chitchat(|chitchat| {
                chitchat.self_node_state().set(KEY_LEAVING, marker);
                peer_addrs(chitchat)
            })
            .await;
        for peer in peers {
            // A Syn makes the peer answer with its digest, and our Ack then carries the
            // marker: one round trip instead of waiting for the random gossip fan-out.
            if self.chitchat.gossip(peer).is_err() {
                break;
            }
        }
        tokio::time::sleep(self.gossip_interval * LEAVE_ROUNDS).await;
        info!(node_id = %self.self_id.node_id, "leaving the cluster");
        self.shutdown().await
    }

    /// Stops gossip now, without telling peers: they find this node dead through the failure
    /// detector, as they would after a crash.
    pub async fn shutdown(self) -> Result<(), MembershipError> {
        let _ = self.stop_refresher.send(());
        // The refresher only ends on the signal or a panic; a panic is not ours to report.
        let _ = self.refresher.await;
        self.chitchat
            .shutdown()
            .await
            .map_err(|e| MembershipError::Stop(e.into()))
    }
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Membership")
            .field("self_id", &self.self_id)
            .field("gossip_interval", &self.gossip_interval)
            .finish_non_exhaustive()
    }
}

impl Tracker {
    fn new(self_id: ChitchatId) -> Self {
        Self {
            self_id,
            heartbeats: HashMap::new(),
            reported_mismatches: HashMap::new(),
            reported_newer_self: None,
        }
    }

    /// Builds the member list from what chitchat holds now, and says which rules mismatches
    /// and newer generations of our own id are new since the last call.
    fn update(&mut self, observed: Vec<Observed>, now: Instant) -> Update {
        let mut newest: HashMap<&str, u64> = HashMap::new();
        for o in &observed {
            let generation = newest.entry(&o.id.node_id).or_default();
            *generation = (*generation).max(o.id.generation_id);
        }
        let newer_self = newest
            .get(&*self.self_id.node_id)
            .copied()
            .filter(|&generation| generation > self.self_id.generation_id);

        let seen: HashSet<&ChitchatId> = observed.iter().map(|o| &o.id).collect();
        self.heartbeats.retain(|id, _| seen.contains(id));

        let mut members: Vec<Member> = observed
            .iter()
            .map(|o| {
                let is_self = o.id == self.self_id;
                let last_seen = if is_self {
                    Some(Duration::ZERO)
                } else {
                    self.last_seen(&o.id, o.heartbeat, now)
                };
                let superseded = newest
                    .get(&*o.id.node_id)
                    .is_some_and(|&generation| generation > o.id.generation_id);
                Member {
                    node_id: o.id.node_id.to_string(),
                    generation: o.id.generation_id,
                    gossip_addr: o.id.gossip_advertise_addr,
                    meta: o.meta.clone(),
                    alive: is_self || (o.detector_alive && !o.leaving && !superseded),
                    leaving: o.leaving,
                    published_through: o.published_through,
                    carried: o.carried.clone(),
                    last_seen,
                    is_self,
                }
            })
            .collect();
        members.sort_by(|a, b| {
            (&a.node_id, a.generation, a.gossip_addr).cmp(&(
                &b.node_id,
                b.generation,
                b.gossip_addr,
            ))
        });

        let newer_self = match newer_self {
            Some(generation) if self.reported_newer_self != Some(generation) => {
                self.reported_newer_self = Some(generation);
                Some(generation)
            }
            _ => None,
        };
        let mismatches = self.new_mismatches(&members);
        Update {
            members,
            mismatches,
            newer_self,
        }
    }

    fn last_seen(&mut self, id: &ChitchatId, heartbeat: u64, now: Instant) -> Option<Duration> {
        if heartbeat == 0 {
            // Known from someone's digest only; no heartbeat of its own heard yet.
            return None;
        }
        let entry = self
            .heartbeats
            .entry(id.clone())
            .or_insert((heartbeat, now));
        if entry.0 != heartbeat {
            *entry = (heartbeat, now);
        }
        Some(now.saturating_duration_since(entry.1))
    }

    fn new_mismatches(&mut self, members: &[Member]) -> Vec<RulesMismatch> {
        let Some(our_hash) = own_rules_hash(members) else {
            return Vec::new();
        };
        let present: HashSet<&str> = members.iter().map(|m| m.node_id.as_str()).collect();
        self.reported_mismatches
            .retain(|peer, _| present.contains(peer.as_str()));
        let mut fresh = Vec::new();
        for member in members.iter().filter(|m| m.alive && !m.is_self) {
            let Some(meta) = &member.meta else { continue };
            if meta.rules_hash == our_hash {
                self.reported_mismatches.remove(&member.node_id);
                continue;
            }
            let pair = (meta.rules_hash.clone(), our_hash.to_owned());
            if self.reported_mismatches.get(&member.node_id) != Some(&pair) {
                self.reported_mismatches
                    .insert(member.node_id.clone(), pair.clone());
                fresh.push(RulesMismatch {
                    peer: member.node_id.clone(),
                    peer_hash: pair.0,
                    our_hash: pair.1,
                });
            }
        }
        fresh
    }
}

/// One [`Tracker::update`]'s result.
#[derive(Debug)]
struct Update {
    members: Vec<Member>,
    /// Mismatches not reported before.
    mismatches: Vec<RulesMismatch>,
    /// A newer generation of our own node id, the first time it is seen.
    newer_self: Option<u64>,
}

fn own_rules_hash(members: &[Member]) -> Option<&str> {
    members
        .iter()
        .find(|m| m.is_self)
        .and_then(|m| m.meta.as_ref())
        .map(|meta| meta.rules_hash.as_str())
}

fn mismatched_rules(members: &[Member]) -> Vec<String> {
    let Some(ours) = own_rules_hash(members) else {
        return Vec::new();
    };
    let mut peers: Vec<String> = members
        .iter()
        .filter(|m| m.alive && !m.is_self)
        .filter(|m| m.meta.as_ref().is_some_and(|meta| meta.rules_hash != ours))
        .map(|m| m.node_id.clone())
        .collect();
    peers.dedup();
    peers
}

/// Copies what chitchat holds about every node it knows.
fn observe(chitchat: &Chitchat) -> Vec<Observed> {
    let live: HashSet<&ChitchatId> = chitchat.live_nodes().collect();
    chitchat
        .node_states()
        .iter()
        .map(|(id, state)| observed(id, state, live.contains(id)))
        .collect()
}

fn observed(id: &ChitchatId, state: &NodeState, detector_alive: bool) -> Observed {
    Observed {
        id: id.clone(),
        heartbeat: u64::from(state.heartbeat()),
        meta: NodeMeta::from_keys(|key| state.get(key)),
        leaving: state.get(KEY_LEAVING).is_some(),
        // "through N"; a bare "1" (or an older node's marker) names no round.
        published_through: state
            .get(KEY_LEAVING)
            .and_then(|v| v.strip_prefix("through "))
            .and_then(|r| r.parse().ok()),
        carried: state.get(KEY_LEAVING).and_then(Carried::parse),
        detector_alive,
    }
}

fn peer_addrs(chitchat: &Chitchat) -> Vec<SocketAddr> {
    let me = chitchat.self_chitchat_id();
    chitchat
        .live_nodes()
        .filter(|id| *id != me)
        .map(|id| id.gossip_advertise_addr)
        .collect()
}

/// Refreshes the member list every gossip interval (so liveness changes, which chitchat does
/// not signal, are seen), when chitchat's live set or a live node's keys change, and when
/// this node changed its own keys.
async fn refresh_loop(
    chitchat: Arc<Mutex<Chitchat>>,
    mut tracker: Tracker,
    tx: watch::Sender<Vec<Member>>,
    refresh: Arc<Notify>,
    mut stop: oneshot::Receiver<()>,
    interval: Duration,
) {
    let mut live_nodes = chitchat.lock().await.live_nodes_watcher();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
            () = refresh.notified() => {}
            changed = live_nodes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let observed = {
            let guard = chitchat.lock().await;
            observe(&guard)
        };
        let update = tracker.update(observed, Instant::now());
        for m in &update.mismatches {
            warn!(
                peer = %m.peer,
                peer_rules_hash = %m.peer_hash,
                our_rules_hash = %m.our_hash,
                "peer runs different rules"
            );
        }
        if let Some(generation) = update.newer_self {
            warn!(
                node_id = %tracker.self_id.node_id,
                our_generation = tracker.self_id.generation_id,
                newer_generation = generation,
                "a newer incarnation of this node id is in the cluster: duplicate node id, or \
                 this process should have stopped"
            );
        }
        let members = update.members;
        tx.send_if_modified(|current| {
            let changed = !same_view(current, &members);
            // Replaced even when unchanged, so `last_seen` stays fresh without waking anyone.
            *current = members;
            changed
        });
    }
}

/// Equal except for `last_seen`.
fn same_view(a: &[Member], b: &[Member]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.node_id == y.node_id
                && x.generation == y.generation
                && x.gossip_addr == y.gossip_addr
                && x.meta == y.meta
                && x.alive == y.alive
                && x.is_self == y.is_self
        })
}

#[cfg(test)]
mod tests;
