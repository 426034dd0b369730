-- refresh: keeps waiting processes' fair-queue places alive, many in one call
-- (the watchdog's tick sends one per batch, per slot on a cluster).
--
-- KEYS     per place: its key's lock hash, queue and queue entries (see
--          fair.lua)
-- ARGV[1]  entry lifetime in milliseconds
-- ARGV[2..] per place: holder id, handoff lease ms, tokens to reserve
--
-- returns  two numbers per place: 1 refreshed, or 0 not queued any more (a
--          release dequeued it, handing it the lock, whose message may still
--          be on its way; or its entry was dropped): its waiter should try;
--          and the lock's PTTL (-2: free), so that a waiter does not sleep
--          past a holder's claim that runs out without a release message
local life = tonumber(ARGV[1])
local t = redis.call('time')
local expiry = string.format('%.0f',
  tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + life)
local out = {}
for i = 1, #KEYS / 3 do
  local lock, queue, entries = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local holder, lease, reserve = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  if redis.call('hexists', entries, holder) == 1 then
    redis.call('hset', entries, holder, expiry .. ':' .. lease .. ':' .. reserve)
    redis.call('pexpire', queue, life)
    redis.call('pexpire', entries, life)
    out[2 * i - 1] = 1
  else
    out[2 * i - 1] = 0
  end
  out[2 * i] = redis.call('pttl', lock)
end
return out
