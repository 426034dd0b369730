-- renew: extend the lease of a lock, only while it is still ours.
--
-- KEYS[1]  the lock hash          (a write hold, or a read hold: see read.lua)
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
--
-- returns  1  renewed (a reader: its own lease end set, the hash's TTL
--             extended to it, never shortened: other readers may end later)
--          0  not ours any more (expired, deleted, taken over, or this
--             reader's lease has passed): the holder has lost it
local lock, holder = KEYS[1], ARGV[1]
-- (HGETs, not HMGET: the commands an ACL user needs stay those the README
-- lists.)
local found = {redis.call('hget', lock, holder), redis.call('hget', lock, 'mode')}
if not found[1] then
  return 0
end
if found[2] == 'r' then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  -- A reader whose lease has passed has lost its share, though the hash
  -- still stands for other readers: its fields go.
  if tonumber(redis.call('hget', lock, 'x:' .. holder) or '0') <= now then
    redis.call('hdel', lock, holder, 'x:' .. holder, 'f:' .. holder)
    return 0
  end
  redis.call('hset', lock, 'x:' .. holder, string.format('%.0f', now + tonumber(ARGV[2])))
  if redis.call('pttl', lock) < tonumber(ARGV[2]) then
    redis.call('pexpire', lock, ARGV[2])
  end
  return 1
end
redis.call('pexpire', lock, ARGV[2])
return 1
