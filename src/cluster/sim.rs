//! A deterministic simulation of a cluster of [`Global`]s: the production round protocol on
//! virtual time, over a simulated network, with faults drawn from one seed.
//!
//! Everything that is random here (loads, losses, delays, the fault schedule) comes from one
//! xorshift generator seeded by the caller, and the code under test reads no clock and draws
//! no randomness of its own, so a seed replays exactly: `gossamer sim --seed N`.
//!
//! What is simulated, and how:
//! - **The network**: every message goes through the wire codec, then may be lost, duplicated,
//!   delayed (a base delay plus a per-message jitter, which also reorders) or cut (per
//!   directed link, which makes one-way and flapping partitions).
//! - **Membership** (chitchat in a node): node i holds j alive while it heard from j within
//!   [`DETECT`], and learns j's new generation when it hears from it.
//! - **Nodes**: a crash drops the node and its inbound messages; a restart is a new
//!   generation; a pause stops the node's ticks and queues its inbound messages until it
//!   resumes (as a stopped process's sockets would), with its clock running on. Each node
//!   reads the virtual time plus its own clock offset.
//!
//! [`run`] draws a schedule, plays it under a load, checks invariants as it goes and after
//! the faults stop ([`Outcome`]); the [`Sim`] itself is also the harness of the scenario
//! tests in `global/tests.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use crate::cluster::global::{Global, MemberInfo, OnPartition, Output, Params, RuleNumbers};
use crate::counter::Actor;
use crate::limiter::{Algorithm, Decision, Limit, MILLISECOND, Nanos, SECOND};
use crate::wire::{self, Message};

pub mod judge;
pub mod report;

/// How long a node holds a silent peer alive (chitchat at a 100 ms gossip interval takes
/// 0.4–0.8 s; `membership.rs`).
pub const DETECT: Nanos = 600 * MILLISECOND;
/// How long a restarted node waits to pull before it serves global rules anyway (the
/// default `ready_timeout`).
pub const READY_TIMEOUT: Nanos = 5 * SECOND;
/// Virtual time starts here: round-aligned and far from the epoch.
pub const START: Nanos = 1_700_000_000 * SECOND;
const MS: Nanos = MILLISECOND;

/// Per-message network behaviour.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Net {
    /// Per mille of messages lost.
    pub loss: u64,
    /// Per mille of messages delivered twice.
    pub duplicate: u64,
    /// Every message takes at least this long.
    pub delay: Nanos,
    /// Plus up to this much more, drawn per message (so messages overtake each other).
    pub jitter: Nanos,
    /// Directed links `(from, to)` that drop everything.
    pub cut: HashSet<(usize, usize)>,
}

/// The simulations' one generator, xorshift64*: the next draw from `state`.
pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A draw from `state` in `lo..hi` (`lo` if empty).
pub(crate) fn between(state: &mut u64, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else {
        lo + xorshift(state) % (hi - lo)
    }
}

/// A message in flight: (from, to, encoded frame).
type InFlight = (usize, usize, Arc<Vec<u8>>);

/// A cluster of [`Global`]s on virtual time. See the module docs.
#[derive(Debug)]
pub struct Sim {
    /// Virtual (true) time.
    pub now: Nanos,
    /// Node ids.
    pub names: Vec<String>,
    /// The running incarnation of each node; `None` while crashed.
    pub nodes: Vec<Option<Global>>,
    /// The network.
    pub net: Net,
    /// Each node's clock offset from true time.
    pub skew: Vec<i64>,
    /// When in each 100 ms gossip period a node is told the members it knows of (0: at the
    /// period's start, with the round boundary; chitchat's rounds are not aligned with ours).
    pub gossip_at: Vec<Nanos>,
    /// Admissions per (node, window of length [`Sim::window`] by the node's own clock).
    pub admitted: BTreeMap<(usize, u64), u64>,
    /// The window `admitted` is bucketed by.
    pub window: Nanos,
    /// Messages a node refused.
    pub rejects: u64,
    /// Encoded bytes each node sent.
    pub bytes_sent: Vec<u64>,
    /// Encoded bytes sent by all nodes, by kind of message ([`Traffic`]).
    pub traffic: Traffic,
    /// With a key set, the round frames that reported it, as (sender, round), one per frame
    /// sent (not per copy): what a test watches to see how often a change goes out.
    pub watch: Option<(String, Vec<(usize, u64)>)>,
    /// Each node's rules, as its configuration has them ([`Sim::relimit`] changes them).
    rules: Vec<Vec<(String, Vec<Limit>)>>,
    /// What each node publishes of its rules' numbers, as gossip carries it.
    numbers: Vec<Arc<RuleNumbers>>,
    /// `heard_numbers[i][j]`: j's numbers as node i last heard them.
    heard_numbers: Vec<Vec<Arc<RuleNumbers>>>,
    params: Params,
    generations: Vec<u64>,
    /// Until when a node is paused.
    paused: Vec<Option<Nanos>>,
    /// Since when a (restarted) node has been waiting to join: it takes no lease until it
    /// has pulled every live peer's counts or [`READY_TIMEOUT`] has passed, as
    /// `cluster/node.rs`'s `join` task has it.
    joining: Vec<Option<Nanos>>,
    /// Whether a node's current generation left gracefully (gossiped as leaving), and the
    /// round from which its frames carry every admission it made, if it got that far.
    left: Vec<Option<Option<u64>>>,
    /// Messages in flight by (delivery time, sequence).
    queue: BTreeMap<(Nanos, u64), InFlight>,
    seq: u64,
    rng: u64,
    /// `heard[i][j]`: when node i last heard from j (a delivered message or gossip).
    heard: Vec<Vec<Option<Nanos>>>,
    /// `known[i][j]`: the generation of j that node i knows.
    known: Vec<Vec<u64>>,
    /// The member list last given to each node, to call `set_members` only on a change.
    told: Vec<Vec<MemberInfo>>,
    /// True admissions per (actor, rule, key, slot by the actor's clock), for fixed windows.
    truth: HashMap<(Actor, String, String, u64), u64>,
    /// Every fixed-window admission: (true time, key, slot by the node's clock, cost).
    log: Vec<(Nanos, String, u64, u64)>,
    /// Whether `truth` and `log` are kept (off for large runs that check no invariant).
    pub track: bool,
}

/// What a node with `rules` publishes of their numbers.
fn numbers_of(rules: &[(String, Vec<Limit>)]) -> Arc<RuleNumbers> {
    let numbers = rules.iter().map(|(name, limits)| {
        (
            name.clone(),
            limits.iter().map(|l| (l.limit(), l.burst())).collect(),
        )
    });
    Arc::new(numbers.collect())
}

impl Sim {
    /// `n` nodes serving `rules`, seeded with `seed`, all formed into one cluster.
    pub fn new(n: usize, rules: Vec<(String, Vec<Limit>)>, params: Params, seed: u64) -> Sim {
        // Keys hashed from the seed: which round's sweep forgets a key repeats from run to run.
        let params = Params {
            hash_seed: params.hash_seed.or(Some(seed)),
            ..params
        };
        let mut sim = Sim {
            now: START,
            names: (0..n).map(|i| format!("node-{i}")).collect(),
            nodes: Vec::new(),
            net: Net {
                delay: MS,
                ..Net::default()
            },
            skew: vec![0; n],
            gossip_at: vec![0; n],
            admitted: BTreeMap::new(),
            window: SECOND,
            rejects: 0,
            bytes_sent: vec![0; n],
            traffic: Traffic::default(),
            watch: None,
            numbers: vec![numbers_of(&rules); n],
            heard_numbers: vec![vec![numbers_of(&rules); n]; n],
            rules: vec![rules; n],
            params,
            generations: vec![1; n],
            paused: vec![None; n],
            joining: vec![None; n],
            left: vec![None; n],
            queue: BTreeMap::new(),
            seq: 0,
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            heard: vec![vec![Some(START); n]; n],
            known: vec![vec![1; n]; n],
            told: vec![Vec::new(); n],
            truth: HashMap::new(),
            log: Vec::new(),
            track: true,
        };
        for i in 0..n {
            let g = sim.make(i);
            sim.nodes.push(Some(g));
        }
        for i in 0..n {
            sim.announce(i);
        }
        sim
    }

    fn make(&self, i: usize) -> Global {
        Global::new(
            Actor::new(self.names[i].clone(), self.generations[i]),
            self.params.clone(),
            self.rules[i].clone(),
            Arc::new(AtomicUsize::new(0)),
            1_000_000,
        )
        .expect("rules fit the params")
    }

    /// Node `i`'s configuration changes the numbers of rule `rule`'s limits to those of
    /// `limits` (a reload): it applies them (if running) and publishes them, and the others
    /// hear them with the next gossip; a crashed node restarts with them.
    pub fn relimit(&mut self, i: usize, rule: &str, limits: Vec<Limit>) {
        if let Some(g) = &self.nodes[i] {
            let index = g.rule_index(rule).expect("a global rule");
            g.relimit(index, &limits).expect("only the numbers change");
        }
        if let Some((_, l)) = self.rules[i].iter_mut().find(|(name, _)| name == rule) {
            *l = limits;
        }
        self.numbers[i] = numbers_of(&self.rules[i]);
    }

    /// Node `i`'s configuration gains global rule `rule` of `limits` (a reload adds it): it
    /// serves it from now on (if running) and publishes its numbers; a crashed node restarts
    /// with it.
    pub fn add_rule(&mut self, i: usize, rule: &str, limits: Vec<Limit>) {
        if let Some(g) = &self.nodes[i] {
            g.add_rule(rule, &limits).expect("a rule the node can add");
        }
        match self.rules[i].iter_mut().find(|(name, _)| name == rule) {
            Some((_, l)) => *l = limits,
            None => self.rules[i].push((rule.to_owned(), limits)),
        }
        self.numbers[i] = numbers_of(&self.rules[i]);
    }

    /// Node `i`'s configuration no longer has global rule `rule` (a reload removed it).
    pub fn remove_rule(&mut self, i: usize, rule: &str) {
        if let Some(g) = &self.nodes[i]
            && let Some(index) = g.rule_index(rule)
        {
            g.remove_rule(index);
        }
        self.rules[i].retain(|(name, _)| name != rule);
        self.numbers[i] = numbers_of(&self.rules[i]);
    }

    /// Whether node `i`'s configuration has `rule`.
    pub fn has_rule(&self, i: usize, rule: &str) -> bool {
        self.rules[i].iter().any(|(name, _)| name == rule)
    }

    /// The first limit of `rule` as node `i`'s config says.
    pub fn configured(&self, i: usize, rule: &str) -> u64 {
        self.rules[i]
            .iter()
            .find(|(name, _)| name == rule)
            .map_or(0, |(_, l)| l[0].limit())
    }

    /// Marks joined every waiting node that has pulled (or waited long enough).
    fn join(&mut self) {
        for i in 0..self.nodes.len() {
            let (Some(since), Some(g)) = (self.joining[i], &self.nodes[i]) else {
                continue;
            };
            if g.peer_count() > 0 && g.pulled() || self.now >= since + READY_TIMEOUT {
                g.set_joined(true);
                self.joining[i] = None;
            }
        }
    }

    /// Whether the cluster is whole: every node running and joined, no link cut, nothing
    /// lost, and no node suspecting another (the false-denial invariant's condition).
    pub fn whole(&self) -> bool {
        self.net.loss == 0
            && self.net.cut.is_empty()
            && (0..self.nodes.len()).all(|i| {
                self.running(i) && self.node(i).joined() && self.node(i).suspected().is_empty()
            })
    }

    /// Node `i`'s clock.
    pub fn clock(&self, i: usize) -> Nanos {
        self.now.saturating_add_signed(self.skew[i])
    }

    /// Whether node `i` runs now (not crashed, not paused).
    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].is_some() && self.paused[i].is_none()
    }

    /// The running node `i`.
    pub fn node(&self, i: usize) -> &Global {
        self.nodes[i].as_ref().expect("node is running")
    }

    /// A draw from the simulation's generator (xorshift64*).
    pub fn random(&mut self) -> u64 {
        xorshift(&mut self.rng)
    }

    /// A draw in `lo..hi` (`lo` if empty).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        between(&mut self.rng, lo, hi)
    }

    /// Tells node `i` the members it knows of now (at once, whatever it heard).
    pub fn announce(&mut self, i: usize) {
        let members: Vec<MemberInfo> = (0..self.names.len())
            .filter(|&j| j != i)
            .map(|j| MemberInfo {
                actor: Actor::new(self.names[j].clone(), self.generations[j]),
                alive: self.running(j),
                left: false,
                published_through: None,
                numbers: Some(self.numbers[j].clone()),
            })
            .collect();
        for (j, m) in members.iter().enumerate() {
            let j = if j >= i { j + 1 } else { j };
            self.known[i][j] = m.actor.generation;
        }
        self.tell(i, members);
    }

    fn tell(&mut self, i: usize, members: Vec<MemberInfo>) {
        if self.told[i] == members || !self.running(i) {
            return;
        }
        let now = self.clock(i);
        let out = self.node(i).set_members(&members, now);
        self.told[i] = members;
        self.route(i, out);
    }

    /// Membership as a failure detector sees it: j is alive to i if i heard from j within
    /// [`DETECT`]; i knows j's generation as of the last time it heard from it.
    fn hear(&mut self) {
        let n = self.names.len();
        for i in 0..n {
            for j in 0..n {
                if i != j && self.running(j) && !self.net.cut.contains(&(j, i)) {
                    self.heard[i][j] = Some(self.now);
                    self.known[i][j] = self.generations[j];
                    self.heard_numbers[i][j] = self.numbers[j].clone();
                }
            }
        }
    }

    /// Tells node `i` the members it knows of, as gossip heard up to now has them.
    fn gossip_to(&mut self, i: usize) {
        if !self.running(i) {
            return;
        }
        let n = self.names.len();
        let members: Vec<MemberInfo> = (0..n)
            .filter(|&j| j != i)
            .map(|j| MemberInfo {
                actor: Actor::new(self.names[j].clone(), self.known[i][j]),
                alive: self.heard[i][j].is_some_and(|t| self.now - t <= DETECT),
                left: self.left[j].is_some() && self.known[i][j] == self.generations[j],
                published_through: self.left[j].flatten(),
                numbers: Some(self.heard_numbers[i][j].clone()),
            })
            .collect();
        self.tell(i, members);
    }

    /// Sends what node `from` output over the simulated network.
    pub fn route(&mut self, from: usize, out: Vec<Output>) {
        for o in out {
            let (targets, message): (Vec<usize>, Message) = match o {
                Output::ToAll(m) => ((0..self.names.len()).filter(|&j| j != from).collect(), m),
                Output::To(node, m) => match self.names.iter().position(|n| *n == node) {
                    Some(j) => (vec![j], m),
                    None => continue,
                },
            };
            let frame = Arc::new(wire::encode(&message).expect("a node's message encodes"));
            let kind = match &message {
                Message::Round(f) if f.keys.is_empty() => &mut self.traffic.empty_frames,
                Message::Round(_) => &mut self.traffic.frames,
                _ => &mut self.traffic.other,
            };
            *kind += frame.len() as u64 * targets.len() as u64;
            if let Message::Round(f) = &message {
                self.traffic.round_frames += targets.len() as u64;
                self.traffic.key_reports += (f.keys.len() * targets.len()) as u64;
                let counted = f
                    .keys
                    .iter()
                    .filter(|k| k.limits.iter().any(|l| !l.counts.is_empty()))
                    .count();
                self.traffic.counted_reports += (counted * targets.len()) as u64;
                if let Some((key, seen)) = &mut self.watch
                    && f.keys.iter().any(|k| k.key == *key)
                {
                    seen.push((from, f.round));
                }
            }
            for to in targets {
                self.bytes_sent[from] += frame.len() as u64;
                if self.net.cut.contains(&(from, to)) || self.random() % 1000 < self.net.loss {
                    continue;
                }
                let copies = if self.random() % 1000 < self.net.duplicate {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let jitter = self.between(0, self.net.jitter + 1);
                    let at = self.now + self.net.delay + jitter;
                    self.seq += 1;
                    self.queue
                        .insert((at, self.seq), (from, to, Arc::clone(&frame)));
                }
            }
        }
    }

    /// Advances virtual time by `dt` in 1 ms steps, running every due tick and delivery.
    pub fn advance(&mut self, dt: Nanos) {
        let end = self.now + dt;
        while self.now < end {
            self.now = (self.now + MS).min(end);
            if self.now.is_multiple_of(100 * MS) {
                self.hear();
            }
            for i in 0..self.nodes.len() {
                if self.now % (100 * MS) == self.gossip_at[i] {
                    self.gossip_to(i);
                }
            }
            if self.now.is_multiple_of(100 * MS) {
                self.join();
            }
            for i in 0..self.nodes.len() {
                if self.paused[i].is_some_and(|until| until <= self.now) {
                    self.paused[i] = None;
                }
                for _ in 0..3 {
                    if !self.running(i) {
                        break;
                    }
                    let now = self.clock(i);
                    let g = self.node(i);
                    if g.next_tick(now) > now {
                        break;
                    }
                    let out = g.tick(now);
                    self.route(i, out);
                }
            }
            while let Some(entry) = self.queue.first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let (from, to, frame) = entry.remove();
                if self.nodes[to].is_none() {
                    continue;
                }
                if self.paused[to].is_some() {
                    // Held in the socket until the node resumes.
                    let until = self.paused[to].unwrap_or(self.now);
                    self.seq += 1;
                    self.queue.insert((until, self.seq), (from, to, frame));
                    continue;
                }
                let message = match wire::decode(&frame) {
                    Ok(m) => m,
                    Err(e) => panic!(
                        "frame of {} bytes from node {from} does not decode: {e}; kind byte {:?}",
                        frame.len(),
                        frame.get(1)
                    ),
                };
                let now = self.clock(to);
                match self.node(to).receive(&self.names[from], message, now) {
                    Ok(out) => self.route(to, out),
                    Err(_) => self.rejects += 1,
                }
            }
        }
    }

    /// Node `i` checks `cost` of `key` under `rule` now.
    pub fn check(&mut self, i: usize, rule: &str, key: &str, cost: u64) -> Decision {
        let now = self.clock(i);
        let g = self.node(i);
        let ri = g.rule_index(rule).expect("a global rule");
        let (_, d) = g.check(ri, key, cost, 0, now).expect("the store has room");
        let actor = g.me().clone();
        if d.allowed() {
            *self.admitted.entry((i, now / self.window)).or_default() += cost;
            let period = self.rules[i]
                .iter()
                .find(|(name, _)| name == rule)
                .and_then(|(_, limits)| limits.first())
                .filter(|l| self.track && l.algorithm() == Algorithm::FixedWindow)
                .map(Limit::period);
            if let Some(period) = period {
                *self
                    .truth
                    .entry((actor, rule.to_owned(), key.to_owned(), now / period))
                    .or_default() += cost;
                self.log
                    .push((self.now, key.to_owned(), now / period, cost));
            }
        }
        d
    }

    /// Runs `dur` of load: each ms, node i gets a check of cost 1 on `key` with probability
    /// `per_mille[i]`/1000.
    pub fn load(&mut self, rule: &str, key: &str, per_mille: &[u64], dur: Nanos) {
        let end = self.now + dur;
        while self.now < end {
            self.advance(MS);
            for (i, &p) in per_mille.iter().enumerate() {
                if self.running(i) && self.random() % 1000 < p {
                    self.check(i, rule, key, 1);
                }
            }
        }
    }

    /// Admissions per window, all nodes together.
    pub fn per_window(&self) -> BTreeMap<u64, u64> {
        let mut w = BTreeMap::new();
        for ((_, win), n) in &self.admitted {
            *w.entry(*win).or_default() += n;
        }
        w
    }

    /// Admissions of `key` (fixed windows, while `track`) per slot by the admitting node's
    /// clock, all nodes together.
    pub fn key_windows(&self, key: &str) -> BTreeMap<u64, u64> {
        let mut w = BTreeMap::new();
        for (_, k, slot, cost) in &self.log {
            if k == key {
                *w.entry(*slot).or_default() += cost;
            }
        }
        w
    }

    /// Admissions so far.
    pub fn total(&self) -> u64 {
        self.admitted.values().sum()
    }

    /// Kills node `i`: it and everything sent to it are gone.
    pub fn crash(&mut self, i: usize) {
        self.nodes[i] = None;
        self.paused[i] = None;
        self.joining[i] = None;
        self.queue.retain(|_, m| m.1 != i);
    }

    /// Starts node `i` again as a new generation, announced to everyone at once.
    pub fn restart(&mut self, i: usize) {
        self.restart_quietly(i);
        for j in 0..self.nodes.len() {
            self.announce(j);
        }
    }

    /// Stops node `i` as a graceful shutdown does: it admits nothing more, its next round
    /// publishes its last counts, then it leaves (its peers hear so through membership).
    pub fn leave(&mut self, i: usize) {
        let mut through = None;
        if let Some(g) = &self.nodes[i] {
            let wanted = g.next_publication();
            for _ in 0..300 {
                self.advance(MS);
                match &self.nodes[i] {
                    Some(g) if g.has_published(wanted) => {
                        through = Some(wanted);
                        break;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
        self.crash(i);
        self.left[i] = Some(through);
    }

    /// Starts node `i` again as a new generation; peers learn of it through membership.
    pub fn restart_quietly(&mut self, i: usize) {
        self.generations[i] += 1;
        self.left[i] = None;
        let g = self.make(i);
        g.set_joined(false);
        self.nodes[i] = Some(g);
        self.joining[i] = Some(self.now);
        self.told[i].clear();
        self.announce(i);
    }

    /// Stops node `i` (no ticks, inbound messages held) for `dur`.
    pub fn pause(&mut self, i: usize, dur: Nanos) {
        if self.nodes[i].is_some() {
            self.paused[i] = Some(self.now + dur);
        }
    }

    /// Cuts every link between `side` and the rest, both ways.
    pub fn partition(&mut self, side: &[usize]) {
        for &a in side {
            for b in 0..self.nodes.len() {
                if !side.contains(&b) {
                    self.net.cut.insert((a, b));
                    self.net.cut.insert((b, a));
                }
            }
        }
    }

    /// Every node's count of `actor` in a fixed window's slot.
    fn counts_of(&self, rule: &str, key: &str, slot: u64, actor: &Actor) -> Vec<u64> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some())
            .map(|i| self.node(i).known_count(rule, 0, key, slot, actor))
            .collect()
    }
}

/// One fault of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// From now on, this per mille of messages is lost.
    Loss(u64),
    /// From now on, this per mille of messages is delivered twice.
    Duplicate(u64),
    /// From now on, messages take `delay` plus up to `jitter`.
    Delay {
        /// The least delay.
        delay: Nanos,
        /// The most extra delay.
        jitter: Nanos,
    },
    /// Cut these nodes off from the rest, both ways.
    Partition(Vec<usize>),
    /// This node hears nothing (its messages still go out).
    Deaf(usize),
    /// Cut the link between two nodes, both ways (repeated, it flaps).
    Cut(usize, usize),
    /// Restore every link.
    Heal,
    /// Kill a node.
    Crash(usize),
    /// Start a crashed node again, as a new generation.
    Restart(usize),
    /// Stop a node for this long.
    Pause(usize, Nanos),
    /// This node's config now says the fixed-window rule's limit is this (a reload; a crashed
    /// node restarts with it): design §3.8.
    Relimit(usize, u64),
    /// This node's config now has the rule [`Setup::add_rule`] names (a reload adds it; a
    /// crashed node restarts with it): design §3.8, "Adding and removing a global rule".
    AddRule(usize),
    /// This node's config no longer has that rule (a reload removes it).
    RemoveRule(usize),
}

impl Fault {
    /// Whether the fault can make nodes disagree on who is reachable (so the sides may
    /// disagree on n₀; design §5).
    fn splits(&self) -> bool {
        matches!(
            self,
            Fault::Partition(_) | Fault::Deaf(_) | Fault::Cut(..) | Fault::Pause(..)
        )
    }
}

/// A simulation run's settings.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The seed of everything.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// Virtual time the run lasts.
    pub duration: Nanos,
    /// Faults are drawn in `[1 s, faults_until)`; then the network heals, crashed nodes
    /// restart, and the run goes on fault-free.
    pub faults_until: Nanos,
    /// Partition mode.
    pub on_partition: OnPartition,
    /// Whether nodes' clocks are offset (by up to ±5 ms).
    pub skew: bool,
    /// Play this schedule instead of drawing one.
    pub schedule: Option<Vec<(Nanos, Fault)>>,
    /// Whether a drawn schedule also changes the fixed window's limit node by node, as a
    /// ConfigMap change reaches the nodes apart ([`Fault::Relimit`]).
    pub relimit: bool,
    /// A rule of the run (one of its four) that no node has at the start: a drawn schedule
    /// adds it node by node, as a ConfigMap change reaches the nodes apart, then removes it
    /// from one node and adds it back ([`Fault::AddRule`], [`Fault::RemoveRule`]). A node
    /// checks only the rules its config has.
    pub add_rule: Option<&'static str>,
}

impl Setup {
    /// The setup seed `seed` draws: 3 to 5 nodes, 8 s, faults in the first 5 s, hold mode.
    pub fn from_seed(seed: u64) -> Setup {
        Setup {
            seed,
            nodes: 3 + (seed % 3) as usize,
            duration: 8 * SECOND,
            faults_until: 5 * SECOND,
            on_partition: OnPartition::Hold,
            skew: true,
            schedule: None,
            relimit: false,
            add_rule: None,
        }
    }

    /// The rule [`Setup::add_rule`] adds in runs of seed `seed`: each of the run's four in
    /// turn.
    pub fn added_rule(seed: u64) -> &'static str {
        [RULE, BUCKET_RULE, SLIDING[0].0, SLIDING[1].0][(seed % 4) as usize]
    }
}

/// What a run found.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The schedule played, as (time since start, fault).
    pub schedule: Vec<(Nanos, Fault)>,
    /// Per key and window of the fixed rule: (window, admitted, allowance, limit).
    pub windows: Vec<(u64, u64, u64, u64)>,
    /// Invariant violations, each a sentence.
    pub violations: Vec<String>,
    /// How long after the load stopped (the faults stopped 3 s before) every node agreed on
    /// every count.
    pub converged_after: Option<Nanos>,
    /// Admitted over every window, and the ideal (min of demand and limit, per window).
    pub admitted: u64,
    /// The limit times the windows, capped by the load offered.
    pub ideal: u64,
    /// Encoded bytes per node per second.
    pub bytes_per_node_second: f64,
    /// Admissions in the slots still open at the end that no running node counts (a
    /// crashed node's last, unpublished ones that its retirement did not cover).
    pub lost: u64,
    /// The token bucket's admissions over the run.
    pub bucket_admitted: u64,
    /// Checks made while the cluster was whole (every node running and joined, no link
    /// cut or lossy, nobody suspected) that the false-denial invariant says must be admitted
    /// at once ([`judge`], design §3.3.3), and how many of those were denied: reported, not
    /// yet an invariant a run breaks. One per rule, in the order of [`JUDGED`].
    pub must_admit: [u64; 4],
    /// Of [`Outcome::must_admit`], the checks denied.
    pub false_denials: [u64; 4],
    /// The judge's line and its first few false denials.
    pub judged: Vec<String>,
    /// The most any interval τ of the run admitted on the token bucket beyond
    /// `burst + rate·τ` (under `split`, times the sides, for intervals a splitting fault
    /// overlaps; design §5); negative if always below.
    pub bucket_excess: i64,
    /// What design §3.5 allows beyond that: the one-unit capacity floor of every node but
    /// one, `N − 1`.
    pub bucket_allowance: u64,
    /// The sliding rules' worst, by the admitting nodes' clocks (design §3.4): the most the
    /// log admitted in any period ending at one of its admissions, and the most the counter
    /// admitted in an aligned window; each with the allowance it had there (under `split`,
    /// a limit per extra side where a splitting fault overlaps; else 0).
    pub sliding: [(u64, u64); 2],
    /// The sliding counter's weighted estimate (§3.4) read at each admission, at its most:
    /// reported, not judged (the stated bound is per aligned window).
    pub counter_estimate: f64,
}

impl Outcome {
    /// The worst over-admission beyond the limit in any window (0 if none).
    pub fn worst_over(&self) -> u64 {
        self.windows
            .iter()
            .map(|&(_, n, _, limit)| n.saturating_sub(limit))
            .chain(self.sliding.iter().map(|&(n, _)| n.saturating_sub(LIMIT)))
            .max()
            .unwrap_or(0)
    }

    /// The run as text: the schedule, the windows and any violation (what a failure prints).
    pub fn describe(&self, setup: &Setup) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "seed {} ({} nodes, {} s, faults until {} s, {}, skew {}):",
            setup.seed,
            setup.nodes,
            setup.duration / SECOND,
            setup.faults_until / SECOND,
            setup.on_partition.name(),
            setup.skew
        );
        for (t, f) in &self.schedule {
            let _ = writeln!(s, "  +{:>5} ms  {f:?}", t / MS);
        }
        let _ = writeln!(
            s,
            "  admitted per window (s since start) and key, against the limit + allowance:"
        );
        let first = self.windows.iter().map(|w| w.0).min().unwrap_or(0);
        let line: Vec<String> = self
            .windows
            .iter()
            .map(|(w, n, allow, limit)| format!("{}:{n}/{limit}+{allow}", w - first))
            .collect();
        for chunk in line.chunks(8) {
            let _ = writeln!(s, "    {}", chunk.join("  "));
        }
        let _ = writeln!(
            s,
            "  token bucket: {} admitted; worst interval {:+} over burst + rate × τ ({} allowed)",
            self.bucket_admitted, self.bucket_excess, self.bucket_allowance
        );
        let _ = writeln!(
            s,
            "  sliding log: {} in its worst period (limit {LIMIT} + {}); sliding counter: {} in its worst aligned window (limit {LIMIT} + {}), weighted estimate at most {:.2}",
            self.sliding[0].0,
            self.sliding[0].1,
            self.sliding[1].0,
            self.sliding[1].1,
            self.counter_estimate
        );
        let _ = writeln!(
            s,
            "  admitted {} of ideal {}; {} lost; agreed {:?} ms after the load stopped; {:.0} B/node/s",
            self.admitted,
            self.ideal,
            self.lost,
            self.converged_after.map(|t| t / MS),
            self.bytes_per_node_second
        );
        for line in &self.judged {
            let _ = writeln!(s, "  false denials (cluster whole): {line}");
        }
        for v in &self.violations {
            let _ = writeln!(s, "  VIOLATION: {v}");
        }
        s
    }
}

/// The rule every run loads: 100 per second, fixed window.
pub const LIMIT: u64 = 100;
const RULE: &str = "api";
const KEYS: [&str; 2] = ["a", "b"];
/// The token bucket every run also loads: [`LIMIT`] per second, burst [`LIMIT`].
const BUCKET_RULE: &str = "tb";
const BUCKET_KEY: &str = "t";
/// The sliding rules every run also loads, (rule, key): a log of [`LIMIT`] per 1.6 s (its
/// sub-slot is a round) and a counter of [`LIMIT`] per second.
const SLIDING: [(&str, &str); 2] = [("sl", "l"), ("sc", "c")];
/// The rules the false-denial judge reports on, in the order of [`Outcome::must_admit`].
pub const JUDGED: [&str; 4] = [
    "fixed window",
    "token bucket",
    "sliding log",
    "sliding counter",
];

/// Draws a fault schedule from the sim's generator.
fn schedule(sim: &mut Sim, setup: &Setup) -> Vec<(Nanos, Fault)> {
    let n = setup.nodes;
    let mut out = Vec::new();
    let mut t = SECOND;
    while t < setup.faults_until {
        let node = sim.between(0, n as u64) as usize;
        let other = (node + 1 + sim.between(0, n as u64 - 1) as usize) % n;
        let fault = match sim.random() % 10 {
            0 => Fault::Loss(sim.between(0, 4) * 100),
            1 => Fault::Duplicate(sim.between(0, 3) * 100),
            2 => Fault::Delay {
                delay: sim.between(1, 10) * MS,
                jitter: sim.between(0, 40) * MS,
            },
            3 => {
                let size = sim.between(1, n as u64 / 2 + 1) as usize;
                Fault::Partition((0..size).map(|k| (node + k) % n).collect())
            }
            4 => Fault::Deaf(node),
            5 => Fault::Cut(node, other),
            6 => Fault::Heal,
            7 => Fault::Crash(node),
            8 => Fault::Restart(node),
            _ => Fault::Pause(node, sim.between(2, 20) * 100 * MS),
        };
        out.push((t, fault));
        t += sim.between(1, 8) * 100 * MS;
    }
    if setup.relimit {
        // A limit cut to half or raised to twice, reaching each node within 1.5 s of the
        // first, and changed back 2.5 s later in the same way.
        let to = if sim.random().is_multiple_of(2) {
            LIMIT / 2
        } else {
            2 * LIMIT
        };
        let first = sim.between(10, 26) * 100 * MS;
        for (at, limit) in [(first, to), (first + 2500 * MS, LIMIT)] {
            for node in 0..n {
                out.push((
                    at + sim.between(0, 16) * 100 * MS,
                    Fault::Relimit(node, limit),
                ));
            }
        }
        out.sort_by_key(|(t, _)| *t);
    }
    if setup.add_rule.is_some() {
        // Added at every node within 1.6 s of the first; removed from one 2.5 s after the
        // first addition and added back a second later. Drawn apart from the rest, so that
        // the run's other faults and load are those of the same seed without the addition.
        let mut rng = setup.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        let mut between = |lo: u64, hi: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            lo + rng % (hi - lo)
        };
        let first = between(5, 21) * 100 * MS;
        for node in 0..n {
            out.push((first + between(0, 16) * 100 * MS, Fault::AddRule(node)));
        }
        let node = between(0, n as u64) as usize;
        let gone = first + 2500 * MS + between(0, 10) * 100 * MS;
        out.push((gone, Fault::RemoveRule(node)));
        out.push((gone + SECOND, Fault::AddRule(node)));
        out.sort_by_key(|(t, _)| *t);
    }
    out
}

fn apply(sim: &mut Sim, fault: &Fault, added: Option<(&str, &[Limit])>) {
    match fault {
        Fault::Loss(p) => sim.net.loss = *p,
        Fault::Duplicate(p) => sim.net.duplicate = *p,
        Fault::Delay { delay, jitter } => {
            sim.net.delay = *delay;
            sim.net.jitter = *jitter;
        }
        Fault::Partition(side) => sim.partition(side),
        Fault::Deaf(i) => {
            for j in 0..sim.names.len() {
                if j != *i {
                    sim.net.cut.insert((j, *i));
                }
            }
        }
        Fault::Cut(a, b) => {
            sim.net.cut.insert((*a, *b));
            sim.net.cut.insert((*b, *a));
        }
        Fault::Heal => sim.net.cut.clear(),
        Fault::Crash(i) => sim.crash(*i),
        Fault::Restart(i) => {
            if sim.nodes[*i].is_none() {
                sim.restart_quietly(*i);
            }
        }
        Fault::Pause(i, dur) => sim.pause(*i, *dur),
        Fault::Relimit(i, limit) => {
            let limit =
                Limit::new(Algorithm::FixedWindow, *limit, SECOND, None).expect("a valid limit");
            sim.relimit(*i, RULE, vec![limit]);
        }
        Fault::AddRule(i) => {
            if let Some((rule, limits)) = added
                && !sim.has_rule(*i, rule)
            {
                sim.add_rule(*i, rule, limits.to_vec());
            }
        }
        Fault::RemoveRule(i) => {
            if let Some((rule, _)) = added {
                sim.remove_rule(*i, rule);
            }
        }
    }
}

/// Plays `setup`: a skewed load of 150/s (1.5× a per-second limit) on two keys of a fixed
/// window, a token bucket, a sliding log and a sliding counter, the drawn faults, then a
/// fault-free stretch.
/// Checks after every 10 ms that no node credits an actor with more than it admitted
/// (retired actors aside: their ghost is meant to), and at the end that every window,
/// bucket interval and sliding period stayed within the limit (under `split`, plus a limit
/// per extra side where a splitting fault overlaps, design §5), and that every node
/// converged to the same counts equal to the true ones.
pub fn run(setup: &Setup) -> Outcome {
    let params = Params {
        on_partition: setup.on_partition,
        ..Params::default()
    };
    let limit = Limit::new(Algorithm::FixedWindow, LIMIT, SECOND, None).expect("a valid limit");
    let bucket =
        Limit::new(Algorithm::TokenBucket, LIMIT, SECOND, Some(LIMIT)).expect("a valid limit");
    let sliding = [
        Limit::new(Algorithm::SlidingWindowLog, LIMIT, 1600 * MS, None).expect("a valid limit"),
        Limit::new(Algorithm::SlidingWindowCounter, LIMIT, SECOND, None).expect("a valid limit"),
    ];
    let mut rules: Vec<(String, Vec<Limit>)> = vec![
        (RULE.into(), vec![limit]),
        (BUCKET_RULE.into(), vec![bucket]),
        (SLIDING[0].0.into(), vec![sliding[0]]),
        (SLIDING[1].0.into(), vec![sliding[1]]),
    ];
    let all_rules = rules.clone();
    let added = setup.add_rule.and_then(|name| {
        let i = rules.iter().position(|(r, _)| r == name)?;
        Some(rules.remove(i))
    });
    let mut sim = Sim::new(setup.nodes, rules, params.clone(), setup.seed);
    let n = setup.nodes;
    if setup.skew {
        for i in 0..n {
            sim.skew[i] = sim.between(0, 11) as i64 * MS as i64 - 5 * MS as i64;
        }
    }
    // Load: node i gets 1.5 × LIMIT/s in total, spread unevenly.
    let weights: Vec<u64> = (0..n).map(|_| sim.between(1, 10)).collect();
    let sum: u64 = weights.iter().sum();
    let per_mille: Vec<u64> = weights.iter().map(|w| 150 * w / sum).collect();
    let start = sim.now;
    sim.advance(300 * MS);
    let plan = match &setup.schedule {
        Some(plan) => plan.clone(),
        None => schedule(&mut sim, setup),
    };
    let mut outcome = Outcome {
        schedule: plan.clone(),
        ..Outcome::default()
    };
    let mut splits: Vec<Nanos> = Vec::new();
    let mut next = 0;
    let faults_end = start + setup.faults_until;
    let end = start + setup.duration;
    let mut retired: HashSet<Actor> = HashSet::new();
    let mut healed = false;
    let mut offered: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    // The bucket's admissions per ms of true time.
    let mut bucket_admitted: BTreeMap<u64, u64> = BTreeMap::new();
    let mut suspected: Vec<HashSet<String>> = vec![HashSet::new(); n];
    let mut judges: [judge::Judge; 4] =
        std::array::from_fn(|_| judge::Judge::new(&all_rules, params.round));
    // When every node was down at once: the counts of the windows open then are gone with
    // them (design §2.4), as a standalone node's are when it restarts, so a window is judged
    // on what was admitted since the last such moment.
    let mut outages: Vec<Nanos> = Vec::new();
    // Since when each node's messages have not reached some peer, and the spans (node, from,
    // crash) of nodes that crashed so cut off: what they admitted then may never have
    // reached anyone, and their retirement may charge less than that (design §5, "A dead
    // member under `hold`": not covered), so the sliding judge allows it.
    let mut cut_since: Vec<Option<Nanos>> = vec![None; n];
    let mut orphans: Vec<(usize, Nanos, Nanos)> = Vec::new();
    // The sliding rules' admissions.
    let mut slid: [Vec<Slid>; 2] = [Vec::new(), Vec::new()];
    // With limit changes: every 10 ms, (true time, the least and the most of the fixed
    // window's limit in force at the nodes that run or may resume, the least their configs
    // say).
    let mut in_force: Vec<(Nanos, u64, u64, u64)> = Vec::new();
    while sim.now < end {
        while next < plan.len() && start + plan[next].0 <= sim.now {
            let fault = &plan[next].1;
            if fault.splits() {
                splits.push(sim.now);
            }
            if let Fault::Crash(i) = fault
                && let Some(g) = &sim.nodes[*i]
            {
                retired.insert(g.me().clone());
                if let Some(from) = cut_since[*i] {
                    orphans.push((*i, from, sim.now));
                }
            }
            apply(
                &mut sim,
                fault,
                added.as_ref().map(|(r, l)| (r.as_str(), l.as_slice())),
            );
            if (0..n).all(|i| !sim.running(i)) {
                outages.push(sim.now);
            }
            for (j, since) in cut_since.iter_mut().enumerate() {
                let cut = (0..n).any(|i| sim.net.cut.contains(&(j, i)));
                match (cut, *since) {
                    (true, None) => *since = Some(sim.now),
                    (false, _) => *since = None,
                    _ => {}
                }
            }
            next += 1;
        }
        if !healed && sim.now >= faults_end {
            healed = true;
            sim.net = Net {
                delay: MS,
                ..Net::default()
            };
            for i in 0..n {
                sim.paused[i] = None;
                if sim.nodes[i].is_none() {
                    sim.restart_quietly(i);
                }
            }
            splits.push(sim.now);
        }
        // With limit changes, the fixed window's checks are judged only while no node has a
        // smaller limit in force than the judge's (a raise keeps them judged against the
        // old limit, which asks less of the cluster than the new one does).
        let judge_fixed = in_force.last().is_none_or(|&(_, least, ..)| least >= LIMIT);
        for _ in 0..10 {
            sim.advance(MS);
            let whole = sim.whole();
            for (i, &p) in per_mille.iter().enumerate() {
                for key in KEYS {
                    if sim.running(i) && sim.random() % 1000 < p && sim.has_rule(i, RULE) {
                        *offered.entry((key, sim.now / SECOND)).or_default() += 1;
                        let d = sim.check(i, RULE, key, 1);
                        let judged = whole && judge_fixed;
                        judges[0].check(RULE, key, i, n, sim.clock(i), 1, &d, judged);
                    }
                }
                if sim.running(i) && sim.random() % 1000 < p && sim.has_rule(i, BUCKET_RULE) {
                    let d = sim.check(i, BUCKET_RULE, BUCKET_KEY, 1);
                    judges[1].check(BUCKET_RULE, BUCKET_KEY, i, n, sim.clock(i), 1, &d, whole);
                    if d.allowed() {
                        *bucket_admitted.entry(sim.now / MS).or_default() += 1;
                    }
                }
                for (r, (rule, key)) in SLIDING.into_iter().enumerate() {
                    if sim.running(i) && sim.random() % 1000 < p && sim.has_rule(i, rule) {
                        let at = sim.clock(i);
                        let d = sim.check(i, rule, key, 1);
                        judges[2 + r].check(rule, key, i, n, at, 1, &d, whole);
                        if d.allowed() {
                            slid[r].push(Slid {
                                outages: outages.len(),
                                at,
                                node: i,
                                true_at: sim.now,
                            });
                        }
                    }
                }
            }
        }
        if setup.relimit {
            let limits: Vec<u64> = sim
                .nodes
                .iter()
                .flatten()
                .map(|g| g.numbers_in_force()[RULE][0].0)
                .collect();
            let configured = (0..n)
                .filter(|&i| sim.nodes[i].is_some())
                .map(|i| sim.configured(i, RULE))
                .min();
            if let (Some(&least), Some(&most), Some(config)) =
                (limits.iter().min(), limits.iter().max(), configured)
            {
                in_force.push((sim.now, least, most, config));
            }
        }
        // A suspicion splits the nodes' views from the rounds before it (degraded on one
        // side, maybe not on the other): under `split` the sides' extra starts there.
        for (i, before) in suspected.iter_mut().enumerate() {
            let now_suspected: HashSet<String> = if sim.running(i) {
                sim.node(i).suspected().into_iter().collect()
            } else {
                HashSet::new()
            };
            if now_suspected.difference(before).next().is_some() {
                let lead = u64::from(params.suspect_after + 1) * params.round;
                splits.push(sim.now.saturating_sub(lead));
            }
            *before = now_suspected;
        }
        check_counts(&sim, &retired, &mut outcome.violations);
        if outcome.violations.len() > 20 {
            break;
        }
    }
    // Quiet until every node agrees, at most 3 s more.
    let quiet_from = sim.now;
    for _ in 0..300 {
        if agreement(&sim).is_none() {
            outcome.converged_after = Some(sim.now - quiet_from);
            break;
        }
        sim.advance(10 * MS);
    }
    if outcome.converged_after.is_none()
        && let Some(why) = agreement(&sim)
    {
        outcome
            .violations
            .push(format!("no agreement 3 s after the load stopped: {why}"));
    }
    // A window's limit, with limit changes (design §3.8). Where no splitting fault (a cut,
    // a deaf node, a pause, a suspicion) overlaps it: the smallest limit the running nodes'
    // configs say, at its largest from two windows before the window (its slot was
    // pre-leased and based then) to its end; judged against it, a node that ran its own
    // config's limit instead of the smaller one a peer publishes breaks it. Where one does,
    // a node that hears nobody runs the numbers it knows, so the limit is the largest in
    // force at any node over the same span. Either way at least the smallest in force
    // during the window (for the ideal).
    let split_span = (
        splits.iter().copied().min().unwrap_or(Nanos::MAX),
        splits.iter().copied().max().unwrap_or(0),
    );
    let limits_over = |from: Nanos, to: Nanos| {
        let from_ix = in_force.partition_point(|&(t, ..)| t < from);
        let to_ix = in_force.partition_point(|&(t, ..)| t <= to);
        let span = &in_force[from_ix..to_ix];
        let least = span.iter().map(|s| s.1).min().unwrap_or(LIMIT);
        let split = from < split_span.1 && to > split_span.0;
        let most = span
            .iter()
            .map(|s| if split { s.2 } else { s.3 })
            .max()
            .unwrap_or(LIMIT);
        (least, most)
    };
    let window_limit = |slot: u64| {
        // (A node's window is by its clock, up to 5 ms off true time.)
        let to = (slot + 1) * SECOND + 10 * MS;
        let most = limits_over((slot * SECOND).saturating_sub(2 * SECOND), to).1;
        if setup.relimit { most } else { LIMIT }
    };
    outcome.ideal = offered
        .iter()
        .map(|(&(_, s), &o)| {
            let least = limits_over(s * SECOND, (s + 1) * SECOND).0;
            o.min(if setup.relimit { least } else { LIMIT })
        })
        .sum();
    for (i, (name, judge)) in JUDGED.iter().zip(&judges).enumerate() {
        outcome.must_admit[i] = judge.must_admit;
        outcome.false_denials[i] = judge.false_denials;
        outcome.judged.push(format!("{name}: {}", judge.line()));
        outcome
            .judged
            .extend(judge.examples.iter().take(3).cloned());
    }
    let newest = sim.now / SECOND;
    for ((actor, rule, key, slot), &truth) in &sim.truth {
        if *slot + 1 < newest {
            continue; // forgotten by design once no decision reads it
        }
        let counted = sim
            .counts_of(rule, key, *slot, actor)
            .into_iter()
            .max()
            .unwrap_or(0);
        outcome.lost += truth.saturating_sub(counted);
    }
    // Under `split` each side may take the whole limit once it holds the other dead (§5).
    let sides = match setup.on_partition {
        OnPartition::Hold => 0,
        OnPartition::Split => n as u64 - 1,
    };
    check_windows(&sim, &splits, &outages, sides, &window_limit, &mut outcome);
    check_bucket(&bucket_admitted, &splits, sides, n, &mut outcome);
    check_sliding(&sliding, &mut slid, &splits, &orphans, sides, &mut outcome);
    let seconds = (sim.now - start) as f64 / SECOND as f64;
    outcome.bytes_per_node_second = sim.bytes_sent.iter().sum::<u64>() as f64 / n as f64 / seconds;
    outcome
}

/// What [`explore`] found over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub runs: u64,
    /// The [`Outcome::describe`] of every run that broke an invariant.
    pub failures: Vec<String>,
    /// Every run's worst over-admission beyond the limit (within its allowance unless it
    /// failed).
    pub worst_over: u64,
    /// Admitted and ideal, summed.
    pub admitted: u64,
    /// See [`Outcome::ideal`].
    pub ideal: u64,
    /// Lost admissions, summed.
    pub lost: u64,
    /// Every run's time to agree after the load stopped, sorted.
    pub converged: Vec<Nanos>,
    /// The token bucket's worst interval over `burst + rate·τ`, over every run.
    pub bucket_excess: Option<i64>,
    /// [`Outcome::must_admit`], summed.
    pub must_admit: [u64; 4],
    /// [`Outcome::false_denials`], summed.
    pub false_denials: [u64; 4],
    /// The sliding counter's worst weighted estimate over every run
    /// ([`Outcome::counter_estimate`]).
    pub counter_estimate: f64,
}

impl Summary {
    /// The `q`th percentile of the agreement times, in ms.
    pub fn converged_ms(&self, q: usize) -> u64 {
        self.converged
            .get(self.converged.len().saturating_sub(1) * q / 100)
            .map_or(0, |t| t / MS)
    }

    /// One line: runs, failures, admitted against ideal, worst over-admission, lost counts
    /// and agreement times.
    pub fn line(&self, took: std::time::Duration) -> String {
        let pct = |q| self.converged_ms(q);
        let denied: Vec<String> = JUDGED
            .iter()
            .enumerate()
            .map(|(i, name)| {
                format!(
                    "{name} {} of {} ({:.2}%)",
                    self.false_denials[i],
                    self.must_admit[i],
                    100.0 * self.false_denials[i] as f64 / self.must_admit[i].max(1) as f64
                )
            })
            .collect();
        format!(
            "{} seeds in {:.0} s: {} broke an invariant; admitted {:.1}% of ideal (fixed window); worst window or sliding period {} over the limit (within its allowance unless failed); token bucket's worst interval {:+} over burst + rate × τ; sliding counter's weighted estimate at most {:.2}; {} lost; agreement after the load stopped: median {} ms, p99 {} ms, max {} ms; checks far from the limit with the cluster whole that were denied (design §3.3.3, reported, not an invariant yet): {}",
            self.runs,
            took.as_secs_f64(),
            self.failures.len(),
            100.0 * self.admitted as f64 / self.ideal.max(1) as f64,
            self.worst_over,
            self.bucket_excess.unwrap_or(0),
            self.counter_estimate,
            self.lost,
            pct(50),
            pct(99),
            pct(100),
            denied.join(", ")
        )
    }
}

/// Runs every seed of `seeds` (setups from [`Setup::from_seed`], changed by `adjust`) on
/// `threads` threads.
pub fn explore(
    seeds: std::ops::Range<u64>,
    threads: usize,
    adjust: impl Fn(&mut Setup) + Sync,
) -> Summary {
    let summary = std::sync::Mutex::new(Summary::default());
    let count = usize::try_from(seeds.end.saturating_sub(seeds.start)).unwrap_or(usize::MAX);
    on_threads(count, threads, |i| {
        let mut setup = Setup::from_seed(seeds.start + i as u64);
        adjust(&mut setup);
        let outcome = run(&setup);
        let mut s = summary.lock().unwrap_or_else(|p| p.into_inner());
        s.runs += 1;
        s.worst_over = s.worst_over.max(outcome.worst_over());
        s.bucket_excess = s.bucket_excess.max(Some(outcome.bucket_excess));
        s.admitted += outcome.admitted;
        s.ideal += outcome.ideal;
        s.lost += outcome.lost;
        for i in 0..JUDGED.len() {
            s.must_admit[i] += outcome.must_admit[i];
            s.false_denials[i] += outcome.false_denials[i];
        }
        s.counter_estimate = s.counter_estimate.max(outcome.counter_estimate);
        s.converged.extend(outcome.converged_after);
        if !outcome.violations.is_empty() {
            s.failures.push(outcome.describe(&setup));
        }
    });
    let mut summary = summary.into_inner().unwrap_or_else(|p| p.into_inner());
    summary.converged.sort_unstable();
    summary
}

/// Runs `job(i)` for every `i` in `0..count` on up to `threads` threads, each taking the
/// next index when it is done with one (jobs of uneven cost keep every thread busy).
pub fn on_threads(count: usize, threads: usize, job: impl Fn(usize) + Sync) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, count.max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    job(i);
                }
            });
        }
    });
}

/// One point of the scaling figures.
#[derive(Clone, Debug)]
pub struct ScalePoint {
    /// Nodes.
    pub nodes: usize,
    /// Keys changed every round, cluster-wide.
    pub keys: usize,
    /// Encoded bytes each node sent per second (frames, digests, repairs).
    pub bytes_per_node_second: f64,
    /// From a burst at one node on a fresh key until every node counts all of it (`None`:
    /// not within 3 s).
    pub converge: Option<Nanos>,
    /// Admitted on one saturated key (1.5× its limit spread evenly) in two whole windows.
    pub admitted: u64,
    /// The most either window admitted (the limit is 1,000).
    pub worst_window: u64,
    /// The limit times the windows of that load.
    pub ideal: u64,
    /// Wall time the point took to simulate.
    pub took: std::time::Duration,
    /// What the bytes of `bytes_per_node_second` were.
    pub traffic: Traffic,
}

/// Encoded bytes sent, by kind of message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Round frames that report no key: a header saying the sender has nothing new.
    pub empty_frames: u64,
    /// Round frames that report keys.
    pub frames: u64,
    /// Digests and repairs.
    pub other: u64,
    /// Round frames sent (each copy counted).
    pub round_frames: u64,
    /// The key reports those frames carried.
    pub key_reports: u64,
    /// Those of the key reports that carried counts.
    pub counted_reports: u64,
}

impl Traffic {
    pub(crate) fn since(self, before: Traffic) -> Traffic {
        Traffic {
            empty_frames: self.empty_frames - before.empty_frames,
            frames: self.frames - before.frames,
            other: self.other - before.other,
            round_frames: self.round_frames - before.round_frames,
            key_reports: self.key_reports - before.key_reports,
            counted_reports: self.counted_reports - before.counted_reports,
        }
    }
}

/// Simulates `nodes` nodes with `keys` keys each checked once a round at a random node,
/// for 1 s after the cluster forms, then a burst on a fresh key, then 2 s of 1.5× load on
/// one key whose limit is 1,000 per second.
pub fn scale(nodes: usize, keys: usize, seed: u64) -> ScalePoint {
    let started = std::time::Instant::now();
    let rules = vec![
        (
            "spread".to_owned(),
            vec![Limit::new(Algorithm::FixedWindow, 1_000_000, SECOND, None).expect("valid")],
        ),
        (
            "hot".to_owned(),
            vec![Limit::new(Algorithm::FixedWindow, 1000, SECOND, None).expect("valid")],
        ),
    ];
    let mut sim = Sim::new(nodes, rules, Params::default(), seed);
    sim.track = false;
    sim.advance(500 * MS);
    let names: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    let round = Params::default().round;
    let measure_from = sim.now;
    let sent_before: u64 = sim.bytes_sent.iter().sum();
    let traffic_before = sim.traffic;
    for _ in 0..10 {
        // Every key once this round, spread over its 100 ms.
        let per_ms = keys.div_ceil((round / MS) as usize);
        for ms in 0..round / MS {
            sim.advance(MS);
            for k in (ms as usize * per_ms..((ms as usize + 1) * per_ms).min(keys)).rev() {
                let i = sim.between(0, nodes as u64) as usize;
                sim.check(i, "spread", &names[k], 1);
            }
        }
    }
    let sent: u64 = sim.bytes_sent.iter().sum::<u64>() - sent_before;
    let seconds = (sim.now - measure_from) as f64 / SECOND as f64;
    let bytes_per_node_second = sent as f64 / nodes as f64 / seconds;
    let traffic = sim.traffic.since(traffic_before);
    // A burst of 5 on a fresh key at node 0 (retried each ms until admitted: a new key
    // waits for its first lease), then wait until every node counts all of it.
    let mut admitted = 0;
    for _ in 0..500 {
        if admitted == 5 {
            break;
        }
        sim.advance(MS);
        while admitted < 5 && sim.check(0, "hot", "burst", 1).allowed() {
            admitted += 1;
        }
    }
    let burst_at = sim.now;
    let slot = sim.clock(0) / SECOND;
    let mut converge = None;
    for _ in 0..3000 {
        sim.advance(MS);
        if (0..nodes).all(|i| sim.node(i).known_total("hot", 0, "burst", slot) == admitted) {
            converge = Some(sim.now - burst_at);
            break;
        }
    }
    // 2 s of load on one key at 1.5× its limit, spread evenly, arrivals at random.
    sim.admitted.clear();
    let per_ms = 1_500_000 / nodes as u64; // per node, in millionths of a check per ms
    let to_next = SECOND - sim.now % SECOND;
    sim.advance(to_next);
    let first = sim.now / SECOND;
    for _ in 0..2000 {
        sim.advance(MS);
        for i in 0..nodes {
            if sim.random() % 1_000_000 < per_ms {
                sim.check(i, "hot", "load", 1);
            }
        }
    }
    let windows = sim.per_window();
    let full: Vec<u64> = (first..first + 2)
        .map(|w| windows.get(&w).copied().unwrap_or(0))
        .collect();
    ScalePoint {
        nodes,
        keys,
        bytes_per_node_second,
        converge,
        admitted: full.iter().sum(),
        worst_window: full.iter().copied().max().unwrap_or(0),
        ideal: 2000,
        took: started.elapsed(),
        traffic,
    }
}

/// No node credits a live actor with more than it admitted.
fn check_counts(sim: &Sim, retired: &HashSet<Actor>, violations: &mut Vec<String>) {
    for ((actor, rule, key, slot), &truth) in &sim.truth {
        if retired.contains(actor) {
            continue;
        }
        for (i, c) in sim
            .counts_of(rule, key, *slot, actor)
            .into_iter()
            .enumerate()
        {
            if c > truth {
                violations.push(format!(
                    "at +{} ms a node ({i}th running) counts {actor:?} {c} in {rule}/{key} slot {slot}, which admitted {truth}",
                    (sim.now - START) / MS
                ));
            }
        }
    }
}

/// Why the running nodes do not agree yet, if they do not: a suspected peer, or different
/// counts of some actor in an open slot, or a live actor's count short of the truth.
fn agreement(sim: &Sim) -> Option<String> {
    let running: Vec<usize> = (0..sim.nodes.len()).filter(|&i| sim.running(i)).collect();
    for &i in &running {
        let suspected = sim.node(i).suspected();
        if !suspected.is_empty() {
            return Some(format!("node {i} suspects {suspected:?}"));
        }
    }
    let live: HashSet<Actor> = running.iter().map(|&i| sim.node(i).me().clone()).collect();
    let newest = sim.now / SECOND;
    for ((actor, rule, key, slot), &truth) in &sim.truth {
        if *slot + 1 < newest {
            continue;
        }
        let counts = sim.counts_of(rule, key, *slot, actor);
        if counts.iter().any(|&c| c != counts[0]) {
            return Some(format!("{actor:?} {rule}/{key} slot {slot}: {counts:?}"));
        }
        if live.contains(actor) && counts[0] != truth {
            return Some(format!(
                "{actor:?} {rule}/{key} slot {slot}: counted {} of {truth}",
                counts[0]
            ));
        }
    }
    None
}

/// The token bucket within `burst + rate·τ` over every interval τ, plus the capacity floor
/// (design §3.5). Under `split`, an interval that a splitting fault overlaps may admit
/// `extra_sides` more times that (§5).
fn check_bucket(
    per_ms: &BTreeMap<u64, u64>,
    splits: &[Nanos],
    extra_sides: u64,
    nodes: usize,
    outcome: &mut Outcome,
) {
    let (first, last) = match (per_ms.keys().next(), per_ms.keys().next_back()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => return,
    };
    let mut worst = worst_excess(per_ms, first..=last, LIMIT, LIMIT);
    if extra_sides > 0 && !splits.is_empty() {
        let from = splits.iter().min().map_or(0, |t| t / MS);
        let to = splits.iter().max().map_or(0, |t| t / MS);
        // Intervals clear of the splitting faults keep the single bound; any interval is
        // within the sides' bound (which a clear one meets if it meets its own).
        let sides = 1 + extra_sides;
        worst = worst_excess(per_ms, first..=from.saturating_sub(1), LIMIT, LIMIT)
            .max(worst_excess(per_ms, to + 1..=last, LIMIT, LIMIT))
            .max(worst_excess(
                per_ms,
                first..=last,
                sides * LIMIT,
                sides * LIMIT,
            ));
    }
    outcome.bucket_admitted = per_ms.values().sum();
    outcome.bucket_excess = worst;
    outcome.bucket_allowance = nodes as u64 - 1;
    if worst > outcome.bucket_allowance as i64 {
        outcome.violations.push(format!(
            "token bucket: an interval admitted {worst} more than burst + rate × τ, {} allowed",
            outcome.bucket_allowance
        ));
    }
}

/// The most any interval `[t, u]` of whole ms within `range` admitted beyond
/// `burst + rate·(u − t + 1 ms)`, from admissions per ms (`rate` per second); `i64::MIN`
/// for an empty range.
pub fn worst_excess(
    per_ms: &BTreeMap<u64, u64>,
    range: std::ops::RangeInclusive<u64>,
    rate: u64,
    burst: u64,
) -> i64 {
    // Over [t, u]: A(u) − A(t−1) − burst − rate·(u − t + 1)/1000, maximised over t ≤ u by
    // keeping the largest rate·t/1000 − A(t−1) seen so far (in thousandths of a unit). An
    // ms with no admission never ends a worst interval, so only the ms listed are visited.
    if range.start() > range.end() {
        return i64::MIN; // BTreeMap::range would panic
    }
    let (mut admitted, mut best_start, mut worst) = (0i64, i64::MIN, i64::MIN);
    for (&ms, &n) in per_ms.range(range) {
        let ms = ms as i64;
        best_start = best_start.max(rate as i64 * ms - 1000 * admitted);
        admitted += n as i64;
        let excess = 1000 * admitted - 1000 * burst as i64 - rate as i64 * (ms + 1) + best_start;
        worst = worst.max(excess);
    }
    if worst == i64::MIN {
        return worst;
    }
    worst.div_euclid(1000)
}

/// The sliding rules within the limit, judged on the admitting nodes' clocks (design §3.4):
/// the log never over in any period ending at one of its admissions (any period: the count
/// only grows at an admission), the counter never over in an aligned window. Under `split`,
/// a period or window that a splitting fault overlaps may also admit `extra_sides` more
/// limits, and one may also admit what it holds of the `orphans`' admissions ((node, from,
/// to): a node that crashed while cut off, design §5). Each stretch between two moments
/// with every node down is judged on its own. Also finds the counter's weighted estimate at
/// its most (reported).
fn check_sliding(
    limits: &[Limit; 2],
    admitted: &mut [Vec<Slid>; 2],
    splits: &[Nanos],
    orphans: &[(usize, Nanos, Nanos)],
    extra_sides: u64,
    outcome: &mut Outcome,
) {
    for (r, all) in admitted.iter_mut().enumerate() {
        all.sort_unstable_by_key(|a| (a.outages, a.at));
        for stretch in all.chunk_by(|a, b| a.outages == b.outages) {
            let at: Vec<Nanos> = stretch.iter().map(|a| a.at).collect();
            // Orphaned admissions up to each one, in the same order.
            let orphaned: Vec<u64> = stretch
                .iter()
                .scan(0, |n, a| {
                    *n += u64::from(
                        orphans
                            .iter()
                            .any(|&(j, from, to)| a.node == j && (from..to).contains(&a.true_at)),
                    );
                    Some(*n)
                })
                .collect();
            check_sliding_stretch(r, &limits[r], &at, &orphaned, splits, extra_sides, outcome);
        }
    }
}

/// A sliding rule's admission, as [`check_sliding`] judges it.
#[derive(Clone, Copy, Debug)]
struct Slid {
    /// Moments with every node down before it.
    outages: usize,
    /// The admitting node's clock.
    at: Nanos,
    /// The admitting node.
    node: usize,
    /// True time.
    true_at: Nanos,
}

/// [`check_sliding`] for sliding rule `r` over one stretch: its admissions `at`, sorted, and
/// how many of those up to each were orphaned.
fn check_sliding_stretch(
    r: usize,
    l: &Limit,
    at: &[Nanos],
    orphaned: &[u64],
    splits: &[Nanos],
    extra_sides: u64,
    outcome: &mut Outcome,
) {
    let sides = split_allowance(splits, extra_sides);
    // Orphaned admissions with a clock in [from, to).
    let orphaned_in = |from: Nanos, to: Nanos| {
        let upto = |t: Nanos| match at.partition_point(|&a| a < t) {
            0 => 0,
            k => orphaned[k - 1],
        };
        upto(to) - upto(from)
    };
    let allowance = |from: Nanos, to: Nanos| sides(from, to) + orphaned_in(from, to);
    let w = l.period();
    let below = |t: Nanos| at.partition_point(|&a| a <= t) as u64;
    let mut worst = outcome.sliding[r];
    let mut judge = |n: u64, allow: u64, what: String| {
        if n.saturating_sub(allow) > worst.0.saturating_sub(worst.1) {
            worst = (n, allow);
        }
        if n > LIMIT + allow {
            outcome.violations.push(format!(
                "{}: {n} admitted in {what}, limit {LIMIT} + {allow} allowed",
                JUDGED[2 + r]
            ));
        }
    };
    if l.algorithm() == Algorithm::SlidingWindowLog {
        for &t in at {
            let n = below(t) - below(t.saturating_sub(w));
            let from = (t + 1).saturating_sub(w);
            judge(
                n,
                allowance(from, t + 1),
                format!("the period ending {t} ns"),
            );
        }
    } else {
        let mut per: BTreeMap<u64, u64> = BTreeMap::new();
        for t in at {
            *per.entry(t / w).or_default() += 1;
        }
        for (&s, &n) in &per {
            judge(n, allowance(s * w, (s + 1) * w), format!("window {s}"));
        }
        for &t in at {
            let s = t / w;
            let elapsed = (t - s * w) as f64 / w as f64;
            let prev = per.get(&s.wrapping_sub(1)).copied().unwrap_or(0) as f64;
            let cur = (below(t) - at.partition_point(|&a| a < s * w) as u64) as f64;
            outcome.counter_estimate = outcome.counter_estimate.max(prev * (1.0 - elapsed) + cur);
        }
    }
    outcome.sliding[r] = worst;
}

/// What `split` allows a window or period `[from, to)` beyond the limit: `extra_sides` more
/// limits where it overlaps the splitting faults' span (design §5), else nothing.
fn split_allowance(splits: &[Nanos], extra_sides: u64) -> impl Fn(Nanos, Nanos) -> u64 {
    let start = splits.iter().copied().min().unwrap_or(0);
    let end = splits.iter().copied().max().unwrap_or(0);
    move |from, to| {
        if from < end && to > start {
            extra_sides * LIMIT
        } else {
            0
        }
    }
}

/// Every window within the limit. Under `split`, a window that a splitting fault overlaps
/// may also admit `extra_sides` more limits.
fn check_windows(
    sim: &Sim,
    splits: &[Nanos],
    outages: &[Nanos],
    extra_sides: u64,
    limit_of: &dyn Fn(u64) -> u64,
    outcome: &mut Outcome,
) {
    let sides = split_allowance(splits, extra_sides);
    let mut per_slot: BTreeMap<(&str, u64, usize), (u64, u64)> = BTreeMap::new();
    for (at, key, slot, cost) in &sim.log {
        let since = outages.partition_point(|&o| o <= *at);
        per_slot.entry((key.as_str(), *slot, since)).or_default().0 += cost;
    }
    for ((key, slot, _), (n, allowance)) in per_slot {
        let allowance = allowance + sides(slot * SECOND, (slot + 1) * SECOND);
        let limit = limit_of(slot);
        outcome.windows.push((slot, n, allowance, limit));
        outcome.admitted += n;
        if n > limit + allowance {
            outcome.violations.push(format!(
                "key {key} window {slot}: {n} admitted, limit {limit} + {allowance} allowed"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds CI runs (`gossamer sim --seeds 1..10000` runs more).
    const CI_SEEDS: std::ops::RangeInclusive<u64> = 1..=24;
    /// Seeds of the wider sweep that once broke an invariant, played too:
    /// - 5476: a node granted room at an instant admitted once and crashed before its next
    ///   frame, then came back before it was suspected; its retirement charged nothing for a
    ///   sparse key (demand 0, nothing held in its last frame), and a sliding log admitted 101
    ///   per 100 once carry let the others use their room (design §5, the retirement's unit).
    const REGRESSION_SEEDS: [u64; 1] = [5476];

    #[test]
    fn fixed_seeds_keep_every_invariant() {
        let mut failed = Vec::new();
        for seed in CI_SEEDS.chain(REGRESSION_SEEDS) {
            let setup = Setup::from_seed(seed);
            let outcome = run(&setup);
            if !outcome.violations.is_empty() {
                failed.push(outcome.describe(&setup));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    /// A rule added node by node, removed from one node and added back (design §3.8,
    /// "Adding and removing a global rule"), each of the four rules in turn, with the drawn
    /// faults (the CI seeds) and alone (40 seeds, no other fault): no window or period over
    /// its limit or allowance, nothing lost, every node agreeing at the end. Without the
    /// guard of an added rule (no starter, no allotment and no key "idle at the record" until
    /// an all-reachable consistent instant), 5 of seeds 1–3000 of `gossamer sim --seeds
    /// 1..3001 --add-rule` broke it, 234 and 534 among them.
    #[test]
    fn rule_additions_keep_every_invariant() {
        let mut failed = Vec::new();
        let setups = CI_SEEDS
            .chain([234, 534])
            .map(Setup::from_seed)
            .chain((1..=40).map(|seed| Setup {
                faults_until: SECOND,
                ..Setup::from_seed(seed)
            }));
        for mut setup in setups {
            setup.add_rule = Some(Setup::added_rule(setup.seed));
            let outcome = run(&setup);
            assert!(
                outcome
                    .schedule
                    .iter()
                    .any(|(_, f)| matches!(f, Fault::RemoveRule(..))),
                "seed {}: no rule removal drawn",
                setup.seed
            );
            if !outcome.violations.is_empty() {
                failed.push(outcome.describe(&setup));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    /// A limit changed node by node (design §3.8), with the drawn faults (the CI seeds) and
    /// alone (40 seeds, no other fault, so nearly every window is judged against the smallest
    /// limit the nodes' configs say): no window over the limit the judge allows. With each
    /// node on its own config's limit instead, 13 of seeds 1–1000 broke it.
    #[test]
    fn limit_changes_keep_every_invariant() {
        let mut failed = Vec::new();
        let with_faults = CI_SEEDS.map(|seed| Setup {
            relimit: true,
            ..Setup::from_seed(seed)
        });
        let alone = (1..=40).map(|seed| Setup {
            relimit: true,
            faults_until: SECOND,
            ..Setup::from_seed(seed)
        });
        for setup in with_faults.chain(alone) {
            let outcome = run(&setup);
            assert!(
                outcome
                    .schedule
                    .iter()
                    .any(|(_, f)| matches!(f, Fault::Relimit(..))),
                "seed {}: no limit change drawn",
                setup.seed
            );
            if !outcome.violations.is_empty() {
                failed.push(outcome.describe(&setup));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    /// The traffic breakdown `gossamer sim --scale` prints accounts for every byte sent, and
    /// a node that checks nothing sends frames with no key.
    #[test]
    fn traffic_by_kind_adds_up_to_the_bytes_sent() {
        let point = scale(4, 3, 7);
        let t = point.traffic;
        let sent = point.bytes_per_node_second * 4.0;
        let kinds = (t.empty_frames + t.frames + t.other) as f64;
        assert!((kinds - sent).abs() < 1.0, "{t:?} against {sent} bytes");
        assert!(t.frames > 0 && t.key_reports >= t.round_frames / 2, "{t:?}");
        assert_eq!(
            t.round_frames,
            4 * 3 * 10,
            "a frame to each peer, each round"
        );

        let rules = vec![(
            "r".to_owned(),
            vec![Limit::new(Algorithm::FixedWindow, 100, SECOND, None).expect("valid")],
        )];
        let mut sim = Sim::new(3, rules, Params::default(), 1);
        sim.advance(SECOND);
        assert_eq!(sim.traffic.key_reports, 0, "{:?}", sim.traffic);
        assert!(sim.traffic.empty_frames > 0 && sim.traffic.frames == 0);
    }

    /// Seed `seed` on every algorithm and a composite rule, 3 to 4 nodes, with a drawn fault
    /// schedule: a hot key per rule and 300 sparse keys, each checked now and then, so keys
    /// go dormant, wake at their slot edges and are listed again by checks and reports.
    /// Returns every decision in order, each node's bytes sent, and every key's status at
    /// the end.
    #[allow(clippy::type_complexity)]
    fn mixed(
        seed: u64,
        visit_all: bool,
    ) -> (
        Vec<(Nanos, usize, usize, u32, Decision)>,
        String,
        Vec<(Nanos, Vec<String>)>,
    ) {
        let on_partition = if seed.is_multiple_of(2) {
            OnPartition::Hold
        } else {
            OnPartition::Split
        };
        let params = Params {
            visit_all,
            on_partition,
            ..Params::default()
        };
        let limit = |alg, limit, period, burst| Limit::new(alg, limit, period, burst).unwrap();
        let rules: Vec<(String, Vec<Limit>)> = vec![
            (
                "fixed".into(),
                vec![limit(Algorithm::FixedWindow, 40, SECOND, None)],
            ),
            (
                "log".into(),
                vec![limit(Algorithm::SlidingWindowLog, 40, 3200 * MS, None)],
            ),
            (
                "counter".into(),
                vec![limit(Algorithm::SlidingWindowCounter, 40, SECOND, None)],
            ),
            (
                "tb".into(),
                vec![limit(Algorithm::TokenBucket, 20, SECOND, Some(20))],
            ),
            (
                "lb".into(),
                vec![limit(Algorithm::LeakyBucket, 20, SECOND, Some(10))],
            ),
            (
                "both".into(),
                vec![
                    limit(Algorithm::FixedWindow, 30, 2 * SECOND, None),
                    limit(Algorithm::TokenBucket, 10, SECOND, Some(10)),
                ],
            ),
        ];
        let names: Vec<String> = rules.iter().map(|(name, _)| name.clone()).collect();
        let n = 3 + (seed / 2 % 2) as usize;
        let mut sim = Sim::new(n, rules, params, seed);
        sim.track = false;
        let setup = Setup {
            nodes: n,
            ..Setup::from_seed(seed)
        };
        sim.advance(300 * MS);
        let plan = schedule(&mut sim, &setup);
        let start = sim.now;
        let mut next = 0;
        let mut healed = false;
        let mut decisions = Vec::new();
        let mut dumps: Vec<(Nanos, Vec<String>)> = Vec::new();
        while sim.now < start + setup.duration {
            while next < plan.len() && start + plan[next].0 <= sim.now {
                apply(&mut sim, &plan[next].1, None);
                next += 1;
            }
            if !healed && sim.now >= start + setup.faults_until {
                healed = true;
                sim.net = Net {
                    delay: MS,
                    ..Net::default()
                };
                for i in 0..n {
                    sim.paused[i] = None;
                    if sim.nodes[i].is_none() {
                        sim.restart_quietly(i);
                    }
                }
            }
            sim.advance(MS);
            if sim.now % (200 * MS) == 50 * MS {
                let mut all = Vec::new();
                for i in (0..n).filter(|&i| sim.nodes[i].is_some()) {
                    all.extend(sim.node(i).dump().into_iter().map(|l| format!("{i} {l}")));
                }
                dumps.push((sim.now, all));
            }
            for i in 0..n {
                if !sim.running(i) || sim.random() % 1000 >= 150 {
                    continue;
                }
                let rule = sim.between(0, names.len() as u64) as usize;
                let key = if sim.random().is_multiple_of(4) {
                    0
                } else {
                    sim.between(1, 301) as u32
                };
                let cost = sim.between(1, 3);
                let d = sim.check(i, &names[rule], &format!("k{key}"), cost);
                decisions.push((sim.now, i, rule, key, d));
            }
        }
        let mut end = format!("bytes {:?}\n", sim.bytes_sent);
        for i in (0..n).filter(|&i| sim.running(i)) {
            let g = sim.node(i);
            for (ri, name) in names.iter().enumerate() {
                for key in 0..=300 {
                    let (_, d) = g.status(ri, &format!("k{key}"), sim.clock(i));
                    let _ = writeln!(end, "{i} {name} k{key} {d:?}");
                }
            }
        }
        (decisions, end, dumps)
    }

    /// The rounds visit only listed keys (`Store::visit_listed`); a dormant key is left
    /// alone until something lists it again. That must change nothing: every decision, every
    /// byte sent and every key's final status are those of visiting every key every time.
    ///
    /// `GOSSAMER_LISTED_SEEDS=1..500` runs more seeds than the ten CI runs. Seed 70 found
    /// that a peer's full frame drops the reports of keys it no longer names without a word
    /// (those keys are now marked changed); seed 182, that a suspicion which comes and goes
    /// over degraded instants changed what the next consistent instant allots every key
    /// (every key is visited when the participants differ from the last consistent
    /// instant's). Seeds 7 and 23 found that a sliding counter may sleep only from an
    /// instant that allotted it (a degraded one does not), and that its allotment also reads
    /// which peers' frames say their starters are closed, so an unchanged one is renewed,
    /// not allotted afresh, while its budget holds.
    #[test]
    fn visiting_only_listed_keys_decides_exactly_as_visiting_every_key() {
        let seeds: Vec<u64> = std::env::var("GOSSAMER_LISTED_SEEDS")
            .ok()
            .and_then(|s| {
                let (a, b) = s.split_once("..")?;
                Some((a.parse::<u64>().ok()?..b.parse::<u64>().ok()?).collect())
            })
            .unwrap_or_else(|| (1..8).chain([23, 70, 182]).collect());
        for seed in seeds {
            let (listed, listed_end, d1) = mixed(seed, false);
            let (all, all_end, d2) = mixed(seed, true);
            for ((t, a), (_, b)) in d1.iter().zip(&d2).filter(|((_, a), (_, b))| a != b) {
                let only_a: Vec<&String> = a.iter().filter(|l| !b.contains(l)).take(3).collect();
                let only_b: Vec<&String> = b.iter().filter(|l| !a.contains(l)).take(3).collect();
                assert!(
                    only_a.is_empty() && only_b.is_empty(),
                    "seed {seed} at {} ms: listed {only_a:#?}\nall {only_b:#?}",
                    (t - START) / MS
                );
            }
            assert!(listed.len() > 1_000, "seed {seed}: {} checks", listed.len());
            let first = listed.iter().zip(&all).position(|(a, b)| a != b);
            assert!(
                first.is_none() && listed.len() == all.len(),
                "seed {seed}: first difference at check {first:?}: {:?} against {:?}",
                first.map(|i| &listed[i]),
                first.map(|i| &all[i]),
            );
            let differ = listed_end
                .lines()
                .zip(all_end.lines())
                .find(|(a, b)| a != b);
            assert!(differ.is_none(), "seed {seed}: at the end, {differ:?}");
        }
    }

    #[test]
    fn a_seed_replays_exactly() {
        let setup = Setup::from_seed(7);
        let a = run(&setup);
        let b = run(&setup);
        assert_eq!(a.describe(&setup), b.describe(&setup));
        assert!(!a.schedule.is_empty());
    }

    /// The sliding judge reads every period a log admission ends, and every aligned window of
    /// a counter, and allows only the crashes it states: a run's "held" means something.
    #[test]
    fn the_sliding_judge_finds_one_over_and_allows_only_what_a_node_cut_off_then_killed_admitted() {
        let limits = [
            Limit::new(Algorithm::SlidingWindowLog, LIMIT, 1600 * MS, None).unwrap(),
            Limit::new(Algorithm::SlidingWindowCounter, LIMIT, SECOND, None).unwrap(),
        ];
        let at = |node: usize, t: Nanos| Slid {
            outages: 0,
            at: START + t,
            node,
            true_at: START + t,
        };
        // 100 at node 0 in the first 1.5 s, all within any period; then one more at 1.59 s
        // (the log's period holds 101) and one in the counter's next window.
        let mut log: Vec<Slid> = (0..100).map(|k| at(0, k * 15 * MS)).collect();
        log.push(at(1, 1590 * MS));
        let judge = |admitted: &mut [Vec<Slid>; 2], orphans: &[(usize, Nanos, Nanos)]| {
            let mut o = Outcome::default();
            check_sliding(&limits, admitted, &[], orphans, 0, &mut o);
            o
        };
        let o = judge(&mut [log.clone(), log.clone()], &[]);
        assert_eq!(o.sliding[0], (101, 0), "{:?}", o.violations);
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
        assert!(
            o.violations[0].starts_with("sliding log: 101"),
            "{:?}",
            o.violations
        );
        // The counter's aligned windows hold 67 + 34: none over; its estimate is read.
        assert_eq!(o.sliding[1].0, 67);
        assert!(o.counter_estimate > 67.0);
        // Node 0 cut off from 1.2 s and killed at 1.3 s: its 7 admissions then are allowed.
        let o = judge(
            &mut [log.clone(), log.clone()],
            &[(0, START + 1200 * MS, START + 1300 * MS)],
        );
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert_eq!(o.sliding[0], (101, 7));
        // Node 1 was the one killed: nothing of node 0's is allowed.
        let o = judge(
            &mut [log.clone(), log],
            &[(1, START + 1200 * MS, START + 1300 * MS)],
        );
        assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
    }
}
