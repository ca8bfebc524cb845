-- The live holds of one owner's field, for a counted lock (reentrant, read, write): a set
-- `ferrolock:holds:{key}:<field>` of hold ids beside their marks (one slot), added to with
-- every grant, living as long as its longest hold. The field's count alone cannot tell: a
-- hold whose lease ran out (watchdog off, a shorter ttl than its siblings') keeps its count in
-- the hash (a reader's, also a hold key, which the shared numbering lets a sibling's release
-- raise to its own lease), and the owner's last release, taking only its own, left the key
-- held with nobody holding it for a ttl. A hold is live while its mark is there.
-- The names from the hold's mark (`ferrolock:hold:{key}:<hold id>`): the set, the hold id,
-- and the marks' prefix.
local function hold_names(mark, field)
  local tagged, id = string.match(mark, '^ferrolock:hold:(.*):([^:]*)$')
  return 'ferrolock:holds:' .. tagged .. ':' .. field, id, string.sub(mark, 1, #mark - #id)
end

-- Raises `name`'s expiry to `ttl` ms, never lowers it (-1, none yet, is raised).
local function raise_to(name, ttl)
  if redis.call('PTTL', name) < tonumber(ttl) then
    redis.call('PEXPIRE', name, ttl)
  end
end

-- A hold of `field` granted or renewed here for `ttl` ms.
local function hold_live(mark, field, ttl)
  local holds, id = hold_names(mark, field)
  redis.call('SADD', holds, id)
  raise_to(holds, ttl)
end

-- Whether a hold in the set `holds` is live here (its mark, under `prefix`, is there). The
-- holds that lapsed leave the set; an empty set goes.
local function any_live(holds, prefix)
  local live = false
  for _, other in ipairs(redis.call('SMEMBERS', holds)) do
    if redis.call('EXISTS', prefix .. other) == 1 then
      live = true
    else
      redis.call('SREM', holds, other)
    end
  end
  if not live then
    redis.call('DEL', holds)
  end
  return live
end

-- The hold of `mark` leaves (its count was taken): whether another hold of `field` is still
-- live here.
local function others_live(mark, field)
  local holds, id, prefix = hold_names(mark, field)
  redis.call('SREM', holds, id)
  return any_live(holds, prefix)
end

-- A read-write lock `key` left to its read holds (their hold keys under `prefix`, Redisson's
-- `<prefix>:<field>:rwlock_timeout:<n>`): whether one is live, and if so the hash set to the
-- longest of them, as Redisson's read unlock does. Kept at a longer expiry (the one a released
-- hold raised it to), it stayed read-held by nobody once the holds left lapsed, and every
-- writer waited. No live reader's deadline is past its hold keys' expiry, so none is cut.
-- A reader with no hold key left (crashed, or never renewed) holds nothing here (its renewal
-- and release say so too): its field goes. Kept while other readers kept the key alive, the
-- fields of crashed readers piled up, one per crash, each read by every later release.
local function keep_for_read_holds(key, prefix)
  local longest = 0
  for _, f in ipairs(redis.call('HKEYS', key)) do
    local n = tonumber(redis.call('HGET', key, f))
    if f ~= 'mode' and n then
      local live = false
      for i = n, 1, -1 do
        local left = redis.call('PTTL', prefix .. ':' .. f .. ':rwlock_timeout:' .. i)
        longest = math.max(longest, left)
        live = live or left ~= -2
      end
      if not live and string.sub(f, -6) ~= ':write' then
        redis.call('HDEL', key, f)
      end
    end
  end
  if longest > 0 and redis.call('PTTL', key) > longest then
    redis.call('PEXPIRE', key, longest)
  end
  return longest > 0
end
