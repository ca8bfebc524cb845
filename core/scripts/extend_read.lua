-- A reader's renewal: its own hold keys to the ttl, and the hash only upward (never shorter:
-- the other readers' deadlines follow it). Redisson's read renewal sets the hash to its lease
-- (30 s) whatever it was, so the reply is the hash's PTTL after ours: the reader's deadline
-- follows it (a Redisson reader may have shortened it since our last renewal, never below
-- what this reply says plus Redisson's next renewal's 30 s).
-- KEYS[1] lock key, KEYS[2] our timeout prefix (one slot); ARGV[1] field, ARGV[2] ttl ms.
-- Returns 0 when we hold no read lock, else the hash's PTTL in ms (-1: no expiry).
local count = tonumber(redis.pcall('HGET', KEYS[1], ARGV[1]))
if not count then
  return 0
end
for i = 1, count do
  redis.call('PEXPIRE', KEYS[2] .. ':' .. i, ARGV[2])
end
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  left = tonumber(ARGV[2])
end
return left
