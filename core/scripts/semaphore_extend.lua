-- Renews this holder's permits (its ids) on Redisson's RPermitExpirableSemaphore layout
-- (issue 33; the watchdog's batches, `Renewal::Permits`): each id still held gets expiry
-- max(its expiry, server TIME + lease), never shorter. An id gone (released, reclaimed) or
-- already past its expiry (waiting for the next acquire to reclaim it) is lost: it is not
-- revived, and the reply says so.
-- KEYS[1] `{name}:timeout`. ARGV[1] lease ms, ARGV[2..] this holder's ids (16 raw bytes).
-- Returns 1 when every id was still held (and is renewed), 0 when any was lost.
-- Safe to run twice: never-shorter makes a second run set the same or a later expiry.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
  if score == nil or score <= now then
    return 0
  end
end
for i = 2, #ARGV do
  if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i])) < expiry then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
  end
end
return 1
