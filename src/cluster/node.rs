//! The cluster shell around the exchange ([`Global`], the full mesh, or the aggregation
//! [`Tree`]): membership (chitchat over UDP), frames over QUIC, and the round clock.
//! Everything it decides is decided by the exchange; this module only moves bytes and time:
//!
//! - a *round task* sleeps until [`Global::next_tick`] ([`Tree::next_tick`]), runs its
//!   `tick` and sends what it returns;
//! - an *inbound task* decodes each frame the transport delivers (already authenticated) and
//!   hands it to [`Global::receive`] ([`Tree::receive`]);
//! - a *membership task* turns chitchat's member list into [`Global::set_members`]
//!   ([`Tree::set_members`]: the live members, this node among them) and keeps the QUIC
//!   address of every member.
//!
//! All of it (chitchat, QUIC, these tasks, the rounds' blocking threads) runs on a runtime of
//! its own, one worker thread whose priority `round_nice` lowers (a nice value, or
//! `SCHED_IDLE`): on a core it shares with the HTTP workers, a check waiting for the CPU goes
//! before the decoding of a peer's frame.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::Exchange;
use super::global::{Global, MemberInfo, Output, Reject, RuleNumbers};
use super::membership::{Carried, Member, Membership, MembershipConfig, MetaPublisher, NodeMeta};
use super::quic::{Inbound, QuicTransport};
use super::tls::Security;
use super::tree::Tree;
use crate::clock::Clock;
use crate::config::{Config, RoundNice};
use crate::counter::Actor;
use crate::limiter::Nanos;
use crate::wire;

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The QUIC transport could not start (address in use, bad TLS files).
    #[error("cluster transport: {0}")]
    Transport(#[from] super::quic::TransportError),
    /// Membership could not start.
    #[error("cluster membership: {0}")]
    Membership(#[from] super::membership::MembershipError),
    /// `--advertise` does not resolve to one address.
    #[error("advertise address {0:?} does not resolve")]
    Advertise(String),
    /// The cluster's own runtime could not start (no threads left).
    #[error("cluster runtime: {0}")]
    Runtime(std::io::Error),
}

/// The cluster's tokio runtime. Dropped without waiting (a runtime must not be dropped
/// blocking from inside another one, as the server's is).
#[derive(Debug)]
struct ClusterRuntime(Option<tokio::runtime::Runtime>);

impl ClusterRuntime {
    /// One worker thread: the cluster's work is a few frames per peer per round; the rounds
    /// themselves run on its blocking threads. Every thread it starts takes the lowered
    /// priority (a failure is reported by the round task, which tries again).
    fn start(nice: RoundNice) -> std::io::Result<ClusterRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gossamer-cluster")
            .on_thread_start(move || {
                let _ = lower_priority(nice);
            })
            .enable_all()
            .build()?;
        Ok(ClusterRuntime(Some(runtime)))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("present until dropped").handle()
    }
}

impl Drop for ClusterRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Counts for metrics.
#[derive(Debug, Default)]
struct Counts {
    rejected: BTreeMap<&'static str, u64>,
    oversized: u64,
    /// Ticks run (boundaries and instants) and the time they took.
    ticks: u64,
    tick_seconds: f64,
    /// Messages handed to the transport, and their encoded bytes, by kind
    /// ([`Message::kind`]): one per peer sent to.
    sent: BTreeMap<&'static str, (u64, u64)>,
}

/// A running cluster node.
#[derive(Debug)]
pub struct Cluster {
    exchange: Exchange,
    /// Taken on shutdown (leaving consumes it).
    membership: Mutex<Option<Membership>>,
    /// A snapshot of the members, refreshed by the membership task (for `/v1/cluster`).
    view: tokio::sync::watch::Receiver<Vec<Member>>,
    transport: QuicTransport,
    addrs: Arc<Mutex<HashMap<String, SocketAddr>>>,
    counts: Arc<Mutex<Counts>>,
    tasks: Vec<JoinHandle<()>>,
    meta: MetaPublisher,
    /// For the tree's handoff on shutdown.
    sender: Sender,
    clock: Arc<dyn Clock>,
    /// Last, so it is dropped after everything that runs on it.
    _runtime: ClusterRuntime,
}

impl Cluster {
    /// Starts membership, the QUIC transport and the round task for `exchange`, acting as
    /// `me`, on a runtime of their own.
    pub async fn start(
        config: &Config,
        exchange: Exchange,
        me: Actor,
        clock: Arc<dyn Clock>,
        rules_hash: String,
    ) -> Result<Cluster, ClusterError> {
        let runtime =
            ClusterRuntime::start(config.cluster.round_nice).map_err(ClusterError::Runtime)?;
        let started = runtime
            .handle()
            .spawn(Self::start_here(
                config.clone(),
                exchange,
                me,
                clock,
                rules_hash,
            ))
            .await;
        match started {
            Ok(Ok(parts)) => Ok(parts.into_cluster(runtime)),
            Ok(Err(e)) => Err(e),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// [`Cluster::start`] on the current runtime.
    async fn start_here(
        config: Config,
        exchange: Exchange,
        me: Actor,
        clock: Arc<dyn Clock>,
        rules_hash: String,
    ) -> Result<Parts, ClusterError> {
        let c = &config.cluster;
        let Some(gossip) = c.gossip else {
            unreachable!("a cluster starts only with a gossip address")
        };
        let quic = c.quic_addr().unwrap_or(gossip);
        let node_id = me.node.clone();
        let security = match &c.tls {
            Some(files) => Security::Mutual {
                ca: files.ca.clone(),
                cert: files.cert.clone(),
                key: files.key.clone(),
            },
            None => Security::Ephemeral,
        };
        let (transport, inbound) = QuicTransport::bind(quic, &node_id, &security).await?;
        if !transport.secure() {
            warn!(
                "cluster traffic is not authenticated: no [cluster.tls] configured, so peers use ephemeral self-signed certificates (run `gossamer certs` to make a cluster CA)"
            );
        }
        let advertise = match &c.advertise {
            Some(a) => resolve(a)
                .await
                .ok_or_else(|| ClusterError::Advertise(a.clone()))?,
            None => gossip,
        };
        let advertised_quic = SocketAddr::new(advertise.ip(), transport.local_addr().port());
        let membership = Membership::start(
            MembershipConfig {
                node_id: node_id.clone(),
                generation: me.generation,
                listen: gossip,
                advertise,
                seeds: c.seeds.clone(),
                cluster_id: c.cluster_id.clone(),
                gossip_interval: c.gossip_interval,
                phi_threshold: c.phi_threshold,
                dead_node_grace_period: c.dead_node_grace,
                marked_for_deletion_grace_period: c.dead_node_grace,
            },
            NodeMeta {
                quic_addr: advertised_quic,
                version: env!("CARGO_PKG_VERSION").to_owned(),
                rules_hash,
                limits: published_limits(&exchange),
            },
        )
        .await?;
        info!(%gossip, quic = %transport.local_addr(), %advertise, seeds = ?c.seeds, secure = transport.secure(), "cluster started");
        let own = [gossip.to_string(), advertise.to_string()];
        let expects_peers = c.seeds.iter().any(|s| !own.contains(s));
        if let Exchange::Mesh(global) = &exchange {
            global.set_joined(!expects_peers);
        }
        let addrs = Arc::new(Mutex::new(HashMap::new()));
        let counts = Arc::new(Mutex::new(Counts::default()));
        let sender = Sender {
            transport: transport.clone(),
            addrs: addrs.clone(),
            counts: counts.clone(),
            authenticated: Arc::new(Mutex::new(HashSet::new())),
            newly_authenticated: Arc::new(tokio::sync::Notify::new()),
            frame_arrived: Arc::new(tokio::sync::Notify::new()),
        };
        let mut tasks = vec![
            tokio::spawn(receive(
                exchange.clone(),
                me.clone(),
                clock.clone(),
                inbound,
                sender.clone(),
            )),
            tokio::spawn(members(
                exchange.clone(),
                me,
                clock.clone(),
                membership.watch(),
                sender.clone(),
                if expects_peers {
                    c.ready_timeout
                } else {
                    Duration::ZERO
                },
            )),
        ];
        match &exchange {
            Exchange::Mesh(global) => {
                tasks.push(tokio::spawn(rounds(
                    global.clone(),
                    clock.clone(),
                    sender.clone(),
                    c.round_nice,
                )));
                tasks.push(tokio::spawn(join(
                    global.clone(),
                    expects_peers,
                    c.ready_timeout,
                    c.gossip_interval,
                )));
            }
            Exchange::Tree(tree, _) => {
                tasks.push(tokio::spawn(tree_rounds(
                    tree.clone(),
                    clock.clone(),
                    sender.clone(),
                    c.round_nice,
                )));
            }
        }
        Ok(Parts {
            exchange,
            membership,
            transport,
            addrs,
            counts,
            tasks,
            sender,
            clock,
        })
    }

    /// Publishes a new hash of the rules (after a reload), which peers compare with theirs,
    /// and the numbers of the global rules' limits, which peers take the smaller of.
    pub async fn publish_rules_hash(&self, rules_hash: &str) {
        self.meta.rules_hash(rules_hash).await;
        self.meta.limits(&published_limits(&self.exchange)).await;
    }

    /// Whether `/readyz` may say 200: the node has found a peer and pulled the counts of
    /// every live one (from then on global rules take leases), and had a round with every
    /// peer's frame in (so its bucket keys start full: [`Global::ready`]); or it was given no
    /// seed but itself; or the ready timeout passed (then it serves with what it has, and
    /// logs a warning).
    ///
    /// Over the tree: once a round's totals included every member of this node's view (a
    /// node alone in its view completes its own rounds).
    pub fn ready(&self) -> bool {
        match &self.exchange {
            Exchange::Mesh(global) => global.ready(),
            Exchange::Tree(_, keys) => keys.complete_rounds() > 0,
        }
    }

    /// Whether peers authenticate each other (mutual TLS).
    pub fn secure(&self) -> bool {
        self.transport.secure()
    }

    /// Every member this node knows, itself included.
    pub fn members(&self) -> Vec<Member> {
        match &*self.membership.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(m) => m.members(),
            None => self.view.borrow().clone(),
        }
    }

    /// Peers the round protocol suspects (frames missing).
    /// (None over the tree: a member missing a deadline makes its round short, and
    /// membership alone takes it out of the view.)
    pub fn suspected(&self) -> Vec<String> {
        match &self.exchange {
            Exchange::Mesh(global) => global.suspected(),
            Exchange::Tree(..) => Vec::new(),
        }
    }

    /// Each peer's estimated clock offset from this node's, in ns (see
    /// [`Global::clock_offsets`]).
    /// (None over the tree, which does not estimate them.)
    pub fn clock_offsets(&self) -> Vec<(String, i64)> {
        match &self.exchange {
            Exchange::Mesh(global) => global.clock_offsets(),
            Exchange::Tree(..) => Vec::new(),
        }
    }

    /// Peers whose rules differ from ours.
    pub fn mismatched_rules(&self) -> Vec<String> {
        self.membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Membership::mismatched_rules)
            .unwrap_or_default()
    }

    /// Over the mesh, the numbers of the global rules' limits in force here: the smaller of
    /// this node's and those of every member in the allotment ([`Global::relimit`]).
    pub fn limits_in_force(&self) -> Option<RuleNumbers> {
        match &self.exchange {
            Exchange::Mesh(global) => Some(global.numbers_in_force()),
            Exchange::Tree(..) => None,
        }
    }

    /// Prometheus text for the cluster's counters.
    pub fn render_metrics(&self, out: &mut String) {
        let t = self.transport.stats();
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let members = self.members();
        let alive = members.iter().filter(|m| m.alive).count() as u64;
        family(
            out,
            "gossamer_cluster_members",
            "gauge",
            "Members known, by state.",
            &[
                ("state=\"alive\"", alive),
                ("state=\"dead\"", members.len() as u64 - alive),
            ],
        );
        let (reports_dropped, own_dots_refused) = match &self.exchange {
            Exchange::Mesh(global) => {
                mesh_metrics(global, out);
                let stats = global.stats();
                (stats.reports_dropped, stats.own_dots_refused)
            }
            Exchange::Tree(tree, _) => {
                tree_metrics(&super::lock(tree), out);
                (0, 0)
            }
        };
        let rejected = |reason: &str| counts.rejected.get(reason).copied().unwrap_or(0);
        let reasons = [
            Reject::Impostor,
            Reject::NotMember,
            Reject::StaleGeneration,
            Reject::RoundOutOfRange,
            Reject::Unexpected,
            Reject::BadParts,
        ];
        let labels: Vec<(String, u64)> = reasons
            .iter()
            .map(|r| (r.name(), rejected(r.name())))
            .chain([
                ("malformed", rejected("malformed")),
                ("bad_report", reports_dropped),
                ("own_actor", own_dots_refused),
            ])
            .map(|(reason, n)| (format!("reason=\"{reason}\""), n))
            .collect();
        family(
            out,
            "gossamer_cluster_frames_rejected_total",
            "counter",
            "Frames or reports from peers dropped, by reason.",
            &labels,
        );
        family(
            out,
            "gossamer_cluster_frames_too_large_total",
            "counter",
            "Outgoing messages over the frame limit, not sent.",
            &[("", counts.oversized)],
        );
        family(
            out,
            "gossamer_cluster_ticks_total",
            "counter",
            "Round boundaries and instants run.",
            &[("", counts.ticks)],
        );
        family(
            out,
            "gossamer_cluster_tick_seconds_total",
            "counter",
            "Time spent running them (all keys visited).",
            &[("", format!("{:.6}", counts.tick_seconds))],
        );
        family(
            out,
            "gossamer_cluster_transport",
            "counter",
            "Transport counters.",
            &[
                ("what=\"frames_sent\"", t.frames_sent),
                ("what=\"frames_received\"", t.frames_received),
                ("what=\"bytes_sent\"", t.bytes_sent),
                ("what=\"bytes_received\"", t.bytes_received),
                ("what=\"handshakes_refused\"", t.handshakes_refused),
                ("what=\"send_failures\"", t.send_failures),
                ("what=\"queue_drops\"", t.queue_drops),
            ],
        );
        let sent = |i: usize| -> Vec<(String, u64)> {
            wire::Message::KINDS
                .iter()
                .map(|kind| {
                    let (messages, bytes) = counts.sent.get(kind).copied().unwrap_or_default();
                    (format!("kind=\"{kind}\""), [messages, bytes][i])
                })
                .collect()
        };
        family(
            out,
            "gossamer_cluster_sent_messages_total",
            "counter",
            "Messages handed to QUIC for peers, by kind (one per peer sent to).",
            &sent(0),
        );
        family(
            out,
            "gossamer_cluster_sent_bytes_total",
            "counter",
            "Their encoded bytes, by kind (QUIC's own overhead not included).",
            &sent(1),
        );
    }

    /// Publishes this node's last admissions, leaves the cluster (peers see the leave at
    /// once) and stops every task. Call it once the node admits nothing more (after the
    /// HTTP drain): it waits for the next round's frame to go out, so every admission is
    /// published, then leaves. (Leaving first and draining after would admit against a
    /// lease no round publishes: counts lost, seen in `tests/chaos.rs`.)
    ///
    /// Over the tree, it hands its admissions in the open windows to a member that reports
    /// them as its own ([`Tree::leave`]), and leaves with a marker naming it: the members
    /// left freeze nothing. If no member takes them in time, it leaves without, and the
    /// members left freeze the windows it may hold room in, as after a crash.
    pub async fn shutdown(&self) {
        let (published_through, carried) = match &self.exchange {
            Exchange::Mesh(global) => (Self::publish_last(global).await, None),
            Exchange::Tree(tree, _) => (None, self.hand_off(tree).await),
        };
        for t in &self.tasks {
            t.abort();
        }
        let membership = self
            .membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(m) = membership {
            let left = match &carried {
                Some(c) => m.leave_carried(c).await,
                None => m.leave(published_through).await,
            };
            if let Err(e) = left {
                debug!(error = %e, "leaving the cluster");
            }
        }
        self.transport.clone().shutdown().await;
        self.addrs.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The tree's handoff: gives back all this node holds, sends its admissions to its
    /// carrier, and waits (up to eight rounds) until the carrier answered and the round from
    /// which it reports them has begun, so that members that see this node go see it go in
    /// a round the carrier reports. The round task resends the handoff meanwhile.
    async fn hand_off(&self, tree: &Arc<Mutex<Tree>>) -> Option<Carried> {
        let (out, round) = {
            let mut t = super::lock(tree);
            (t.leave(self.clock.now()), t.params().round)
        };
        if out.is_empty() {
            info!("nobody to hand this node's admissions to (alone in the tree's view)");
            return None;
        }
        self.sender.send(out);
        let carried = async {
            loop {
                let carried = super::lock(tree).carried();
                if let Some((carrier, from)) = carried
                    && self.clock.now() >= from.saturating_mul(round)
                {
                    return Carried {
                        node_id: carrier.node,
                        generation: carrier.generation,
                        from,
                    };
                }
                self.clock.sleep(round / 10).await;
            }
        };
        match tokio::time::timeout(Duration::from_nanos(round) * 8, carried).await {
            Ok(c) => {
                info!(carrier = %c.node_id, from_round = c.from, "handed this node's admissions over: the members left freeze nothing");
                Some(c)
            }
            Err(_) => {
                warn!(
                    "no member took this node's admissions in time: the members left freeze the open windows"
                );
                None
            }
        }
    }

    /// Waits (up to three rounds) for the next round's frame to go out: the round whose
    /// frame holds every admission, if it went.
    async fn publish_last(global: &Global) -> Option<u64> {
        let wanted = global.next_publication();
        let round = Duration::from_nanos(global.params().round);
        let published = async {
            while !global.has_published(wanted) {
                tokio::time::sleep(round / 10).await;
            }
        };
        // Peers that applied frame `wanted` know every count of this node and charge it no
        // retirement; the others charge it (design §5).
        match tokio::time::timeout(round * 3, published).await {
            Ok(()) => Some(wanted),
            Err(_) => {
                debug!("no round ran before leaving: the last admissions may be unpublished");
                None
            }
        }
    }
}

/// The full mesh's metrics.
fn mesh_metrics(global: &Global, out: &mut String) {
    let stats = global.stats();
    let visits: Vec<(String, u64)> = stats
        .rule_visits
        .iter()
        .map(|(rule, n)| (format!("rule=\"{}\"", label_value(rule)), *n))
        .collect();
    let (held, participants) = global.held_members();
    let (differ, silent) = global.members_on_other_numbers();
    family(
        out,
        "gossamer_cluster_members_on_other_limits",
        "gauge",
        "Members in the allotment (under hold, dead ones too) whose global rules' numbers \
         differ from this node's (a reload that has \
         not reached every node: the smaller numbers are in force meanwhile), or that \
         publish none (an earlier version).",
        &[
            ("published=\"differ\"", differ.len() as u64),
            ("published=\"none\"", silent as u64),
        ],
    );
    family(
        out,
        "gossamer_cluster_limit_changes_total",
        "counter",
        "Times the numbers in force of a global limit changed on this node: its own reload, \
         or a member's published numbers.",
        &[("", stats.numbers_changes)],
    );
    family(
        out,
        "gossamer_cluster_suspected_peers",
        "gauge",
        "Participants this node has missed frames from (design.md §5): under `hold`, and \
         under `split` until membership declares them dead, their share stays set aside.",
        &[("", held as u64)],
    );
    family(
        out,
        "gossamer_cluster_held_share",
        "gauge",
        "Fraction of every global limit set aside for participants this node cannot \
         reach: each is charged an even share of a window opened since it went away (its \
         last allotment in the window open then) and keeps its last bucket share. Under \
         `hold` after a node died this stays until dead_node_grace passes (design.md §5).",
        &[(
            "",
            format!("{:.6}", held as f64 / participants.max(1) as f64),
        )],
    );
    family(
        out,
        "gossamer_cluster_rounds_total",
        "counter",
        "Round instants, by whether this node could lease.",
        &[
            ("state=\"consistent\"", stats.consistent_rounds),
            ("state=\"degraded\"", stats.degraded_rounds),
        ],
    );
    family(
        out,
        "gossamer_cluster_full_frames_total",
        "counter",
        "Round frames that named every key with something to say (and visited every key), by \
         cause: view_changed (a member joined, left or restarted; a suspicion sends none), asked \
         (a peer missed more of this node's frames than the repeats cover). Many asked mean \
         frames late or lost for long stretches (design.md §3.3.4).",
        &[
            ("cause=\"view_changed\"", stats.full_frames.view_changed),
            ("cause=\"asked\"", stats.full_frames.asked),
        ],
    );
    family(
        out,
        "gossamer_cluster_full_instants_total",
        "counter",
        "Round instants that visited every key, because the allocation's shared inputs moved \
         (the participants, who is reachable, a side regrown).",
        &[("", stats.full_instants)],
    );
    family(
        out,
        "gossamer_cluster_retired_ghosts_total",
        "counter",
        "Keys charged the ghost of a restarted peer's previous incarnation (its \
         possible admissions after its last frame, counted so they are not handed out again).",
        &[("", stats.retired_ghosts)],
    );
    family(
        out,
        "gossamer_cluster_key_visits_total",
        "counter",
        "Keys visited by round boundaries and instants, per global rule: those with activity \
         since they were last found dormant, and every key at a full boundary or a view \
         change. The round work a rule's keys cost.",
        &visits,
    );
    family(
        out,
        "gossamer_cluster_final_leaves_total",
        "counter",
        "Peers that left gracefully after this node had their final frame: their counts \
         were complete, so no retirement was charged.",
        &[("", stats.final_leaves)],
    );
    family(
        out,
        "gossamer_cluster_dots_dropped_total",
        "counter",
        "Peer counts ignored, by reason: slot_out_of_range is a slot more than one ahead \
         of this node's clock or older than the lookback (clock skew, design.md §4).",
        &[("reason=\"slot_out_of_range\"", stats.dots_out_of_range)],
    );
    family(
        out,
        "gossamer_cluster_peer_clock_offset_seconds",
        "gauge",
        "Each peer's clock less this node's, estimated from when its round frames arrive \
         (design.md §4; understates a peer ahead by the least one-way delay).",
        &per_peer(global.clock_offsets(), |offset| {
            format!("{:.6}", offset as f64 / 1e9)
        }),
    );
    family(
        out,
        "gossamer_cluster_peer_dots_out_of_range_total",
        "counter",
        "Counts from each peer ignored because their slot was out of this node's range (a \
         clock off by about a window, design.md §4); peers with none are not listed.",
        &per_peer(global.out_of_range(), |n| n),
    );
}

/// The aggregation tree's metrics.
fn tree_metrics(tree: &Tree, out: &mut String) {
    let stats = tree.stats();
    family(
        out,
        "gossamer_cluster_tree_members",
        "gauge",
        "Members of this node's view (this node included; 0 until it joined): a round's \
         totals must include every one of them for it to grant.",
        &[("", tree.members().len() as u64)],
    );
    family(
        out,
        "gossamer_cluster_tree_rounds_total",
        "counter",
        "Rounds whose totals reached this node, by whether they included every member of its \
         view (complete: it granted) or not (short: a subtree missed its deadline).",
        &[
            ("state=\"complete\"", stats.complete_rounds),
            ("state=\"short\"", stats.short_rounds),
        ],
    );
    family(
        out,
        "gossamer_cluster_tree_units_total",
        "counter",
        "Units of room granted to this node by complete rounds, and given back at boundaries \
         (held above its target).",
        &[
            ("what=\"granted\"", stats.granted),
            ("what=\"released\"", stats.released),
        ],
    );
    family(
        out,
        "gossamer_cluster_tree_messages_ignored_total",
        "counter",
        "Tree messages for a round this node was not in, or from a node that is not its \
         parent or child in it (late, another view).",
        &[("", stats.ignored)],
    );
    family(
        out,
        "gossamer_cluster_tree_gaps_total",
        "counter",
        "Ticks that found three or more boundaries due at once (the node was stopped): each \
         froze the open slots.",
        &[("", stats.gaps)],
    );
    family(
        out,
        "gossamer_cluster_tree_sums_too_large_total",
        "counter",
        "Rounds whose sums needed more than 64 parts, not sent (the round is short).",
        &[("", stats.oversized)],
    );
    family(
        out,
        "gossamer_cluster_tree_handoffs_total",
        "counter",
        "Handoffs of members that left on purpose: taken (this node reports a leaving \
         member's admissions as its own), and members that left this node's view with theirs \
         carried (nothing frozen).",
        &[
            ("what=\"taken\"", stats.taken),
            ("what=\"left_carried\"", stats.left_carried),
        ],
    );
    family(
        out,
        "gossamer_cluster_tree_start_frozen",
        "gauge",
        "1 while this node's start freeze holds (no member seen yet that applied every round \
         since before the open windows began: it grants itself nothing there), else 0.",
        &[("", u64::from(tree.start_frozen()))],
    );
}

/// A started cluster, before it holds its runtime.
struct Parts {
    exchange: Exchange,
    membership: Membership,
    transport: QuicTransport,
    addrs: Arc<Mutex<HashMap<String, SocketAddr>>>,
    counts: Arc<Mutex<Counts>>,
    tasks: Vec<JoinHandle<()>>,
    sender: Sender,
    clock: Arc<dyn Clock>,
}

impl Parts {
    fn into_cluster(self, runtime: ClusterRuntime) -> Cluster {
        Cluster {
            exchange: self.exchange,
            view: self.membership.watch(),
            meta: self.membership.meta_publisher(),
            membership: Mutex::new(Some(self.membership)),
            transport: self.transport,
            addrs: self.addrs,
            counts: self.counts,
            tasks: self.tasks,
            sender: self.sender,
            clock: self.clock,
            _runtime: runtime,
        }
    }
}

/// Marks the node joined once it has found a peer and pulled the counts of every live one, or
/// was given no seed but itself, or `ready_timeout` passed (then it serves with what it has,
/// and says so). Until then global rules take no lease: a restarted node must not admit as if
/// it were alone. Then it is ready once it has settled ([`Global::ready`]: a round or two
/// later), or at `ready_timeout` from its start.
async fn join(global: Arc<Global>, expects_peers: bool, ready_timeout: Duration, every: Duration) {
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if global.joined() {
            break;
        }
        let found = global.peer_count() > 0;
        let pulled = found && global.pulled();
        let waited = started.elapsed() >= ready_timeout;
        if pulled || !expects_peers || waited {
            if waited && !pulled {
                warn!(
                    peers = global.peer_count(),
                    "ready timeout: serving global rules without the counts of every peer"
                );
            }
            info!(after = ?started.elapsed(), "joined the cluster");
            global.set_joined(true);
            break;
        }
    }
    loop {
        if global.ready() {
            return;
        }
        if started.elapsed() >= ready_timeout {
            warn!("ready timeout: serving before a round with every peer's frame in");
            global.ready_unsettled();
            return;
        }
        tick.tick().await;
    }
}

/// A Prometheus label value: a peer's node id comes from the network, so its backslashes,
/// quotes and newlines are escaped (the text format's three escapes).
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes one metric family: its HELP and TYPE lines and a sample per label set (`""` for
/// none).
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: &[(impl AsRef<str>, impl std::fmt::Display)],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let labels = labels.as_ref();
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// Samples labelled by peer (escaped), sorted by peer, each value as `value` renders it.
fn per_peer<T, V>(samples: Vec<(String, T)>, value: impl Fn(T) -> V) -> Vec<(String, V)> {
    let mut samples: Vec<(String, V)> = samples
        .into_iter()
        .map(|(peer, v)| (format!("peer=\"{}\"", label_value(&peer)), value(v)))
        .collect();
    samples.sort_by(|a, b| a.0.cmp(&b.0));
    samples
}

async fn resolve(host_port: &str) -> Option<SocketAddr> {
    tokio::net::lookup_host(host_port).await.ok()?.next()
}

/// Encodes and sends [`Output`]s.
#[derive(Clone, Debug)]
struct Sender {
    transport: QuicTransport,
    addrs: Arc<Mutex<HashMap<String, SocketAddr>>>,
    counts: Arc<Mutex<Counts>>,
    /// Node ids that have sent a frame over an authenticated QUIC connection. Gossip alone
    /// (chitchat is unauthenticated) never makes a node a member of the round protocol: a
    /// member nobody can authenticate would be charged as an unreachable peer and hold
    /// everyone's limits. So a node must keep sending its round frames to every address it
    /// has (`addrs`) even while its `Global` knows no peer: a node that sent nothing until it
    /// knew a peer was never authenticated by the others (tests/chaos.rs: 5 nodes each
    /// admitted half the limit, 600 of 300 a window).
    authenticated: Arc<Mutex<HashSet<String>>>,
    /// Wakes the membership task when a node is authenticated for the first time.
    newly_authenticated: Arc<tokio::sync::Notify>,
    /// Wakes the mesh's round task when a peer's round frame arrives: the instant runs as
    /// soon as every frame of its round is in.
    frame_arrived: Arc<tokio::sync::Notify>,
}

impl Sender {
    fn send(&self, outputs: Vec<Output>) {
        for output in outputs {
            let (to, message) = match output {
                Output::ToAll(m) => (None, m),
                Output::To(node, m) => (Some(node), m),
            };
            let frame = match wire::encode(&message) {
                Ok(f) => Bytes::from(f),
                Err(e) => {
                    warn!(error = %e, "cannot send a cluster message");
                    self.counts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .oversized += 1;
                    continue;
                }
            };
            let addrs = self.addrs.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let mut copies = 0;
            for (node, addr) in addrs {
                if to.as_ref().is_none_or(|t| *t == node) {
                    self.transport.send(&node, addr, frame.clone());
                    copies += 1;
                }
            }
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            let sent = counts.sent.entry(message.kind()).or_default();
            sent.0 += copies;
            sent.1 += copies * frame.len() as u64;
        }
    }
}

async fn rounds(global: Arc<Global>, clock: Arc<dyn Clock>, sender: Sender, nice: RoundNice) {
    let mut skew = SkewWarnings::default();
    let mut nice_failed = false;
    loop {
        let now = clock.now();
        let next = global.next_tick(now);
        if next > now {
            tokio::select! {
                () = clock.sleep(next - now) => {}
                // A frame may complete the round: its instant need not wait for δ.
                () = sender.frame_arrived.notified() => continue,
            }
        }
        let g = global.clone();
        let now = clock.now();
        // A round visits the keys with activity, and every key at a full boundary: keep it
        // off the async workers.
        tick_blocking(move || g.tick(now), &sender, nice, &mut nice_failed).await;
        skew.check(&global);
    }
}

/// The tree's round task: sleep until [`Tree::next_tick`] (a boundary, or a deadline to send
/// up without a late child), then tick on a blocking thread and send.
async fn tree_rounds(
    tree: Arc<Mutex<Tree>>,
    clock: Arc<dyn Clock>,
    sender: Sender,
    nice: RoundNice,
) {
    let mut nice_failed = false;
    loop {
        let now = clock.now();
        let next = super::lock(&tree).next_tick();
        if next > now {
            clock.sleep(next - now).await;
        }
        let t = tree.clone();
        let now = clock.now();
        // A boundary visits every key the node tracks: keep it off the async worker.
        tick_blocking(
            move || tree_step(&t, |t| t.tick(now)),
            &sender,
            nice,
            &mut nice_failed,
        )
        .await;
    }
}

/// Runs `step` on the tree, and says in the log when its first complete round lifts this
/// node's start freeze (docs/design.md §11, "Starting").
fn tree_step<R>(tree: &Mutex<Tree>, step: impl FnOnce(&mut Tree) -> R) -> R {
    let mut t = super::lock(tree);
    let (frozen, complete) = (t.start_frozen(), t.stats().complete_rounds);
    let r = step(&mut t);
    if frozen && !t.start_frozen() && t.stats().complete_rounds > complete {
        if t.stats().vouched {
            info!(
                "the tree's first complete round: a member saw every round before this node started; serving"
            );
        } else {
            info!(
                "the tree's first complete round: no member saw the rounds before this node started (the cluster started or restarted whole, or those members are cut off); the windows open now start afresh, as a standalone node's do"
            );
        }
    }
    r
}

/// Runs a round's `tick` on a blocking thread of lowered priority, sends what it returns,
/// and counts it (warning once if the priority cannot be lowered).
async fn tick_blocking(
    tick: impl FnOnce() -> Vec<Output> + Send + 'static,
    sender: &Sender,
    nice: RoundNice,
    nice_failed: &mut bool,
) {
    let started = std::time::Instant::now();
    let round = move || {
        let lowered = lower_priority(nice);
        (tick(), lowered)
    };
    match tokio::task::spawn_blocking(round).await {
        Ok((out, lowered)) => {
            sender.send(out);
            if let Err(e) = lowered
                && !std::mem::replace(nice_failed, true)
            {
                warn!(error = %e, %nice, "cannot lower the cluster's CPU priority; it competes with checks as an equal");
            }
        }
        Err(e) => warn!(error = %e, "round failed"),
    }
    let took = started.elapsed();
    if took > std::time::Duration::from_millis(20) {
        debug!(
            ms = took.as_millis() as u64,
            "a round tick took over 20 ms: what it sent went out that late"
        );
    }
    let mut counts = sender.counts.lock().unwrap_or_else(|p| p.into_inner());
    counts.ticks += 1;
    counts.tick_seconds += took.as_secs_f64();
}

/// Lowers the calling thread's CPU priority as `round_nice` says (a nice value that much
/// above the main thread's), once per thread (on Linux a thread has its own), so that on a
/// core checks and the cluster share the scheduler runs a waiting check first. Every thread
/// of the cluster's runtime does it when it starts.
///
/// A raised nice value gives the cluster a smaller share of a busy core, but once the
/// scheduler picks a cluster thread it runs its whole slice (EEVDF's slice does not shrink
/// with the weight): at 3,000 checks/s on one core about 1% of checks waited ~2 ms, at nice
/// 10 and 19 alike. `SCHED_IDLE` (`round_nice = "idle"`) yields to any check at once, and
/// under CPU saturation starves the cluster instead (`docs/operations.md`).
#[cfg(target_os = "linux")]
fn lower_priority(nice: RoundNice) -> std::io::Result<()> {
    thread_local! {
        static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if nice == RoundNice::Nice(0) || LOWERED.get() {
        return Ok(());
    }
    match nice {
        RoundNice::Nice(increment) => {
            // Above the main thread's nice value, not the calling thread's: a thread inherits
            // its spawner's, and the cluster's blocking threads are spawned by its lowered
            // worker (per thread, the increments added up to 19).
            let base = rustix::process::getpriority_process(Some(rustix::process::getpid()))?;
            let tid = Some(rustix::thread::gettid());
            rustix::process::setpriority_process(tid, (base + increment).min(19))?;
        }
        RoundNice::Idle => {
            use thread_priority::unix::{
                NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
                thread_native_id,
            };
            set_thread_priority_and_policy(
                thread_native_id(),
                thread_priority::ThreadPriority::Min,
                ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
            )
            .map_err(|e| std::io::Error::other(format!("SCHED_IDLE: {e:?}")))?;
        }
    }
    LOWERED.set(true);
    Ok(())
}

/// Thread priorities are left alone off Linux.
#[cfg(not(target_os = "linux"))]
fn lower_priority(_nice: RoundNice) -> std::io::Result<()> {
    Ok(())
}

/// Warns, at most once a minute per peer, about a peer whose clock looks more than half the
/// settle time (δ/2) off this node's: past δ its frames miss the instants (design.md §4);
/// and about a peer some of whose counts were ignored since the last look because their slot
/// was out of this node's range (a clock off by about a window).
#[derive(Default)]
struct SkewWarnings {
    checked: Option<std::time::Instant>,
    warned: HashMap<String, std::time::Instant>,
    /// Per peer: its out-of-range counts at the last look, and when it was last warned of.
    out_of_range: HashMap<String, (u64, Option<std::time::Instant>)>,
}

impl SkewWarnings {
    const EVERY: Duration = Duration::from_secs(5);
    const REPEAT: Duration = Duration::from_secs(60);

    fn check(&mut self, global: &Global) {
        let now = std::time::Instant::now();
        if self.checked.is_some_and(|t| now - t < Self::EVERY) {
            return;
        }
        self.checked = Some(now);
        let tolerance = i64::try_from(global.params().settle / 2).unwrap_or(i64::MAX);
        for (peer, offset) in global.clock_offsets() {
            if offset.abs() <= tolerance
                || self
                    .warned
                    .get(&peer)
                    .is_some_and(|t| now - *t < Self::REPEAT)
            {
                continue;
            }
            warn!(
                %peer,
                offset_ms = offset as f64 / 1e6,
                tolerance_ms = tolerance as f64 / 1e6,
                "a peer's clock is off this node's (run chrony on every node; design.md §4)"
            );
            self.warned.insert(peer, now);
        }
        for (peer, ignored) in global.out_of_range() {
            let (seen, warned) = self.out_of_range.entry(peer.clone()).or_default();
            let new = ignored.saturating_sub(*seen);
            *seen = ignored;
            if new == 0 || warned.is_some_and(|t| now - t < Self::REPEAT) {
                continue;
            }
            *warned = Some(now);
            warn!(
                %peer,
                ignored = new,
                "counts from a peer were ignored: their slot is more than one ahead of this \
                 node's clock or past the lookback (a clock off by about a window; design.md §4)"
            );
        }
    }
}

async fn receive(
    exchange: Exchange,
    me: Actor,
    clock: Arc<dyn Clock>,
    mut inbound: tokio::sync::mpsc::Receiver<Inbound>,
    sender: Sender,
) {
    while let Some(Inbound { peer, frame, .. }) = inbound.recv().await {
        let first = sender
            .authenticated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer.clone());
        if first {
            debug!(%peer, "peer authenticated");
            sender.newly_authenticated.notify_one();
            // Over the tree a node sends only to its parent and children: a peer heard from
            // for the first time is greeted back, so it authenticates this node too (the
            // full mesh sends every peer its frames anyway).
            if let Exchange::Tree(..) = &exchange {
                sender.send(vec![hello(&me, &peer)]);
            }
        }
        let reject = |reason: &'static str| {
            *sender
                .counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .rejected
                .entry(reason)
                .or_default() += 1;
        };
        // Decoding a frame and handing it to the exchange (which takes the round lock, held
        // through a whole round's tick) run on a blocking thread: on the runtime's one worker
        // they held up every frame this node sends until the tick ended.
        let (ex, from, clk) = (exchange.clone(), peer.clone(), clock.clone());
        let handled = tokio::task::spawn_blocking(move || {
            let message = wire::decode(&frame)?;
            Ok::<_, wire::WireError>(match &ex {
                Exchange::Mesh(global) => {
                    let round = matches!(message, wire::Message::Round(_));
                    (round, global.receive(&from, message, clk.now()))
                }
                Exchange::Tree(tree, _) => (false, tree_step(tree, |t| t.receive(&from, message))),
            })
        })
        .await;
        let received = match handled {
            Ok(Ok((round, received))) => {
                if round && received.is_ok() {
                    sender.frame_arrived.notify_one();
                }
                received
            }
            Ok(Err(e)) => {
                debug!(%peer, error = %e, "dropped a malformed frame");
                reject("malformed");
                continue;
            }
            Err(e) => {
                warn!(%peer, error = %e, "handling a frame failed");
                continue;
            }
        };
        match received {
            Ok(out) => sender.send(out),
            Err(r) => {
                debug!(%peer, reason = r.name(), "dropped a frame");
                reject(r.name());
            }
        }
    }
}

async fn members(
    exchange: Exchange,
    me: Actor,
    clock: Arc<dyn Clock>,
    mut watch: tokio::sync::watch::Receiver<Vec<Member>>,
    sender: Sender,
    ready_timeout: Duration,
) {
    let mut generations: HashMap<String, u64> = HashMap::new();
    // Over the tree, a node that expects peers takes part in no round until it has heard
    // from every live member gossip shows it (or `ready_timeout` passed): alone in its view
    // it would complete rounds by itself and grant itself the whole limit beside the
    // others, as a side of a partition does. (The mesh's `join` task does this for `Global`.)
    let join_by = tokio::time::Instant::now() + ready_timeout;
    // Only the tree waits here: for the mesh this task has nothing to join, and its wake-up
    // at `join_by` below would fire on every pass once that moment is past, spinning a core.
    let mut joined = ready_timeout.is_zero() || matches!(exchange, Exchange::Mesh(_));
    // Over the tree, the members greeted (node id, generation): see `receive`.
    let mut greeted: HashSet<(String, u64)> = HashSet::new();
    let mut numbers = PublishedNumbers::default();
    // Whether every member in the allotment published the same global limits as this node, as of the
    // last pass (a change is logged).
    let mut limits_agree = true;
    loop {
        let list = watch.borrow_and_update().clone();
        // Over the tree: members that left with their admissions handed to another. Read
        // before the newest generation of each node id wins below: a node restarted after
        // leaving shows up with its new generation beside the old one's marker.
        let handoffs: Vec<(Actor, Actor, u64)> = list
            .iter()
            .filter(|m| m.leaving && !m.is_self)
            .filter_map(|m| {
                let c = m.carried.as_ref()?;
                Some((
                    Actor::new(m.node_id.clone(), m.generation),
                    Actor::new(c.node_id.clone(), c.generation),
                    c.from,
                ))
            })
            .collect();
        let mut infos = Vec::new();
        let mut greetings = Vec::new();
        let mut unheard = 0;
        {
            let mut addrs = sender.addrs.lock().unwrap_or_else(|p| p.into_inner());
            addrs.clear();
            for m in list.iter().filter(|m| !m.is_self) {
                let Some(meta) = &m.meta else { continue };
                // The newest generation of each node id wins.
                if list
                    .iter()
                    .any(|o| o.node_id == m.node_id && o.generation > m.generation)
                {
                    continue;
                }
                addrs.insert(m.node_id.clone(), meta.quic_addr);
                // A restarted peer: drop the connection to its previous life at once rather
                // than write into it until the idle timeout.
                if generations
                    .insert(m.node_id.clone(), m.generation)
                    .is_some_and(|g| g != m.generation)
                {
                    sender.transport.forget(&m.node_id);
                }
                if let Exchange::Tree(..) = &exchange
                    && greeted.insert((m.node_id.clone(), m.generation))
                {
                    greetings.push(hello(&me, &m.node_id));
                }
                // Frames go to every gossip member (that is how a peer gets the chance to
                // authenticate), but only authenticated ones take part in the rounds.
                let authenticated = sender
                    .authenticated
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&m.node_id);
                if !authenticated && m.alive && !m.leaving {
                    unheard += 1;
                }
                if authenticated {
                    infos.push(MemberInfo {
                        actor: crate::counter::Actor::new(m.node_id.clone(), m.generation),
                        alive: m.alive,
                        left: m.leaving,
                        published_through: m.published_through,
                        numbers: numbers.read(&m.node_id, &meta.limits),
                    });
                }
            }
        }
        sender.send(greetings);
        numbers
            .by_node
            .retain(|node, _| list.iter().any(|m| m.node_id == *node));
        match &exchange {
            Exchange::Mesh(global) => {
                sender.send(global.set_members(&infos, clock.now()));
                let (differ, _) = global.members_on_other_numbers();
                if differ.is_empty() != limits_agree {
                    limits_agree = differ.is_empty();
                    if limits_agree {
                        info!(limits = ?global.numbers_in_force(), "every member publishes this node's global limits: the cluster has converged on them");
                    } else {
                        info!(members = ?differ, in_force = ?global.numbers_in_force(), "members publish other global limits: the smaller numbers are in force until every member has the same");
                    }
                }
            }
            Exchange::Tree(tree, _) => {
                // The view: this node and the live members that have not left.
                let view: Vec<Actor> = infos
                    .into_iter()
                    .filter(|m| m.alive && !m.left)
                    .map(|m| m.actor)
                    .chain([me.clone()])
                    .collect();
                if !joined {
                    let waited = tokio::time::Instant::now() >= join_by;
                    joined = (view.len() > 1 && unheard == 0) || waited;
                    if joined {
                        if view.len() == 1 {
                            warn!("ready timeout: no peer heard from; counting alone");
                        }
                        info!(members = view.len(), "joined the cluster");
                    }
                }
                if joined {
                    let mut tree = super::lock(tree);
                    for (left, carrier, from) in handoffs {
                        tree.handed_off(left, carrier, from);
                    }
                    let before = tree.members().len();
                    let carried_before = tree.stats().left_carried;
                    let lost = tree.set_members(&view, clock.now());
                    let carried = tree.stats().left_carried > carried_before;
                    drop(tree);
                    if !lost.is_empty() {
                        let lost: Vec<&str> = lost.iter().map(|m| m.node.as_str()).collect();
                        if carried {
                            info!(
                                ?lost,
                                members = view.len(),
                                "members left the tree's view with their admissions carried by members still in it: nothing frozen"
                            );
                        } else {
                            warn!(
                                ?lost,
                                members = view.len(),
                                "members left the tree's view: the open windows are frozen (each node spends only the room it holds) until they end"
                            );
                        }
                    } else if view.len() != before {
                        info!(members = view.len(), "the tree's view grew");
                    }
                }
            }
        }
        tokio::select! {
            changed = watch.changed() => if changed.is_err() {
                return;
            },
            () = sender.newly_authenticated.notified() => {}
            () = tokio::time::sleep_until(join_by), if !joined => {}
        }
    }
}

/// A greeting from `me` to `peer`, so that `peer` authenticates this node.
fn hello(me: &Actor, peer: &str) -> Output {
    Output::To(
        peer.to_owned(),
        wire::Message::Hello {
            from: me.clone(),
            rules_hash: 0,
        },
    )
}

/// A hash of the global rules as configured, so peers with different rules are reported.
///
/// Over the tree the exchange is in it too: a mesh node and a tree node cannot count
/// together (each refuses the other's messages), and `/v1/cluster` names the peers that
/// differ.
pub fn rules_hash(config: &Config) -> String {
    let mut h = crate::counter::StableHasher::new();
    h.str(&format!("{:?}", config.rules));
    if config.cluster.exchange != crate::config::ExchangeMode::Mesh {
        h.str(config.cluster.exchange.name());
    }
    format!("{:016x}", h.finish())
}

/// What this node publishes of its global rules' numbers ([`NodeMeta::limits`]): over the
/// mesh, [`Global::own_numbers`] as JSON; over the tree, nothing (its view hash covers the
/// rules, so nodes with other numbers never complete a round together).
fn published_limits(exchange: &Exchange) -> String {
    match exchange {
        Exchange::Mesh(global) => serde_json::to_string(&global.own_numbers()).unwrap_or_default(),
        Exchange::Tree(..) => String::new(),
    }
}

/// The members' published numbers, parsed once per change.
#[derive(Default)]
struct PublishedNumbers {
    by_node: HashMap<String, (String, Option<Arc<RuleNumbers>>)>,
}

impl PublishedNumbers {
    /// `node`'s numbers from what it publishes (`None` if empty or not readable: then they
    /// take no part in the numbers in force).
    fn read(&mut self, node: &str, published: &str) -> Option<Arc<RuleNumbers>> {
        match self.by_node.get(node) {
            Some((seen, numbers)) if seen == published => numbers.clone(),
            _ => {
                let numbers = serde_json::from_str::<RuleNumbers>(published)
                    .ok()
                    .map(Arc::new);
                if numbers.is_none() && !published.is_empty() {
                    warn!(peer = %node, "a peer's published limits do not parse: ignored");
                }
                self.by_node
                    .insert(node.to_owned(), (published.to_owned(), numbers.clone()));
                numbers
            }
        }
    }
}

/// Nanoseconds, for the generation of a starting node: its start time in milliseconds.
pub fn generation(now: Nanos) -> u64 {
    now / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::label_value;

    /// Each setting lowers the calling thread only (a fresh thread each), once.
    #[cfg(target_os = "linux")]
    #[test]
    fn round_nice_lowers_the_calling_thread() {
        use super::{RoundNice, lower_priority};
        use thread_priority::unix::{
            NormalThreadSchedulePolicy, ThreadSchedulePolicy, thread_schedule_policy,
        };
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let before = nice().expect("nice");
        let (raised, spawned, policy) = std::thread::spawn(move || {
            lower_priority(RoundNice::Nice(5)).expect("raise nice");
            // Once per thread: a second call changes nothing.
            lower_priority(RoundNice::Nice(5)).expect("again");
            // A thread the lowered one spawns (as the cluster's worker spawns its blocking
            // threads) inherits its nice value and lowers to the same, not 5 more.
            let spawned = std::thread::spawn(move || {
                lower_priority(RoundNice::Nice(5)).expect("raise nice");
                nice().expect("nice")
            })
            .join()
            .expect("thread");
            (
                nice().expect("nice"),
                spawned,
                thread_schedule_policy().expect("policy"),
            )
        })
        .join()
        .expect("thread");
        assert_eq!(raised, (before + 5).min(19));
        assert_eq!(spawned, raised);
        assert_eq!(
            policy,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Other)
        );
        let policy = std::thread::spawn(|| {
            lower_priority(RoundNice::Idle).expect("SCHED_IDLE needs no privilege");
            thread_schedule_policy().expect("policy")
        })
        .join()
        .expect("thread");
        assert_eq!(
            policy,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle)
        );
        // The test's own thread is untouched.
        assert_eq!(nice().expect("nice"), before);
    }

    #[test]
    fn a_peer_named_to_break_the_metrics_is_escaped() {
        assert_eq!(label_value("node-2"), "node-2");
        assert_eq!(
            label_value("a\"} 1\nevil{x=\"\\"),
            "a\\\"} 1\\nevil{x=\\\"\\\\"
        );
    }
}
