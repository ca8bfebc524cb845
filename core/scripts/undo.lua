-- Undoes a fresh grant that did not make a quorum (or came too late), and puts the waiter back
-- in the queue with its score, atomically: a partial grant dequeued us on the nodes that
-- granted, and without this the nodes would disagree on who is first (the Redlock split-queue
-- livelock; see DESIGN.md, "Waiter queue").
-- KEYS[1] lock key, KEYS[2] unused, KEYS[3] queue, KEYS[4] queue leases, KEYS[5] queue join
-- times (one slot).
-- ARGV[1] token (plain) or field (reentrant), ARGV[2] '1' reentrant, ARGV[3] Redisson's channel
-- (reentrant) or the prefix of the waiters' own channels (plain), ARGV[4] waiter id, ARGV[5]
-- queue score, ARGV[6] lease ms, ARGV[7] barging bound ms, ARGV[8] '1' = sharded pub/sub
-- (SPUBLISH), KEYS[6] this call's latch (`ferrolock:latch:{key}:<call id>`), ARGV[9] its PX
-- in ms, KEYS[7] (reentrant) the attempt's hold mark (`ferrolock:hold:{key}:<hold id>`: the
-- count is taken only with it, see release_reentrant.lua). Waiter id '': compare-and-delete
-- only (an undo sent late, or for a caller that no longer waits: no re-enqueue).
-- The waiter had the turn (or barged): put back, it counts as queued for the whole bound, so
-- nobody barges ahead of it again.
-- Returns 1 when our grant was there and is gone, 0 otherwise.
-- A key of the other type is someone else's grant: pcall turns WRONGTYPE into "not ours".
if ARGV[8] == '1' then
  PUBLISH = 'SPUBLISH'
end
local done = redis.call('GET', KEYS[6])
if done then
  -- This call ran already (a re-send after a dropped connection): its answer, and nothing
  -- again: no second decrement, and no second re-enqueue of a waiter that may have been
  -- granted or left since (it would hold the queue's head for a lease).
  return tonumber(done)
end
local freed = 0
if ARGV[2] == '1' then
  if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) == 1 and redis.call('DEL', KEYS[7]) == 1 then
    -- One decrement: a fresh grant's count is 1 (this frees the key); a re-entry's undo leaves
    -- the outer grant's count.
    -- A count left with no live hold of ours behind it is nobody's (see holds.lua).
    local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
    if not others_live(KEYS[7], ARGV[1]) or count <= 0 then
      redis.call('DEL', KEYS[1])
      redis.call(PUBLISH, ARGV[3], '0')
    end
    freed = 1
  end
elseif redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  freed = 1
end
enqueue(ARGV[4], ARGV[5], tonumber(ARGV[6]), clock() - tonumber(ARGV[7]))
if freed == 1 and ARGV[2] ~= '1' then
  -- After the re-enqueue: the head may be us (we retry anyway) or a waiter ahead of us.
  wake_head(ARGV[3], '0')
end
redis.call('SET', KEYS[6], freed, 'PX', ARGV[9])
return freed
