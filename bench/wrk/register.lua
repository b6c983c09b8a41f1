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
-- done() prints one line, `trainstate-wrk {...}` (JSON, report.lua beside
-- this script): answers counted by status, requests sent, wrk's socket errors
-- and latency percentiles (µs). Every answer that is not 2xx is a failure.

local report = dofile((string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "") .. "report.lua")

setup = report.setup
done = report.done

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
end

function request()
   local id = run_prefix .. "-" .. thread_no .. "-" .. report.sent()
   return wrk.format("POST", path, headers, prefix_body .. id .. suffix_body)
end

function response(status, headers, body)
   report.answered(status)
end
