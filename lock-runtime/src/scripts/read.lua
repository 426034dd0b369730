-- read: take a read hold (plain mode): share the key with other readers,
-- or report the writer in the way.
--
-- KEYS[1]  the lock hash          (a write hold, as in acquire.lua: holder id
--                                  -> hold count, 'fence' -> its token; a read
--                                  hold: 'mode' -> 'r', and per reader
--                                  holder id -> hold count, 'x:<holder id>'
--                                  -> its lease end in server ms, 'f:<holder
--                                  id>' -> its token)
-- KEYS[2]  the fence counter      (as in acquire.lua)
-- ARGV[1]  holder id              ("<process-uuid>:<n>", unique per hold)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  window in milliseconds (the counter's TTL, as in acquire.lua)
--
-- returns  {1, fence, fence}  held: a read hold of our own, shared with the
--                             readers already there (or one more hold of
--                             this holder id, which keeps its token); no
--                             tokens are reserved (read holds are never
--                             passed between tasks: local readers join)
--          {0, pttl}          busy: a write hold has it for pttl more ms
--
-- Every reader has a lease of its own ('x:'), so a crashed reader frees its
-- share while the others renew theirs: readers whose lease has passed are
-- dropped here (and by release.lua and renew.lua) before anything is
-- decided. The hash's own TTL is kept at the latest reader's lease end, so
-- acquire.lua finds a read-held key busy for exactly as long as a writer
-- must wait, without knowing of readers.
--
-- Tokens come from the key's one sequence, as acquire.lua takes them
-- (max(counter + 1, server time in µs), the counter kept for the window): a
-- reader's token is above every earlier writer's and below every later
-- one's. Readers are not serialised by the lock, but the server runs one
-- script at a time, each longer than a microsecond, so tokens do not run
-- ahead of the clock: acquire.lua's window argument holds unchanged.
local lock, fences, holder = KEYS[1], KEYS[2], ARGV[1]
local lease = tonumber(ARGV[2])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = string.format('%.0f', now + lease)

-- Drops the readers whose lease has passed; the number left.
local function prune()
  local fields = redis.call('hgetall', lock)
  local left = 0
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 'x:' then
      if tonumber(fields[i + 1]) <= now then
        local reader = string.sub(name, 3)
        redis.call('hdel', lock, reader, name, 'f:' .. reader)
      else
        left = left + 1
      end
    end
  end
  return left
end

-- The hash lives until the latest reader's lease end (never shortened here).
local function extend()
  if redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
end

if redis.call('hget', lock, 'mode') == 'r' then
  if prune() == 0 then
    -- Every reader's lease has passed: the key is free.
    redis.call('del', lock)
  elseif redis.call('hexists', lock, holder) == 1 then
    redis.call('hincrby', lock, holder, 1)
    redis.call('hset', lock, 'x:' .. holder, ends)
    extend()
    local fence = tonumber(redis.call('hget', lock, 'f:' .. holder) or '0')
    return {1, fence, fence}
  end
elseif redis.call('exists', lock) == 1 then
  return {0, redis.call('pttl', lock)}
end

-- Free, or a read hold this reader joins.
local fence = tonumber(redis.call('get', fences) or '0') + 1
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
if clock > fence then
  fence = clock
end
local token = string.format('%.0f', fence)
redis.call('set', fences, token, 'px', ARGV[3])
redis.call('hset', lock, 'mode', 'r', holder, 1, 'x:' .. holder, ends, 'f:' .. holder, token)
extend()
return {1, fence, fence}
