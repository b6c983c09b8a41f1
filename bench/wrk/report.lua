-- What every trainstate wrk script counts and prints, loaded by the script
-- beside it:
--
--   local report = dofile((string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "") .. "report.lua")
--
-- Each wrk thread counts the requests it built (report.sent()) and the
-- answers by status (report.answered(status)); setup() and done() run in
-- wrk's main state and add them up over the threads. done() prints one line,
-- `trainstate-wrk {...}` (JSON): answers by status, requests sent, wrk's
-- measured time and socket errors, and latency percentiles (µs), which
-- `cargo xtask bench` reads.

local report = {}

local threads = {}

-- Numbers each thread from 1 (its global `thread_no`) and keeps it for done().
function report.setup(thread)
   table.insert(threads, thread)
   thread:set("thread_no", #threads)
end

-- Counts one request built by this thread; returns how many it built.
function report.sent()
   sent = (sent or 0) + 1
   return sent
end

-- Counts one answer of this thread by its status.
function report.answered(status)
   counts = counts or {}
   local key = tostring(status)
   counts[key] = (counts[key] or 0) + 1
end

-- Prints the `trainstate-wrk` line.
function report.done(summary, latency, requests)
   local total = {}
   local sent_all = 0
   for _, thread in ipairs(threads) do
      sent_all = sent_all + (thread:get("sent") or 0)
      for status, n in pairs(thread:get("counts") or {}) do
         total[status] = (total[status] or 0) + n
      end
   end
   local parts = {}
   for status, n in pairs(total) do
      table.insert(parts, string.format("%q:%d", status, n))
   end
   local e = summary.errors
   io.write(string.format(
      "trainstate-wrk {\"status\":{%s},\"sent\":%d,\"duration_us\":%d,\"responses\":%d," ..
      "\"errors\":{\"connect\":%d,\"read\":%d,\"write\":%d,\"status\":%d,\"timeout\":%d}," ..
      "\"latency_us\":{\"min\":%d,\"p50\":%d,\"p90\":%d,\"p99\":%d,\"max\":%d,\"mean\":%.1f}}\n",
      table.concat(parts, ","), sent_all, summary.duration, summary.requests,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean))
end

return report
