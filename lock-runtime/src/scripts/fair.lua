-- fair: first come, first served acquire and release, with direct handoff.
--
-- KEYS[1]  the lock hash          (as in acquire.lua: holder id -> hold count,
--                                  'fence' -> the hold's token)
-- KEYS[2]  the fence counter      (as in acquire.lua: expires a window after
--                                  the token it holds was issued)
-- KEYS[3]  the queue              (list of holder ids, oldest first)
-- KEYS[4]  the queue entries      (hash: holder id -> "<expiry ms>:<lease ms>")
--
-- ARGV[1] = 'acquire': ARGV[2] holder id, ARGV[3] lease ms, ARGV[4] '1' to
--           queue up when busy ('0': try once), ARGV[5] entry lifetime ms,
--           ARGV[6] release channel, ARGV[7] lease ms of a handoff (a short
--           claim that the new holder's watchdog extends: a waiter that died
--           just before its turn then blocks the key only that long),
--           ARGV[8] window ms (the counter's TTL), ARGV[9] tokens to reserve
--           for local holders (as in acquire.lua; kept in the queue entry
--           for a handoff)
--   returns {1, fence, upto}  held: it was free and nobody alive was queued
--                             ahead; fence+1..upto reserved (acquire.lua)
--           {2, fence, upto}  held: a release had handed it to this holder
--                             id (its TTL is extended to the lease, never
--                             shortened)
--           {0, pttl}   busy (queued, or its entry refreshed, when ARGV[4] is '1')
-- ARGV[1] = 'release': ARGV[2] holder id, ARGV[3] release channel, ARGV[4]
--           window ms (the counter's TTL, for a handoff)
--   returns -1  not held (a queued holder id leaves the queue instead)
--            0  freed: handed to the first live queued holder ("g <holder>
--               <fence> <upto>" on the channel), or, with nobody queued, "1"
--               on the channel
--           >0  holds left
--
-- A queue entry lives until its expiry; a waiting process refreshes it by
-- calling 'acquire' again well before that. Entries of waiters that died or
-- gave up without a word are skipped when they reach the head. The lock is
-- handed over with the handoff lease of the waiter's entry. The queue and
-- its entries carry the TTL of the newest entry (each join or refresh sets
-- it), and an emptied queue is deleted: an abandoned queue leaves nothing.
local lock, fences, queue, entries = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local window = ARGV[1] == 'acquire' and ARGV[8] or ARGV[4]

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The fencing token, as in acquire.lua: max(counter + 1, server time in µs),
-- kept in the hash for the hold; the counter keeps the last of the tokens
-- reserved with it (`reserve` more) for the window. Returns both.
local function take(holder, lease, reserve)
  local fence = tonumber(redis.call('get', fences) or '0') + 1
  local t = redis.call('time')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if clock > fence then
    fence = clock
  end
  local token = string.format('%.0f', fence)
  local upto = fence + (tonumber(reserve) or 0)
  redis.call('set', fences, string.format('%.0f', upto), 'px', window)
  redis.call('hset', lock, holder, 1, 'fence', token)
  redis.call('pexpire', lock, lease)
  return fence, upto
end

-- The first queued holder whose entry is alive, its lease and its reserve
-- (entries of an earlier version have none); dead heads are dropped on the
-- way.
local function live_head()
  local now = nil
  while true do
    local head = redis.call('lindex', queue, 0)
    if not head then
      return nil
    end
    local entry = redis.call('hget', entries, head)
    if entry then
      local expiry, lease, reserve = string.match(entry, '^(%d+):(%d+):?(%d*)$')
      now = now or now_ms()
      if expiry and tonumber(expiry) > now then
        return head, lease, reserve
      end
    end
    redis.call('lpop', queue)
    redis.call('hdel', entries, head)
  end
end

local function dequeue_head(head)
  redis.call('lpop', queue)
  redis.call('hdel', entries, head)
end

-- Hands the free lock to the first live queued holder; false when none.
local function hand_over(channel)
  local head, lease, reserve = live_head()
  if not head then
    return false
  end
  dequeue_head(head)
  local fence, upto = take(head, lease, reserve)
  redis.call('publish', channel, 'g ' .. head .. ' ' .. string.format('%.0f', fence)
    .. ' ' .. string.format('%.0f', upto))
  return true
end

if ARGV[1] == 'acquire' then
  local holder, lease = ARGV[2], ARGV[3]
  -- Free first: the uncontended case then reads the hash once.
  if redis.call('exists', lock) == 0 then
    local head = live_head()
    if not head or head == holder then
      if head then
        dequeue_head(head)
      end
      local fence, upto = take(holder, lease, ARGV[9])
      return {1, fence, upto}
    end
    -- Free (its holder's lease ran out, or a plain release): the first in
    -- line gets it, and we stay queued.
    hand_over(ARGV[6])
  elseif redis.call('hexists', lock, holder) == 1 then
    -- Handed to us by a release whose message has not reached us (yet), or
    -- already taken by a sibling waiter of our process: only extend.
    if redis.call('pttl', lock) < tonumber(lease) then
      redis.call('pexpire', lock, lease)
    end
    -- (A lock handed over by an earlier version has no 'fence' field.)
    local fence = tonumber(redis.call('hget', lock, 'fence') or redis.call('get', fences) or '0')
    -- The counter still ends the block reserved with the handoff (nobody
    -- else can take the lock while this holder has it); if it expired, no
    -- local holders.
    local upto = tonumber(redis.call('get', fences) or '0')
    if upto < fence then
      upto = fence
    end
    return {2, fence, upto}
  end
  if ARGV[4] == '1' then
    local life = tonumber(ARGV[5])
    local entry = string.format('%.0f', now_ms() + life) .. ':' .. ARGV[7] .. ':' .. (ARGV[9] or '0')
    if redis.call('hset', entries, holder, entry) == 1 then
      redis.call('rpush', queue, holder)
    end
    redis.call('pexpire', queue, life)
    redis.call('pexpire', entries, life)
  end
  return {0, redis.call('pttl', lock)}
end

if ARGV[1] == 'release' then
  local holder = ARGV[2]
  local holds = tonumber(redis.call('hget', lock, holder))
  if not holds then
    if redis.call('hdel', entries, holder) == 1 then
      redis.call('lrem', queue, 1, holder)
    end
    return -1
  end
  if holds > 1 then
    return redis.call('hincrby', lock, holder, -1)
  end
  redis.call('del', lock)
  if not hand_over(ARGV[3]) then
    redis.call('publish', ARGV[3], '1')
  end
  return 0
end

return redis.error_reply('fair.lua: unknown operation')
