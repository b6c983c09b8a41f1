-- wrk script: registers a fresh run per request on POST /api/train/runs and
-- counts every answer that is not 2xx.
--
--   wrk -t2 -c64 -d10s -s bench/wrk/register_minimal_probe.lua http://127.0.0.1:8266 -- 8 minimal
--
-- Arguments: workers per run (default 8); "minimal" to send
-- `Prefer: return=minimal` (default: the full answer, echoing the run).
-- Ids are `wrk-<start>-<thread>-<counter>`: fresh in every request, and
-- distinct between runs of the script.

local threads = {}
local counter = 0

function setup(thread)
   thread:set("tid", #threads + 1)
   thread:set("nonce", tostring(os.time()))
   table.insert(threads, thread)
end

local workers = 8
local minimal = false
local prefix = ""
local suffix = ""
-- Globals, so that `done` can read each thread's counts.
non2xx = 0
answers = 0
created = 0
first_error = nil

local function worker(w)
   return string.format(
      '{"actor_id":"%032x","world_rank":%d,"local_rank":%d,"node_rank":%d,'
         .. '"node_id":"%056x","node_ip":"127.0.0.1","pid":%d,"gpu_ids":[],'
         .. '"status":"ALIVE","resources":{"CPU":1.0,"GPU":0.0}}',
      w + 1, w, w % 8, math.floor(w / 8), math.floor(w / 8) + 1, 10000 + w)
end

function init(args)
   workers = tonumber(args[1] or "8")
   minimal = args[2] == "minimal"
   local ws, rs = {}, {}
   for w = 0, workers - 1 do
      ws[#ws + 1] = worker(w)
      rs[#rs + 1] = '{"CPU":1.0,"GPU":0.0}'
   end
   prefix = '{"name":"wrk-run","job_id":"01000000",'
      .. '"controller_actor_id":"0000000000000000000000000000c0de",'
      .. '"workers":[' .. table.concat(ws, ",") .. '],'
      .. '"datasets":[{"name":"train","dataset_uuid":"ds-uuid-1","dataset_name":null}],'
      .. '"run_status":"RUNNING","status_detail":"","end_time_ms":null,'
      .. '"resources":[' .. table.concat(rs, ",") .. '],'
   wrk.method = "POST"
   wrk.path = "/api/train/runs"
   wrk.headers["Content-Type"] = "application/json"
   if minimal then
      wrk.headers["Prefer"] = "return=minimal"
   end
end

local base_ms = os.time() * 1000

function request()
   counter = counter + 1
   local body = prefix
      .. string.format('"id":"wrk-%s-%d-%d","start_time_ms":%d}', nonce, tid, counter, base_ms + counter)
   return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
   answers = answers + 1
   if status < 200 or status > 299 then
      non2xx = non2xx + 1
      if first_error == nil then
         first_error = status .. " " .. body
      end
   elseif status == 201 then
      created = created + 1
   end
end

function done(summary, latency, requests)
   local total_non2xx, total_answers, total_created = 0, 0, 0
   for _, thread in ipairs(threads) do
      total_non2xx = total_non2xx + thread:get("non2xx")
      total_answers = total_answers + thread:get("answers")
      total_created = total_created + thread:get("created")
      local err = thread:get("first_error")
      if err ~= nil then
         io.write("first error: " .. err .. "\n")
      end
   end
   io.write(string.format("answers %d created %d non2xx %d\n", total_answers, total_created, total_non2xx))
end
