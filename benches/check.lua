-- wrk script for benches/http_load.sh: POST /v1/check with a JSON body, rotating over
-- NKEYS keys ("user-0000000" .. "user-0009999", 12 bytes) of the built-in `default` rule
-- (token bucket, 100 per second per key). At any rate below 100 x NKEYS = 1,000,000 checks/s
-- every key stays under its limit, so nearly every check is admitted (200); the few 429s
-- are counted in `non2xx` of the result line.
--
-- done() prints one parseable line:
--   RESULT requests=N duration_s=S rps=R p50_us=A p99_us=B p999_us=C non2xx=D socket_errors=E

local NKEYS = 10000
local counter = 0
local threads = {}

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function setup(thread)
  -- Each wrk thread has its own Lua state; start them at different keys.
  thread:set("offset", #threads * 5003)
  table.insert(threads, thread)
end

function init(args)
  counter = offset or 0
end

function request()
  counter = counter + 1
  local body = string.format('{"rule":"default","key":"user-%07d","cost":1}', counter % NKEYS)
  return wrk.format(nil, "/v1/check", nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "RESULT requests=%d duration_s=%.3f rps=%.1f p50_us=%d p99_us=%d p999_us=%d non2xx=%d socket_errors=%d\n",
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    e.status, e.connect + e.read + e.write + e.timeout))
end
