-- wrk script: POST the JSON body from $BENCH_BODY; print one machine-readable summary line.
-- No response() callback on purpose: defining one makes wrk hand every response to Lua,
-- which costs load-generator CPU on the core shared with the target.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
-- The gateway's virtual key (the other targets ignore it).
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "sk-bench")

function done(summary, latency, requests)
  local e = summary.errors
  -- wrk counts a response with status > 399 in errors.status (our "non-2xx").
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
