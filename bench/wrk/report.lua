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
--
-- wrk 4 hands done() its latencies corrected for coordinated omission: for
-- every answer slower than the mean interval between two answers of a
-- connection, it adds samples as if requests had kept arriving at that rate
-- meanwhile. With one connection answering in tens of microseconds, one
-- stall of a few milliseconds adds a hundred samples. A thread with one
-- connection, whose requests and answers alternate, can time each request
-- itself (report.time_requests() in init()): done() then also prints
-- `service_latency_us`, the percentiles of those times, uncorrected.

local report = {}

local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } trainstate_timespec;
int clock_gettime(int clock_id, trainstate_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local timespec = ffi.new("trainstate_timespec")

local function now_us()
   ffi.C.clock_gettime(CLOCK_MONOTONIC, timespec)
   return tonumber(timespec.tv_sec) * 1000000 + tonumber(timespec.tv_nsec) / 1000
end

local threads = {}

-- Numbers each thread from 1 (its global `thread_no`) and keeps it for done().
function report.setup(thread)
   table.insert(threads, thread)
   thread:set("thread_no", #threads)
end

-- Times each request of this thread from its sending to its answer: only
-- for a thread with one connection.
function report.time_requests()
   service_us = {}
end

-- Counts one request built by this thread; returns how many it built.
function report.sent()
   sent = (sent or 0) + 1
   if service_us then
      sent_at_us = now_us()
   end
   return sent
end

-- Counts one answer of this thread by its status.
function report.answered(status)
   counts = counts or {}
   local key = tostring(status)
   counts[key] = (counts[key] or 0) + 1
   if service_us and sent_at_us then
      local us = math.floor(now_us() - sent_at_us)
      service_us[us] = (service_us[us] or 0) + 1
      sent_at_us = nil
   end
end

-- `"service_latency_us":{...},` from the threads' timed requests, or "".
local function service_latency()
   local merged, any = {}, false
   for _, thread in ipairs(threads) do
      for us, n in pairs(thread:get("service_us") or {}) do
         merged[us] = (merged[us] or 0) + n
         any = true
      end
   end
   if not any then
      return ""
   end
   local values, count, sum = {}, 0, 0
   for us, n in pairs(merged) do
      table.insert(values, us)
      count = count + n
      sum = sum + us * n
   end
   table.sort(values)
   local function percentile(p)
      local rank = math.max(1, math.ceil(count * p / 100))
      local seen = 0
      for _, us in ipairs(values) do
         seen = seen + merged[us]
         if seen >= rank then
            return us
         end
      end
      return values[#values]
   end
   return string.format(
      "\"service_latency_us\":{\"count\":%d,\"min\":%d,\"p50\":%d,\"p90\":%d,\"p99\":%d," ..
      "\"max\":%d,\"mean\":%.1f},",
      count, values[1], percentile(50), percentile(90), percentile(99), values[#values], sum / count)
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
      "trainstate-wrk {\"status\":{%s},\"sent\":%d,\"duration_us\":%d,\"responses\":%d,%s" ..
      "\"errors\":{\"connect\":%d,\"read\":%d,\"write\":%d,\"status\":%d,\"timeout\":%d}," ..
      "\"latency_us\":{\"min\":%d,\"p50\":%d,\"p90\":%d,\"p99\":%d,\"max\":%d,\"mean\":%.1f}}\n",
      table.concat(parts, ","), sent_all, summary.duration, summary.requests, service_latency(),
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean))
end

return report
