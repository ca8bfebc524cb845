"""The protected resource: a counter that is not a lock node, written read-modify-write so that
two writers at once lose an update, in three modes.

- ``unfenced``: every write is applied.
- ``fenced``: a write whose fencing token is lower than the highest seen is rejected.
- ``checked`` (N = 1): the resource lives on the lock's own node and a write is applied only
  while the lock key still holds the writer's token (a guarded write, like etcd's ``IsOwner``
  comparison in a transaction). The core offers no such helper, so it is a script of ours.

Every write attempt, applied or not, is appended by the same script to a log list, so the
order of application is the server's own. The checker finds lost updates in it: an applied
write whose value read earlier is not the counter's value just before it was applied.
"""

from __future__ import annotations

import json

import redis

COUNTER = "faults:resource:counter:"
MAXFENCE = "faults:resource:maxfence:"
LOG = "faults:resource:log"

# KEYS: counter, maxfence, log. ARGV: mode, client, fence ('' = none), read value, written
# value, lock key.
_WRITE = """
local mode, fence = ARGV[1], ARGV[3]
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
local maxfence = tonumber(redis.call('GET', KEYS[2]) or '0')
local ok = 1
if mode == 'fenced' then
  if fence == '' or tonumber(fence) < maxfence then
    ok = 0
  else
    redis.call('SET', KEYS[2], fence)
  end
end
if ok == 1 then
  redis.call('SET', KEYS[1], ARGV[5])
end
redis.call('RPUSH', KEYS[3], cjson.encode({client = ARGV[2], fence = fence, read = tonumber(ARGV[4]),
  written = tonumber(ARGV[5]), before = before, maxfence = maxfence, ok = ok, mode = mode,
  key = ARGV[6]}))
return ok
"""

# KEYS: lock key, counter, maxfence, log. ARGV: token, client, fence, read, written, lock key.
_CHECKED = """
local t = redis.call('TYPE', KEYS[1])['ok']
local mine = false
if t == 'string' then
  mine = redis.call('GET', KEYS[1]) == ARGV[1]
elseif t == 'hash' then
  mine = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
end
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
local ok = 0
if mine then
  ok = 1
  redis.call('SET', KEYS[2], ARGV[5])
end
redis.call('RPUSH', KEYS[4], cjson.encode({client = ARGV[2], fence = ARGV[3], read = tonumber(ARGV[4]),
  written = tonumber(ARGV[5]), before = before, ok = ok, mode = 'checked', key = ARGV[6]}))
return ok
"""


# KEYS: counter, maxfence. ARGV: fence. A fenced read raises the highest fence seen, so that
# a stale holder's write cannot land between a newer holder's read and its write.
_FENCED_READ = """
local maxfence = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < maxfence then
  return -1
end
redis.call('SET', KEYS[2], ARGV[1])
return tonumber(redis.call('GET', KEYS[1]) or '0')
"""


class ResourceClient:
    """Used inside a client process: read the counter, write it back + 1."""

    def __init__(self, port: int) -> None:
        self.r = redis.Redis(port=port, socket_timeout=10, decode_responses=True)
        self._write = self.r.register_script(_WRITE)
        self._checked = self.r.register_script(_CHECKED)
        self._fenced_read = self.r.register_script(_FENCED_READ)

    def read(self, key: str, mode: str = "unfenced", fence: int | None = None) -> int | None:
        """The counter of lock ``key``; None when a fenced read is refused (a newer fence was
        seen). Each lock key has its own counter and highest fence: fences of different keys
        are not ordered."""
        if mode == "fenced":
            v = int(self._fenced_read(keys=[COUNTER + key, MAXFENCE + key], args=[fence or 0]))
            return None if v < 0 else v
        return int(self.r.get(COUNTER + key) or 0)

    def write(self, mode: str, client: str, fence: int | None, read: int, written: int,
              lock_key: str = "", token: str = "") -> bool:
        f = "" if fence is None else str(fence)
        if mode == "checked":
            return bool(self._checked(keys=[lock_key, COUNTER + lock_key, MAXFENCE + lock_key, LOG],
                                      args=[token, client, f, read, written, lock_key]))
        return bool(self._write(keys=[COUNTER + lock_key, MAXFENCE + lock_key, LOG],
                                args=[mode, client, f, read, written, lock_key]))


def read_log(port: int) -> list[dict]:
    r = redis.Redis(port=port, socket_timeout=10, decode_responses=True)
    return [json.loads(x) for x in r.lrange(LOG, 0, -1)]
