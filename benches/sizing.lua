-- wrk script for benches/sizing.sh: POST /v1/check of rule `sizing`, each request a new key
-- ("key-0000000", ...) until NKEYS keys (environment, default 1,000,000), then around again.
-- Prints: RESULT requests=N duration_s=S non2xx=D socket_errors=E

local NKEYS = tonumber(os.getenv("NKEYS") or "1000000")
-- Must match wrk's -t: each thread's Lua state sees only its own id, not the thread count.
local THREADS = tonumber(os.getenv("THREADS") or "2")
local counter = 0
local next_id = 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  counter = 0
end

function request()
  -- Threads take interleaved keys, so together they cover 0 .. NKEYS-1 once.
  local k = (counter * THREADS + (id or 0)) % NKEYS
  counter = counter + 1
  return wrk.format(nil, "/v1/check", nil, string.format('{"rule":"sizing","key":"key-%07d"}', k))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_s=%.3f non2xx=%d socket_errors=%d\n",
    summary.requests, summary.duration / 1e6, e.status, e.connect + e.read + e.write + e.timeout))
end
