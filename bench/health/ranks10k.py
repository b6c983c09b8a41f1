"""Joins 1,250 rendezvous groups of 8 ranks (10,000 ranks) on a head and
writes wrk's request list: each rank's heartbeat with a progress report."""
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url = sys.argv[1]
GROUPS, WORLD = 1250, 8
def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())
def worker(g, rank):
    node = rank // 4
    return {"actor_id": f"{g:08x}{rank:024x}", "world_rank": rank, "local_rank": rank % 4, "node_rank": node,
            "node_id": f"{g:028x}{node:028x}", "node_ip": f"10.{g // 250}.{g % 250}.{node + 1}", "pid": 1000 + rank,
            "gpu_ids": [], "status": "ALIVE", "resources": {"CPU": 1.0}}
def group(g):
    run = None
    for rank in range(WORLD):
        a = post(f"/api/train/rendezvous/k{g}/join", {"world_size": WORLD, "worker": worker(g, rank), "name": f"sim-{g}", "job_id": str(g)})
        run = a["run_id"]
    return run
with ThreadPoolExecutor(8) as pool:
    runs = list(pool.map(group, range(GROUPS)))
with open("requests.tsv", "w") as f:
    for i, run in enumerate(runs):
        for rank in range(WORLD):
            body = {"attempt_id": "0", "progress": {"step": 100 + i, "total_steps": 100000, "phase": "train",
                    "metrics": {"loss": 0.25, "lr": 0.001, "grad_norm": 1.5, "tokens_per_s": 12345.0}}}
            f.write(f"POST\t/api/train/runs/{run}/ranks/{rank}/heartbeat\t{json.dumps(body)}\n")
print(len(runs) * WORLD, "ranks")
