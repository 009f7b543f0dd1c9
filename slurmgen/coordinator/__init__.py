"""The coordinator: `slurmgen serve`, `slurmgen agent` and the `slurmgen group` client.

A server (FastAPI on uvicorn, state in one SQLite file) knows every worker on every node;
people put workers into groups, give a group its torch.distributed config, and start it.
One agent per node registers its workers as `<host>-<id>` and heartbeats every second; each
heartbeat reports what runs and carries back what should run (the server reconciles desired
against reported state, so a restarted server or a reconnecting agent needs no replay). The
agent starts each rank in its own process group with the torchrun environment and kills its
ranks if it dies. One failed rank, a silent agent or a stale trainer heartbeat ends the whole
attempt (fail as one). Modules: `models` (the API's pydantic models, shared with the client),
`ranks` (the seed's rank rule over `slurmgen.generate.topology`), `state` (pure transitions), `store`
(the only SQLite user), `service` (the behaviour, one lock) with `agent_beat` (one agent
report) and `changes` (the long poll that wakes agents), `server` (FastAPI), `node_agent` with
`procs` (the ranks' processes) and `watchdog` (the program that kills them when the agent dies),
`client` (httpx), `tokens`, `cli`. The web page lives in `web/` and is mounted by
`server.create_app` when present. Needs the `serve` extra, except `models`, `ranks` and
`state`, which import pydantic only.

JSON API (all under /api, all but /api/health need `Authorization: Bearer <token>`):
    GET    /api/health                      liveness, no token
    GET    /api/workers                     every worker (WorkerOut)
    POST   /api/workers/move                MoveRequest -> list[WorkerOut]; 409 if one runs
    DELETE /api/workers/{name}              forget a lost/idle worker; 409 if it runs
    GET    /api/groups                      list[GroupOut]
    POST   /api/groups                      GroupCreate -> GroupOut; 409 if it exists
    GET    /api/groups/{name}               GroupDetail (group, members with ranks, attempts)
    DELETE /api/groups/{name}               409 while active; members become ungrouped
    PUT    /api/groups/{name}/config        GroupConfig -> GroupOut; 409 while active
    GET    /api/groups/{name}/ranks         list[RankOut] the plan the config gives today
    POST   /api/groups/{name}/start         -> GroupOut; 409 if active or not startable
    POST   /api/groups/{name}/stop          -> GroupOut
    GET    /api/groups/{name}/logs          ?rank=&attempt=&after=&limit=&tail= -> list[LogLine],
                                            X-Lines-Skipped: the lines the limit left out ("N+": at least)
    POST   /api/agents/heartbeat            AgentReport -> AgentOrders (agents only)
    POST   /api/agents/lines                AgentLines -> 204: output lines sent between beats (agents only)
    GET    /api/agents/changes              ?since=V&timeout=S -> Changed; long poll (agents)
"""
