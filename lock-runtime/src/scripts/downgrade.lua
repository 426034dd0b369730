-- downgrade: turn a write hold into a read hold in place (plain mode), so
-- that readers may join it while writers still wait.
--
-- KEYS[1]  the lock hash          (see read.lua for both layouts)
-- ARGV[1]  holder id
-- ARGV[2]  release channel (PUBLISHed to: waiting readers may enter now)
--
-- returns  1  a read hold now (or one already): the holder keeps its hold
--             count and its token ('fence' becomes 'f:<holder id>'), its
--             lease end is the hash's ('x:<holder id>')
--          0  not held by this holder id (nothing changed)
local lock, holder = KEYS[1], ARGV[1]
-- (HGETs, not HMGET: the commands an ACL user needs stay those the README
-- lists.)
local found = {redis.call('hget', lock, holder), redis.call('hget', lock, 'mode'),
  redis.call('hget', lock, 'fence')}
if not found[1] then
  return 0
end
if found[2] == 'r' then
  return 1
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pttl = redis.call('pttl', lock)
if pttl < 0 then
  -- (No expiry: a hold without one is not made here, but a reader needs a
  -- lease end; the watchdog's next renewal sets the real one.)
  pttl = 0
end
redis.call('hdel', lock, 'fence')
redis.call('hset', lock, 'mode', 'r', 'x:' .. holder, string.format('%.0f', now + pttl),
  'f:' .. holder, found[3] or '0')
redis.call('publish', ARGV[2], '1')
return 1
