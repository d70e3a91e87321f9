//! One connection to a limiter, and its check: gossamer's `POST /v1/check`, or one of the
//! central-Redis designs as applications implement them with the `redis` crate.
//!
//! Every design enforces the same rule: 100 per second per key.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use redis::aio::MultiplexedConnection;

use crate::machine::wall_us;

/// The rule every design enforces: this many per second per key.
pub const LIMIT: u64 = 100;

/// A central-Redis rate limiter design.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// Fixed window: `GET`, then `SETEX` (first in the window) or `INCR` if under the limit.
    /// Two round trips to admit, and racy: concurrent callers read the same count.
    FixedGetIncr,
    /// Fixed window: `INCR` and `EXPIRE` in one `MULTI`; admit if the count is within the
    /// limit. One round trip, exact.
    FixedIncrExpire,
    /// Sliding-window log in a sorted set: `ZREMRANGEBYSCORE`, `ZCARD`, `ZADD`, `EXPIRE` in one
    /// `MULTI`; admit if the count before adding was under the limit. Every attempt is logged,
    /// admitted or not (the usual recipe).
    SlidingLog,
    /// Token bucket in a Lua script (`EVALSHA`): refill from the elapsed time, take one token.
    LuaBucket,
}

impl Design {
    pub const ALL: [Design; 4] = [
        Design::FixedGetIncr,
        Design::FixedIncrExpire,
        Design::SlidingLog,
        Design::LuaBucket,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Design::FixedGetIncr => "Redis fixed window, GET then INCR/SETEX",
            Design::FixedIncrExpire => "Redis fixed window, INCR+EXPIRE (MULTI)",
            Design::SlidingLog => "Redis sliding log (ZSET in MULTI)",
            Design::LuaBucket => "Redis token bucket (Lua, EVALSHA)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Design::FixedGetIncr => "redis-get-incr",
            Design::FixedIncrExpire => "redis-incr-expire",
            Design::SlidingLog => "redis-sliding-log",
            Design::LuaBucket => "redis-lua-bucket",
        }
    }

    /// The gossamer rule of the same algorithm (see `report::RULES`).
    pub fn gossamer_rule(self) -> &'static str {
        match self {
            Design::FixedGetIncr | Design::FixedIncrExpire => "fw",
            Design::SlidingLog => "log",
            Design::LuaBucket => "tb",
        }
    }
}

/// The token bucket: refill at ARGV[1] per second up to ARGV[2], at time ARGV[3] (µs).
const BUCKET_LUA: &str = r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(s[1]) or burst
local ts = tonumber(s[2]) or now
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate / 1e6) end
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
-- %.0f, not tostring: Lua's tostring keeps 14 digits, fewer than a µs timestamp has.
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens),
  'ts', string.format('%.0f', math.max(now, ts)))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return allowed
";

/// What a load point talks to.
#[derive(Debug, Clone)]
pub enum Target {
    /// gossamer's HTTP check of `rule`.
    Gossamer {
        addr: SocketAddr,
        rule: &'static str,
    },
    /// A Redis design at `addr` (Redis itself, or a proxy in front of it).
    Redis { addr: SocketAddr, design: Design },
    /// Redis `PING`: the round trip alone (to measure the hop).
    Ping { addr: SocketAddr },
}

/// One open connection of a [`Target`].
pub enum Conn {
    Gossamer {
        send: SendRequest<Full<Bytes>>,
        rule: &'static str,
    },
    Redis {
        conn: MultiplexedConnection,
        design: Design,
        script: redis::Script,
        /// Makes sorted-set members unique: this connection's id and a sequence number.
        id: u64,
        seq: u64,
    },
    Ping {
        conn: MultiplexedConnection,
    },
}

impl Conn {
    /// Opens one connection (each worker has its own, as a pool would give it).
    pub async fn open(target: &Target, id: u64) -> Result<Conn, String> {
        match *target {
            Target::Gossamer { addr, rule } => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect gossamer {addr}: {e}"))?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("handshake {addr}: {e}"))?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(Conn::Gossamer { send, rule })
            }
            Target::Redis { addr, design } => Ok(Conn::Redis {
                conn: redis_conn(addr).await?,
                design,
                script: redis::Script::new(BUCKET_LUA),
                id,
                seq: 0,
            }),
            Target::Ping { addr } => Ok(Conn::Ping {
                conn: redis_conn(addr).await?,
            }),
        }
    }

    /// One check of `key` (cost 1); `Ok(true)` if admitted.
    pub async fn check(&mut self, key: &Key) -> Result<bool, String> {
        match self {
            Conn::Gossamer { send, rule } => {
                let body = if *rule == "fw" {
                    key.fw_body.clone()
                } else if *rule == "log" {
                    key.log_body.clone()
                } else {
                    key.tb_body.clone()
                };
                let req = Request::post("/v1/check")
                    .header(HOST, "127.0.0.1")
                    .header(CONTENT_TYPE, "application/json")
                    .body(Full::new(body))
                    .map_err(|e| e.to_string())?;
                send.ready().await.map_err(|e| e.to_string())?;
                let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
                let status = resp.status();
                resp.into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                match status {
                    StatusCode::OK => Ok(true),
                    StatusCode::TOO_MANY_REQUESTS => Ok(false),
                    s => Err(format!("gossamer answered {s}")),
                }
            }
            Conn::Redis {
                conn,
                design,
                script,
                id,
                seq,
            } => {
                let r = redis_check(conn, *design, script, &key.name, *id, seq).await;
                r.map_err(|e| e.to_string())
            }
            Conn::Ping { conn } => {
                let _: String = redis::cmd("PING")
                    .query_async(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(true)
            }
        }
    }
}

async fn redis_conn(addr: SocketAddr) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(format!("redis://{addr}/")).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connect redis {addr}: {e}"))
}

async fn redis_check(
    c: &mut MultiplexedConnection,
    design: Design,
    script: &redis::Script,
    key: &str,
    id: u64,
    seq: &mut u64,
) -> redis::RedisResult<bool> {
    let now = wall_us();
    match design {
        Design::FixedGetIncr => {
            let k = format!("{key}:{}", now / 1_000_000);
            let count: Option<u64> = redis::cmd("GET").arg(&k).query_async(c).await?;
            match count {
                None => {
                    let () = redis::cmd("SETEX")
                        .arg(&k)
                        .arg(1)
                        .arg(1)
                        .query_async(c)
                        .await?;
                    Ok(true)
                }
                Some(n) if n < LIMIT => {
                    let _: u64 = redis::cmd("INCR").arg(&k).query_async(c).await?;
                    Ok(true)
                }
                Some(_) => Ok(false),
            }
        }
        Design::FixedIncrExpire => {
            let k = format!("{key}:{}", now / 1_000_000);
            let (n, _): (u64, i64) = redis::pipe()
                .atomic()
                .incr(&k, 1)
                .expire(&k, 1)
                .query_async(c)
                .await?;
            Ok(n <= LIMIT)
        }
        Design::SlidingLog => {
            *seq += 1;
            let member = format!("{now}-{id}-{seq}");
            let (_, n, _, _): (i64, u64, i64, i64) = redis::pipe()
                .atomic()
                .cmd("ZREMRANGEBYSCORE")
                .arg(key)
                .arg("-inf")
                .arg(now.saturating_sub(1_000_000))
                .cmd("ZCARD")
                .arg(key)
                .cmd("ZADD")
                .arg(key)
                .arg(now)
                .arg(member)
                .expire(key, 1)
                .query_async(c)
                .await?;
            Ok(n < LIMIT)
        }
        Design::LuaBucket => {
            let allowed: i64 = script
                .key(key)
                .arg(LIMIT)
                .arg(LIMIT)
                .arg(now)
                .invoke_async(c)
                .await?;
            Ok(allowed == 1)
        }
    }
}

/// One key, with its name for Redis and gossamer's request bodies prebuilt (so no target
/// pays for formatting the other does not).
#[derive(Debug, Clone)]
pub struct Key {
    pub name: String,
    fw_body: Bytes,
    log_body: Bytes,
    tb_body: Bytes,
}

impl Key {
    pub fn new(name: String) -> Key {
        let body = |rule: &str| Bytes::from(format!(r#"{{"rule":"{rule}","key":"{name}"}}"#));
        Key {
            fw_body: body("fw"),
            log_body: body("log"),
            tb_body: body("tb"),
            name,
        }
    }
}
