-- wrk script: each request picks a random "PATH TOKEN" line of the file named after `--`,
-- and the run ends with one JSON line of totals and latency percentiles (microseconds).
local targets = {}

function init(args)
  for line in io.lines(args[1]) do
    local path, token = line:match("^(%S+) (%S+)$")
    if path then targets[#targets + 1] = { path, token } end
  end
  math.randomseed(os.time() + math.floor(os.clock() * 1000000))
end

function request()
  local t = targets[math.random(#targets)]
  return wrk.format("GET", t[1], { ["Authorization"] = "Bearer " .. t[2] })
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p99_us":%d,"socket_errors":%d,"non2xx":%d}\n',
    summary.requests, summary.duration, summary.bytes, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
