-- Registers training runs on a trainstate head, one fresh run id per request.
--
--   TRAINSTATE_WRK_BODY=run.json wrk -t2 -c64 -d10s -s bench/wrk/register.lua http://127.0.0.1:PORT
--
-- Environment:
--   TRAINSTATE_WRK_BODY    (required) a file holding one run document (POST
--                          /api/train/runs) whose "id" is the text @RUN_ID@;
--                          `cargo xtask bench --path wrk` writes it, W workers a run.
--   TRAINSTATE_WRK_PREFIX  the start of every run id (default: from the clock);
--                          ids are PREFIX-<thread>-<n>, unique across wrk's threads.
--   TRAINSTATE_WRK_PREFER  "minimal": send `Prefer: return=minimal` (RFC 7240).
--
-- wrk runs for its -d duration. Requests in flight when it stops (at most one
-- per connection) may be committed without their answer being counted.
--
-- done() prints one line, `trainstate-wrk {...}` (JSON): answers counted by
-- status, requests sent, wrk's socket errors and latency percentiles (µs).
-- Every answer that is not 2xx is a failure.

local threads = {}
local next_thread = 1

function setup(thread)
   thread:set("thread_no", next_thread)
   table.insert(threads, thread)
   next_thread = next_thread + 1
end

local prefix_body, suffix_body, path, headers, run_prefix

function init(args)
   local file = os.getenv("TRAINSTATE_WRK_BODY")
   if file == nil or file == "" then
      error("TRAINSTATE_WRK_BODY must name a file holding one run document with \"id\":\"@RUN_ID@\"")
   end
   local f = assert(io.open(file, "rb"))
   local template = f:read("*a")
   f:close()
   local at = string.find(template, "@RUN_ID@", 1, true)
   if at == nil then
      error(file .. ": the run document holds no @RUN_ID@ placeholder")
   end
   prefix_body = string.sub(template, 1, at - 1)
   suffix_body = string.sub(template, at + string.len("@RUN_ID@"))
   run_prefix = os.getenv("TRAINSTATE_WRK_PREFIX") or string.format("wrk%x", os.time())
   path = "/api/train/runs"
   headers = { ["Content-Type"] = "application/json" }
   if os.getenv("TRAINSTATE_WRK_PREFER") == "minimal" then
      headers["Prefer"] = "return=minimal"
   end
   sent = 0
   answered = 0
   counts = {}
end

function request()
   sent = sent + 1
   local id = run_prefix .. "-" .. thread_no .. "-" .. sent
   return wrk.format("POST", path, headers, prefix_body .. id .. suffix_body)
end

function response(status, headers, body)
   local key = tostring(status)
   counts[key] = (counts[key] or 0) + 1
   answered = answered + 1
end

function done(summary, latency, requests)
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
