//! The aggregation tree ([`Tree`]) on virtual time, over the same simulated network as the
//! full mesh's simulation ([`Net`]), with faults drawn from one seed.
//!
//! - **Network**: every message through the wire codec (its bytes are what is counted), then
//!   lost, duplicated, delayed with jitter (which reorders), or dropped between sides of a
//!   partition.
//! - **Membership**: each node's view is the running, unpaused nodes on its side of any
//!   partition, as the membership layer would report them: a node refreshes its view
//!   [`VIEW_LAG_MIN`]–[`DETECT`] after any change, drawn per node (so views disagree for a
//!   while after every change, as they do in a real cluster).
//! - **Nodes**: a crash drops the node; a leave on purpose hands its admissions to its
//!   carrier first ([`Tree::leave`]) and leaves a marker the others' views take up; a
//!   restart is a new generation; a pause stops the node (its ticks, its view refreshes;
//!   messages to it are lost); each node reads the virtual time plus its own clock offset.
//!
//! [`run`] draws a schedule, plays it under load and checks after every millisecond that no
//! slot admitted more than its limit times the number of sides the cluster was split into
//! around it, and reports the checks far from the limit it denied while the cluster was
//! whole (the mesh's false-denial judge); [`scale`] measures traffic and admission at a
//! given size.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::cluster::global::Output;
use crate::cluster::sim::judge::Judge;
use crate::cluster::sim::{DETECT, Net, START};
use crate::cluster::tree::{Tree, TreeParams};
use crate::counter::Actor;
use crate::limiter::{Algorithm, Decision, Limit, MILLISECOND, Nanos, SECOND};
use crate::wire;

/// The soonest a node's view follows a change in who is up.
pub const VIEW_LAG_MIN: Nanos = 200 * MILLISECOND;
const MS: Nanos = MILLISECOND;

/// A message in flight: (to, encoded frame), keyed by (arrival, sequence).
type InFlight = (usize, Arc<Vec<u8>>);

/// A cluster of [`Tree`]s on virtual time.
#[derive(Debug)]
pub struct TreeSim {
    /// Virtual time.
    pub now: Nanos,
    /// The network.
    pub net: Net,
    nodes: Vec<Option<Tree>>,
    generation: Vec<u64>,
    paused: Vec<bool>,
    offsets: Vec<i64>,
    /// Which side of a partition each node is on (all 0 when whole).
    pub side: Vec<usize>,
    /// How long after a change in who is up a node's view follows, drawn per node in this
    /// range ([`VIEW_LAG_MIN`]..=[`DETECT`] unless a test sets it).
    pub view_lag: (Nanos, Nanos),
    refresh: Vec<Option<Nanos>>,
    queue: BTreeMap<(Nanos, u64), InFlight>,
    seq: u64,
    rng: u64,
    rules: Vec<(String, Limit)>,
    params: TreeParams,
    /// Bytes each node sent (encoded frames).
    pub bytes_sent: Vec<u64>,
    /// Messages each node sent.
    pub messages_sent: Vec<u64>,
    /// Units admitted per (rule, key, slot), over every node and incarnation.
    pub admitted: BTreeMap<(String, String, u64), u64>,
    /// Units admitted per (rule, key, slot) since every node was last down at once: the
    /// counts of the slots open then went with them, and the cluster starts those slots
    /// afresh (design §2.4, "Lost with every node"), so the bound is judged on each
    /// stretch between such moments.
    pub admitted_since_outage: BTreeMap<(String, String, u64), u64>,
    /// Units handed over by leaving nodes per (rule, key, slot): the leaving node and its
    /// carrier may both report them for a round or two (an answer lost or late).
    pub handed: BTreeMap<(String, String, u64), u64>,
    /// Nodes leaving on purpose ([`TreeSim::leave`]), with when they give up waiting for
    /// their carrier.
    leaving: Vec<Option<Nanos>>,
    /// Leaving markers: (who left, its carrier, the round from which the carrier reports).
    handoffs: Vec<(Actor, Actor, u64)>,
    handed_by: BTreeSet<Actor>,
}

/// How long a leaving node waits for its carrier's answer before leaving without one.
pub const LEAVE_WAIT: Nanos = 500 * MILLISECOND;

fn node_id(i: usize) -> String {
    format!("n{i}")
}

impl TreeSim {
    /// `nodes` nodes, all up and in one view, at [`START`].
    pub fn new(
        nodes: usize,
        rules: Vec<(String, Limit)>,
        params: TreeParams,
        seed: u64,
    ) -> TreeSim {
        let mut sim = TreeSim {
            now: START,
            net: Net::default(),
            nodes: Vec::new(),
            generation: vec![1; nodes],
            paused: vec![false; nodes],
            offsets: vec![0; nodes],
            side: vec![0; nodes],
            view_lag: (VIEW_LAG_MIN, DETECT),
            refresh: vec![None; nodes],
            queue: BTreeMap::new(),
            seq: 0,
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            rules,
            params,
            bytes_sent: vec![0; nodes],
            messages_sent: vec![0; nodes],
            admitted: BTreeMap::new(),
            admitted_since_outage: BTreeMap::new(),
            handed: BTreeMap::new(),
            leaving: vec![None; nodes],
            handoffs: Vec::new(),
            handed_by: BTreeSet::new(),
        };
        for i in 0..nodes {
            let tree = sim.start(i);
            sim.nodes.push(Some(tree));
        }
        for i in 0..nodes {
            sim.refresh_view(i);
        }
        sim
    }

    fn start(&self, i: usize) -> Tree {
        let actor = Actor::new(node_id(i), self.generation[i]);
        Tree::new(
            actor,
            self.rules.clone(),
            self.params.clone(),
            self.clock(i),
        )
        .expect("the simulation's rules are fixed windows")
    }

    /// A draw from the simulation's generator (xorshift64*).
    pub fn random(&mut self) -> u64 {
        crate::cluster::sim::xorshift(&mut self.rng)
    }

    /// A draw in `lo..hi` (`lo` if empty).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        crate::cluster::sim::between(&mut self.rng, lo, hi)
    }

    /// Node `i`'s clock.
    pub fn clock(&self, i: usize) -> Nanos {
        self.now.saturating_add_signed(self.offsets[i])
    }

    /// Sets node `i`'s clock offset.
    pub fn set_offset(&mut self, i: usize, offset: i64) {
        self.offsets[i] = offset;
    }

    /// Whether node `i` is up and not paused.
    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].is_some() && !self.paused[i]
    }

    /// Node `i`'s tree, if it is up.
    pub fn node(&self, i: usize) -> Option<&Tree> {
        self.nodes[i].as_ref()
    }

    /// The view node `i` would be told of now.
    fn truth_view(&self, i: usize) -> Vec<Actor> {
        (0..self.nodes.len())
            .filter(|&j| self.running(j) && self.side[j] == self.side[i])
            .map(|j| Actor::new(node_id(j), self.generation[j]))
            .collect()
    }

    fn refresh_view(&mut self, i: usize) {
        let view = self.truth_view(i);
        let now = self.clock(i);
        if let Some(t) = self.nodes[i].as_mut() {
            // The leaving markers reach a node with the leaves themselves.
            for (left, carrier, from) in &self.handoffs {
                t.handed_off(left.clone(), carrier.clone(), *from);
            }
            t.set_members(&view, now);
        }
    }

    /// Who is up changed: every running node refreshes its view after a lag of its own.
    fn membership_changed(&mut self) {
        for i in 0..self.nodes.len() {
            let lag = self.between(self.view_lag.0, self.view_lag.1 + 1);
            let at = self.now + lag;
            self.refresh[i] = Some(self.refresh[i].map_or(at, |r| r.min(at)));
        }
    }

    /// Crashes node `i` (whatever it held is lost with it).
    pub fn crash(&mut self, i: usize) {
        if self.nodes[i].take().is_some() {
            self.membership_changed();
            self.note_outage();
        }
    }

    /// With every node down, the open slots' counts are gone: a new stretch begins.
    fn note_outage(&mut self) {
        if self.nodes.iter().all(Option::is_none) {
            self.admitted_since_outage.clear();
        }
    }

    /// Node `i` leaves on purpose ([`Tree::leave`]): it hands its admissions to its carrier
    /// and, once the carrier answers (or after [`LEAVE_WAIT`] without an answer), stops,
    /// leaving a marker that names the carrier if it answered.
    pub fn leave(&mut self, i: usize) {
        if !self.running(i) || self.leaving[i].is_some() {
            return;
        }
        let now = self.clock(i);
        let out = self.nodes[i].as_mut().expect("running").leave(now);
        self.leaving[i] = Some(self.now + LEAVE_WAIT);
        self.send(i, out);
    }

    /// Whether node `i` is leaving and not gone yet.
    pub fn is_leaving(&self, i: usize) -> bool {
        self.leaving[i].is_some()
    }

    /// Leaving nodes whose carrier answered, or that waited long enough, stop.
    fn finish_leaves(&mut self) {
        for i in 0..self.nodes.len() {
            let Some(until) = self.leaving[i] else {
                continue;
            };
            let carried = self.nodes[i].as_ref().and_then(Tree::carried);
            let round = self.params.round;
            match carried {
                // It stays until its carrier reports its admissions (the handoff's round),
                // so that those who see it go see it go in a round the carrier reports.
                Some((carrier, from)) if self.clock(i) >= from * round => {
                    let me = Actor::new(node_id(i), self.generation[i]);
                    self.handoffs.push((me, carrier, from));
                }
                _ if self.now < until && self.nodes[i].is_some() => continue,
                _ => {}
            }
            self.leaving[i] = None;
            self.crash(i);
        }
    }

    /// Restarts node `i` as a new generation (a crashed node; a running one is crashed
    /// first).
    pub fn restart(&mut self, i: usize) {
        self.leaving[i] = None;
        self.nodes[i] = None;
        self.note_outage();
        self.paused[i] = false;
        self.generation[i] += 1;
        let tree = self.start(i);
        self.nodes[i] = Some(tree);
        self.refresh_view(i);
        self.membership_changed();
    }

    /// Pauses or resumes node `i`.
    pub fn pause(&mut self, i: usize, paused: bool) {
        if self.paused[i] != paused && self.nodes[i].is_some() {
            self.paused[i] = paused;
            self.membership_changed();
        }
    }

    /// Splits the cluster: node `i` goes to side `sides[i]`.
    pub fn partition(&mut self, sides: Vec<usize>) {
        self.side = sides;
        self.membership_changed();
    }

    /// Whether the cluster is whole, the condition under which the false-denial judge
    /// ([`Judge`], design §3.3.3) judges a check: every node up, not paused and not leaving
    /// (so every crashed or departed node has restarted); one side (no partition); no loss
    /// or duplication; and every node's view is exactly the n nodes at their current
    /// generations (each view lag since the last change has run out). Delay and jitter do
    /// not count, nor does a node's freeze or a round still to complete in its new view:
    /// denials those cause are what the judge is for.
    pub fn whole(&self) -> bool {
        let n = self.nodes.len();
        if self.net.loss > 0 || self.net.duplicate > 0 || self.side.windows(2).any(|w| w[0] != w[1])
        {
            return false;
        }
        let mut all: Vec<Actor> = (0..n)
            .map(|j| Actor::new(node_id(j), self.generation[j]))
            .collect();
        // In the order a view keeps its members.
        all.sort();
        (0..n).all(|i| {
            self.running(i)
                && self.leaving[i].is_none()
                && self.nodes[i].as_ref().is_some_and(|t| t.members() == all)
        })
    }

    /// How long after its boundary a round's grants are due in the whole cluster (a hop per
    /// level of the tree up and down, and one: [`TreeKeys::grant_wait`] from a boundary), as
    /// node 0's view has it; 0 if node 0 is down. A denial closer than this to a round's
    /// start is in the round's gap, before its grants can be in.
    ///
    /// [`TreeKeys::grant_wait`]: crate::cluster::tree::TreeKeys::grant_wait
    pub fn grant_hops(&self) -> Nanos {
        self.node(0).map_or(0, |t| {
            let keys = t.keys();
            keys.grant_wait(keys.next_boundary() * self.params.round)
        })
    }

    /// Checks `cost` units at node `i` (false if it is down or paused).
    pub fn check(&mut self, i: usize, rule: &str, key: &str, cost: u64) -> bool {
        self.check_decision(i, rule, key, cost)
            .is_some_and(|d| d.allowed())
    }

    /// Checks `cost` units at node `i` and returns the whole decision
    /// ([`TreeKeys::decide`](crate::cluster::tree::TreeKeys::decide)), as a client would
    /// get it. `None`: the node is down or paused, no such rule, or the node tracks
    /// [`TreeParams::max_keys`] keys already (none is admitted then).
    pub fn check_decision(
        &mut self,
        i: usize,
        rule: &str,
        key: &str,
        cost: u64,
    ) -> Option<Decision> {
        if !self.running(i) {
            return None;
        }
        let now = self.clock(i);
        let slot = now
            / self
                .rules
                .iter()
                .find(|(n, _)| n == rule)
                .map_or(SECOND, |(_, l)| l.period());
        let tree = self.nodes[i].as_ref().expect("running");
        let decision = tree.keys().decide(rule, key, cost, now)?.ok()?;
        if decision.allowed() {
            let k = (rule.to_owned(), key.to_owned(), slot);
            *self.admitted_since_outage.entry(k.clone()).or_default() += cost;
            *self.admitted.entry(k).or_default() += cost;
        }
        Some(decision)
    }

    fn send(&mut self, from: usize, outputs: Vec<Output>) {
        for output in outputs {
            let Output::To(to, message) = output else {
                continue;
            };
            let Some(to) = to.strip_prefix('n').and_then(|s| s.parse::<usize>().ok()) else {
                continue;
            };
            if let wire::Message::TreeHandoff(h) = &message
                && h.part == 0
                && self.handed_by.insert(h.from.clone())
            {
                // The first time: what the leaving node hands over (every part of it).
                let me = self.nodes[from].as_ref().expect("sending");
                for ((rule, key, slot), units) in me.handing() {
                    *self.handed.entry((rule, key, slot)).or_default() += units;
                }
            }
            let frame = Arc::new(wire::encode(&message).expect("a round's sums fit a frame"));
            self.bytes_sent[from] += frame.len() as u64;
            self.messages_sent[from] += 1;
            if self.side[from] != self.side[to] || self.random() % 1000 < self.net.loss {
                continue;
            }
            let copies = if self.random() % 1000 < self.net.duplicate {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let delay = self.net.delay + self.between(0, self.net.jitter + 1);
                self.seq += 1;
                self.queue
                    .insert((self.now + delay, self.seq), (to, frame.clone()));
            }
        }
    }

    /// Runs the cluster for `dt`, a millisecond at a time.
    pub fn advance(&mut self, dt: Nanos) {
        let end = self.now + dt;
        while self.now < end {
            self.now += MS;
            self.step();
        }
    }

    fn step(&mut self) {
        self.finish_leaves();
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (to, frame) = entry.remove();
            if !self.running(to) {
                continue;
            }
            let Ok(message) = wire::decode(&frame) else {
                continue;
            };
            let from = match &message {
                wire::Message::TreeUp(s)
                | wire::Message::TreeDown(s)
                | wire::Message::TreeHandoff(s) => s.from.node.clone(),
                wire::Message::TreeCarried { from, .. } => from.node.clone(),
                _ => continue,
            };
            let tree = self.nodes[to].as_mut().expect("running");
            if let Ok(out) = tree.receive(&from, message) {
                self.send(to, out);
            }
        }
        for i in 0..self.nodes.len() {
            if self.refresh[i].is_some_and(|r| r <= self.now) && !self.paused[i] {
                self.refresh[i] = None;
                self.refresh_view(i);
            }
            if !self.running(i) {
                continue;
            }
            let now = self.clock(i);
            let tree = self.nodes[i].as_mut().expect("running");
            if tree.next_tick() <= now {
                let out = tree.tick(now);
                self.send(i, out);
            }
        }
    }
}

/// One size of cluster over the tree: see [`scale`].
#[derive(Clone, Debug)]
pub struct TreeScalePoint {
    /// Nodes.
    pub nodes: usize,
    /// Keys checked each round.
    pub keys: usize,
    /// Mean bytes sent per node per second while every key was checked each round.
    pub bytes_per_node_second: f64,
    /// The most any one node sent per second then.
    pub max_bytes_per_node_second: f64,
    /// Messages per node per second then (mean).
    pub messages_per_node_second: f64,
    /// From a burst's last admission until the totals the burst's node receives count all
    /// of it.
    pub converge: Option<Nanos>,
    /// Units admitted in two whole windows of 1.5× load on a 1,000/s key.
    pub admitted: u64,
    /// The most admitted in one of those windows.
    pub worst_window: u64,
    /// The rounds every node applied, of those it could (complete rounds per node per
    /// round, in the load's two seconds).
    pub complete: f64,
    /// Wall time the point took.
    pub took: std::time::Duration,
}

/// Simulates `nodes` nodes over the tree with `keys` keys each checked once a round at a
/// random node, for 1 s once the cluster has formed; then a burst of 5 on a fresh key at
/// node 0; then 2 s of 1.5× load on one key limited to 1,000 per second. The same load as
/// the full mesh's [`scale`](crate::cluster::sim::scale).
pub fn scale(nodes: usize, keys: usize, seed: u64) -> TreeScalePoint {
    let started = std::time::Instant::now();
    let rules = vec![
        (
            "spread".to_owned(),
            Limit::new(Algorithm::FixedWindow, 1_000_000, SECOND, None).expect("valid"),
        ),
        (
            "hot".to_owned(),
            Limit::new(Algorithm::FixedWindow, 1000, SECOND, None).expect("valid"),
        ),
    ];
    let params = TreeParams::default();
    let round = params.round;
    let mut sim = TreeSim::new(nodes, rules, params, seed);
    // Past the slots open at the start, which no member is based in (bases are claimed
    // before a slot opens).
    sim.advance(2 * SECOND);
    let names: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    let sent_before: u64 = sim.bytes_sent.iter().sum();
    let messages_before: u64 = sim.messages_sent.iter().sum();
    let per_node_before = sim.bytes_sent.clone();
    let from = sim.now;
    for _ in 0..10 {
        let per_ms = keys.div_ceil((round / MS) as usize);
        for ms in 0..round / MS {
            sim.advance(MS);
            for k in (ms as usize * per_ms..((ms as usize + 1) * per_ms).min(keys)).rev() {
                let i = sim.between(0, nodes as u64) as usize;
                sim.check(i, "spread", &names[k], 1);
            }
        }
    }
    let seconds = (sim.now - from) as f64 / SECOND as f64;
    let sent: u64 = sim.bytes_sent.iter().sum::<u64>() - sent_before;
    let messages: u64 = sim.messages_sent.iter().sum::<u64>() - messages_before;
    let max = sim
        .bytes_sent
        .iter()
        .zip(&per_node_before)
        .map(|(a, b)| a - b)
        .max()
        .unwrap_or(0);
    // A burst of 5 on a fresh key at node 0, retried each ms until admitted.
    let mut admitted = 0;
    for _ in 0..1000 {
        if admitted == 5 {
            break;
        }
        sim.advance(MS);
        while admitted < 5 && sim.check(0, "hot", "burst", 1) {
            admitted += 1;
        }
    }
    let burst_at = sim.now;
    let slot = sim.clock(0) / SECOND;
    let mut converge = None;
    for _ in 0..3000 {
        sim.advance(MS);
        let node = sim.node(0).expect("up");
        if node.known_total("hot", "burst", slot) == Some(admitted) {
            converge = Some(sim.now - burst_at);
            break;
        }
    }
    // 2 s of load at 1.5× the limit, spread evenly, arrivals at random.
    let per_ms = 1_500_000 / nodes as u64;
    let to_next = SECOND - sim.now % SECOND;
    sim.advance(to_next);
    let first = sim.now / SECOND;
    let complete_before: u64 = (0..nodes)
        .map(|i| sim.node(i).map_or(0, |t| t.stats().complete_rounds))
        .sum();
    for _ in 0..2000 {
        sim.advance(MS);
        for i in 0..nodes {
            if sim.random() % 1_000_000 < per_ms {
                sim.check(i, "hot", "load", 1);
            }
        }
    }
    let complete_after: u64 = (0..nodes)
        .map(|i| sim.node(i).map_or(0, |t| t.stats().complete_rounds))
        .sum();
    let full: Vec<u64> = (first..first + 2)
        .map(|w| {
            sim.admitted
                .get(&("hot".to_owned(), "load".to_owned(), w))
                .copied()
                .unwrap_or(0)
        })
        .collect();
    TreeScalePoint {
        nodes,
        keys,
        bytes_per_node_second: sent as f64 / nodes as f64 / seconds,
        max_bytes_per_node_second: max as f64 / seconds,
        messages_per_node_second: messages as f64 / nodes as f64 / seconds,
        converge,
        admitted: full.iter().sum(),
        worst_window: full.iter().copied().max().unwrap_or(0),
        complete: (complete_after - complete_before) as f64 / nodes as f64 / 20.0,
        took: started.elapsed(),
    }
}

/// What [`run`] drew from its seed.
#[derive(Clone, Debug)]
pub struct TreeSetup {
    /// The seed.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// Children per node.
    pub fanout: usize,
    /// The limit of the 1-s window (the 3-s window's is three times it).
    pub limit: u64,
}

/// What one seeded run saw.
#[derive(Clone, Debug, Default)]
pub struct TreeOutcome {
    /// Every invariant the run broke (empty: none).
    pub violations: Vec<String>,
    /// The faults, in order: (ms from the start, what).
    pub schedule: Vec<(u64, String)>,
    /// The most any slot admitted over its limit times the sides around it (≤ 0 when the
    /// limit held), in units.
    pub worst_over: i64,
    /// Units admitted after the faults stopped and the cluster agreed, over what the load
    /// offered capped at the limit, over the same windows.
    pub admitted: u64,
    /// What an exact limiter would have admitted then.
    pub ideal: u64,
    /// From the end of the faults until every running node had applied a complete round of
    /// one common view (`None`: not within the run).
    pub agreed_after: Option<Nanos>,
    /// Checks made while the cluster was whole ([`TreeSim::whole`]) that the false-denial
    /// invariant says must be admitted at once ([`Judge`], design §3.3.3), per rule in the
    /// order of [`TREE_JUDGED`]: reported, not an invariant a run breaks (as the mesh's).
    pub must_admit: [u64; 2],
    /// Of [`TreeOutcome::must_admit`], the checks denied.
    pub false_denials: [u64; 2],
    /// Of [`TreeOutcome::false_denials`], those within a round's grant wait of its boundary
    /// (before its grants can be in).
    pub in_gap: [u64; 2],
    /// The judges' lines and their first few false denials.
    pub judged: Vec<String>,
}

/// The rules [`run`] loads and judges, in the order of [`TreeOutcome::must_admit`]: a
/// fixed window of the seed's limit per second, and one of three times it per 3 s.
pub const TREE_JUDGED: [&str; 2] = ["w0", "w1"];

const FAULTS_FROM: Nanos = SECOND;
const FAULTS_UNTIL: Nanos = 5 * SECOND;
const RUN_UNTIL: Nanos = 10 * SECOND;
/// After the faults stop, every running node applies a complete round in one view within
/// this long: the view lag, plus a restart's freeze, plus rounds.
pub const AGREE_WITHIN: Nanos = 2 * SECOND;

impl TreeSetup {
    /// The setup a seed draws.
    pub fn from_seed(seed: u64) -> TreeSetup {
        let mut sim = TreeSim::new(0, Vec::new(), TreeParams::default(), seed);
        TreeSetup {
            seed,
            nodes: sim.between(3, 21) as usize,
            fanout: sim.between(2, 5) as usize,
            limit: sim.between(50, 301),
        }
    }
}

/// Plays seed's schedule: the cluster forms, load at about twice the limits on three keys
/// of a 1-s and a 3-s fixed window, faults from 1 s to 5 s (loss, duplication, delay
/// with jitter, partitions into two sides and heals, crashes, leaves on purpose, every node
/// crashing at once, restarts, pauses, clock offsets up to ±5 ms), then a calm network to
/// 10 s. Checked after every millisecond: no slot admitted more than its limit times the
/// sides the cluster was split into from a view lag before it opened to a view lag after it
/// closed (a paused node counts as a side of its own; the counts of slots open when every
/// node was down at once go with them, so each stretch between such moments is judged on
/// its own); no node's totals count more than was admitted (plus what leaving nodes handed
/// over, which a leaving node and its carrier may both report for a round or two). After
/// the faults: agreement within [`AGREE_WITHIN`]. Every check is also shown to the
/// false-denial judge of its rule, which judges those made while [`TreeSim::whole`]:
/// reported in [`TreeOutcome::false_denials`], not a violation.
pub fn run(setup: &TreeSetup) -> TreeOutcome {
    let limits = [(SECOND, setup.limit), (3 * SECOND, 3 * setup.limit)];
    let rules: Vec<(String, Limit)> = limits
        .iter()
        .enumerate()
        .map(|(i, &(len, c))| {
            let limit = Limit::new(Algorithm::FixedWindow, c, len, None).expect("valid");
            (format!("w{i}"), limit)
        })
        .collect();
    let params = TreeParams {
        fanout: setup.fanout,
        ..TreeParams::default()
    };
    let round = params.round;
    let n = setup.nodes;
    let mut sim = TreeSim::new(n, rules.clone(), params, setup.seed);
    let mut out = TreeOutcome::default();
    let judged_rules: Vec<(String, Vec<Limit>)> = rules
        .iter()
        .map(|(name, l)| (name.clone(), vec![*l]))
        .collect();
    let gap = sim.grant_hops();
    let mut judges: [Judge; 2] = std::array::from_fn(|_| {
        let mut judge = Judge::new(&judged_rules, round);
        judge.gap = gap;
        judge
    });
    for i in 0..n {
        let offset = sim.between(0, 10_001) as i64 - 5000;
        sim.set_offset(i, offset * 1000);
    }
    let ms_of = |sim: &TreeSim| (sim.now - START) / MS;
    // Per-ms probability (per million) that a node checks: twice each key's limits (three
    // keys, two rules).
    let per_ms = 12 * setup.limit * 1000 / n as u64;
    let keys = ["a", "b", "c"];
    let mut next_fault = START + FAULTS_FROM;
    let mut restarts: Vec<(Nanos, usize)> = Vec::new();
    let mut resumes: Vec<(Nanos, usize)> = Vec::new();
    // (from, until, sides): when the cluster was split.
    let mut splits: Vec<(Nanos, Nanos, usize)> = Vec::new();
    let mut split_since: Option<Nanos> = None;
    let mut paused_since: Vec<Option<Nanos>> = vec![None; n];
    let mut pauses: Vec<(Nanos, Nanos)> = Vec::new();
    let mut calm_at = None;
    let mut agreed_at = None;
    let mut complete_at_calm: Vec<u64> = Vec::new();
    let mut measured: BTreeMap<(String, String, u64), u64> = BTreeMap::new();
    let mut offered: BTreeMap<(String, String, u64), u64> = BTreeMap::new();
    while sim.now < START + RUN_UNTIL {
        sim.advance(MS);
        let t = sim.now - START;
        // Faults.
        if t < FAULTS_UNTIL && sim.now >= next_fault {
            next_fault = sim.now + sim.between(100, 801) * MS;
            let i = sim.between(0, n as u64) as usize;
            let what = match sim.random() % 11 {
                0 => {
                    sim.net.loss = sim.between(0, 301);
                    format!("loss {}‰", sim.net.loss)
                }
                1 => {
                    sim.net.duplicate = sim.between(0, 201);
                    format!("duplicate {}‰", sim.net.duplicate)
                }
                2 => {
                    sim.net.delay = sim.between(1, 11) * MS;
                    sim.net.jitter = sim.between(0, 31) * MS;
                    format!(
                        "delay {} ms + jitter {} ms",
                        sim.net.delay / MS,
                        sim.net.jitter / MS
                    )
                }
                3 => {
                    let sides: Vec<usize> = (0..n).map(|_| (sim.random() % 2) as usize).collect();
                    // A draw with every node on one side splits nothing.
                    if split_since.is_none() && sides.iter().any(|&s| s != sides[0]) {
                        split_since = Some(sim.now);
                    }
                    let what = format!("partition {sides:?}");
                    sim.partition(sides);
                    what
                }
                4 => {
                    if let Some(from) = split_since.take() {
                        splits.push((from, sim.now, 2));
                    }
                    sim.partition(vec![0; n]);
                    "heal".to_owned()
                }
                5 | 6 if sim.node(i).is_some() => {
                    sim.crash(i);
                    let back = sim.now + sim.between(300, 1501) * MS;
                    restarts.push((back, i));
                    format!("crash n{i}")
                }
                9 => {
                    // Every node at once (a power cut, a botched deploy): nobody left saw
                    // the rounds that granted the old incarnations room.
                    for j in 0..n {
                        sim.crash(j);
                        let back = sim.now + sim.between(300, 1501) * MS;
                        restarts.push((back, j));
                    }
                    "crash all".to_owned()
                }
                8 if sim.running(i) && !sim.is_leaving(i) => {
                    sim.leave(i);
                    let back = sim.now + sim.between(300, 1501) * MS;
                    restarts.push((back, i));
                    format!("leave n{i}")
                }
                7 if sim.running(i) => {
                    // A paused node is cut off: under `split` it and the others are sides
                    // (a node that starts meanwhile may see nobody who saw the open slots).
                    paused_since[i] = Some(sim.now);
                    sim.pause(i, true);
                    let back = sim.now + sim.between(200, 2001) * MS;
                    resumes.push((back, i));
                    format!("pause n{i}")
                }
                _ => {
                    sim.net.loss = 0;
                    sim.net.duplicate = 0;
                    "calm".to_owned()
                }
            };
            out.schedule.push((ms_of(&sim), what));
        }
        for (at, i) in std::mem::take(&mut restarts) {
            if sim.now >= at || t >= FAULTS_UNTIL {
                sim.restart(i);
                out.schedule.push((ms_of(&sim), format!("restart n{i}")));
            } else {
                restarts.push((at, i));
            }
        }
        for (at, i) in std::mem::take(&mut resumes) {
            if sim.now >= at || t >= FAULTS_UNTIL {
                if let Some(from) = paused_since[i].take() {
                    pauses.push((from, sim.now));
                }
                sim.pause(i, false);
                out.schedule.push((ms_of(&sim), format!("resume n{i}")));
            } else {
                resumes.push((at, i));
            }
        }
        if t >= FAULTS_UNTIL && calm_at.is_none() {
            if let Some(from) = split_since.take() {
                splits.push((from, sim.now, 2));
            }
            sim.partition(vec![0; n]);
            sim.net = Net {
                delay: MS,
                jitter: 2 * MS,
                ..Net::default()
            };
            out.schedule
                .push((ms_of(&sim), "faults stop: heal, calm".to_owned()));
            calm_at = Some(sim.now);
            complete_at_calm = (0..n)
                .map(|i| sim.node(i).map_or(0, |t| t.stats().complete_rounds))
                .collect();
        }
        // Agreement: one view at every running node, and a complete round applied by each
        // since the faults stopped.
        if let (Some(calm), None) = (calm_at, agreed_at) {
            let views: BTreeSet<u64> = (0..n)
                .filter(|&i| sim.running(i))
                .map(|i| sim.node(i).expect("up").view())
                .collect();
            let applied = (0..n)
                .filter(|&i| sim.running(i))
                .all(|i| sim.node(i).expect("up").stats().complete_rounds > complete_at_calm[i]);
            if views.len() == 1 && applied {
                agreed_at = Some(sim.now);
                out.agreed_after = Some(sim.now - calm);
                complete_at_calm = (0..n)
                    .map(|i| sim.node(i).map_or(0, |t| t.stats().complete_rounds))
                    .collect();
            }
        }
        // Load, every check shown to its rule's judge.
        let whole = sim.whole();
        for i in 0..n {
            if sim.random() % 1_000_000 < per_ms {
                let key = keys[(sim.random() % 3) as usize];
                let r = (sim.random() % 2) as usize;
                let rule = TREE_JUDGED[r];
                let decision = sim.check_decision(i, rule, key, 1);
                let admitted = decision.as_ref().is_some_and(Decision::allowed);
                if let Some(d) = &decision {
                    judges[r].check(rule, key, i, n, sim.clock(i), 1, d, whole);
                }
                if let Some(agreed) = agreed_at
                    && sim.running(i)
                {
                    let len = if rule == "w0" { SECOND } else { 3 * SECOND };
                    let slot = sim.clock(i) / len;
                    // Whole windows after agreement.
                    if slot * len >= agreed + len.min(SECOND) {
                        let k = (rule.to_owned(), key.to_owned(), slot);
                        *offered.entry(k.clone()).or_default() += 1;
                        if admitted {
                            *measured.entry(k).or_default() += 1;
                        }
                    }
                }
            }
        }
        // Invariants.
        let lag = DETECT + TreeParams::default().round;
        for ((rule, key, slot), &admitted) in &sim.admitted_since_outage {
            let (len, c) = if rule == "w0" { limits[0] } else { limits[1] };
            let (from, until) = (slot * len - lag, (slot + 1) * len + lag);
            let sides = splits
                .iter()
                .copied()
                .chain(split_since.map(|f| (f, sim.now, 2)))
                .filter(|&(a, b, _)| a < until && b > from)
                .map(|(_, _, s)| s)
                .max()
                .unwrap_or(1) as u64;
            // A paused node is cut off, a side of its own while it is stopped: a node that
            // starts meanwhile, seeing nobody who saw the slot's rounds, starts it afresh.
            let sides = sides
                + pauses
                    .iter()
                    .copied()
                    .chain(paused_since.iter().flatten().map(|&f| (f, sim.now)))
                    .filter(|&(a, b)| a < until && b > from)
                    .count() as u64;
            let over = admitted as i64 - (c * sides) as i64;
            out.worst_over = out.worst_over.max(over);
            if over > 0 && out.violations.len() < 10 {
                out.violations.push(format!(
                    "at +{} ms {rule}/{key} slot {slot} admitted {admitted} > {c} × {sides} sides",
                    ms_of(&sim)
                ));
            }
            // A leaving node and its carrier may both report what it handed over for a
            // round or two: counted twice, never missing.
            let handed = sim
                .handed
                .get(&(rule.clone(), key.clone(), *slot))
                .copied()
                .unwrap_or(0);
            for i in 0..n {
                if let Some(total) = sim.node(i).and_then(|t| t.known_total(rule, key, *slot))
                    && total > admitted + handed
                    && out.violations.len() < 10
                {
                    out.violations.push(format!(
                        "at +{} ms n{i}'s totals count {total} in {rule}/{key} slot {slot}, which admitted {admitted}",
                        ms_of(&sim)
                    ));
                }
            }
        }
    }
    if out.worst_over == 0 {
        // The closest any slot came, as a negative margin.
        out.worst_over = sim
            .admitted
            .iter()
            .map(|((rule, _, _), &a)| {
                a as i64
                    - if rule == "w0" {
                        limits[0].1
                    } else {
                        limits[1].1
                    } as i64
            })
            .max()
            .unwrap_or(0)
            .min(0);
    }
    if out.agreed_after.is_none_or(|a| a > AGREE_WITHIN) && out.violations.len() < 10 {
        out.violations.push(format!(
            "the running nodes did not agree within {} ms of the faults' end (took {:?} ms)",
            AGREE_WITHIN / MS,
            out.agreed_after.map(|a| a / MS)
        ));
    }
    for (k, &o) in &offered {
        let (len, c) = if k.0 == "w0" { limits[0] } else { limits[1] };
        // Only windows wholly inside the run.
        if (k.2 + 1) * len <= sim.now {
            out.ideal += o.min(c);
            out.admitted += measured.get(k).copied().unwrap_or(0);
        }
    }
    for (r, judge) in judges.iter().enumerate() {
        out.must_admit[r] = judge.must_admit;
        out.false_denials[r] = judge.false_denials;
        out.in_gap[r] = judge.in_gap;
        out.judged
            .push(format!("{}: {}", TREE_JUDGED[r], judge.line()));
        out.judged.extend(judge.examples.iter().take(3).cloned());
    }
    out
}

impl TreeOutcome {
    /// The run's schedule and result, for `gossamer sim --tree --seed N`.
    pub fn describe(&self, setup: &TreeSetup) -> String {
        let mut s = format!(
            "seed {}: {} nodes, fan-out {}, limits {}/s and {}/3 s\n",
            setup.seed,
            setup.nodes,
            setup.fanout,
            setup.limit,
            3 * setup.limit
        );
        for (ms, what) in &self.schedule {
            s.push_str(&format!("  +{ms} ms: {what}\n"));
        }
        s.push_str(&format!(
            "worst slot over its bound: {}; agreed {} after the faults; admitted {} of {} ideal\n",
            self.worst_over,
            self.agreed_after
                .map_or("never".to_owned(), |a| format!("{} ms", a / MS)),
            self.admitted,
            self.ideal
        ));
        for line in &self.judged {
            s.push_str(&format!("false denials (cluster whole): {line}\n"));
        }
        for v in &self.violations {
            s.push_str(&format!("VIOLATION {v}\n"));
        }
        s
    }
}

/// Many seeds' outcomes, summed.
#[derive(Clone, Debug, Default)]
pub struct TreeSummary {
    /// Seeds run.
    pub seeds: u64,
    /// One line per seed that broke an invariant.
    pub failures: Vec<String>,
    /// The most any slot admitted over its bound (≤ 0: the bound held everywhere).
    pub worst_over: i64,
    /// Summed over the seeds.
    pub admitted: u64,
    /// Summed over the seeds.
    pub ideal: u64,
    /// Agreement times after the faults, sorted.
    pub agreed: Vec<Nanos>,
    /// [`TreeOutcome::must_admit`], summed.
    pub must_admit: [u64; 2],
    /// [`TreeOutcome::false_denials`], summed.
    pub false_denials: [u64; 2],
    /// [`TreeOutcome::in_gap`], summed.
    pub in_gap: [u64; 2],
}

impl TreeSummary {
    /// One line: seeds, failures, admission, agreement, false denials.
    pub fn line(&self, took: std::time::Duration) -> String {
        let pct = |q: f64| -> String {
            if self.agreed.is_empty() {
                return "-".to_owned();
            }
            let i = ((self.agreed.len() - 1) as f64 * q).round() as usize;
            format!("{}", self.agreed[i] / MS)
        };
        let denied: Vec<String> = TREE_JUDGED
            .iter()
            .enumerate()
            .map(|(r, name)| {
                format!(
                    "{name} {} of {} far from the limit ({:.2}%, {} in the gap)",
                    self.false_denials[r],
                    self.must_admit[r],
                    100.0 * self.false_denials[r] as f64 / self.must_admit[r].max(1) as f64,
                    self.in_gap[r]
                )
            })
            .collect();
        format!(
            "tree: {} seeds, {} broke an invariant; admitted {:.1}% of ideal after the faults; worst slot over its bound {}; agreed after the faults median {} / p99 {} / max {} ms; false denials with the cluster whole (design §3.3.3, reported, not an invariant): {}; {:.1} s",
            self.seeds,
            self.failures.len(),
            100.0 * self.admitted as f64 / self.ideal.max(1) as f64,
            self.worst_over,
            pct(0.5),
            pct(0.99),
            pct(1.0),
            denied.join(", "),
            took.as_secs_f64()
        )
    }
}

/// Runs every seed in `seeds` on `threads` threads.
pub fn explore(seeds: std::ops::Range<u64>, threads: usize) -> TreeSummary {
    let next = std::sync::atomic::AtomicU64::new(seeds.start);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if seed >= seeds.end {
                        break;
                    }
                    let setup = TreeSetup::from_seed(seed);
                    let outcome = run(&setup);
                    results.lock().expect("not poisoned").push((seed, outcome));
                }
            });
        }
    });
    let mut results = results.into_inner().expect("not poisoned");
    results.sort_by_key(|(seed, _)| *seed);
    let mut summary = TreeSummary {
        seeds: results.len() as u64,
        worst_over: i64::MIN,
        ..TreeSummary::default()
    };
    for (seed, o) in results {
        if let Some(v) = o.violations.first() {
            summary.failures.push(format!(
                "seed {seed}: {v} (replay: gossamer sim --tree --seed {seed})"
            ));
        }
        summary.worst_over = summary.worst_over.max(o.worst_over);
        summary.admitted += o.admitted;
        summary.ideal += o.ideal;
        summary.agreed.extend(o.agreed_after);
        for r in 0..TREE_JUDGED.len() {
            summary.must_admit[r] += o.must_admit[r];
            summary.false_denials[r] += o.false_denials[r];
            summary.in_gap[r] += o.in_gap[r];
        }
    }
    summary.agreed.sort_unstable();
    summary
}
