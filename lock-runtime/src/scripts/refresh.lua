-- refresh: keeps waiting processes' fair-queue places alive, many in one call
-- (the watchdog's tick sends one per batch, per slot on a cluster).
--
-- KEYS     per place: its key's lock hash, queue and queue entries (see
--          fair.lua)
-- ARGV[1]  entry lifetime in milliseconds
-- ARGV[2..] per place: holder id, handoff lease ms, tokens to reserve, and
--          'r' for a reader's place ('w' for a writer's)
--
-- returns  two numbers per place: 1 refreshed, or 0 not queued any more (a
--          release dequeued it, handing it the lock, whose message may still
--          be on its way; or its entry was dropped) or, for a reader, free
--          to come in (the key free or read-held and no live writer queued
--          ahead of it: readers past the run a handoff lets in): its waiter
--          should try; and the lock's PTTL (-2: free), so that a waiter does
--          not sleep past a holder's claim that runs out without a release
--          message
local life = tonumber(ARGV[1])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = string.format('%.0f', now + life)

-- Whether a live writer is queued ahead of `holder` (entries as in fair.lua).
local function writer_ahead(queue, entries, holder)
  for _, id in ipairs(redis.call('lrange', queue, 0, -1)) do
    if id == holder then
      return false
    end
    local ends, mode = string.match(redis.call('hget', entries, id) or '', '^(%d+):%d+:?%d*:?(r?)$')
    if ends and tonumber(ends) > now and mode ~= 'r' then
      return true
    end
  end
  return false
end

local out = {}
for i = 1, #KEYS / 3 do
  local lock, queue, entries = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local holder, lease, reserve, mode = ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i], ARGV[4 * i + 1]
  local read = mode == 'r'
  if redis.call('hexists', entries, holder) == 0 then
    out[2 * i - 1] = 0
  elseif read and (redis.call('exists', lock) == 0 or redis.call('hget', lock, 'mode') == 'r')
    and not writer_ahead(queue, entries, holder) then
    out[2 * i - 1] = 0
  else
    redis.call('hset', entries, holder, expiry .. ':' .. lease .. ':' .. (read and '0:r' or reserve))
    redis.call('pexpire', queue, life)
    redis.call('pexpire', entries, life)
    out[2 * i - 1] = 1
  end
  out[2 * i] = redis.call('pttl', lock)
end
return out
