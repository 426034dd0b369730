-- release: give back one hold; free the lock and wake waiters when none is left.
--
-- KEYS[1]  the lock hash          (a write hold, or a read hold: see read.lua)
-- ARGV[1]  holder id
-- ARGV[2]  release channel (PUBLISHed to when the lock becomes free)
--
-- returns  -1  not held: the lock is gone or belongs to someone else, or
--              this reader's lease has passed (nothing else changed)
--           0  freed: the hash is deleted and one message went to the
--              channel; or this reader left and other readers remain
--              (no message: the key is no freer for a writer)
--          >0  still held by us with this many holds left (TTL unchanged)
local lock, holder = KEYS[1], ARGV[1]
-- (Two HGETs, not one HMGET: the commands an ACL user needs stay those
-- the README lists.)
if redis.call('hget', lock, 'mode') ~= 'r' then
  local holds = tonumber(redis.call('hget', lock, holder))
  if not holds then
    return -1
  end
  if holds > 1 then
    return redis.call('hincrby', lock, holder, -1)
  end
  redis.call('del', lock)
  redis.call('publish', ARGV[2], '1')
  return 0
end

-- A read hold. Readers whose lease has passed are dropped first (see
-- read.lua), this one included: its share had ended already.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holds = nil
local latest = 0
local fields = redis.call('hgetall', lock)
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 2) == 'x:' then
    local reader = string.sub(name, 3)
    local ends = tonumber(fields[i + 1])
    if ends <= now then
      redis.call('hdel', lock, reader, name, 'f:' .. reader)
    elseif reader == holder then
      holds = tonumber(redis.call('hget', lock, holder))
    elseif ends > latest then
      latest = ends
    end
  end
end
if holds and holds > 1 then
  return redis.call('hincrby', lock, holder, -1)
end
if holds then
  redis.call('hdel', lock, holder, 'x:' .. holder, 'f:' .. holder)
end
if latest == 0 then
  -- No reader is left: the key is free.
  redis.call('del', lock)
  redis.call('publish', ARGV[2], '1')
elseif holds then
  -- Others read on: the hash lives until the latest of their lease ends,
  -- and a writer waiting learns of the key's release from the last of them.
  redis.call('pexpire', lock, latest - now)
end
if holds then
  return 0
end
return -1
