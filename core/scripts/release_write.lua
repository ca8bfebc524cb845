-- Redisson's write unlock: one hold fewer; the last one drops our writer field and, with no
-- live read hold left (ours, taken under the write lock), deletes the hash, otherwise hands the
-- hash to those readers (mode 'read'). Either way it publishes "1" on Redisson's channel:
-- every waiter re-checks, so every reader at the front of the queue can go (Redisson's own
-- write unlock publishes nothing when read holds are left; its readers then wait for a poll).
-- Handed to read holds, the key goes with the longest of their hold keys.
-- KEYS[1] lock key, KEYS[2] this call's latch, KEYS[3] this hold's mark (see
-- release_reentrant.lua: the count is taken only with it), KEYS[4] the prefix of every
-- reader's timeout keys ("{name}" or the name with a '{') (one slot).
-- ARGV[1] the writer's field ("<field>:write"), ARGV[2] unused, ARGV[3] channel, ARGV[4] '1' =
-- SPUBLISH, ARGV[5] the latch's PX in ms.
-- Returns nil when we hold no write lock (or this hold lapsed), 0 when still held (another
-- write hold of ours is live), 1 when released.
-- Safe to run twice, however late: the mark is taken once; the reply is kept in the latch (a
-- re-send run after it expired finds no mark and answers nil, having taken nothing).
local done = redis.call('GET', KEYS[2])
if done then
  return tonumber(done)
end
-- Our write field goes (no write hold of ours is left here), and the key with it, or to the
-- read holds left.
local function let_go()
  redis.call('HDEL', KEYS[1], ARGV[1])
  -- The read holds left are ours, taken under the write hold; one whose lease ran out keeps its
  -- field but not its hold keys. Handed to such holds alone, the key stayed read-held with
  -- nobody holding it for the rest of the hash's TTL (the write lease): freed instead, as a read
  -- release that finds no live reader frees it. Handed to live ones, the hash goes with the
  -- longest of their hold keys, as a read release leaves it (`keep_for_read_holds`).
  if keep_for_read_holds(KEYS[1], KEYS[4]) then
    redis.call('HSET', KEYS[1], 'mode', 'read')
  else
    redis.call('DEL', KEYS[1])
  end
  redis.call(ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[3], '1')
end

if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) ~= 1 then
  return nil
end
-- Without its mark this hold has no count here (its lease ran out, or its grant never reached
-- this node); the owner's field is another hold's: not ours to release, as a lapsed lock's.
-- (0, "still held", made its caller's release say that this hold was released in time.)
if redis.call('DEL', KEYS[3]) == 0 then
  -- Our write holds all lapsed here too (a downgrade's read hold keeps the hash): their count
  -- is nobody's, and kept, it held the key write-held for as long as the read hold lived (for
  -- ever with its watchdog on), every other reader waiting. Let go, still answering nil.
  local holds, _, prefix = hold_names(KEYS[3], ARGV[1])
  if not any_live(holds, prefix) then
    let_go()
  end
  return nil
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
-- A count left with no live write hold of ours behind it (holds whose leases ran out) is
-- nobody's: kept, it held the key for a ttl with nobody holding it (see holds.lua).
local others = others_live(KEYS[3], ARGV[1])
if count > 0 and others then
  redis.call('SET', KEYS[2], '0', 'PX', ARGV[5])
  return 0
end
let_go()
redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
return 1
