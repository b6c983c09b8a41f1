-- Sends a fixed list of requests to a trainstate head, over and over: the
-- reads and heartbeats of `cargo xtask bench --path wrk-reads`.
--
--   TRAINSTATE_WRK_REQUESTS=requests.tsv wrk -t2 -c64 -d5s -s bench/wrk/cycle.lua http://127.0.0.1:PORT -- 2
--
-- Environment:
--   TRAINSTATE_WRK_REQUESTS  (required) a file of requests, one a line:
--                            METHOD <tab> PATH, or METHOD <tab> PATH <tab> BODY
--                            (a JSON body, sent with Content-Type: application/json).
-- Arguments (after --): the number of wrk threads (-t), so that each thread
-- starts at its own place in the list (thread k of T at line (k-1)·n/T + 1),
-- and of connections (-c); 1 when absent. Each thread then takes the lines in
-- order, wrapping around. With one connection a thread, each request is also
-- timed by the script (`service_latency_us` in the report, see report.lua).
--
-- done() prints one line, `trainstate-wrk {...}` (JSON, report.lua beside this
-- script): answers counted by status, requests sent, wrk's socket errors and
-- latency percentiles (µs). The driver decides which statuses are failures.

local report = dofile((string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "") .. "report.lua")

setup = report.setup
done = report.done

local requests = {}
local next_request

function init(args)
   local file = os.getenv("TRAINSTATE_WRK_REQUESTS")
   if file == nil or file == "" then
      error("TRAINSTATE_WRK_REQUESTS must name a file of requests, one a line: METHOD<tab>PATH[<tab>BODY]")
   end
   local json = { ["Content-Type"] = "application/json" }
   for line in io.lines(file) do
      if line ~= "" then
         local method, path, body = string.match(line, "^(%u+)\t([^\t]+)\t?(.*)$")
         if method == nil then
            error(file .. ": not METHOD<tab>PATH[<tab>BODY]: " .. line)
         end
         if body == "" then
            table.insert(requests, wrk.format(method, path))
         else
            table.insert(requests, wrk.format(method, path, json, body))
         end
      end
   end
   if #requests == 0 then
      error(file .. " holds no request")
   end
   local thread_count = tonumber(args[1]) or 1
   local connections = tonumber(args[2]) or 1
   next_request = math.floor((thread_no - 1) * #requests / thread_count) % #requests + 1
   if connections == thread_count then
      report.time_requests()
   end
end

function request()
   report.sent()
   local req = requests[next_request]
   next_request = next_request % #requests + 1
   return req
end

function response(status, headers, body)
   report.answered(status)
end
