-- wrk script for benches/cluster_figures.sh (cluster traffic with many active keys):
-- POST /v1/check for rule `win`, cycling over NKEYS keys "<prefix>-0000000".. with a fixed
-- pause between a connection's requests, so that the check rate is set by
-- connections x 1000 / (DELAY_MS + latency) rather than by how fast the node answers.
--
--   wrk -t1 -c9 -d25s -s benches/cluster_keys.lua URL -- PREFIX OFFSET [NKEYS] [DELAY_MS]
--
-- Each wrk thread walks the keys in order from OFFSET, so several wrk processes started at
-- different offsets touch every key from several nodes. done() prints one line:
--   RESULT requests=N duration_s=S rps=R non2xx=D socket_errors=E

local prefix = "k"
local counter = 0
local nkeys = 10000
local delay_ms = 5

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function init(args)
  prefix = args[1] or prefix
  counter = tonumber(args[2] or "0")
  nkeys = tonumber(args[3] or "10000")
  delay_ms = tonumber(args[4] or "5")
end

function delay()
  return delay_ms
end

function request()
  counter = counter + 1
  local body = string.format('{"rule":"win","key":"%s-%07d","cost":1}', prefix, counter % nkeys)
  return wrk.format(nil, "/v1/check", nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format("RESULT requests=%d duration_s=%.3f rps=%.1f non2xx=%d socket_errors=%d\n",
    summary.requests, seconds, summary.requests / seconds, e.status,
    e.connect + e.read + e.write + e.timeout))
end
